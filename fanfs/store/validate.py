"""Validate a whole index once, at open: every number a reader will trust is checked here.

A checksum only proves an index is the one that was written; a crafted one can carry a valid checksum.
So before anything is served: the header's keys and types; the tree (root, parents before children,
each directory's children one contiguous range, modes matching types); every path (no NUL, a child's
path is its parent's plus ``/`` and one name of 1-255 bytes that is not ``.`` or ``..``); the lookup
tables; every file's blob range, codec, shard and record kind (each kind checks its own layers); every
blob's bytes inside its shard; symlink targets.  A store that fails is refused with one line naming
the first fault.  All checks are numpy passes over the columns (no Python loop per entry).
"""

from __future__ import annotations

import re
import stat
from typing import Any

import numpy as np

from ..errors import StoreError
from ..records import expand, kinds
from .format import DIR, FILE, FORMATS, SHARD_HEADER, SHARED_BLOBS_FORMAT, SYMLINK
from .schema import TOTALS

_MAX_INT = 1 << 62


def _ints(column: np.ndarray, what: str, limit: int = _MAX_INT) -> np.ndarray:
    """``column`` as int64, refused if any value exceeds ``limit`` (a uint64 above 2**63 would wrap negative)."""
    if column.size and int(column.max()) > limit:
        raise _fail(what)
    return column.astype(np.int64)


def _fail(what: str) -> StoreError:
    return StoreError(f"index: {what}: the store is corrupt or was crafted; repack it from its source")


def validate(index: Any) -> None:
    """Raise StoreError (one line) unless every part of ``index`` is consistent.

    ``index`` is a :class:`fanfs.store.index.Index` whose schema (columns, types, lengths) was checked.
    """
    _check_meta(index.meta, index)
    _check_paths(index)
    _check_tree(index)
    _check_files(index)
    _check_symlinks(index)


def _is_int(value: Any, low: int = 0, high: int = _MAX_INT) -> bool:
    return type(value) is int and low <= value <= high


def _check_meta(meta: dict[str, Any], index: Any) -> None:
    if meta.get("format") not in FORMATS or type(meta.get("format")) is not int:
        raise _fail(f"format {meta.get('format')!r} in the header, not one of {', '.join(map(str, FORMATS))}")
    store_id = meta.get("store_id")
    if not (isinstance(store_id, str) and re.fullmatch(r"[0-9a-f]{32}", store_id)):
        raise _fail("no valid store id")
    chunk = meta.get("chunk_size")
    if not (_is_int(chunk, 4096, 1 << 26) and chunk & (chunk - 1) == 0):
        raise _fail(f"chunk size {chunk!r} is not a power of two between 4 KiB and 64 MiB")
    codecs = meta.get("codecs")
    if not (isinstance(codecs, list) and codecs and all(isinstance(c, dict) for c in codecs) and len(codecs) <= 256):
        raise _fail("no codec table")
    totals = meta.get("totals")
    if not (isinstance(totals, dict) and all(_is_int(totals.get(k)) for k in TOTALS)):
        raise _fail("totals missing or not counts")
    if totals["entries"] != index.entries or totals["shards"] != index.shard_size.size:
        raise _fail("totals do not match the columns")
    stats = meta.get("codec_stats", {})
    if not (isinstance(stats, dict) and all(isinstance(v, dict) and all(_is_int(v.get(k)) for k in ("files", "raw", "stored"))
                                            and _is_int(int(k) if k.isdigit() else -1, 0, len(codecs) - 1)
                                            for k, v in stats.items())):
        raise _fail("codec statistics malformed")
    for key in ("created", "source", "fanfs"):
        if not isinstance(meta.get(key, ""), str):
            raise _fail(f"{key!r} is not text")
    for key in ("plan", "records"):
        if not isinstance(meta.get(key) or {}, dict):
            raise _fail(f"{key!r} is malformed")
    sources = meta.get("sources", [])
    if not (isinstance(sources, list) and all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                              and isinstance(s.get("kind"), str) for s in sources)
            and isinstance(meta.get("expand_archives", False), bool)):
        raise _fail("'sources' is malformed")


SLAB = 1 << 16
"""Entries whose paths are checked at once: temporaries of a few MiB that the allocator reuses, where whole-index
arrays cost ~230 MiB of fresh pages at 1.28 M files (half a second of page faults on a first mount)."""


def _check_paths(index: Any) -> None:
    paths, n = index.paths, index.entries
    offsets = _ints(index.path_offset, "path offsets out of range", paths.size)
    if offsets[0] != 0 or offsets[-1] != paths.size:
        raise _fail("path offsets out of order")
    for low in range(0, paths.size, SLAB * 64):
        if not paths[low:low + SLAB * 64].all():
            raise _fail("a path holds a NUL byte")
    if offsets[1] != 0:
        raise _fail("the root has a name")
    slashes = np.zeros(n, np.int64)  # '/' in each path; a parent's count is known before its children's
    words = _Words(paths)
    for low in range(1, n, SLAB):
        _check_path_slab(index, offsets, slashes, words, low, min(n, low + SLAB))
    hashes, order = index.hash_sorted, index.hash_entry
    if (hashes[1:] < hashes[:-1]).any():
        raise _fail("the path hash table is not sorted")
    if (order >= n).any() or (np.bincount(order, minlength=n) != 1).any():
        raise _fail("the path hash table does not name every entry once")


def _check_path_slab(index: Any, offsets: np.ndarray, slashes: np.ndarray, words: "_Words", low: int, high: int) -> None:
    """Entries ``low..high-1``: each path is its parent's, a '/' (not under the root) and one name."""
    paths = index.paths
    bounds = offsets[low:high + 1]
    if (bounds[1:] < bounds[:-1]).any():
        raise _fail("path offsets out of order")
    lengths = np.diff(bounds)
    child = np.arange(low, high)
    par = index.parent[low:high].astype(np.int64)
    if (par >= child).any():  # checked again, with its reason, by _check_tree; needed here for indexing
        raise _fail("an entry comes before its parent")
    parent_length = offsets[par + 1] - offsets[par]
    base = np.where(par == 0, 0, parent_length + 1)  # bytes of "parent/" (nothing under the root)
    name = lengths - base
    if ((name < 1) | (name > 255)).any():
        raise _fail("a name is empty or longer than 255 bytes")
    # slashes per path, from the positions of its slashes (a few per path): no pass that widens every byte
    here = paths[bounds[0]:bounds[-1]]
    slashes[low:high] = np.diff(np.searchsorted(np.flatnonzero(here == ord("/")), bounds - bounds[0]))
    if (slashes[low:high] != np.where(par == 0, 0, slashes[par] + 1)).any():
        raise _fail("a name holds a '/'")
    start = bounds[:-1]
    inner = par != 0
    if (paths[(start + base - 1)[inner]] != ord("/")).any():
        raise _fail("a path does not continue its parent's with '/'")
    name_at = start + base
    short = np.flatnonzero(name <= 2)
    dots = (paths[name_at[short]] == ord(".")) & ((name[short] == 1) | (paths[np.minimum(name_at[short] + 1, paths.size - 1)] == ord(".")))
    if dots.any():
        raise _fail("a name is '.' or '..'")
    words.check_prefixes(start[inner], offsets[par[inner]], parent_length[inner])


class _Words:
    """The little-endian uint64 made of bytes i..i+7 of ``paths``, for any i, without a padded copy.

    A strided view (one-byte stride) over the column covers every i up to ``size - 8``; a word asked for
    later than that is the last whole word shifted right, its missing high bytes zero.  A prefix of L bytes
    is then ceil(L / 8) word comparisons, the last one masked to the bytes it covers (always inside the column).
    """

    def __init__(self, paths: np.ndarray) -> None:
        if paths.size < 8:
            paths = np.concatenate([paths, np.zeros(8 - paths.size, np.uint8)])
        self.last = paths.size - 8
        self.words = np.ndarray((self.last + 1,), dtype="<u8", buffer=paths, strides=(1,))

    def at(self, positions: np.ndarray) -> np.ndarray:
        clamped = np.minimum(positions, self.last)
        return self.words[clamped] >> ((positions - clamped).astype(np.uint64) * np.uint64(8))

    def check_prefixes(self, child_start: np.ndarray, parent_start: np.ndarray, length: np.ndarray) -> None:
        """Each child path starts with its parent's path (``length`` bytes at ``parent_start``)."""
        step = 0
        while (length > step).any():
            active = np.flatnonzero(length > step)
            rest = np.minimum(length[active] - step, 8).astype(np.uint64)
            mask = np.where(rest == 8, np.uint64(2**64 - 1), (np.uint64(1) << (rest * np.uint64(8))) - np.uint64(1))
            if ((self.at(child_start[active] + step) ^ self.at(parent_start[active] + step)) & mask).any():
                raise _fail("a path does not start with its parent's path")
            step += 8


def _check_tree(index: Any) -> None:
    n = index.entries
    kind, mode = index.type, index.mode
    if (kind > SYMLINK).any():
        raise _fail("an entry of unknown type")
    fmt = mode & stat.S_IFMT(0o170000)
    expected = np.array([stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK], np.uint32)[np.minimum(kind, SYMLINK)]
    if (fmt != expected).any():
        raise _fail("an entry's mode does not match its type")
    if kind[0] != DIR or index.parent[0] != 0:
        raise _fail("the root is not a directory")
    parent = index.parent.astype(np.int64)
    if n > 1 and ((parent[1:] >= np.arange(1, n)) | (kind[parent[1:]] != DIR)).any():
        raise _fail("an entry's parent is not a directory listed before it")
    dirs = np.flatnonzero((kind == DIR) & (index.count > 0))
    first = _ints(index.first[dirs], "a directory's children lie outside the entries", n)
    count = index.count[dirs].astype(np.int64)
    order = np.argsort(first, kind="stable")
    first, count = first[order], count[order]
    if n > 1 and (first.size == 0 or first[0] != 1 or (first[1:] != first[:-1] + count[:-1]).any()
                  or first[-1] + count[-1] != n):
        raise _fail("directories' children are not contiguous ranges covering every entry once")
    if n > 1:
        p = parent[1:]
        lo, cnt = index.first[p].astype(np.int64), index.count[p].astype(np.int64)  # p are directories: checked
        e = np.arange(1, n)
        if ((e < lo) | (e >= lo + cnt)).any():
            raise _fail("an entry lies outside its parent's children")


def _check_files(index: Any) -> None:
    files = np.flatnonzero(index.type == FILE)
    others = np.flatnonzero(index.type != FILE)
    if (index.record[others] != 0).any():
        raise _fail("a directory or symlink with a record kind")
    known = kinds()
    record = index.record[files]
    unknown = np.setdiff1d(np.flatnonzero(np.bincount(record, minlength=1)), np.array(sorted(known)))
    if unknown.size:
        raise _fail(f"record kind {int(unknown[0])}, unknown to this fanfs (a newer one wrote it)")
    if (index.codec[files] >= len(index.meta["codecs"])).any():
        raise _fail("a file names a codec the store lacks")
    blobs = index.blob_offset.size
    first = _ints(index.first[files], "a file's blobs lie outside the blob table", blobs)
    count = index.count[files].astype(np.int64)
    _ints(index.size[files], "a file is larger than any file can be")
    if ((first + count > blobs) | (first > blobs)).any():
        raise _fail("a file's blobs lie outside the blob table")
    held = count > 0
    if (index.shard[files][held] >= index.shard_size.size).any():
        raise _fail("a file names a shard the store lacks")
    f, c, shard_of_file = first[held], count[held], index.shard[files][held]
    if f.size and (f[1:] < f[:-1]).any():  # pack writes files' blobs in entry order: sorted already
        order = np.argsort(f, kind="stable")
        f, c, shard_of_file, held = f[order], c[order], shard_of_file[order], files[held][order]
    else:
        held = files[held]
    if (f[1:] < f[:-1] + c[:-1]).any():
        f, c, shard_of_file = _shared_ranges(index, f, c, shard_of_file, held)
    sizes = _ints(index.shard_size, "a shard size is impossible")
    if (sizes < SHARD_HEADER.size).any() or sum(sizes.tolist()) > _MAX_INT:  # a store of more than 4 EiB
        raise _fail("a shard size is impossible")
    for low in range(0, f.size, SLAB):
        _check_blob_slab(index, f[low:low + SLAB], c[low:low + SLAB], shard_of_file[low:low + SLAB], sizes)
    for kind_id, kind in known.items():
        mine = files[record == kind_id]
        if mine.size and kind.since_format > index.meta["format"]:
            raise _fail(f"{kind.label} in a store of format {index.meta['format']}, which cannot hold them")
        if mine.size:
            problem = kind.check(index, mine)
            if problem:
                raise _fail(problem)


def _shared_ranges(index: Any, f: np.ndarray, c: np.ndarray, shard: np.ndarray,
                   entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Files whose blob ranges overlap (sorted by first blob): only hard links of format 4 and later may, and only
    as whole copies of each other's range and file columns; the ranges once each."""
    again = (f[1:] == f[:-1]) & (c[1:] == c[:-1])
    if ((f[1:] < f[:-1] + c[:-1]) & ~again).any() or index.meta["format"] < SHARED_BLOBS_FORMAT:
        raise _fail("two files share blobs")
    a, b = entries[:-1][again], entries[1:][again]
    for column in (index.record, index.layers, index.codec, index.size, index.checksum, index.shard):
        if (column[a] != column[b]).any():
            raise _fail("two files share blobs but differ")
    keep = np.concatenate([[True], ~again])
    return f[keep], c[keep], shard[keep]


def _check_blob_slab(index: Any, first: np.ndarray, count: np.ndarray, shard: np.ndarray, sizes: np.ndarray) -> None:
    """The blobs of some files (sorted by first blob; shard: each file's) lie inside their shards."""
    if first.size and (first[1:] == first[:-1] + count[:-1]).all():  # blobs back to back, as pack writes them
        owned = np.arange(first[0], first[-1] + count[-1])
        owner_shard = np.repeat(shard.astype(np.int64), count)
    else:
        owned, owner = expand(first, count)
        owner_shard = shard.astype(np.int64)[owner]
    offset, stored, raw = index.blob_offset[owned], index.blob_stored[owned], index.blob_raw[owned]
    if (stored > raw).any():
        raise _fail("a blob is stored larger than it decodes")
    present = stored > 0
    offset = offset[present].astype(np.uint64)
    end = offset + stored[present].astype(np.uint64)  # uint64: an offset near 2**64 cannot wrap negative
    if ((offset < SHARD_HEADER.size) | (offset > _MAX_INT) | (end > sizes[owner_shard[present]].astype(np.uint64))).any():
        raise _fail("a blob lies outside its shard")


def _check_symlinks(index: Any) -> None:
    links = np.flatnonzero(index.type == SYMLINK)
    first = _ints(index.first[links], "a symlink target lies outside the target table", index.targets.size)
    count = index.count[links].astype(np.int64)
    if ((count < 1) | (count > 4095) | (first + count > index.targets.size)).any():
        raise _fail("a symlink target lies outside the target table")
    if (index.size[links] != count.astype(np.uint64)).any():
        raise _fail("a symlink's size is not its target's length")
    if (index.targets == 0).any():
        raise _fail("a symlink target holds a NUL byte")
