"""A node's local copy of a store's blobs, filled as they are read (``--stage lazy``) and held within a budget.

Two files in the node's local directory, shared by every process of the node (its serving processes, its peer
server, its in-process readers) and kept from one mount to the next:

* ``cache.data``: sparse, a slot per blob of the store at a 4 KiB-aligned offset, so that dropping a blob frees
  exactly its blocks and the bytes on disk are the sum of the slots held (a slot's *footprint*);
* ``cache.state``: a header naming the store, then one byte per blob (:data:`ABSENT` ... :data:`HOLE`), mapped
  shared: a state one process writes is seen by every other at once.

A blob is written into its slot and only then marked held, under a lock on its state byte (an open file
description lock: the kernel releases it when its process dies), so a copy being written is never read; a crash
leaves the blob "being filled", dropped at the next open; and every process that wants a blob nobody holds yet
waits for the one fetching it, so the shared store is read once per blob.  The Store checks every copy read
from here against the index anyway: one gone bad is rejected, dropped here, and read elsewhere.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import FanfsError, WouldWait
from ..util.checksum import checksum
from ..util.files import file_lock
from ..store.resident import NoWaitReads
from ..store.sources import reopen
from .keyedlocks import KeyedLocks

log = logging.getLogger("fanfs")

DATA_NAME, STATE_NAME = "cache.data", "cache.state"
ABSENT, FILLING, SPENT, AHEAD, KEPT, HOLE = range(6)
"""A blob's state.  ``AHEAD``: fetched for a read that is coming (held until read); ``SPENT``: read since, the first
to be dropped for room; ``KEPT``: the node keeps it (dropped only at an open whose budget leaves it out);
``HOLE``: nothing stored, nothing to hold.  Ordered so that a state >= ``AHEAD`` serves a read here and is never
dropped while a read may want it."""
BLOCK = 4096
REPORT_EVERY = 60.0  # seconds between two log lines about blobs that could not be kept
_HEADER = struct.Struct("<16s16sQ")  # magic, store id, blobs
_MAGIC = b"fanfs-cache-v1\0\0"
HEADER_SIZE = 64
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def footprints(stored: np.ndarray) -> np.ndarray:
    """Bytes each blob occupies in the cache: its stored size up to whole 4 KiB blocks."""
    return (np.asarray(stored, np.int64) + BLOCK - 1) // BLOCK * BLOCK


def state_file_bytes(blobs: int) -> int:
    """What the state file occupies on disk (counted in a node's budget)."""
    return -(-(HEADER_SIZE + blobs) // BLOCK) * BLOCK


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


def punch(fd: int, offset: int, length: int) -> None:
    """Free the blocks of ``[offset, offset + length)`` (the file keeps its size; the range reads as zeros)."""
    if length and _libc.fallocate(fd, _PUNCH_HOLE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot free cache space: {os.strerror(err)}")


class DiskCache:
    """The cache files in ``directory`` for the store of ``index`` (made, or started afresh if they were another
    store's).  ``owner``: this process serves the node (its daemon): it holds the directory for its lifetime (a
    second daemon there is refused) and may :meth:`recover`; in-process readers share it without."""

    def __init__(self, directory: str, index: Any, store_id: bytes, owner: bool = False) -> None:
        self.directory = directory
        self.blobs = int(index.blob_stored.size)
        self.stored = index.blob_stored
        self._stored = memoryview(index.blob_stored)
        self._checksum = memoryview(index.blob_checksum)
        self.footprint = footprints(index.blob_stored)
        self.slot = np.concatenate([[0], np.cumsum(self.footprint)[:-1]]).astype(np.int64) if self.blobs else \
            np.zeros(0, np.int64)
        self._slot = memoryview(self.slot)
        state_path = os.path.join(directory, STATE_NAME)
        self._fd = os.open(state_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self._owner_fd = -1
        if owner:
            self._owner_fd = os.open(state_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                fcntl.flock(self._owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.close()
                raise FanfsError(f"{directory} is the local directory of another fanfs mount that is still serving: "
                                 "give each mount its own") from None
        header = _HEADER.pack(_MAGIC, store_id, self.blobs)
        fresh = os.pread(self._fd, _HEADER.size, 0) != header or os.fstat(self._fd).st_size != HEADER_SIZE + self.blobs
        data_path = os.path.join(directory, DATA_NAME)
        self._data = os.open(data_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        if fresh:  # another store's, cut short, or new: nothing in it is this store's
            if not owner:
                self.close()
                raise FanfsError(f"{directory} holds no cache of this store: its node has not started one")
            os.ftruncate(self._data, 0)
            os.ftruncate(self._fd, 0)
            os.ftruncate(self._fd, HEADER_SIZE + self.blobs)
            os.pwrite(self._fd, header, 0)
        size = int(self.slot[-1] + self.footprint[-1]) if self.blobs else 0
        if os.fstat(self._data).st_size < size:
            os.ftruncate(self._data, size)  # sparse: the slots take no space until written
        self._map = mmap.mmap(self._fd, HEADER_SIZE + self.blobs)
        self.states = np.frombuffer(self._map, np.uint8, self.blobs, HEADER_SIZE)
        self._states = memoryview(self._map)[HEADER_SIZE:]
        self._locks = KeyedLocks()
        self._nowait = NoWaitReads()
        self.punch_failed = False

    # --- what is here -----------------------------------------------------------------------------

    def state(self, blob: int) -> int:
        return self._states[blob]

    def present(self, first: int, count: int) -> bool:
        """Whether blobs ``first .. first + count - 1`` are all here to be read (and not to be dropped meanwhile)."""
        if count == 1:
            return self._states[first] >= AHEAD
        return count > 0 and min(self._states[first:first + count]) >= AHEAD

    def held_bytes(self, states: tuple[int, ...] = (FILLING, SPENT, AHEAD, KEPT)) -> int:
        """Bytes on disk of the blobs in ``states`` (by default every one that occupies its slot)."""
        return int(self.footprint[np.isin(self.states, states)].sum())

    def read(self, blob: int, length: int, wait: bool = True) -> bytes | None:
        """The local copy of a blob that is here (None if it is not): a kept one at once; one fetched ahead under its
        lock, which :meth:`drop` respects (and marked spent: it was read).  ``wait=False``: WouldWait where that
        would wait on the disk, or on a fill or drop under way."""
        state = self._states[blob]
        if state == KEPT:
            return self._pread(blob, length, wait)
        if state not in (AHEAD, SPENT):
            return None
        with self._locks.hold(blob, wait), self._file_lock(blob, fcntl.F_RDLCK, wait):
            if self._states[blob] not in (AHEAD, SPENT):
                return None  # dropped meanwhile
            data = self._pread(blob, length, wait)
            self._states[blob] = SPENT
            return data

    def _pread(self, blob: int, length: int, wait: bool) -> bytes:
        if wait:
            return os.pread(self._data, length, self._slot[blob])
        return self._nowait.pread(self._data, length, self._slot[blob])

    # --- filling and dropping ---------------------------------------------------------------------

    def fill(self, blob: int, fetch: Callable[[], bytes], state: int = KEPT) -> tuple[bytes, bool, str]:
        """The blob's bytes: the copy here if there is one by now, else ``fetch()``'s, checked against the index and
        written here as ``state``; whether they were fetched; why they could not be kept ("" if they were)."""
        length = self._stored[blob]
        with self._locks.hold(blob), self._file_lock(blob, fcntl.F_WRLCK):
            if self._states[blob] >= AHEAD and (data := os.pread(self._data, length, self._slot[blob])) \
                    and checksum(data) == self._checksum[blob]:
                if self._states[blob] == SPENT and state == AHEAD:
                    self._states[blob] = AHEAD
                return data, False, ""
            self._states[blob] = FILLING
            try:
                data = fetch()
                if len(data) != length or checksum(data) != self._checksum[blob]:
                    raise FanfsError(f"blob {blob}: the shared store's copy fails its checksum (run 'fanfs verify' on it)")
            except BaseException:
                self._set_absent(blob)
                raise
            try:
                written = os.pwrite(self._data, data, self._slot[blob])
                if written != length:
                    raise OSError(errno.ENOSPC, f"short write ({written} of {length} bytes)")
            except OSError as err:
                self._set_absent(blob)
                return data, True, f"{err.strerror or err}" + (" (the local directory is full)"
                                                               if err.errno in _FULL_DISK else "")
            self._states[blob] = state
            return data, True, ""

    def spend(self, blob: int) -> None:
        """A blob fetched ahead for a read that did not come: it may be dropped now."""
        with self._locks.hold(blob), self._file_lock(blob, fcntl.F_WRLCK):
            if self._states[blob] == AHEAD:
                self._states[blob] = SPENT

    def drop(self, blob: int, wait: bool = False) -> bool:
        """Free a blob's slot unless a read holds it (``wait``: wait for it); whether it was dropped."""
        with self._locks.hold(blob):
            if not file_lock(self._fd, fcntl.F_WRLCK, HEADER_SIZE + blob, 1, wait=wait):
                return False
            try:
                if self._states[blob] in (ABSENT, HOLE):
                    return True
                self._set_absent(blob)
                return True
            finally:
                self._unlock(blob)

    def recover(self, keep: np.ndarray) -> int:
        """At the owner's start, before any read: drop what is not a blob ``keep`` says to keep (copies cut short by
        a crash, blobs fetched ahead for a read that never came, kept ones a new budget leaves out); mark the
        holes.  Returns how many blobs were dropped."""
        states = self.states
        hole = self.stored == 0
        drop = np.flatnonzero((states != ABSENT) & ~hole & ~((states == KEPT) & keep))
        for blob in drop.tolist():
            self._set_absent(blob)
        states[hole] = HOLE
        return int(drop.size)

    def _set_absent(self, blob: int) -> None:
        """Mark the blob absent first (no reader trusts it from here on), then free its blocks."""
        self._states[blob] = ABSENT
        try:
            punch(self._data, self._slot[blob], int(self.footprint[blob]))
        except OSError as err:
            if not self.punch_failed:
                self.punch_failed = True
                log.warning("%s: %s; dropped blobs keep their space until the next mount", self.directory, err)

    # --- locks on state bytes: threads of this process by KeyedLocks, processes by file locks -----------

    @contextmanager
    def _file_lock(self, blob: int, kind: int, wait: bool = True) -> Iterator[None]:
        if not file_lock(self._fd, kind, HEADER_SIZE + blob, 1, wait=wait):
            raise WouldWait  # another process fills or drops it
        try:
            yield
        finally:
            self._unlock(blob)

    def _unlock(self, blob: int) -> None:
        file_lock(self._fd, fcntl.F_UNLCK, HEADER_SIZE + blob, 1)

    def reopen(self) -> int:
        return reopen(self._data)  # the data file, on a descriptor of the caller's own

    def after_fork(self) -> None:
        """In a forked child: a descriptor of its own for the state file, whose file locks are then this process's
        (the inherited one's are the parent's), and locks no thread of the parent holds."""
        fd = os.open(os.path.join(self.directory, STATE_NAME), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        os.close(self._fd)
        self._fd = fd
        self._locks.after_fork()

    def close(self) -> None:
        states = getattr(self, "_states", None)
        if states is not None:
            states.release()
            del self.states
            try:
                self._map.close()
            except BufferError:  # a numpy view of it is still alive somewhere: the mapping goes with the process
                pass
        for fd in (self._fd, getattr(self, "_data", -1), self._owner_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._data = self._owner_fd = -1
