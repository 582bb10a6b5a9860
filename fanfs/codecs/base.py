"""The codec interface and its registry."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import UsageError


MIN_SAVING = 16
"""Bytes are stored compressed only if that saves at least 1/16 of them: a smaller saving costs a decode at every
read for next to nothing (3.4% of the benchmark's JPEGs were stored zstd-compressed to save 3% of their bytes,
and each read of them cost ~140 us of CPU instead of ~35)."""


def pays(codec: "Codec", data: bytes) -> bytes | None:
    """``codec``'s encoding of ``data`` if it saves at least 1/:data:`MIN_SAVING` of it, else None."""
    packed = codec.encode(data)
    return packed if len(packed) <= len(data) - len(data) // MIN_SAVING else None


def required_decode(rate: float | None, threads: int, mode: str = "sync", overhead: float = 0.05,
                    headroom: float = 0.20, stored: float = 1.0) -> float:
    """The per-thread decode speed (bytes/s) a codec needs so that reading at ``rate`` bytes/s keeps up (FanStore's
    constraint; 0 without a rate): ``rate`` times :func:`_decode_per_byte_read`."""
    return rate * _decode_per_byte_read(threads, mode, overhead, headroom, stored) if rate else 0.0


def rate_kept_up(decode: float, threads: int, mode: str = "sync", overhead: float = 0.05, headroom: float = 0.20,
                 stored: float = 1.0) -> float:
    """The highest read rate (bytes/s) a per-thread decode speed ``decode`` keeps up with: the inverse of
    :func:`required_decode`."""
    return decode / _decode_per_byte_read(threads, mode, overhead, headroom, stored)


def _decode_per_byte_read(threads: int, mode: str, overhead: float, headroom: float, stored: float) -> float:
    """FanStore's constraint, the one formula of both above: the bytes/s each of ``threads`` decoding at once must
    decode per byte/s read.  ``sync``: a read waits for its decode; reading the ``stored`` fraction of a file's bytes
    (1: reading them costs as much as reading the file raw) and decoding it whole may take at most ``1 + overhead``
    times reading it raw at the rate R: stored/R + 1/(threads D) <= (1 + overhead)/R.  With ``stored`` 1 that is
    the decode adding at most ``overhead`` to the read; a file compressed 57x is read in 1/57 of the time and leaves
    nearly all of it to its decode.  ``async``: decoding overlaps the reads and must outrun them by ``headroom``."""
    if mode == "sync":
        spare = 1 + overhead - stored
        return 1 / (threads * spare) if spare > 0 else math.inf
    return (1 + headroom) / threads


class CodecError(UsageError):
    """A codec spec or config that cannot be honoured."""


class Codec:
    """Compresses independent blobs."""

    codec_id: ClassVar[str]
    option_forms: ClassVar[tuple[str, ...]] = ()
    """How ``--codec`` names it (none: fanfs alone chooses it, as float records choose ``planes``)."""
    decode_rate: ClassVar[float] = 0.0
    """Bytes/s of decoded output one process is counted on to decode at (``pack --extents auto``): one figure, the
    same on every host and rank, so that a store never depends on where it was packed (0: none counted on)."""

    def encode(self, data: bytes) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes, raw_size: int) -> bytes:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dictionaries: Mapping[str, bytes]) -> "Codec":
        return cls()

    @property
    def spec(self) -> str:
        """The short command-line form, e.g. ``zstd:19``."""
        return self.codec_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"


_REGISTRY: dict[str, type[Codec]] = {}


def register(cls: type[Codec]) -> type[Codec]:
    _REGISTRY[cls.codec_id] = cls
    return cls


def codec_from_config(config: Mapping[str, Any], dictionaries: Mapping[str, bytes] | None = None) -> Codec:
    """Rebuild a codec from its stored config; an unknown id or a bad parameter is a clear error."""
    try:
        cls = _REGISTRY[config["id"]]
    except (KeyError, TypeError):
        raise CodecError(f"unknown codec {config!r}; this fanfs knows {', '.join(sorted(_REGISTRY))}") from None
    try:
        return cls.from_config(config, dictionaries or {})
    except (TypeError, ValueError, AttributeError) as err:
        if isinstance(err, CodecError):
            raise
        raise CodecError(f"bad codec config {dict(config)!r}: {err}") from None


def codec_forms() -> str:
    """What ``--codec`` takes, as its help and its errors list it."""
    forms = [form for cls in _REGISTRY.values() for form in cls.option_forms]
    return ", ".join(forms[:-1]) + f" or {forms[-1]}"


def parse_codec(spec: str) -> Codec:
    """``zstd:19`` / ``lz4`` / ``lz4:9`` / ``raw`` -> codec (the ``--codec`` option)."""
    name, _, level = spec.partition(":")
    if not getattr(_REGISTRY.get(name), "option_forms", ()):
        raise CodecError(f"no codec {name!r} to choose: use {codec_forms()}")
    config: dict[str, Any] = {"id": name}
    if level:
        try:
            config["level"] = int(level)
        except ValueError:
            raise CodecError(f"bad codec level in {spec!r}: use e.g. zstd:3, lz4:9") from None
    return codec_from_config(config)

