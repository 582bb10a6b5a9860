"""Float records (lossless or ELF) as a candidate of the float class: measured like any codec.

A probe encodes a measurement unit the way pack stores a float record's values: codes cut into byte
planes, each plane compressed on its own by the blob codec (or the codes whole where that is smaller),
plus the side data (exceptions, zeros); decoding is the full-precision presentation a mount does.  A
unit is taken as values from its first byte (what pack would see of the bytes of a header in it does
not matter at this scale); bytes after the last whole value are kept as they are.  The plan records the
blob codec and the record form (``record``) separately, so ``pack --plan`` makes float records.
"""

from __future__ import annotations

import struct
from typing import Any

from ...codecs import Codec, Zstd
from ...records.floats.coding import ELF_DTYPES, SPECS, Coding, elf_bits
from ...records.floats import record_label

_SIZES = struct.Struct("<II")  # raw and stored size of each blob in a probe's output
_DTYPE_OF_WIDTH = {2: "f16", 4: "f32", 8: "f64"}


class FloatRecordProbe(Codec):
    """Not a store codec (never registered): a measurement of float records with a zstd level."""

    codec_id = "float-record-probe"

    def __init__(self, width: int, level: int, elf: bool = False, error: float | None = None) -> None:
        dtype = _DTYPE_OF_WIDTH[width]
        spec = SPECS[dtype]
        if elf and dtype in ELF_DTYPES:
            m = elf_bits(error, spec)
            self.coding = Coding(spec, m, error if error is not None else 2.0 ** -(m + 1))
        else:
            self.coding = Coding(spec)
        self.width, self.elf, self.error = width, elf, error
        self.blob_codec = Zstd(level)

    @property
    def record(self) -> dict[str, Any]:
        """The record form for a plan: float records, lossless or ELF with this bound."""
        return {"kind": "float", "elf": self.elf, "error": self.error}

    @property
    def spec(self) -> str:
        return record_label(self.record, self.blob_codec.spec)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "width": self.width, "elf": self.elf, "error": self.error,
                "level": self.blob_codec.level}

    def _blob(self, raw: bytes) -> bytes:
        """One blob as pack stores it: compressed, or raw when that is not smaller; framed with both sizes."""
        packed = self.blob_codec.encode(raw)
        stored = packed if len(packed) < len(raw) else raw
        return _SIZES.pack(len(raw), len(stored)) + stored

    def encode(self, data: bytes) -> bytes:
        n = len(data) - len(data) % self.width
        codes, side, _ = self.coding.encode(memoryview(data)[:n])
        planes = [self._blob(p) for p in self.coding.planes_of(codes)]
        whole = self._blob(self.coding.interleaved(codes))
        if len(planes) > 1 and len(whole) < sum(map(len, planes)):
            planes = [whole]
        return b"".join(planes) + self._blob(side) + _SIZES.pack(len(data) - n, len(data) - n) + bytes(data[n:])

    def decode(self, data: bytes, raw_size: int) -> bytes:
        blobs, pos = [], 0
        while pos < len(data):
            raw, stored = _SIZES.unpack_from(data, pos)
            blob = data[pos + _SIZES.size:pos + _SIZES.size + stored]
            blobs.append(blob if stored == raw else self.blob_codec.decode(blob, raw))
            pos += _SIZES.size + stored
        tail, side = blobs.pop(), blobs.pop()
        n = (raw_size - len(tail)) // self.width
        whole = blobs[0] if len(blobs) == 1 and self.coding.planes > 1 else None
        codes = self.coding.codes(n, blobs if whole is None else [], whole, self.coding.planes)
        return self.coding.present(codes, self.coding.planes, side) + tail
