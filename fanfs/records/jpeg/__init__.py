"""Progressive JPEG records: the kind (:mod:`.kind`), the JPEG format it cuts (:mod:`.markers`), the scan
scripts it may follow (:mod:`.scans`) and the lossless transcoder (:mod:`.transcode`)."""

from .kind import MAX_SIZE, JpegRecords, decode_pixels

__all__ = ["MAX_SIZE", "JpegRecords", "decode_pixels"]
