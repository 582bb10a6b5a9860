"""Content classes for compressor selection: what kind of bytes a file holds, from its first bytes.

Cheap by design (pack calls it on every file): magic numbers first, then a small sniff of at most
``SNIFF`` bytes.  The classes, in the fixed order a plan uses for its codec table:

``jpeg``        JPEG (``FF D8 FF``)
``png``         PNG signature
``float``       float arrays: NumPy ``.npy`` with a float dtype (``\\x93NUMPY``), safetensors whose tensors
                are floats
``compressed``  already compressed: gzip, zip (also ``.npz``, ``.pt``), zstd, xz, bz2, lz4 frame, 7z,
                rar, and compressed media (GIF, WebP, MP4/MOV, WebM/MKV, FLAC, Ogg, MP3 with ID3)
``text``        decodes as UTF-8 (a multi-byte character cut by the sniff is allowed) with at most 1%
                control bytes other than tab, newline, carriage return, form feed and escape
``binary``      everything else (including empty files and NumPy arrays of integers)
"""

from __future__ import annotations

import ast
import json
import struct

CLASSES = ("jpeg", "png", "float", "compressed", "text", "binary")
SNIFF = 4096  # bytes looked at; callers may pass more, the rest is ignored

_COMPRESSED_MAGICS = (
    b"\x1f\x8b",  # gzip
    b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08",  # zip, empty zip, spanned zip
    b"\x28\xb5\x2f\xfd",  # zstd frame
    b"\xfd7zXZ\x00",  # xz
    b"\x04\x22\x4d\x18",  # lz4 frame
    b"7z\xbc\xaf\x27\x1c",  # 7z
    b"Rar!\x1a\x07",  # rar
    b"GIF87a", b"GIF89a",
    b"\x1a\x45\xdf\xa3",  # matroska / webm
    b"fLaC", b"OggS", b"ID3",
)
# bytes that do not count as control bytes in text: printable, UTF-8 continuation/lead bytes and a few
# whitespace controls; ``translate`` deletes them, so what remains are the control bytes
_NOT_CONTROL = bytes(b for b in range(256) if b >= 0x20 and b != 0x7f) + b"\t\n\r\f\x1b\x0b"
_FLOAT_NPY = {"f2": 2, "f4": 4, "f8": 8, "e": 2, "f": 4, "d": 8}
_FLOAT_SAFETENSORS = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def classify(data: bytes | memoryview) -> str:
    """The content class of a file whose first bytes are ``data`` (the whole file, or at least ``SNIFF``)."""
    head = bytes(data[:SNIFF])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if float_width(head):
        return "float"
    if head.startswith(_COMPRESSED_MAGICS) or (head[:3] == b"BZh" and head[3:4].isdigit()) \
            or (head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"AVI ")) \
            or head[4:8] == b"ftyp":
        return "compressed"
    if head and _is_text(head):
        return "text"
    return "binary"


def float_width(head: bytes) -> int:
    """Bytes per value if ``head`` starts a float array (.npy or safetensors), else 0."""
    if head[:6] == b"\x93NUMPY":
        try:
            major = head[6]
            if major == 1:
                (length,), start = struct.unpack("<H", head[8:10]), 10
            else:
                (length,), start = struct.unpack("<I", head[8:12]), 12
            header = ast.literal_eval(head[start:start + length].decode("latin-1"))
            descr = header["descr"]
        except Exception:  # a cut or odd header: not something we recognise as floats
            return 0
        if isinstance(descr, str):
            return _FLOAT_NPY.get(descr.lstrip("<>=|"), 0)
        return 0
    if len(head) > 10 and head[8:9] == b"{":
        (length,) = struct.unpack("<Q", head[:8])
        if 2 <= length <= 100_000_000:
            text = head[8:8 + length]
            try:
                header = json.loads(text)
            except ValueError:
                # the sniff may cut a long header: look for dtypes in what we have
                found = [w for name, w in _FLOAT_SAFETENSORS.items() if f'"dtype":"{name}"'.encode() in text
                         or f'"dtype": "{name}"'.encode() in text]
                return max(found) if found and b'"data_offsets"' in text else 0
            widths = [_FLOAT_SAFETENSORS.get(t.get("dtype"), 0) for k, t in header.items()
                      if k != "__metadata__" and isinstance(t, dict)]
            if widths and all(widths):
                return max(set(widths), key=widths.count)
    return 0


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        # a multi-byte character cut at the end of the sniff is still text
        if not (err.reason == "unexpected end of data" and err.start >= len(head) - 3):
            return False
    control = len(head.translate(None, _NOT_CONTROL))
    return b"\x00" not in head and control <= len(head) // 100
