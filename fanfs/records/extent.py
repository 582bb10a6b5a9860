"""Extents: a large file whose bytes are stored raw, as one contiguous, page-aligned run of its shard.

Byte X of the file is byte ``base + X`` of the shard (``base``: its first blob's offset, a multiple of
:data:`ALIGN`), so a read of it can be answered by the kernel from the shard's own pages (the FUSE front
splices them: :mod:`fanfs.serve.splice`) instead of being copied through the daemon.  Its blobs are still
1 MiB chunks, each with its checksum: the unit in which a reader verifies bytes before it first serves them.

Pack stores a file this way where compressing it does not pay (:meth:`Extents.adopts`: the
plan's codec is raw, or the codec saves less than 1/16 of a sample of it); a file with holes, or smaller
than :data:`EXTENT_MIN`, stays a plain (chunked) file.  The index validator refuses an extent that is not
back to back, not aligned, or overlaps any other blob of its shard (:func:`overlaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codecs import Codec, pays
from ..util.source_file import SourceFile
from .base import AddOption, Columns, Packed, RecordKind, expand, register
from .plain import CHUNK_SIZE, PlainFiles

ALIGN = 4096
"""Where an extent begins in its shard: a page boundary, so its pages are the shard's pages."""
EXTENT_MIN = 256 << 10
"""Smaller files stay plain: one read covers them whole, and a reply that small is copied by libfuse anyway."""
FORMAT = 5


@register
class Extents(PlainFiles):
    """Read like plain files (the same chunks, never decoded); laid out so that the kernel can serve them."""

    kind_id = 3
    name = "extent"
    label = "extents"
    since_format = FORMAT
    fallback = "large files kept chunked"
    in_place = True

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        add("--no-extents", action="store_true",
            help="keep every file chunked, even large ones that do not compress (no spliced reads)")

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        return None if options.get("no_extents") else cls()

    def adopts(self, source: SourceFile, codec: Codec, raw: bool) -> str | None:
        """None if the file is to be stored as an extent; else why it stays chunked ("" for a file too small to
        say why).  ``codec``: the file's codec by the plan (``raw``: it stores bytes as they are)."""
        size = source.size
        if size < EXTENT_MIN:
            return ""
        if any(source.data_from(pos) >= min(size, pos + CHUNK_SIZE) for pos in range(0, size, CHUNK_SIZE)):
            return "it has holes, stored as nothing"
        if raw:
            return None
        sample = b"".join(source.pread(CHUNK_SIZE, pos) for pos in sorted({0, size // 2 // CHUNK_SIZE * CHUNK_SIZE}))
        packed = pays(codec, sample)
        return None if packed is None else f"{codec.spec} saves {1 - len(packed) / len(sample):.0%} of a sample"

    def pack(self, source: SourceFile, head: bytes) -> Packed:
        """The plain chunks, stored as they are and page-aligned (the caller checked :meth:`adopts`)."""
        return self.adopt(super().pack(source, head))

    def adopt(self, packed: Packed) -> Packed:
        """A plain file's chunks (no holes) as an extent's: stored as they are, from a page boundary."""
        packed.compress, packed.align = False, ALIGN
        return packed

    def check(self, index: Columns, entries: np.ndarray) -> str | None:
        problem = super().check(index, entries)
        if problem:
            return problem
        blobs, owner = expand(index.first[entries], index.count[entries])
        position = blobs - np.repeat(index.first[entries].astype(np.int64), index.count[entries].astype(np.int64))
        offset = index.blob_offset[blobs].astype(np.int64)
        base = offset[position == 0]
        if (index.size[entries] < EXTENT_MIN).any():
            return "an extent smaller than an extent can be"
        if (index.blob_stored[blobs] != index.blob_raw[blobs]).any():
            return "an extent whose bytes are not stored raw"
        if (base % ALIGN).any():
            return "an extent that does not begin on a page boundary of its shard"
        if (offset != base[owner] + position * int(index.meta["chunk_size"])).any():
            return "an extent whose chunks are not back to back"
        if overlaps(index, entries):
            return "an extent that overlaps another blob of its shard"
        return None


def overlaps(index: Columns, entries: np.ndarray) -> bool:
    """Whether the byte range of any of ``entries`` (extents) holds a byte of a blob that is not its own.

    Every stored blob is placed by its start in (shard, offset) order; an extent's own blobs are back to back, so
    another blob overlaps it exactly when one starts inside it or one that starts before it runs into it: the
    largest end among the blobs before it in its shard (not only the one just before: a long blob two places
    before may run past a short one into it)."""
    present = np.flatnonzero(index.blob_stored > 0)
    blob_shard = _blob_shards(index)[present]
    order = np.lexsort((index.blob_offset[present], blob_shard))
    starts = index.blob_offset[present][order].astype(np.int64)
    ends = starts + index.blob_stored[present][order].astype(np.int64)
    shards = blob_shard[order]
    first = index.first[entries].astype(np.int64)
    count = index.count[entries].astype(np.int64)
    rank = np.empty(present.size, np.int64)
    rank[order] = np.arange(present.size)
    where = np.searchsorted(present, first)  # every extent blob is stored: its position among the present ones
    at = rank[where]
    # the extent's blobs must be the next ``count`` in order, and nothing else may start before it ends
    last = at + count - 1
    if (last >= present.size).any() or (shards[np.minimum(last, present.size - 1)] != shards[at]).any():
        return True
    if (present[order][np.minimum(last, present.size - 1)] != first + count - 1).any():
        return True
    extent_end = starts[at] + index.size[entries].astype(np.int64)
    after = last + 1
    nxt = np.minimum(after, present.size - 1)
    if ((after < present.size) & (shards[nxt] == shards[at]) & (starts[nxt] < extent_end)).any():
        return True
    before = np.maximum(at - 1, 0)
    furthest = _furthest(ends, shards, index.shard_size)[before]
    return bool(((at > 0) & (shards[before] == shards[at]) & (furthest > starts[at])).any())


def _furthest(ends: np.ndarray, shards: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """For blobs in (shard, offset) order, the largest end of each blob and those before it in its shard: one running
    maximum, each shard's ends lifted above every end of the shards before it by their sizes (an end lies within its
    shard; the sizes add up to at most 2**62: validated)."""
    lift = np.concatenate([[0], np.cumsum(sizes.astype(np.int64) + 1)[:-1]])[shards]
    return np.maximum.accumulate(ends + lift) - lift


def _blob_shards(index: Columns) -> np.ndarray:
    """The shard of every blob (a blob belongs to the file whose range holds it: its shard's)."""
    files = np.flatnonzero((index.count > 0) & (index.type == 1))
    shard = np.zeros(index.blob_offset.size, np.int64)
    blobs, owner = expand(index.first[files], index.count[files])
    shard[blobs] = index.shard[files][owner]
    return shard
