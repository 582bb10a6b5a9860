"""Float records: the kind (:mod:`.kind`), values as byte-plane codes (:mod:`.coding`), where a file's values
lie (:mod:`.values`) and a record's header and writer (:mod:`.layout`)."""

from .kind import FloatRecords, parse_precision, record_label

__all__ = ["FloatRecords", "parse_precision", "record_label"]
