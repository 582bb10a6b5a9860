"""Float records: the values of ``.npy`` and safetensors files as byte planes, one layer per plane.

Byte planes are layers: the first k planes of every value, most significant first, are a coarser but
valid float, and in a layer-major shard they are a prefix.  So a mount presents a float record at a
*precision* (its first ``8k`` bits, :mod:`.coding` fills the rest) and reads only k planes from
storage, exactly as it presents a JPEG record's first K scans.  The file keeps its size at every
precision: header bytes and other tensors are always there, so ``np.load``, ``safetensors`` and
``mmap`` work unchanged.

Layers of a record (blob numbers are file-major: layer 0's blobs, then layer 1's, ...)::

    layer 0   record header | side blob of each value chunk | the non-value bytes, in 1 MiB chunks
    layer j   plane j of each value chunk (j = 1..P)

Values are cut into chunks of ``CHUNK_SIZE`` bytes, so a read at any offset decodes one bounded chunk
and big files stream through pack.  A chunk whose codes compress better whole than as planes keeps
them whole in layer 1 (its later layers are empty): it reads more at low precision, stores less.
Lossless records present the original bytes at full precision; ELF records (``--float-error``) present
values within the pack's bound (lossy: ``info`` and ``verify`` say so).
"""

from __future__ import annotations

import bisect
import struct
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...util.source_file import SourceFile
from ..base import FULL, AddOption, Columns, Packed, Presentation, Reader, RecordKind, expand, register
from .coding import ELF_DTYPES, SPECS, Coding, SideError, elf_bits
from .values import find_values, sniff
from .layout import HEADER, Layout, RecordWriter, blob_limit, header_limit, parse_layout
from .options import (MAX_PLANES, PRECISION, add_pack_options, add_select_options, asked, plan_record_problem,
                      record_label)
from ..plain import CHUNK_SIZE

MAX_CACHED_PIECES = 1 << 18
"""Pieces (value segments and the runs between them) of the layouts kept: ~40 MiB of lists at most."""

@register
class FloatRecords(RecordKind):
    kind_id = 2
    name = "float"
    label = "float records"
    setting = PRECISION
    setting_unit = 8
    since_format = 2

    def __init__(self, elf: bool = False, error: float | None = None) -> None:
        """Lossless by default; ``elf``: ELF within ``error`` (None: within the dtype's last mantissa bit)."""
        self.elf = elf
        self.error = error
        self._layouts: OrderedDict[tuple[int, int], Layout] = OrderedDict()
        self._pieces = 0  # pieces of the cached layouts (a record may have up to 2 * MAX_SEGMENTS + 1)

    # --- presentation -------------------------------------------------------------------------

    def setting_range(self, index: Columns, entries: np.ndarray) -> tuple[int, int]:
        files = entries[index.type[entries] == 1]
        planes = int(index.layers[files].max()) - 1 if files.size else 0
        return (8, 8 * (planes - 1)) if planes >= 2 else (FULL, FULL)

    def view(self, index: Columns, entry: int, presentation: Presentation) -> int:
        kept = presentation[PRECISION.name] // 8
        return kept if kept < int(index.layers[entry]) - 1 else FULL

    def views(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        kept = presentation[PRECISION.name] // 8
        return np.where(index.layers[entries].astype(np.int64) - 1 > kept, kept, FULL).astype(np.int64)

    def read(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> bytes:
        layout = self._layout(reader, entry)
        end = min(offset + size, layout.size)
        if offset >= end:
            return b""
        kept = min(view, layout.coding.planes)
        i = bisect.bisect_right(layout.starts, offset) - 1
        parts = []
        pos = offset
        while pos < end:
            start, length = layout.starts[i], layout.lengths[i]
            stop = min(end, start + length)
            a, b = layout.stream[i] + pos - start, layout.stream[i] + stop - start
            if layout.in_values[i]:
                parts.append(self._value_bytes(reader, entry, layout, kept, a, b))
            else:
                parts.append(self._other_bytes(reader, entry, layout, a, b))
            pos = stop
            i += 1
        return b"".join(parts)

    def _other_bytes(self, reader: Reader, entry: int, layout: Layout, a: int, b: int) -> bytes:
        chunk = reader.chunk_size
        base = layout.first + 1 + layout.chunks
        parts = []
        for c in range(a // chunk, (b - 1) // chunk + 1):
            data = reader.blob(entry, base + c, 0)
            parts.append(data[max(a - c * chunk, 0):b - c * chunk])
        return b"".join(parts)

    def _value_bytes(self, reader: Reader, entry: int, layout: Layout, kept: int, a: int, b: int) -> bytes:
        step = layout.chunk_values * layout.coding.spec.width
        parts = []
        for c in range(a // step, (b - 1) // step + 1):
            lo, hi = max(a - c * step, 0), b - c * step
            parts.append(self._chunk(reader, entry, layout, kept, c, whole=lo == 0 and hi >= step)[lo:hi])
        return b"".join(parts)

    def _chunk(self, reader: Reader, entry: int, layout: Layout, kept: int, c: int, whole: bool) -> bytes:
        """The presented bytes of value chunk c with ``kept`` planes, through the store's cache."""
        key = ("float", entry, kept, c)
        data = reader.cache.get(key)
        if data is not None:
            return data
        coding = layout.coding
        n = min(layout.chunk_values, layout.values - c * layout.chunk_values)
        first_plane = layout.plane_blob(1, c)
        interleaved = None
        planes: list[bytes] = []
        if coding.planes > 1 and int(reader.index.blob_raw[first_plane]) == n * coding.planes:
            interleaved = reader.blob(entry, first_plane, 1, keep=False)
        else:
            planes = [reader.blob(entry, layout.plane_blob(j + 1, c), j + 1, keep=False) for j in range(kept)]
        needs_side = kept < coding.planes or coding.mbits
        side = reader.blob(entry, layout.first + 1 + c, 0, keep=False) if needs_side else b""
        try:
            data = coding.present(coding.codes(n, planes, interleaved, kept), kept, side)
        except SideError as err:
            raise reader.fault(entry, layout.first + 1 + c, f"value chunk {c}: {err}") from None
        if not whole:
            reader.cache.put(key, data)
        return data

    # --- the record header, checked once per entry ------------------------------------------

    def _layout(self, reader: Reader, entry: int) -> Layout:
        ix = reader.index
        key = (id(ix), entry)
        layout = self._layouts.get(key)
        if layout is not None and layout.index is ix:
            return layout
        first = int(ix.first[entry])
        try:
            layout = parse_layout(ix, entry, reader.blob(entry, first, 0), reader.chunk_size)
        except (ValueError, struct.error) as err:
            raise reader.fault(entry, first, f"bad float record header: {err}") from None
        self._layouts[key] = layout
        self._pieces += len(layout.starts)
        while len(self._layouts) > 1 and (len(self._layouts) > 4096 or self._pieces > MAX_CACHED_PIECES):
            self._pieces -= len(self._layouts.popitem(last=False)[1].starts)
        return layout

    # --- index --------------------------------------------------------------------------------

    def check(self, index: Columns, entries: np.ndarray) -> str | None:
        layers = index.layers[entries].astype(np.int64)
        if ((layers < 2) | (layers > MAX_PLANES + 1)).any():
            return f"a float record with fewer than 2 or more than {MAX_PLANES + 1} layers"
        if (index.count[entries].astype(np.int64) < layers + 1).any():
            return "a float record with fewer blobs than it has layers"
        first = index.first[entries].astype(np.int64)
        header = index.blob_raw[first].astype(np.int64)
        if (header < HEADER.size).any():
            return "a float record whose header blob is too short"
        # every blob is decoded whole: bound what each may decode to before any is read
        if (header > header_limit(index.size[entries])).any():
            return "a float record whose header blob is larger than its file's value segments allow"
        blobs, owner = expand(first, index.count[entries])
        if (index.blob_raw[blobs[blobs != first[owner]]] > blob_limit(int(index.meta["chunk_size"]))).any():
            return "a float record blob larger than a chunk of values can need"
        return None

    def describe(self, index: Columns, entries: np.ndarray) -> dict[str, Any]:
        lossy = (index.meta.get("records") or {}).get(self.name, {}).get("error")
        elf = (index.meta.get("records") or {}).get(self.name, {}).get("elf")
        out: dict[str, Any] = {"planes": {str(int(v) - 1): int(c) for v, c in
                                          zip(*np.unique(index.layers[entries], return_counts=True))}}
        if elf:
            out["lossy"] = {"elf": True, "error": lossy}
            bound = "within 2**-(m+1) (the dtype's last mantissa bit)" if lossy is None else f"within {lossy:g}"
            out["notes"] = [f"LOSSY: float32/float64 values stored with ELF, each {bound} of its source "
                            "(float16/bfloat16 files are lossless)"]
        return out

    def summary(self, described: Mapping[str, Any]) -> str:
        planes = ", ".join(f"{k}: {v}" for k, v in described.get("planes", {}).items())
        return f" (planes: {planes})" if planes else ""

    # --- pack ---------------------------------------------------------------------------------

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        add_pack_options(add)

    @classmethod
    def select_options(cls, add: AddOption) -> None:
        add_select_options(add)

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        arguments = asked(options, plan_record)
        return None if arguments is None else cls(**arguments)

    def pack_notes(self) -> list[str]:
        if not self.elf:
            return []
        bound = "the last mantissa bit" if self.error is None else format(self.error, "g")
        return [f"LOSSY store: float32/float64 values are kept with ELF, each within {bound} of its source"]

    def plan_record_problem(self, class_name: str, record: Mapping[str, Any]) -> str | None:
        return plan_record_problem(class_name, record)

    def plan_label(self, record: Mapping[str, Any], codec: str) -> str:
        return record_label(record, codec)

    def claims(self, head: bytes) -> bool:
        return sniff(head)

    def coding(self, dtype: str) -> Coding:
        spec = SPECS[dtype]
        if not self.elf or dtype not in ELF_DTYPES:
            return Coding(spec)
        m = elf_bits(self.error, spec)
        return Coding(spec, m, self.error if self.error is not None else 2.0 ** -(m + 1))

    def pack(self, source: SourceFile, head: bytes) -> Packed | str:
        found = find_values(source, head)
        if isinstance(found, str):
            return found
        writer = RecordWriter(source, found, self.coding(found.dtype), CHUNK_SIZE)
        return Packed([writer.layer0(), *(writer.plane(j) for j in range(1, writer.coding.planes + 1))],
                      source.size, digest=writer.digest)

    def matches_source(self, reader: Reader, entry: int, source: SourceFile) -> str | None:
        """Lossless: the same bytes.  ELF: the same bytes but for values, each within the bound (exceptions exact)."""
        layout = self._layout(reader, entry)
        coding = layout.coding
        if not coding.mbits:
            return super().matches_source(reader, entry, source)
        spec, step = coding.spec, 1 << 20
        for start, length, is_value in zip(layout.starts, layout.lengths, layout.in_values):
            for pos in range(start, start + length, step):
                n = min(step, start + length - pos)
                mine, theirs = self.read(reader, entry, FULL, pos, n), source.pread(n, pos)
                if len(theirs) != n:
                    return f"the source is shorter than the record (near offset {pos})"
                if mine == theirs:
                    continue
                if not is_value:
                    return f"bytes differ from the source near offset {pos}"
                a, b = np.frombuffer(mine, spec.bits), np.frombuffer(theirs, spec.bits)
                with np.errstate(invalid="ignore"):
                    err = np.abs(spec.to_float64(a) - spec.to_float64(b))
                if ((a != b) & ~(err <= coding.eps)).any():
                    return f"a value differs from the source by more than {coding.eps:g} near offset {pos}"
        if source.pread(1, int(reader.index.size[entry])):
            return "the source is longer than the record"
        return None

    def pack_config(self) -> dict[str, Any] | None:
        return {"elf": self.elf, "error": self.error}


