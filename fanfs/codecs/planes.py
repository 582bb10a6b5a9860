"""``planes``: byte planes of fixed-width values (floats) + zstd: byte 0 of every value, then byte 1, ...

The sign/exponent bytes of neighbouring floats are alike, so planes compress where the interleaved
bytes do not.  A tail shorter than ``width`` (a length not divisible by it) is kept as is after the
planes.  Config ``{"id": "planes", "width": 4, "level": L}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import Codec, CodecError, register
from .zstd import Zstd


@register
class BytePlanes(Codec):
    codec_id = "planes"

    def __init__(self, width: int = 4, level: int = 3) -> None:
        if width not in (2, 4, 8):
            raise CodecError(f"planes width {width!r} not one of 2, 4, 8")
        self.width = width
        self.level = level
        self._zstd = Zstd(level)

    def encode(self, data: bytes) -> bytes:
        w = self.width
        n = len(data) - len(data) % w
        planes = np.frombuffer(data, np.uint8, count=n).reshape(-1, w).T.tobytes()
        return self._zstd.encode(planes + bytes(data[n:]) if n < len(data) else planes)

    def decode(self, data: bytes, raw_size: int) -> bytes:
        w = self.width
        raw = self._zstd.decode(data, raw_size)
        n = raw_size - raw_size % w
        values = np.frombuffer(raw, np.uint8, count=n).reshape(w, -1).T.tobytes()
        return values + raw[n:] if n < raw_size else values

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "width": self.width, "level": self.level}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dictionaries: Mapping[str, bytes]) -> "BytePlanes":
        return cls(config.get("width", 4), config.get("level", 3))

    @property
    def spec(self) -> str:
        return f"planes:{self.level}" + (f"/w{self.width}" if self.width != 4 else "")
