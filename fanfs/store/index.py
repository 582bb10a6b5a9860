"""The global index: every path, its attributes and where its bytes are, as numpy columns.

Entries are in breadth-first order with each directory's children contiguous and sorted, so a
listing is one slice.  Paths are stored whole (relative, no leading slash; the root is ``b""``) in
one byte blob; a sorted array of their xxh3 hashes turns a FUSE path into an entry with one binary
search and one byte comparison, without a Python dict of millions of keys.

Per entry, ``first``/``count`` mean: the blob range (file), the child range (directory), the target
byte range in ``targets`` (symlink).  A file's blobs are ordered layer by layer; ``layers`` says how
many layers there are (one for plain files, one per scan group for progressive JPEG records).  The
columns and their types are in :mod:`.schema`.
"""

from __future__ import annotations

import mmap
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .format import checksum, read_index, write_index
from .schema import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, check_schema
from .trust import record_validated, was_validated
from .validate import validate


class ColumnItems:
    """The entry and blob columns as memoryviews, for code that reads one value at a time (every read): an item is
    a Python int (~60 ns), where a numpy array's is a numpy scalar (~250 ns with its ``int()``)."""

    def __init__(self, columns: Mapping[str, np.ndarray]) -> None:
        for name in (*ENTRY_COLUMNS, *BLOB_COLUMNS):
            setattr(self, name, memoryview(columns[name]))


class Index:
    """Read-only view of an index file; attribute columns are public numpy arrays."""

    def __init__(self, path: str, data: bytes | bytearray | mmap.mmap | None = None, *, validated: bool = False,
                 file_id: str | None = None, checked: bool = False) -> None:
        """``data``: the file's bytes already in memory (broadcast to a job's nodes) instead of reading ``path``.

        The whole index is validated here (:mod:`fanfs.store.validate`): an Index that exists is safe to
        serve from, and a crafted one is refused with one line naming what is wrong.  Not again for a
        file this user validated on this node and that has not changed since (:mod:`.trust`), nor for
        ``data`` the caller says is ``validated`` (bytes its own process or its job's rank 0 validated).
        ``file_id``: for ``data`` read whole from the index file, that file's identity (:mod:`.trust`).  ``checked``:
        ``data`` whose checksum was verified and that nobody can have changed since (:func:`.format.read_index`).
        """
        self.meta, columns, self.nbytes, digest, read_from, memory = read_index(path, data, checked)
        self.digest = digest  # the index file's checksum, which measurements saved with the store are bound to
        file_id = file_id or read_from
        self.data = data  # the bytes it was given (a job's rank hands them to its daemon), else None
        self.memory = memory  # the bytes the columns are views of (sealed memory when read from the file)
        check_schema(columns)
        for name, column in columns.items():
            setattr(self, name, column)
        self.entries = int(self.parent.size)
        # Lookups go through memoryviews: bisect on one costs ~1 us, while numpy's searchsorted with a
        # Python int above 2**63 converts the whole column (~0.5 ms at 1.28 M entries).
        self._paths = memoryview(columns["paths"])
        self._path_offset = memoryview(columns["path_offset"]).cast("B").cast("Q")
        self._hash_sorted = memoryview(columns["hash_sorted"]).cast("B").cast("Q")
        self._hash_entry = memoryview(columns["hash_entry"]).cast("B").cast("I")
        self.items = ColumnItems(columns)
        self.dictionaries = {name[5:]: column.tobytes() for name, column in columns.items()
                             if name.startswith("dict:")}
        if not validated and not (file_id and was_validated(file_id, digest)):
            validate(self)
            if file_id:
                record_validated(file_id, digest)

    def path(self, entry: int) -> bytes:
        offsets = self._path_offset
        return self._paths[offsets[entry]:offsets[entry + 1]].tobytes()

    def lookup(self, path: bytes) -> int:
        """Entry number of a relative path, or -1."""
        digest = checksum(path)
        hashes = self._hash_sorted
        i = bisect_left(hashes, digest)
        paths, offsets = self._paths, self._path_offset
        while i < len(hashes) and hashes[i] == digest:
            entry = self._hash_entry[i]
            if paths[offsets[entry]:offsets[entry + 1]] == path:  # compared in place, no copy
                return entry
            i += 1
        return -1

    def lookup_many(self, paths: Sequence[bytes]) -> np.ndarray:
        """Entry numbers of many relative paths (-1 for each not in the index), 2-3 times as fast as :meth:`lookup`
        one by one: the hashes are searched by numpy at once, a Python call per path only hashes and compares it."""
        digests = np.fromiter(map(checksum, paths), np.uint64, len(paths))
        hashes = self.hash_sorted
        at = np.minimum(np.searchsorted(hashes, digests), hashes.size - 1)  # an index has its root at least
        entries = np.where(hashes[at] == digests, self.hash_entry[at].astype(np.int64), -1)
        path = self.path
        for i, (entry, name) in enumerate(zip(entries.tolist(), paths)):
            if entry >= 0 and path(entry) != name:  # two paths of one hash: the next may be this one
                entries[i] = self.lookup(name)
        return entries

    def children(self, entry: int, start: int = 0, stop: int | None = None) -> list[bytes]:
        """Names in a directory, sorted (those from ``start`` to ``stop``); one slice of the path blob, split by
        the offsets."""
        first, count = int(self.first[entry]), int(self.count[entry])
        stop = count if stop is None else min(stop, count)
        if start >= stop:
            return []
        offsets = self._path_offset[first + start:first + stop + 1].tolist()
        blob = self._paths[offsets[0]:offsets[-1]].tobytes()
        skip = len(self.path(entry)) + (1 if entry else 0)
        base = offsets[0]
        return [blob[a - base + skip:b - base] for a, b in zip(offsets, offsets[1:])]

    def target(self, entry: int) -> bytes:
        first, count = int(self.first[entry]), int(self.count[entry])
        return self.targets[first:first + count].tobytes()


def build_index(path: str, meta: Mapping[str, Any], paths: list[bytes], columns: Mapping[str, np.ndarray],
                targets: bytes, dictionaries: Mapping[str, bytes]) -> int:
    """Write an index from per-entry ``paths`` (BFS order) and the entry/blob/shard columns."""
    lengths = np.fromiter((len(p) for p in paths), dtype=np.uint64, count=len(paths))
    path_offset = np.zeros(len(paths) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=path_offset[1:])
    hashes = np.fromiter((checksum(p) for p in paths), dtype=np.uint64, count=len(paths))
    order = np.argsort(hashes, kind="stable")
    out: dict[str, np.ndarray] = {
        "paths": np.frombuffer(b"".join(paths), dtype=np.uint8),
        "path_offset": path_offset,
        "hash_sorted": hashes[order],
        "hash_entry": order.astype(np.uint32),
        "targets": np.frombuffer(targets, dtype=np.uint8),
    }
    for name, dtype in {**ENTRY_COLUMNS, **BLOB_COLUMNS, **SHARD_COLUMNS}.items():
        out[name] = np.asarray(columns[name], dtype=dtype)
    for name, data in dictionaries.items():
        out["dict:" + name] = np.frombuffer(data, dtype=np.uint8)
    return write_index(path, meta, out)
