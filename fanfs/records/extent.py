"""Extents: a large file whose bytes are stored raw, as one contiguous, page-aligned run of its shard.

Byte X of the file is byte ``base + X`` of the shard (``base``: its first blob's offset, a multiple of
:data:`ALIGN`), so a read of it can be answered by the kernel from the shard's own pages (the FUSE front
splices them: :mod:`fanfs.serve.splice`) instead of being copied through the daemon.  Its blobs are still
1 MiB chunks, each with its checksum: the unit in which a reader verifies bytes before it first serves them.

Pack stores a file this way where compressing it does not pay (:meth:`Extents.adopts`: the plan's codec is raw, the
codec saves less than 1/16 of a sample of it, or decoding it would slow the reads the training needs: FanStore's
constraint, the codec must decode fast enough to add at most 5% to reading at ``--large-rate`` with the mount's
serving processes); a file with holes, or smaller than :data:`EXTENT_MIN`, stays a plain (chunked) file.  The index validator refuses an extent that is not
back to back, not aligned, or overlaps any other blob of its shard (:func:`overlaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codecs import Codec, decode_speed, pays, required_decode
from ..util.server import default_workers
from ..util.source_file import SourceFile
from ..util.units import human_rate, parse_rate
from .base import AddOption, Columns, Packed, RecordKind, blob_shards, expand, register
from .plain import CHUNK_SIZE, PlainFiles

ALIGN = 4096
"""Where an extent begins in its shard: a page boundary, so its pages are the shard's pages."""
EXTENT_MIN = 256 << 10
"""Smaller files stay plain: one read covers them whole, and a reply that small is copied by libfuse anyway."""
FORMAT = 5
LARGE_RATE = 1e9
"""The bytes/s a training reads large files at, by default (``pack --large-rate``): a node's SSD to one reader."""
HOLES = "it has holes, stored as nothing"
"""Why a file with holes stays chunked (any other reason: its codec compresses it)."""


@register
class Extents(PlainFiles):
    """Read like plain files (the same chunks, never decoded); laid out so that the kernel can serve them."""

    kind_id = 3
    name = "extent"
    label = "extents"
    since_format = FORMAT
    fallback = "large files kept chunked"
    in_place = True

    def __init__(self, mode: str = "auto", rate: float = LARGE_RATE, threads: int = 1) -> None:
        """``mode``: "auto" (by the constraint below), "always" (every large file without holes); ``rate``: the bytes/s
        the training reads large files at; ``threads``: the mount's serving processes, decoding at once."""
        self.mode, self.rate = mode, rate
        self.required = required_decode(rate, threads)  # a chunk's codec must decode this fast to stay compressed

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        add("--extents", choices=("auto", "always", "never"), default="auto",
            help="large files (256 KiB and more, no holes) stored raw as extents, spliced by the kernel: 'auto' (the "
                 "default) where compressing them does not pay or decoding would slow their reads (see "
                 "--large-rate), 'always', or 'never' (every file chunked and compressed)")
        add("--no-extents", dest="extents", action="store_const", const="never", help="the same as --extents never")
        add("--large-rate", type=parse_rate, default=LARGE_RATE, metavar="RATE",
            help=f"the rate the training reads large files at (default {LARGE_RATE / 1e9:g}GB/s): with --extents auto "
                 "a large file stays compressed only if its codec decodes it fast enough to add at most 5%% to reading "
                 "it at that rate with the mount's serving processes (FanStore's constraint, as 'fanfs select --mode "
                 "sync'); else it is stored raw as an extent")

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        mode = options.get("extents") or "auto"
        return None if mode == "never" else cls(mode, options.get("large_rate") or LARGE_RATE, default_workers())

    def adopts(self, source: SourceFile, codec: Codec, raw: bool, planned: bool) -> str | None:
        """None if the file is to be stored as an extent; else why it stays chunked ("" for a file too small to
        say why).  ``codec``: the file's codec (``raw``: it stores bytes as they are; ``planned``: a selection plan
        chose it, weighing its decode speed against the training's demand already: it is kept if it saves)."""
        size = source.size
        if size < EXTENT_MIN:
            return ""
        if any(source.data_from(pos) >= min(size, pos + CHUNK_SIZE) for pos in range(0, size, CHUNK_SIZE)):
            return HOLES
        if raw or self.mode == "always":
            return None
        sample = b"".join(source.pread(CHUNK_SIZE, pos) for pos in sorted({0, size // 2 // CHUNK_SIZE * CHUNK_SIZE}))
        packed = pays(codec, sample)
        if packed is None:
            return None  # saves too little to decode at every read
        saves = 1 - len(packed) / len(sample)
        if planned:
            return f"the plan's {codec.spec} saves {saves:.0%} of a sample"
        speed = decode_speed(codec, packed, len(sample))
        if speed < self.required:
            return None  # decoding would slow the reads the training needs more than the bytes it saves are worth
        return (f"{codec.spec} saves {saves:.0%} of a sample and decodes it at "
                f"{human_rate(speed)}, fast enough for {human_rate(self.rate)} (--large-rate)")

    def kept_as(self, reason: str) -> str:
        """A file that compresses stays chunked and is kept compressed; one with holes is kept chunked."""
        return "kept chunked" if reason == HOLES else "kept compressed"

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
    blob_shard = np.zeros(index.blob_offset.size, np.int64)
    owned, shards = blob_shards(index)
    blob_shard[owned] = shards
    blob_shard = blob_shard[present]
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

