"""Progressive JPEG records: the kind (:mod:`.kind`), the JPEG format it cuts (:mod:`.markers`), the scan
scripts it may follow (:mod:`.scans`), the lossless transcoder (:mod:`.transcode`), resolution tiers
(:mod:`.tiers`), and what the kind declares: its fidelity setting and pack options (:mod:`.options`)."""

from .kind import MAX_SIZE, JpegRecords, tier_values
from .markers import JpegError, frame
from .options import DEFAULT_MAX_PIXELS, FIDELITY
from .tiers import is_tier

__all__ = ["DEFAULT_MAX_PIXELS", "FIDELITY", "MAX_SIZE", "JpegError", "JpegRecords", "frame", "is_tier", "tier_values"]
