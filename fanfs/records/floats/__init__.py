"""Float records: the kind (:mod:`.kind`), values as byte-plane codes (:mod:`.coding`), where a file's values
lie (:mod:`.values`), a record's header and writer (:mod:`.layout`), and what the kind declares: its precision
setting and pack options (:mod:`.options`)."""

from .kind import FloatRecords
from .options import PRECISION, record_label

__all__ = ["PRECISION", "FloatRecords", "record_label"]
