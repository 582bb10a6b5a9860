"""Extents: a large file whose bytes are stored raw, as one contiguous, page-aligned run of its shard.

Byte X of the file is byte ``base + X`` of the shard (``base``: its first blob's offset, a multiple of
:data:`ALIGN`), so a read of it can be answered by the kernel from the shard's own pages (the FUSE front
splices them: :mod:`fanfs.serve.splice`) instead of being copied through the daemon.  Its blobs are still
1 MiB chunks, each with its checksum: the unit in which a reader verifies bytes before it first serves them.

Pack stores a file this way where compressing it does not pay (:meth:`Extents.adopts`): the plan's codec is raw, the
codec saves less than 1/16 of a sample of it, or serving it compressed would be slower than serving it raw.  That is
FanStore's constraint counted in the time to serve the file (:func:`fanfs.codecs.required_decode`): reading its
compressed bytes and decoding them may take at most 5% longer than reading it raw at ``--large-rate``, with
``--large-workers`` serving processes decoding at once, each at the codec's
:attr:`~fanfs.codecs.Codec.decode_rate`.  Every figure is given or fanfs's own, never measured on the packing host,
so a tree packs the same on any host and by any ranks.  A file with holes, or smaller than :data:`EXTENT_MIN`, stays
a plain (chunked) file.  The index validator refuses an extent that is not back to back, not aligned, or overlaps any
other blob of its shard (:func:`overlaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codecs import Codec, Lz4, Zstd, pays, required_decode
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
"""The bytes/s a large file's copy is read at raw, by default (``pack --large-rate``): a node's SSD to one reader."""
OVERHEAD = 0.05
"""How much longer than reading it raw a large file may take to serve compressed (read, then decoded)."""
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
    adopted_as = "stored raw"
    in_place = True

    def __init__(self, mode: str = "auto", rate: float = LARGE_RATE, workers: int = 1) -> None:
        """``mode``: "auto" (by the constraint above), "always" (every large file without holes); ``rate``: the bytes/s
        a large file is read at raw; ``workers``: the mounts' serving processes, decoding at once."""
        self.mode, self.rate, self.workers = mode, rate, workers

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        add("--extents", choices=("auto", "always", "never"), default="auto",
            help="large files (256 KiB and more, no holes) stored raw as extents, spliced by the kernel: 'auto' (the "
                 "default) where compressing them does not pay or serving them compressed would be slower (see "
                 "--large-rate), 'always', or 'never' (every file chunked and compressed)")
        add("--no-extents", dest="extents", action="store_const", const="never", help="the same as --extents never")
        add("--large-rate", type=parse_rate, default=LARGE_RATE, metavar="RATE",
            help=f"the rate a large file is read at from the node's disk (default {LARGE_RATE / 1e9:g}GB/s): with "
                 f"--extents auto a large file stays compressed only if reading its compressed bytes and decoding "
                 f"them takes at most {OVERHEAD:.0%}% longer than reading it raw at that rate (FanStore's constraint); "
                 "else it is stored raw as an extent")
        add("--large-workers", type=_count, default=1, metavar="N",
            help="the serving processes that decode large files at once on the mounts that will read the store "
                 "(their --workers; default 1, which every mount has): with --extents auto each is counted on to "
                 f"decode at its codec's figure (zstd {Zstd.decode_rate / 1e9:g}GB/s, lz4 {Lz4.decode_rate / 1e9:g}"
                 "GB/s), so what is stored raw depends on these figures and the files' bytes, never on the host "
                 "that packs")

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        mode = options.get("extents") or "auto"
        if mode == "never":
            return None
        return cls(mode, options.get("large_rate") or LARGE_RATE, options.get("large_workers") or 1)

    def pack_config(self) -> dict[str, Any] | None:
        """What the choice of extents was made for, recorded in the index (``fanfs info`` says it)."""
        return {"mode": self.mode, "large_rate": self.rate, "large_workers": self.workers}

    def adopts(self, source: SourceFile, codec: Codec, raw: bool, planned: bool) -> tuple[bool, str]:
        """Whether the file is to be stored as an extent, and why (:class:`RecordKind`'s): ``codec``, the file's codec
        (``raw``: it stores bytes as they are; ``planned``: a selection plan chose it, weighing its decode speed
        against the training's demand already: it is kept if it saves)."""
        size = source.size
        if size < EXTENT_MIN:
            return False, ""
        if any(source.data_from(pos) >= min(size, pos + CHUNK_SIZE) for pos in range(0, size, CHUNK_SIZE)):
            return False, HOLES
        if raw or self.mode == "always":
            return True, ""
        sample = b"".join(source.pread(CHUNK_SIZE, pos) for pos in sorted({0, size // 2 // CHUNK_SIZE * CHUNK_SIZE}))
        packed = pays(codec, sample)
        if packed is None:
            return True, ""  # saves too little to decode at every read
        stored = len(packed) / len(sample)
        saves = f"{codec.spec} saves {1 - stored:.0%} of a sample"
        if planned:
            return False, f"the plan's {saves}"
        required = required_decode(self.rate, self.workers, overhead=OVERHEAD, stored=stored)
        raw_read = (f"within {OVERHEAD:.0%} of its time read raw at {human_rate(self.rate)} by "
                    f"{_processes(self.workers)} (--large-rate, --large-workers)")
        if codec.decode_rate < required:
            return True, (f"{saves}; to be served {raw_read} it would have to decode at {human_rate(required)} a "
                          f"process ({codec.codec_id}: {human_rate(codec.decode_rate)})")
        return False, (f"{saves}: read so and decoded at {human_rate(codec.decode_rate)} a process "
                       f"({human_rate(required)} needed) it is served {raw_read}")

    def kept_as(self, reason: str) -> str:
        """A file that compresses stays chunked and is kept compressed; one with holes is kept chunked."""
        return "kept chunked" if reason == HOLES else "kept compressed"

    def adopt(self, packed: Packed) -> Packed:
        """A plain file's chunks (no holes) as an extent's: stored as they are, from a page boundary."""
        packed.compress, packed.align = False, ALIGN
        return packed

    def describe(self, index: Columns, entries: np.ndarray) -> dict[str, Any]:
        """What ``--extents auto`` chose the extents for, as the index records it (a store packed before did not)."""
        recorded = (index.meta.get("records") or {}).get(self.name)
        if not isinstance(recorded, dict) or recorded.get("mode") != "auto":
            return {}
        rate, workers = recorded.get("large_rate"), recorded.get("large_workers")
        if not (isinstance(rate, (int, float)) and rate > 0 and isinstance(workers, int) and workers > 0):
            return {}
        return {"chosen_for": {"large_rate": rate, "large_workers": workers}}

    def summary(self, described: Mapping[str, Any]) -> str:
        chosen = described.get("chosen_for")
        if not chosen:
            return ""
        return f" (chosen for reads at {human_rate(chosen['large_rate'])} by {_processes(chosen['large_workers'])})"

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


def _processes(count: int) -> str:
    return f"{count} serving process{'es' * (count != 1)}"


def _count(text: str) -> int:
    """``--large-workers``: a whole number above 0."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"expected a whole number above 0, got {text!r}")
    return int(text)
