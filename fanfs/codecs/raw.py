"""``raw``: bytes stored as they are (already compressed data: JPEG, PNG, archives)."""

from __future__ import annotations

from .base import Codec, register


@register
class Raw(Codec):
    codec_id = "raw"
    option_forms = ("raw",)

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes, raw_size: int) -> bytes:
        return data
