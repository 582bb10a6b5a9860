"""Where the float values of a NumPy ``.npy`` or safetensors file lie: found by content, never by name.

:func:`find_values` reads a file's header and returns its :class:`ValueMap`: the dtype of the values
and the value segments (file offset, count), in file order; every other byte (the header, tensors of
other dtypes, padding, trailing bytes) stays as it is.  Anything it cannot vouch for is a reason
string, and the file is kept as an ordinary one: big-endian or Fortran-order arrays, a dtype that is
no float, a shape that is no tuple of counts, overlapping tensors, a file that ends before its data.
"""

from __future__ import annotations

import ast
import json
import math
import struct
from dataclasses import dataclass

from ...util.source_file import SourceFile

NPY_MAGIC = b"\x93NUMPY"
MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
MAX_SEGMENTS = 1 << 16
"""Value segments a float record may have: its header lists each in 16 bytes, and a reader decodes the
header whole, so this bounds that decode (1 MiB) and the layout kept per record.  Back-to-back tensors
are one segment, so only files whose float tensors are split by more than 65,535 others reach it."""
_NPY_FLOATS = {"<f2": "f16", "<f4": "f32", "<f8": "f64"}
SAFETENSORS_FLOATS = {"F16": "f16", "BF16": "bf16", "F32": "f32", "F64": "f64"}
_SAFETENSORS_WIDTHS = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                       "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
WIDTH = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}


@dataclass
class ValueMap:
    """A file's float values: ``dtype`` (f16, bf16, f32, f64), ``counts[i]`` values at file offset ``offsets[i]``."""

    dtype: str
    offsets: list[int]
    counts: list[int]
    size: int  # the whole file's bytes

    @property
    def width(self) -> int:
        return WIDTH[self.dtype]

    @property
    def values(self) -> int:
        return sum(self.counts)


def sniff(head: bytes) -> bool:
    """Whether a file starting with ``head`` may be a .npy or safetensors file (its header decides)."""
    if head.startswith(NPY_MAGIC):
        return True
    if len(head) >= 10 and head[8:9] == b"{":
        (length,) = struct.unpack_from("<Q", head)
        return 2 <= length <= MAX_HEADER
    return False


def find_values(source: SourceFile, head: bytes) -> ValueMap | str:
    """The value map of a source file, or why its values cannot be stored as float records."""
    try:
        found = _npy(source, head) if head.startswith(NPY_MAGIC) else _safetensors(source, head)
        if isinstance(found, ValueMap) and len(found.offsets) > MAX_SEGMENTS:
            return f"{len(found.offsets):,} separate runs of float values, more than {MAX_SEGMENTS:,}"
        return found
    except (ValueError, SyntaxError, TypeError, KeyError, struct.error, RecursionError, MemoryError) as err:
        return f"unreadable header ({type(err).__name__})"


def _npy(source: SourceFile, head: bytes) -> ValueMap | str:
    size = source.size
    if len(head) < 10:
        return "ends within its header"
    major = head[6]
    if major == 1:
        (length,), start = struct.unpack_from("<H", head, 8), 10
    elif major in (2, 3):
        if len(head) < 12:
            return "ends within its header"
        (length,), start = struct.unpack_from("<I", head, 8), 12
    else:
        return f"unknown .npy version {major}"
    if length > MAX_HEADER or start + length > size:
        return "ends within its header"
    text = source.pread(length, start).decode("utf-8" if major == 3 else "latin-1")
    header = ast.literal_eval(text)
    if not (isinstance(header, dict) and {"descr", "fortran_order", "shape"} <= set(header)):
        return "a .npy header without descr, fortran_order and shape"
    descr, shape = header["descr"], header["shape"]
    if not isinstance(descr, str):
        return "a structured dtype, not floats"
    if descr in (">f2", ">f4", ">f8"):
        return "big-endian floats"
    dtype = _NPY_FLOATS.get(descr)
    if dtype is None:
        return f"dtype {descr}, not little-endian floats"
    if header["fortran_order"] is not False:
        return "Fortran order"
    if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
        return f"odd shape {shape!r}"
    count = math.prod(shape)
    data = start + length
    if data + count * WIDTH[dtype] > size:
        return "ends before its data does"
    if count == 0:
        return "no values"
    return ValueMap(dtype, [data], [count], size)


def _safetensors(source: SourceFile, head: bytes) -> ValueMap | str:
    size = source.size
    (length,) = struct.unpack_from("<Q", head)
    if 8 + length > size:
        return "ends within its header"
    header = json.loads(source.pread(length, 8))
    if not isinstance(header, dict):
        return "a safetensors header that is no JSON object"
    base = 8 + length
    tensors = []
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(tensor, dict):
            return f"tensor {name!r} is no object"
        dtype, shape, span = tensor.get("dtype"), tensor.get("shape"), tensor.get("data_offsets")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            return f"tensor {name!r} has an odd shape"
        if not (isinstance(span, list) and len(span) == 2 and all(type(n) is int and n >= 0 for n in span)
                and span[0] <= span[1]):
            return f"tensor {name!r} has odd data offsets"
        width = _SAFETENSORS_WIDTHS.get(dtype) if isinstance(dtype, str) else None
        if width is not None and span[1] - span[0] != math.prod(shape) * width:
            return f"tensor {name!r}: its data offsets do not match its shape"
        if base + span[1] > size:
            return "ends before its data does"
        tensors.append((span[0], span[1], SAFETENSORS_FLOATS.get(dtype)))
    tensors.sort()
    for (_, end, _), (start, _, _) in zip(tensors, tensors[1:]):
        if start < end:
            return "overlapping tensors"
    nbytes: dict[str, int] = {}
    for start, end, dtype in tensors:
        if dtype:
            nbytes[dtype] = nbytes.get(dtype, 0) + end - start
    if not any(nbytes.values()):
        return "no float tensors"
    dtype = max(nbytes, key=lambda d: (nbytes[d], WIDTH[d]))  # the other float dtypes stay as they are
    offsets: list[int] = []
    counts: list[int] = []
    for start, end, which in tensors:
        if which != dtype or start == end:
            continue
        if offsets and offsets[-1] + counts[-1] * WIDTH[dtype] == base + start:
            counts[-1] += (end - start) // WIDTH[dtype]  # back to back: one segment
        else:
            offsets.append(base + start)
            counts.append((end - start) // WIDTH[dtype])
    return ValueMap(dtype, offsets, counts, size)
