"""Chunks of large files shared by the serving processes of one mount, so that each is loaded once.

The kernel hands a file's consecutive requests to whichever serving process reads next, and requests do not
follow the chunks: a chunk is wanted by two requests (1 MiB requests off the chunks' edges) or eight (the
kernel's own 128 KiB), often in two processes at the same moment.  Measured with 2 processes on a 150 MB
file: 210 loads of its 144 chunks with 1 MiB requests, 288 with 128 KiB ones.  Here a process that loads a
chunk (found, verified, decoded) puts it in memory mapped before the fork, and one that wants a chunk another
is loading waits for it.  Only chunks stored compressed are shared: reading a raw one again (a ``pread`` and
a checksum) cost less than sharing it (a copy in, a copy out, the lock and the wait), measured with 2
processes on 192 MB of raw chunks: 1.3-1.7 s of CPU per GB shared against 0.9-1.4 re-read; on 185 MB of
zstd chunks (ratio 2.2) sharing cut the loads from 271-330 to 192-211 and the CPU from 4.1-7.2 to 3.9-5.7
s per GB.  Slots are direct-mapped (chunk ``b`` in slot ``b % slots``: a file's consecutive
chunks take consecutive slots); one lock, shared by the processes, guards every slot's state and bytes, and a
chunk is copied out under it, so no process ever sees a slot half written.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import time

import numpy as np

from ..errors import WouldWait
from ..util.processes import pid_alive

EMPTY, LOADING, READY = 0, 1, 2
SLOTS = 16
WAIT = 10.0
"""Seconds a process waits for a chunk another one loads before it loads it itself (longer than a peer's timeout)."""


class SharedChunks:
    """``slots`` decoded chunks of up to ``chunk_size`` bytes, in memory that processes forked after this share."""

    def __init__(self, chunk_size: int, slots: int = SLOTS) -> None:
        self.chunk_size, self.slots = chunk_size, slots
        self._memory = mmap.mmap(-1, 8 * 4 * slots + chunk_size * slots)
        header = np.frombuffer(self._memory, np.int64, 4 * slots).reshape(4, slots)
        self._blob, self._state, self._length, self._owner = header
        self._blob[:] = -1
        self._data = memoryview(self._memory)[8 * 4 * slots:]
        self._lock = multiprocessing.get_context("fork").Lock()

    def get_or_claim(self, blob: int, wait: bool = True) -> bytes | None:
        """The chunk's bytes if a process loaded it; else None, and the caller loads it and then calls :meth:`put`
        (or :meth:`abandon`).  Waits while another live process loads it, up to :data:`WAIT` seconds (``wait=False``:
        WouldWait instead)."""
        slot = blob % self.slots
        deadline = time.monotonic() + WAIT
        while True:
            with self._lock:
                here = self._blob[slot] == blob
                if here and self._state[slot] == READY:
                    start = slot * self.chunk_size
                    return bytes(self._data[start:start + self._length[slot]])
                owner = int(self._owner[slot])
                if not (here and self._state[slot] == LOADING and owner != os.getpid() and pid_alive(owner)
                        and time.monotonic() < deadline):
                    self._blob[slot], self._state[slot], self._owner[slot] = blob, LOADING, os.getpid()
                    return None
                if not wait:
                    raise WouldWait
            time.sleep(0.0002)  # another process loads it

    def put(self, blob: int, data: bytes) -> None:
        """The chunk a :meth:`get_or_claim` of this process left to it, loaded: for the other processes."""
        slot = blob % self.slots
        with self._lock:
            if self._blob[slot] == blob and self._state[slot] == LOADING and self._owner[slot] == os.getpid():
                start = slot * self.chunk_size
                self._data[start:start + len(data)] = data
                self._length[slot], self._state[slot] = len(data), READY

    def abandon(self, blob: int) -> None:
        """This process could not load the chunk it claimed: the next process that wants it tries for itself."""
        slot = blob % self.slots
        with self._lock:
            if self._blob[slot] == blob and self._state[slot] == LOADING and self._owner[slot] == os.getpid():
                self._blob[slot], self._state[slot] = -1, EMPTY


class ReportTimes:
    """When each trouble (a number naming it: a blob, a cause) was last logged, in memory the processes forked after
    this share (a mount's serving processes, a loader's workers), so that one trouble is logged once, not once per
    process.  Direct-mapped slots: a trouble whose slot another took meanwhile may be logged again sooner, never less
    often."""

    def __init__(self, slots: int = 4096) -> None:
        self._memory = mmap.mmap(-1, 16 * slots)
        self._key = np.frombuffer(self._memory, np.int64, slots)
        self._when = np.frombuffer(self._memory, np.float64, slots, 8 * slots)
        self._key[:] = -1

    def due(self, key: int, every: float) -> bool:
        """Whether ``key`` was not logged in the last ``every`` seconds (and it counts as logged now if so)."""
        slot, now = key % self._key.size, time.monotonic()
        if self._key[slot] == key and now - self._when[slot] < every:
            return False
        self._key[slot], self._when[slot] = key, now
        return True
