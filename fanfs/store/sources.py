"""Shard sources: somewhere a store's shard bytes can be read from.

The store asks its sources in order for one blob at a time (the local shard directory first; in a job,
the peers that hold the blob) and checks every copy against the index, so a source only has to return
bytes or raise: ``NotHeld`` when it does not hold them by design (another node does), OSError or a
FanfsError when it should have and failed.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..errors import NotHeld, StoreError
from ..util.deadline import deadline_for
from ..util.files import open_regular
from .format import SHARD_HEADER, check_shard_header, shard_name

__all__ = ["NotHeld", "ShardSource", "LocalShards", "HeldShards", "reopen"]


class ShardSource:
    """Somewhere shard bytes can be read from."""

    name = "source"

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        """The stored bytes of ``blob``: ``length`` bytes at ``offset`` of ``shard``."""
        raise NotImplementedError

    def rejected(self, blob: int) -> None:
        """The bytes this source gave for ``blob`` failed the store's check (a cache drops its copy)."""

    def place(self, blob: int, shard: int, offset: int) -> int | None:
        """Where in a file of this node the blob's stored bytes lie, to be read in place (an extent's, spliced);
        None if this source cannot say (a peer; a copy not made yet): the store reads it with :meth:`read`.
        NotHeld, as :meth:`read` raises it."""
        return None

    def holds_in_place(self, blob: int) -> bool:
        """Whether the bytes :meth:`read` just gave for the blob are the ones :meth:`place` positions (a file read
        as it lies: they were checked, so a splice of them serves checked bytes)."""
        return False

    def served_in_place(self, blob: int, length: int, from_start: bool) -> None:
        """``length`` bytes of the blob were served where :meth:`place` said they lie (``from_start``: from its first
        byte on: a read of the blob, as :meth:`read` counts them)."""

    def reopen(self, shard: int, offset: int) -> int | None:
        """A new descriptor (the caller's to close) on the file that :meth:`place` positions are in for blobs of
        ``shard`` at ``offset``: the same file, opened again, so that a stream has read-ahead of its own."""
        return None

    def close(self) -> None:
        pass

    def stop_waiting(self) -> None:
        """The mount is ending: reads waiting on a stalled file system give up now (EIO), so that its daemon ends."""

    def after_fork(self) -> None:
        """In a forked child, before its first read: renew what cannot be shared with the parent (locks another
        thread may have held at the fork; connections).  Open files stay shared: reads use ``pread``."""


class LocalShards(ShardSource):
    """Shard files in a directory (``STORE/shards`` or a node-local staging directory).

    A shard file is opened once (as a regular file: never a FIFO or device planted in its place),
    its header checked against the store, and kept open.  ``scattered``: reads will be single blobs here and
    there (a cache's fills and read-throughs), so the kernel reads no further ahead than asked: on a network
    file system its read-ahead would fetch bytes nobody reads.  On a network file system, every read (and open) is
    waited on for ``--store-timeout`` at most (:mod:`fanfs.util.deadline`), and no blob is read in place: a splice
    from a stalled file would wait with no deadline.
    """

    def __init__(self, directory: str, store_id: bytes, scattered: bool = False) -> None:
        self.directory = directory
        self.name = directory
        self._store_id = store_id
        self._scattered = scattered
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self.deadline = deadline_for(directory)  # None on a local disk

    def path(self, shard: int) -> str:
        return os.path.join(self.directory, shard_name(shard))

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:  # opened with no lock held: an open that waits on a stalled file system holds up nothing else
            fd = open_regular(self.path(shard))
            try:
                check_shard_header(os.pread(fd, SHARD_HEADER.size, 0), shard, self._store_id, self.path(shard))
            except StoreError:
                os.close(fd)
                raise
            if self._scattered:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            with self._lock:
                kept = self._fds.setdefault(shard, fd)
            if kept != fd:  # another thread's came first
                os.close(fd)
                fd = kept
        return fd

    def adopt(self, shard: int, fd: int) -> None:
        """Keep ``fd``, a descriptor of ``shard``'s regular file whose header the caller checked, as its own."""
        with self._lock:
            old = self._fds.get(shard)
            if old is not None:
                os.close(old)
            if self._scattered:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            self._fds[shard] = fd

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        if self.deadline is not None:
            return self.deadline.run(self.path(shard), self._pread, shard, length, offset)
        return self._pread(shard, length, offset)

    def _pread(self, shard: int, length: int, offset: int) -> bytes:
        return os.pread(self._fd(shard), length, offset)

    def place(self, blob: int, shard: int, offset: int) -> int | None:
        if self.deadline is not None:
            return None
        self._fd(shard)  # there, a regular file, and this store's: checked once
        return offset

    def holds_in_place(self, blob: int) -> bool:
        return True

    def reopen(self, shard: int, offset: int) -> int | None:
        return reopen(self._fd(shard))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def stop_waiting(self) -> None:
        if self.deadline is not None:
            self.deadline.stop()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        if self.deadline is not None:
            self.deadline.after_fork()


class HeldShards(LocalShards):
    """Shard files holding only the blobs marked in ``held`` (a bool per blob): a node's staged share,
    or the shared store for the layers no node staged.  Other blobs are NotHeld: the store asks on."""

    def __init__(self, directory: str, store_id: bytes, held: np.ndarray, name: str | None = None,
                 scattered: bool = False) -> None:
        super().__init__(directory, store_id, scattered)
        self.held = held
        self.name = name or directory

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        if not self.held[blob]:
            raise NotHeld(f"blob {blob} is not in {self.name}")
        return super().read(blob, shard, offset, length)

    def place(self, blob: int, shard: int, offset: int) -> int | None:
        if not self.held[blob]:
            raise NotHeld(f"blob {blob} is not in {self.name}")
        return super().place(blob, shard, offset)


def reopen(fd: int) -> int:
    """The file open at ``fd`` opened again, read-only: the same file (not whatever its path names now), with an open
    file description, and so a read-ahead state, of its own."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
