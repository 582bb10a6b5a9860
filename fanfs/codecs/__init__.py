"""Codecs: how a blob's bytes are compressed.  Each has an id and a JSON config, so an index names
exactly how to decode its blobs.

Modelled on numcodecs: ``get_config()`` gives a plain dict that :func:`codec_from_config` turns back into
the codec.  A blob whose compressed form would not be smaller is stored raw; readers recognise it by
``stored size == raw size`` and never call the codec, so no per-blob flag is needed.

Adding a codec is one module defining a :class:`Codec` subclass decorated with :func:`register`, and its
import below.
"""

from . import zstd, lz4, raw, planes  # noqa: F401  (each registers its codec; --codec lists them in this order)
from .base import (MIN_SAVING, Codec, CodecError, codec_forms, codec_from_config, pays, parse_codec, rate_kept_up,
                   register, required_decode)
from .lz4 import Lz4
from .planes import BytePlanes
from .raw import Raw
from .zstd import Zstd

__all__ = ["MIN_SAVING", "pays", "required_decode", "rate_kept_up", "Codec", "CodecError", "codec_forms",
           "codec_from_config", "parse_codec", "register", "Raw", "Zstd", "Lz4", "BytePlanes"]
