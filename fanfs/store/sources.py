"""Shard sources: somewhere a store's shard bytes can be read from.

The store asks its sources in order for one blob at a time (the local shard directory first; in a job,
the peers that hold the blob) and checks every copy against the index, so a source only has to return
bytes or raise: ``NotHeld`` when it does not hold them by design (another node does), OSError or a
FanfsError when it should have and failed.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import FanfsError, NotHeld, StoreError, WouldWait
from ..util.deadline import close_within, deadline_for, within
from ..util.files import closed_with, open_regular
from .resident import NoWaitReads
from .format import SHARD_DIR, SHARD_HEADER, check_shard_header, checksum, shard_name

__all__ = ["NotHeld", "ShardSource", "InPlace", "ReadsRuns", "ReadsInMemory", "Descriptors", "LocalShards",
           "HeldShards", "reopen"]


class ShardSource(ABC):
    """Somewhere shard bytes can be read from.  What a source can do beyond :meth:`read` it declares by the
    capabilities it implements (:class:`InPlace`, :class:`ReadsRuns`, :class:`ReadsInMemory`, :class:`Descriptors`:
    protocols the Store and its readers check once, when they are given the source)."""

    name = "source"

    @abstractmethod
    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        """The stored bytes of ``blob``: ``length`` bytes at ``offset`` of ``shard``."""

    def rejected(self, blob: int) -> None:
        """The bytes this source gave for ``blob`` failed the store's check (a cache drops its copy)."""

    def close(self) -> None:
        pass

    def stop_waiting(self) -> None:
        """The mount is ending: reads waiting on a stalled file system give up now (EIO), so that its daemon ends."""

    def after_fork(self) -> None:
        """In a forked child, before its first read: renew what cannot be shared with the parent (locks another
        thread may have held at the fork; connections).  Open files stay shared: reads use ``pread``."""


@runtime_checkable
class InPlace(Protocol):
    """A source whose blobs lie in files of this node, where an extent's read may splice them from
    (:mod:`fanfs.store.extents`)."""

    def place(self, blob: int, shard: int, offset: int, wait: bool = True) -> int | None:
        """Where in a file of this node the blob's stored bytes lie; None if this source cannot say now (a copy not
        made yet; a file on a network file system, never spliced; ``wait=False``, a file not open yet): the store
        reads it with ``read``.  NotHeld, as ``read`` raises it."""
        ...

    def holds_in_place(self, blob: int) -> bool:
        """Whether the bytes ``read`` just gave for the blob are the ones :meth:`place` positions (a file read as it
        lies: they were checked, so a splice of them serves checked bytes)."""
        ...

    def served_in_place(self, blob: int, length: int, from_start: bool) -> None:
        """``length`` bytes of the blob were served where :meth:`place` said they lie (``from_start``: from its first
        byte on: a read of the blob, as ``read`` counts them)."""
        ...

    def reopen(self, shard: int, offset: int) -> int | None:
        """A new descriptor (the caller's to close) on the file that :meth:`place` positions are in for blobs of
        ``shard`` at ``offset``: the same file, opened again, so that a stream has read-ahead of its own."""
        ...


@runtime_checkable
class ReadsRuns(Protocol):
    """A source that gives a run of one file's blobs in one round trip (a peer): a read of several blobs this node
    lacks fetches them at once."""

    name: str

    def read_run(self, first: int, count: int) -> bytes:
        """The stored bytes of blobs ``first .. first + count - 1``, back to back; NotHeld as ``read`` raises it."""
        ...


def fetch_run(sources: list[ReadsRuns], first: int, count: int, stored: Any,
              checksums: Any) -> dict[int, tuple[bytes, str]]:
    """Blobs ``first .. first + count - 1`` from the first of ``sources`` that gives them all in one round trip, each
    checked against ``checksums`` (``stored``: their sizes); empty if none does (the blob-at-a-time path then asks every
    source, logs and falls back)."""
    for source in sources:
        try:
            data = source.read_run(first, count)
        except NotHeld:
            continue
        except (OSError, FanfsError):
            continue  # this holder failed (logged by its client): the next one may not
        blobs, pos = {}, 0
        for blob in range(first, first + count):
            part = data[pos:pos + stored[blob]]
            pos += len(part)
            if len(part) != stored[blob] or checksum(part) != checksums[blob]:
                return {}
            blobs[blob] = (part, source.name)
        return blobs
    return {}


@runtime_checkable
class ReadsInMemory(Protocol):
    """A source that can give a blob's bytes only if they are in memory, so that a serving loop never waits on its
    disk: the Store asks this in place of :meth:`ShardSource.read` when a read must not wait."""

    def read_resident(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        """As :meth:`ShardSource.read`, or WouldWait if that would wait on a device (or a peer)."""
        ...


@runtime_checkable
class Descriptors(Protocol):
    """A source whose blobs lie at their index offsets in files of this node it keeps open (a store's shards, a
    node's staged copies): a read-ahead may have the kernel read them into its page cache."""

    def descriptor(self, blob: int, shard: int) -> int | None:
        """The descriptor the blob's bytes are read from (at its offset), or None if reading ahead there could wait
        with no deadline (a network file system's); NotHeld as :meth:`ShardSource.read` raises it."""
        ...


class LocalShards(ShardSource):
    """Shard files in a directory (``STORE/shards`` or a node-local staging directory).

    A shard file is opened once (as a regular file: never a FIFO or device planted in its place),
    its header checked against the store, and kept open; never by a read that must not wait (the open, and the
    header's read, may wait on the disk): such a read of a shard not open yet is WouldWait, and so the thread that
    takes it over opens it.  ``scattered``: reads will be single blobs here and
    there (a cache's fills and read-throughs), so the kernel reads no further ahead than asked: on a network
    file system its read-ahead would fetch bytes nobody reads.  On a network file system, every read (and open) is
    waited on for ``--store-timeout`` at most (:mod:`fanfs.util.deadline`), and no blob is read in place: a splice
    from a stalled file would wait with no deadline.
    """

    def __init__(self, directory: str, store_id: bytes, scattered: bool = False, network: bool | None = None) -> None:
        """``network``: whether ``directory`` is on a network file system, where the caller knows (a mount tells its
        in-process readers); None: its file system is asked (a ``statfs``, waited on for the store's timeout)."""
        self.directory = directory
        self.name = directory
        self._store_id = store_id
        self._scattered = scattered
        self._fds: dict[int, int] = {}  # shard -> descriptor: only ever changed in place
        closed_with(self, self._fds)
        self._lock = threading.Lock()
        self.deadline = None if network is False else deadline_for(directory)  # None on a local disk
        self._nowait = NoWaitReads()

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
        return os.pread(self._fds.get(shard) or self._fd(shard), length, offset)

    def _pread(self, shard: int, length: int, offset: int) -> bytes:
        return os.pread(self._fd(shard), length, offset)

    def read_resident(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        if self.deadline is not None:
            raise WouldWait  # a network file system's: read by a thread that may wait, for its deadline
        fd = self._fds.get(shard)
        if fd is None:
            raise WouldWait  # not opened yet: its open and its header's check may read the disk (a thread's)
        return self._nowait.pread(fd, length, offset)

    def descriptor(self, blob: int, shard: int) -> int | None:
        return None if self.deadline is not None else self._fd(shard)

    def place(self, blob: int, shard: int, offset: int, wait: bool = True) -> int | None:
        if self.deadline is not None:
            return None
        if shard not in self._fds:
            if not wait:
                return None  # its open and header's check may read the disk: the copy path's thread opens it
            self._fd(shard)  # there, a regular file, and this store's: checked once
        return offset

    def holds_in_place(self, blob: int) -> bool:
        return True

    def served_in_place(self, blob: int, length: int, from_start: bool) -> None:
        pass

    def reopen(self, shard: int, offset: int) -> int | None:
        return reopen(self._fd(shard))

    def close(self) -> None:
        with self._lock:
            fds = list(self._fds.values())
            self._fds.clear()
        close_within(self.deadline, fds)  # a close may wait on a stalled server too (sshfs's flush)

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

    def read_resident(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        if not self.held[blob]:
            raise NotHeld(f"blob {blob} is not in {self.name}")
        return super().read_resident(blob, shard, offset, length)

    def descriptor(self, blob: int, shard: int) -> int | None:
        if not self.held[blob]:
            raise NotHeld(f"blob {blob} is not in {self.name}")
        return super().descriptor(blob, shard)

    def place(self, blob: int, shard: int, offset: int, wait: bool = True) -> int | None:
        if not self.held[blob]:
            raise NotHeld(f"blob {blob} is not in {self.name}")
        return super().place(blob, shard, offset, wait)


def check_shard_files(root: str, sizes: np.ndarray, store_id: bytes, keep: LocalShards | None = None) -> None:
    """Refuse a store whose shard files are missing, cut short, foreign or not regular files.  ``keep``: the source
    that reads these files, given the descriptors opened here (a forked reader, such as a DataLoader worker, inherits
    them instead of opening and checking every shard again: ~20 us each).  On a network file system each shard's
    check is waited on for ``--store-timeout`` at most (Stalled)."""
    directory = os.path.join(root, SHARD_DIR)
    reads = keep.deadline if keep is not None else deadline_for(directory)
    for shard in range(sizes.size):
        path = os.path.join(directory, shard_name(shard))
        fd = within(reads, path, _checked_shard, root, path, shard, store_id, int(sizes[shard]), keep is not None)
        if keep is not None:
            keep.adopt(shard, fd)


def _checked_shard(root: str, path: str, shard: int, store_id: bytes, size: int, keep: bool) -> int | None:
    """Open and check one shard file; its descriptor if ``keep``, else closed."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise StoreError(f"{root}: incomplete store: shard {shard_name(shard)} is missing") from None
    except OSError as err:
        raise StoreError(f"{path}: {err.strerror}") from None
    try:
        check_shard_header(os.pread(fd, SHARD_HEADER.size, 0), shard, store_id, path)
        if (found := os.fstat(fd).st_size) != size:
            raise StoreError(f"{root}: incomplete store: shard {shard_name(shard)} has {found} bytes, the index "
                             f"says {size}")
    except BaseException:
        os.close(fd)
        raise
    if keep:
        return fd
    os.close(fd)
    return None


def reopen(fd: int) -> int:
    """The file open at ``fd`` opened again, read-only: the same file (not whatever its path names now), with an open
    file description, and so a read-ahead state, of its own."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
