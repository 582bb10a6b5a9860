"""The FUSE front: a thin mfusepy adapter over :class:`fanfs.store.Store`.

Measured choices (README "FUSE"): one single-threaded loop (multithreaded Python daemons fight over
the GIL), kernel caching of data (keep_cache on open) and of attributes, entries and negative lookups
for a day, since a store never changes.  Each open pins the fidelity it was opened at in its file
handle, so a fidelity switch never tears a read of an already open file.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy  # noqa: E402  (needs FUSE_LIBRARY_NAME before import)

from .format import DIR, FILE  # noqa: E402
from .store import Store  # noqa: E402

log = logging.getLogger("fanfs")

CACHE_SECONDS = 86400.0


class FanfsOperations(mfusepy.Operations):
    """Path-based operations; every write-like operation is refused by the ``ro`` mount itself."""

    use_ns = True

    def __init__(self, store: Store, fidelity: int, on_ready: Callable[[], None]) -> None:
        self.store = store
        self.fidelity = fidelity
        self._on_ready = on_ready
        self._last_path: str | None = None
        self._last_entry = 0
        self.fuse_handle: int | None = None

    def _entry(self, path: str) -> int:
        if path == self._last_path:
            return self._last_entry
        entry = self.store.lookup(os.fsencode(path)[1:])
        self._last_path, self._last_entry = path, entry
        return entry

    def init(self, path: str) -> None:
        self.fuse_handle = mfusepy._libfuse.fuse_get_context().contents.fuse
        self._on_ready()

    def getattr(self, path: str, fh: object = None) -> dict[str, int]:
        return self.store.getattr(self._entry(path), self.fidelity)

    def readdir(self, path: str, fh: int) -> list:
        # Inode and mode must be given: libfuse would otherwise send inode 0, which readers skip.
        return [".", "..", *((os.fsdecode(name), {"st_ino": ino, "st_mode": mode}, 0)
                             for name, ino, mode in self.store.listdir(self._entry(path)))]

    def readlink(self, path: str) -> str:
        return os.fsdecode(self.store.readlink(self._entry(path)))

    def open(self, path: str, fi: mfusepy.fuse_file_info) -> int:
        entry = self._entry(path)
        if self.store.index.type[entry] != FILE:
            raise OSError(errno.EISDIR if self.store.index.type[entry] == DIR else errno.EINVAL, "not a file")
        if fi.flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "read-only file system")
        fi.fh = self.fidelity
        fi.keep_cache = 1
        self.store.stats.opens += 1
        return 0

    def read(self, path: str, size: int, offset: int, fi: mfusepy.fuse_file_info) -> bytes:
        return self.store.read(self._entry(path), offset, size, fi.fh)

    def statfs(self, path: str) -> dict[str, int]:
        totals = self.store.meta["totals"]
        block = 4096
        return {"f_bsize": block, "f_frsize": block, "f_blocks": -(-totals["bytes_presented"] // block),
                "f_bfree": 0, "f_bavail": 0, "f_files": totals["entries"], "f_ffree": 0, "f_namemax": 255}


def serve(store: Store, mountpoint: str, ops: FanfsOperations, *, allow_other: bool = False,
          debug: bool = False) -> None:
    """Mount and serve until unmounted or signalled (SIGINT/SIGTERM/SIGHUP unmount cleanly)."""
    options = dict(foreground=True, nothreads=True, raw_fi=True, ro=True, default_permissions=True,
                   fsname="fanfs:" + os.path.abspath(store.root).replace("\\", "\\\\").replace(",", "\\,"), subtype="fanfs", use_ino=True,
                   attr_timeout=CACHE_SECONDS, entry_timeout=CACHE_SECONDS, negative_timeout=CACHE_SECONDS,
                   auto_unmount=True, debug=debug)
    if allow_other:
        options["allow_other"] = True
    mfusepy.FUSE(ops, mountpoint, **options)


def invalidate_path(ops: FanfsOperations, path: bytes) -> int:
    """Drop the kernel's cached attributes and data of one path (libfuse 3 high-level API)."""
    if ops.fuse_handle is None:
        return -errno.ENOTCONN
    return mfusepy._libfuse.fuse_invalidate_path(ctypes.c_void_p(ops.fuse_handle), b"/" + path)
