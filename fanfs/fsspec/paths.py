"""Paths as an fsspec user writes them, resolved to index entries the way ``open`` resolves them on the mount.

The fast path is the index's own lookup of the path as given (``train/cat/1.jpg``: one hash, one
comparison).  Only when that misses, or names a symbolic link to follow, is the path walked component
by component: empty components and ``.`` are skipped, ``..`` goes up, and the store's own symbolic
links are followed.  A link that leads outside the store (an absolute target, or ``..`` above the
root) is not followed: in-process, the store is all there is, and no index reaches past it.
"""

from __future__ import annotations

import errno
import os
from collections import deque

from ..store.format import DIR, SYMLINK
from ..store.index import Index

MAX_LINKS = 40
"""Symbolic links followed in one resolution before it fails with ELOOP (Linux's limit)."""


def resolve(index: Index, path: bytes, follow: bool = True) -> int:
    """Entry that ``path`` (relative to the store's root) names; the last component's link is followed if
    ``follow``.  FileNotFoundError, NotADirectoryError or ELOOP as ``open`` would give on the mount."""
    parts = deque(path.split(b"/"))
    current, entry, links = b"", 0, 0
    while parts:
        name = parts.popleft()
        if name in (b"", b"."):
            continue
        if name == b"..":
            if not current:
                raise FileNotFoundError(errno.ENOENT, "leads outside the store", os.fsdecode(path))
            current = current.rpartition(b"/")[0]
            entry = index.lookup(current)
            continue
        if index.type[entry] != DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fsdecode(current))
        candidate = current + b"/" + name if current else name
        child = index.lookup(candidate)
        if child < 0:
            raise FileNotFoundError(errno.ENOENT, "no such file in the store", os.fsdecode(path))
        if index.type[child] == SYMLINK and (follow or any(p not in (b"", b".") for p in parts)):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", os.fsdecode(path))
            target = index.target(child)
            if target.startswith(b"/"):
                raise FileNotFoundError(errno.ENOENT, "a symbolic link out of the store", os.fsdecode(candidate))
            parts.extendleft(reversed(target.split(b"/")))
            continue
        current, entry = candidate, child
    return entry
