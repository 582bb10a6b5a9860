"""The FUSE front: a thin mfusepy adapter over :class:`fanfs.store.Store`.

Measured choices (README "FUSE"): one single-threaded loop (multithreaded Python daemons fight over
the GIL), kernel caching of data (keep_cache on open) and of attributes, entries and negative lookups
for a day, since a store never changes.

Fidelity switching must not fight that caching.  Each open pins its fidelity in the file handle.  For
JPEG records the daemon remembers at which fidelity the kernel last saw each entry (``shown``) and how
many opens it has; a switch invalidates the kernel's attributes and pages of every closed entry shown
at another fidelity, and an entry still open keeps presenting its old fidelity (size and bytes) until
its last close, when it is invalidated.  So no read is ever torn, and every open after that sees the
new size and bytes.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from collections.abc import Callable

import numpy as np

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy  # noqa: E402  (needs FUSE_LIBRARY_NAME before import)

from .format import DIR, FILE, RECORD_JPEG  # noqa: E402
from .store import FULL, Store  # noqa: E402

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
        self._record = store.index.record
        entries = store.index.entries
        self._shown = np.zeros(entries, np.uint16)  # fidelity the kernel has cached for a JPEG record; 0: none
        self._opens = np.zeros(entries, np.uint32)
        self._lock = threading.Lock()  # the control thread switches fidelity while the loop serves
        # Opens exist only to pin a JPEG record's fidelity.  A store without records answers ENOSYS:
        # the kernel then stops sending open and release altogether and keeps its page cache.
        self._pins_fidelity = bool((self._record == RECORD_JPEG).any())

    def _entry(self, path: str) -> int:
        if path == self._last_path:
            return self._last_entry
        entry = self.store.lookup(os.fsencode(path)[1:])
        self._last_path, self._last_entry = path, entry
        return entry

    def init(self, path: str) -> None:
        self.fuse_handle = mfusepy._libfuse.fuse_get_context().contents.fuse
        self._on_ready()

    def _show(self, entry: int, opening: bool = False) -> tuple[int, int]:
        """(fidelity to present a JPEG record at now, fidelity the kernel had cached for it): an open
        record keeps the fidelity it was opened at, a closed one takes the current."""
        with self._lock:
            shown = int(self._shown[entry])
            fidelity = shown if self._opens[entry] else self.fidelity
            self._shown[entry] = fidelity
            self._opens[entry] += opening
        return fidelity, shown

    def getattr(self, path: str, fh: object = None) -> dict[str, int]:
        entry = self._entry(path)
        if self._record[entry] == RECORD_JPEG:
            return self.store.getattr(entry, self._show(entry)[0])
        return self.store.getattr(entry)

    def readdir(self, path: str, fh: int) -> list:
        # Inode and mode must be given: libfuse would otherwise send inode 0, which readers skip.
        return [".", "..", *((os.fsdecode(name), {"st_ino": ino, "st_mode": mode}, 0)
                             for name, ino, mode in self.store.listdir(self._entry(path)))]

    def readlink(self, path: str) -> str:
        return os.fsdecode(self.store.readlink(self._entry(path)))

    def open(self, path: str, fi: mfusepy.fuse_file_info) -> int:
        if not self._pins_fidelity:
            raise OSError(errno.ENOSYS, "open is not needed")
        entry = self._entry(path)
        kind = self.store.index.type[entry]
        if kind != FILE:
            raise OSError(errno.EISDIR if kind == DIR else errno.EINVAL, "not a file")
        if fi.flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "read-only file system")
        if self._record[entry] == RECORD_JPEG:
            fidelity, shown = self._show(entry, opening=True)
            fi.fh = fidelity
            fi.keep_cache = int(shown == fidelity)  # pages cached at another fidelity are dropped
        else:
            fi.fh = FULL
            fi.keep_cache = 1
        self.store.stats.opens += 1
        return 0

    def read(self, path: str, size: int, offset: int, fi: mfusepy.fuse_file_info) -> bytes:
        return self.store.read(self._entry(path), offset, size, fi.fh)  # fh 0 (no open): a plain file

    def release(self, path: str, fi: mfusepy.fuse_file_info) -> int:
        entry = self._entry(path)
        if self._record[entry] == RECORD_JPEG:
            with self._lock:
                self._opens[entry] -= 1
                stale = not self._opens[entry] and self._shown[entry] != self.fidelity
                if stale:
                    self._shown[entry] = 0
            if stale:  # no user left: safe to invalidate from the loop itself
                invalidate_path(self, self.store.index.path(entry))
        return 0

    def set_fidelity(self, fidelity: int) -> dict[str, int]:
        """Switch fidelity for opens from now on; returns how many entries were invalidated or deferred."""
        with self._lock:
            self.fidelity = fidelity
            stale = (self._shown != 0) & (self._shown != fidelity)
            closed = np.flatnonzero(stale & (self._opens == 0))
            self._shown[closed] = 0
            deferred = int(np.count_nonzero(stale)) - closed.size
        for entry in closed.tolist():  # outside the lock: the loop may need it to finish a read
            invalidate_path(self, self.store.index.path(entry))
        log.info("fidelity %s: %d cached entries invalidated, %d open ones deferred to their close",
                 "full" if fidelity == FULL else fidelity, closed.size, deferred)
        return {"fidelity": fidelity, "invalidated": int(closed.size), "deferred": deferred}

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
