"""A float record's blobs: its header, how pack writes its layers, and how a reader checks them.

The header (layer 0's first blob) names the coding (dtype, lossless or ELF with m bits and its bound),
the chunking of the values and the value segments of the file; :func:`parse_layout` checks it against
the record's index rows once, so every number a read then trusts is known to fit its blobs.
"""

from __future__ import annotations

import bisect
import errno
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...codecs import Zstd
from ...util.checksum import Digest
from ...util.source_file import SourceFile
from ..base import Columns
from .coding import ELF_DTYPES, SIDE, SPECS, Coding
from .values import MAX_SEGMENTS, ValueMap

HEADER = struct.Struct("<8sBBBBBxxxIIQQd")  # magic, version, ELF?, dtype, planes, mbits, chunk values,
_MAGIC = b"FANFSFLT"                      # segments, values, non-value bytes, ELF bound
_DTYPES = ("f16", "bf16", "f32", "f64")
_ESTIMATE = Zstd(1)  # compares planes with whole codes at pack time


def header_limit(size: np.ndarray) -> np.ndarray:
    """The most bytes a float record's header blob can hold for a file of ``size`` bytes: 16 per value
    segment, and a file has at most one segment per 2 bytes (a float16) and at most MAX_SEGMENTS."""
    return HEADER.size + 16 * np.minimum(MAX_SEGMENTS, np.asarray(size, np.int64) // 2)


def blob_limit(chunk: int) -> int:
    """The most bytes any other blob of a float record holds in a store of ``chunk``-byte chunks: the side
    data of a chunk of float16 values (every value an exception, plus the zero bitmap), more than any
    plane or non-value chunk holds."""
    values = chunk // 2
    return SIDE.size + values * (4 + 2) + values // 8 + 1


@dataclass
class Layout:
    """A record's header, checked against its index rows: what its blobs hold and where its values lie."""

    coding: Coding
    chunk_values: int
    values: int
    chunks: int
    first: int  # the record's first blob
    skeleton_chunks: int
    starts: list[int]  # file offset of each piece (value segment or run of other bytes), in file order
    lengths: list[int]
    in_values: list[bool]
    stream: list[int]  # offset of each piece in the value bytes or in the other bytes
    size: int
    index: Any  # the index this was checked against (identity; a cache key may outlive an index)

    def plane_blob(self, plane: int, chunk: int) -> int:
        return self.first + 1 + self.chunks + self.skeleton_chunks + (plane - 1) * self.chunks + chunk


def parse_layout(ix: Columns, entry: int, head: bytes, chunk: int) -> Layout:
    magic, version, elf, dtype, planes, mbits, chunk_values, segments, values, other, eps = \
        HEADER.unpack_from(head)
    if magic != _MAGIC or version != 1 or dtype >= len(_DTYPES) or elf > 1:
        raise ValueError("not a float record header of version 1")
    spec = SPECS[_DTYPES[dtype]]
    coding = Coding(spec, mbits, eps) if elf else Coding(spec)
    if elf and not (_DTYPES[dtype] in ELF_DTYPES and 1 <= mbits <= spec.mant_bits and eps > 0):
        raise ValueError("ELF parameters out of range")
    size = int(ix.size[entry])
    if len(head) != HEADER.size + 16 * segments or not planes == coding.planes == int(ix.layers[entry]) - 1 \
            or not 1 <= chunk_values <= chunk // spec.width or values == 0 \
            or other + values * spec.width != size:
        raise ValueError("header does not match the index")
    offsets = np.frombuffer(head, "<u8", segments, HEADER.size).astype(np.int64)
    counts = np.frombuffer(head, "<u8", segments, HEADER.size + 8 * segments).astype(np.int64)
    if segments == 0 or (counts == 0).any() or (counts > values).any() or int(counts.sum()) != values:
        raise ValueError("value segments do not add up")
    if (offsets < 0).any() or (offsets > size).any():
        raise ValueError("value segments lie outside the file")
    ends = offsets + counts * spec.width
    if (offsets[1:] < ends[:-1]).any() or int(ends[-1]) > size:
        raise ValueError("value segments overlap or lie outside the file")
    chunks = -(-values // chunk_values)
    skeleton = -(-other // chunk)
    first, count = int(ix.first[entry]), int(ix.count[entry])
    if count != 1 + chunks + skeleton + planes * chunks:
        raise ValueError("blob count does not match the header")
    raw = ix.blob_raw[first:first + count].astype(np.int64)
    if int(raw[0]) != len(head):
        raise ValueError("header blob size")
    sizes = np.full(chunks, chunk_values, np.int64)
    sizes[-1] = values - (chunks - 1) * chunk_values
    expected_other = np.full(skeleton, chunk, np.int64)
    if skeleton:
        expected_other[-1] = other - (skeleton - 1) * chunk
    if (raw[1:1 + chunks] > SIDE.size + sizes * (4 + spec.width) + sizes // 8 + 1).any() \
            or (raw[1 + chunks:1 + chunks + skeleton] != expected_other).any():
        raise ValueError("side or non-value blob sizes do not match the header")
    plane_raw = raw[1 + chunks + skeleton:].reshape(planes, chunks)
    whole = (plane_raw[0] == sizes * planes) & (planes > 1)
    expected = np.where(whole, 0, sizes)
    if (~whole & (plane_raw[0] != sizes)).any() or (plane_raw[1:] != expected).any():
        raise ValueError("plane blob sizes do not match the header")
    starts, lengths, in_values, stream = [], [], [], []
    prev, other_pos = 0, 0
    value_pos = 0
    for offset, end in zip(offsets.tolist() + [size], ends.tolist() + [size]):
        if offset > prev:
            starts.append(prev), lengths.append(offset - prev), in_values.append(False), stream.append(other_pos)
            other_pos += offset - prev
        if end > offset:
            starts.append(offset), lengths.append(end - offset), in_values.append(True), stream.append(value_pos)
            value_pos += end - offset
        prev = end
    return Layout(coding, chunk_values, values, chunks, first, skeleton, starts, lengths, in_values, stream, size, ix)


class RecordWriter:
    """Cuts one file into a float record's layers while the shard writer consumes them, layer after layer.

    Layer 0 goes first and, in one pass in file order, computes the side blobs, which chunks keep their
    codes whole, and the checksum of the full presentation; each plane layer reads the values again.
    """

    def __init__(self, source: SourceFile, found: ValueMap, coding: Coding, chunk: int) -> None:
        self.source, self.found, self.coding, self.chunk = source, found, coding, chunk
        self.width = found.width
        self.chunk_values = chunk // self.width
        self.chunks = -(-found.values // self.chunk_values)
        self.gaps = self._gaps()
        self.whole = [False] * self.chunks
        self.digest = Digest()
        self._cumulative = np.concatenate([[0], np.cumsum(found.counts)]).tolist()

    def _gaps(self) -> list[tuple[int, int]]:
        """The runs of non-value bytes: before each segment, then after the last."""
        gaps, prev = [], 0
        for offset, count in zip(self.found.offsets, self.found.counts):
            gaps.append((prev, offset - prev))
            prev = offset + count * self.width
        gaps.append((prev, self.found.size - prev))
        return gaps

    def header(self) -> bytes:
        f, c = self.found, self.coding
        other = sum(length for _, length in self.gaps)
        return (HEADER.pack(_MAGIC, 1, int(bool(c.mbits)), _DTYPES.index(f.dtype), c.planes, c.mbits,
                             self.chunk_values, len(f.offsets), f.values, other, c.eps)
                + np.array(f.offsets, "<u8").tobytes() + np.array(f.counts, "<u8").tobytes())

    def _read(self, offset: int, length: int) -> bytes:
        data = self.source.pread(length, offset)
        if len(data) < length:
            raise OSError(errno.EIO, "file changed size while being packed")
        return data

    def _values(self, c: int) -> bytes:
        """The bytes of value chunk c, gathered from the segments it spans."""
        start = c * self.chunk_values
        stop = min(start + self.chunk_values, self.found.values)
        parts = []
        s = bisect.bisect_right(self._cumulative, start) - 1
        while start < stop:
            seg_end = self._cumulative[s + 1]
            take = min(stop, seg_end) - start
            offset = self.found.offsets[s] + (start - self._cumulative[s]) * self.width
            parts.append(self._read(offset, take * self.width))
            start += take
            s += 1
        return b"".join(parts)

    def layer0(self) -> Iterator[bytes]:
        yield self.header()
        segment, left = 0, 0
        for c in range(self.chunks):
            codes, side, shown = self.coding.encode(self._values(c))
            if self.coding.planes > 1:
                planes = sum(len(_ESTIMATE.encode(p)) for p in self.coding.planes_of(codes))
                self.whole[c] = len(_ESTIMATE.encode(self.coding.interleaved(codes))) < planes
            view = memoryview(shown)
            while view:  # the checksum runs in file order: the bytes before a segment, then its values
                if not left:
                    self._digest_gap(segment)
                    left = self.found.counts[segment] * self.width
                take = min(left, len(view))
                self.digest.update(view[:take])
                view, left = view[take:], left - take
                segment += not left
            yield side
        self._digest_gap(len(self.gaps) - 1)
        yield from self._other_chunks()

    def _digest_gap(self, g: int) -> None:
        offset, length = self.gaps[g]
        for pos in range(offset, offset + length, self.chunk):
            self.digest.update(self._read(pos, min(self.chunk, offset + length - pos)))

    def _other_chunks(self) -> Iterator[bytes]:
        buffer = bytearray()
        for offset, length in self.gaps:
            for pos in range(offset, offset + length, self.chunk):
                buffer += self._read(pos, min(self.chunk, offset + length - pos))
                while len(buffer) >= self.chunk:
                    yield bytes(buffer[:self.chunk])
                    del buffer[:self.chunk]
        if buffer:
            yield bytes(buffer)

    def plane(self, j: int) -> Iterator[bytes]:
        for c in range(self.chunks):
            codes = self.coding.encode(self._values(c))[0]
            if self.whole[c]:
                yield self.coding.interleaved(codes) if j == 1 else b""
            else:
                yield self.coding.planes_of(codes)[j - 1]
