"""Codec registry: each codec has an id and a JSON config, so a store's index names exactly how to decode.

Modelled on numcodecs: ``get_config()`` gives a plain dict that ``codec_from_config()`` turns back into
the codec.  A blob whose compressed form would not be smaller is stored raw; readers recognise it by
``stored size == raw size`` and never call the codec, so no per-blob flag is needed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import lz4.block
import zstandard


class CodecError(ValueError):
    """A codec spec or config that cannot be honoured."""


class Codec:
    """Compresses independent blobs.  Subclasses are registered by :func:`register`."""

    codec_id: ClassVar[str]

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
    """Rebuild a codec from its stored config; unknown ids are a clear error, not a crash."""
    try:
        cls = _REGISTRY[config["id"]]
    except (KeyError, TypeError):
        raise CodecError(f"unknown codec {config!r}; this fanfs knows {', '.join(sorted(_REGISTRY))}") from None
    return cls.from_config(config, dictionaries or {})


def parse_codec(spec: str) -> Codec:
    """``zstd:19`` / ``lz4`` / ``lz4:9`` / ``raw`` -> codec (the ``--codec`` option)."""
    name, _, level = spec.partition(":")
    config: dict[str, Any] = {"id": name}
    if level:
        try:
            config["level"] = int(level)
        except ValueError:
            raise CodecError(f"bad codec level in {spec!r}: use e.g. zstd:3, lz4:9") from None
    codec = codec_from_config(config)
    return codec


@register
class Raw(Codec):
    codec_id = "raw"

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes, raw_size: int) -> bytes:
        return data


@register
class Zstd(Codec):
    """zstd at a level, optionally with a dictionary trained on small files of one kind."""

    codec_id = "zstd"

    def __init__(self, level: int = 3, dictionary: bytes | None = None, dict_name: str | None = None) -> None:
        if not 1 <= level <= 22:
            raise CodecError(f"zstd level {level} out of range 1..22")
        self.level = level
        self.dict_name = dict_name
        self._dict = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self._local = threading.local()  # zstd contexts are reusable but not shareable across threads

    def _contexts(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        local = self._local
        if not hasattr(local, "ctx"):
            local.ctx = (
                zstandard.ZstdCompressor(level=self.level, dict_data=self._dict, write_content_size=True),
                zstandard.ZstdDecompressor(dict_data=self._dict),
            )
        return local.ctx

    def encode(self, data: bytes) -> bytes:
        return self._contexts()[0].compress(data)

    def decode(self, data: bytes, raw_size: int) -> bytes:
        return self._contexts()[1].decompress(data, max_output_size=raw_size)

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"id": self.codec_id, "level": self.level}
        if self.dict_name:
            config["dict"] = self.dict_name
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dictionaries: Mapping[str, bytes]) -> "Zstd":
        name = config.get("dict")
        if name is not None and name not in dictionaries:
            raise CodecError(f"zstd dictionary {name!r} is missing from the store")
        return cls(int(config.get("level", 3)), dictionaries.get(name) if name else None, name)

    @property
    def spec(self) -> str:
        return f"zstd:{self.level}" + (f"+dict:{self.dict_name}" if self.dict_name else "")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_dict"] = self._dict.as_bytes() if self._dict else None
        del state["_local"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        raw = state.pop("_dict")
        self.__dict__.update(state)
        self._dict = zstandard.ZstdCompressionDict(raw) if raw else None
        self._local = threading.local()


@register
class Lz4(Codec):
    """LZ4 block format: level 0 is the fast mode, 1..12 the high-compression mode."""

    codec_id = "lz4"

    def __init__(self, level: int = 0) -> None:
        if not 0 <= level <= 12:
            raise CodecError(f"lz4 level {level} out of range 0..12")
        self.level = level

    def encode(self, data: bytes) -> bytes:
        if self.level:
            return lz4.block.compress(data, mode="high_compression", compression=self.level, store_size=False)
        return lz4.block.compress(data, store_size=False)

    def decode(self, data: bytes, raw_size: int) -> bytes:
        return lz4.block.decompress(data, uncompressed_size=raw_size)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "level": self.level}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dictionaries: Mapping[str, bytes]) -> "Lz4":
        return cls(int(config.get("level", 0)))

    @property
    def spec(self) -> str:
        return f"lz4:{self.level}" if self.level else "lz4"


@register
class BytePlanes(Codec):
    """Byte planes of fixed-width values (floats) + zstd: byte 0 of every value, then byte 1, and so on.

    The sign/exponent bytes of neighbouring floats are alike, so planes compress where the interleaved
    bytes do not.  A tail shorter than ``width`` (a length not divisible by it) is kept as is after the
    planes.  Config ``{"id": "planes", "width": 4, "level": L}``.
    """

    codec_id = "planes"

    def __init__(self, width: int = 4, level: int = 3) -> None:
        if width not in (2, 4, 8):
            raise CodecError(f"planes width {width} not one of 2, 4, 8")
        self.width = width
        self.level = level
        self._zstd = Zstd(level)

    def encode(self, data: bytes) -> bytes:
        import numpy as np
        w = self.width
        n = len(data) - len(data) % w
        planes = np.frombuffer(data, np.uint8, count=n).reshape(-1, w).T.tobytes()
        return self._zstd.encode(planes + bytes(data[n:]) if n < len(data) else planes)

    def decode(self, data: bytes, raw_size: int) -> bytes:
        import numpy as np
        w = self.width
        raw = self._zstd.decode(data, raw_size)
        n = raw_size - raw_size % w
        values = np.frombuffer(raw, np.uint8, count=n).reshape(w, -1).T.tobytes()
        return values + raw[n:] if n < raw_size else values

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "width": self.width, "level": self.level}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dictionaries: Mapping[str, bytes]) -> "BytePlanes":
        return cls(int(config.get("width", 4)), int(config.get("level", 3)))

    @property
    def spec(self) -> str:
        return f"planes:{self.level}" + (f"/w{self.width}" if self.width != 4 else "")
