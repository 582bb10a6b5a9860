"""Where an extent's bytes lie in a file this node holds, verified, so that a FUSE reply can splice them.

An extent (:mod:`fanfs.records.extent`, a kind whose files are read in place) is one run of its shard, and stays one run in every copy a node keeps:
a staged shard (the same offsets), the lazy cache (a 4 KiB-aligned slot per blob: 1 MiB chunks back to back).
:meth:`ExtentPlaces.locate` answers a read with ``(fd, position, length)`` in such a copy, and the FUSE front
hands that to the kernel (:func:`fanfs.serve.splice.reply_fd`), which moves the page-cache pages into the
reply: the daemon never holds the bytes.

**Nothing unverified is served.**  The first time a chunk is located in a copy, its stored bytes are read once
(``pread`` into a reused buffer: the disk read the splice would have made, after which the page cache holds them)
and checked against the index; only then, and from then on, is it located there.  Which copy verified each chunk
is kept in memory the mount's serving processes share.  A chunk that fails, or a copy that cannot say where its
bytes are (a peer, a blob still being fetched), is read by the store's copy path, which finds a good copy or
answers EIO with a log line.  Bytes changed in a copy *after* they were verified would be served as they are
now: the guarantee is "verified before first served" (docs/guarantees.rst).

**One descriptor per file being read** (opened anew on the copy, not shared): the kernel keeps read-ahead state
per open file, so each stream reads ahead for itself.  At most :data:`STREAMS` are kept; the least recently used
one not in a reply is closed for a new one.
"""

from __future__ import annotations

import mmap
import multiprocessing
import multiprocessing.synchronize  # noqa: F401  (the locks' module: imported with the store, not at a first lock)
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import FanfsError, NotHeld, WouldWait
from ..util.checksum import checksum
from ..util.files import closed_with
from .resident import in_memory
from .sources import InPlace, ShardSource

STREAMS = 64
"""Descriptors kept open for files being read (each a stream with its own read-ahead)."""
VERIFY_LOCKS = 64
"""Chunks being verified at once by a mount's threads and processes (a lock per chunk number modulo this)."""


class _Stream:
    __slots__ = ("fd", "source", "entry", "users")

    def __init__(self, fd: int, source: int, entry: int) -> None:
        self.fd, self.source, self.entry, self.users = fd, source, entry, 0


class Located:
    """Bytes of an extent located in a verified copy: ``length`` bytes at ``position`` of the file open at ``fd``."""

    __slots__ = ("stream", "fd", "position", "length", "entry", "offset", "blobs")

    def __init__(self, stream: _Stream, position: int, length: int, entry: int, offset: int, blobs: range) -> None:
        self.stream, self.fd, self.position, self.length = stream, stream.fd, position, length
        self.entry, self.offset, self.blobs = entry, offset, blobs


class ExtentPlaces:
    """Locates verified extent bytes in the copies ``sources`` hold, for a store's index and stats."""

    def __init__(self, index: Any, is_extent: np.ndarray, sources: Sequence[ShardSource], stats: Any, chunk_size: int,
                 fault: Callable[[int, int, str], OSError]) -> None:
        """``is_extent``: a bool per entry (files of a kind read in place); ``fault(entry, blob, why)``: the store's
        count and log line of a blob that could not be read."""
        self._sources, self._stats, self._chunk, self._fault = list(sources), stats, chunk_size, fault
        self._in_place = [isinstance(source, InPlace) for source in self._sources]
        self.is_extent = memoryview(is_extent)
        self._first, self._size, self._shard = memoryview(index.first), memoryview(index.size), memoryview(index.shard)
        self._offset, self._stored = memoryview(index.blob_offset), memoryview(index.blob_stored)
        self._checksum = memoryview(index.blob_checksum)
        self._blobs = max(1, int(index.blob_offset.size))
        self._copies = len(self._sources) * max(1, int(index.shard_size.size))
        size = 8 * self._copies + self._blobs + len(self._sources)
        self.memory_fd: int | None = os.memfd_create("fanfs-extents", os.MFD_CLOEXEC)  # for a mount's readers
        self._release_memory = closed_with(self, [self.memory_fd])
        os.ftruncate(self.memory_fd, size)
        self._map(mmap.mmap(self.memory_fd, size))  # shared with the processes forked after, and readers that adopt it
        # sources written while they serve (a lazy cache's fills): their change time moves by design
        self._filled = [bool(getattr(source, "written_while_serving", False)) for source in self._sources]
        self._streams: OrderedDict[int, _Stream] = OrderedDict()  # only ever changed in place
        weakref.finalize(self, _close_streams, self._streams)  # dropped without close(): their descriptors go
        self._lock = threading.Lock()
        self._verifying: list[Any] | None = None  # a lock per chunk number modulo VERIFY_LOCKS, made at first use
        self._verifying_shared = False
        self._buffers = threading.local()
        self.touched: memoryview | None = None  # per entry, the clock at its last read (Store.follow_reads)
        self.clock: Callable[[], int] = int

    def _map(self, memory: mmap.mmap) -> None:
        copies, blobs = self._copies, self._blobs
        self._memory = memory
        # per copy (source x shard): its identity (change time and size) when a chunk of it was verified (0: none yet)
        self._changed = np.frombuffer(memory, np.int64, copies).reshape(len(self._sources), -1)
        self._verified = memoryview(memory)[8 * copies:8 * copies + blobs]  # per blob: 1 + its source (0: none)
        self._was_cut = memoryview(memory)[8 * copies + blobs:]  # per source: 1 once a copy of its changed

    def adopt(self, memory: mmap.mmap) -> None:
        """Share the record of verified chunks of a mount of this store whose sources are these, in this order (its
        memory, mapped from its :attr:`memory_fd`: ``fanfs run``'s readers): a chunk it or any of its readers verified
        is not verified again here, and a copy seen changed here is verified again there, as between its serving
        processes."""
        if len(memory) != len(self._memory):
            raise FanfsError(f"the mount's record of verified chunks holds {len(memory)} bytes, not {len(self._memory)}")
        self._map(memory)
        self._close_memory()

    def _close_memory(self) -> None:
        if self.memory_fd is not None:
            self._release_memory()
            self.memory_fd = None

    def locate(self, entry: int, offset: int, size: int, wait: bool = True) -> Located | None:
        """Where bytes ``[offset, offset + size)`` of extent ``entry`` (cut at its end) lie in a copy this node holds,
        each chunk verified there: a descriptor, position and length the caller reads or splices, and then hands back
        to :meth:`served`.  None if they cannot be located so (the caller reads them another way: the copy path).
        ``wait=False``: WouldWait unless every chunk was verified there and every page is in memory (nothing then
        waits on a disk)."""
        if self.touched is not None:
            self.touched[entry] = self.clock()
        end = min(offset + size, self._size[entry])
        found = self._place(entry, offset, end, wait) if offset < end else None
        if found is None:
            return None
        stream, position, blobs = found
        return Located(stream, position, end - offset, entry, offset, blobs)

    def served(self, located: Located, sent: bool, spliced: bool = True) -> None:
        """The caller is done with ``located`` (``sent``: its bytes reached the reader, and are counted; ``spliced``:
        by the kernel, from the copy's pages, as a mount's reply; else read by the caller itself)."""
        self._release(located.stream)
        if not sent:
            return
        chunk, first, offset = self._chunk, self._first[located.entry], located.offset
        end = offset + located.length
        served = self._sources[located.stream.source].served_in_place  # type: ignore[attr-defined]
        for blob in located.blobs:
            low = max(offset, (blob - first) * chunk)
            served(blob, min(end, (blob - first + 1) * chunk) - low, low == (blob - first) * chunk)
        stats = self._stats
        stats.reads += 1
        stats.bytes_presented += located.length
        if spliced:
            stats.bytes_spliced += located.length

    def vouch(self, blob: int, shard: int, source: int) -> None:
        """The blob's bytes where ``source`` keeps them were just read and checked (by the copy path); not taken from a
        source whose copy was seen cut: read while it is cut, a chunk may come back changed when it is whole again.
        The copy's identity is recorded as :meth:`_check` records it, so that a change since is seen (:meth:`_covers`)
        (the copy path reads a chunk no run of one copy holds: pieces in several copies, a read given up on)."""
        if self._was_cut[source] or self._verified[blob] == source + 1:
            return
        if self._filled[source]:  # a copy filled as it serves: judged by its size, and its fill checked the blob
            self._verified[blob] = source + 1
            return
        try:
            fd = self._sources[source].descriptor(blob, shard)  # type: ignore[attr-defined]
            identity = _identity(os.fstat(fd)) if fd is not None else 0
        except (OSError, FanfsError, NotHeld):
            return
        if not identity or self._changed[source, shard] not in (0, identity):
            return  # changed since another chunk of it was verified: verified again by a read of its own
        self._changed[source, shard] = identity
        self._verified[blob] = source + 1
        self._stats.bytes_verified += int(self._stored[blob])  # read and checked once in this copy, as by _check

    def _place(self, entry: int, offset: int, end: int, wait: bool) -> tuple[_Stream, int, range] | None:
        """The stream and position of bytes ``[offset, end)`` in the first copy that holds them as one run, each chunk
        verified there, the stream marked in use; None: not so."""
        found = self._run(entry, offset, end, wait)
        if found is None:
            return None
        source, start, blobs = found
        stream = self._stream(entry, source)
        if stream is None:
            return None
        position = start + offset % self._chunk
        try:
            usable = self._checked(stream, start, blobs, wait) and self._covers(stream, position + end - offset,
                                                                                 self._shard[entry])
            if usable and not wait and not in_memory(stream.fd, position, end - offset):
                raise WouldWait  # pages evicted since: the splice would read the disk
        except BaseException:
            self._release(stream)
            raise
        if not usable:
            self._release(stream)
            return None
        return stream, position, blobs

    def _run(self, entry: int, offset: int, end: int, wait: bool) -> tuple[int, int, range] | None:
        """The source whose copy holds the chunks of bytes ``[offset, end)`` as one run, where that run begins, and the
        chunks; None if no copy holds them so (a peer's, or pieces in several copies: the copy path reads them)."""
        chunk, first, shard = self._chunk, self._first[entry], self._shard[entry]
        blobs = range(first + offset // chunk, first + (end - 1) // chunk + 1)
        where = None
        for blob in blobs:
            found = self._where(blob, shard, wait)
            if found is None:
                return None
            source, position = found
            if where is None:
                where = (source, position - (blob - blobs[0]) * chunk)
            elif where != (source, position - (blob - blobs[0]) * chunk):
                return None  # not one run in one copy: the copy path puts the pieces together
        return (*where, blobs) if where is not None else None

    def _checked(self, stream: _Stream, start: int, blobs: range, wait: bool) -> bool:
        """Whether every chunk of ``blobs`` was verified in the stream's copy (verified now where not yet: ``wait``
        only, else WouldWait: a first verification reads the disk, and another process may have reset a chunk since
        it was looked at)."""
        verified, mark, chunk = self._verified, stream.source + 1, self._chunk
        for blob in blobs:
            if verified[blob] == mark:
                continue
            if not wait:
                raise WouldWait
            if not self._verify(stream, blob, start + (blob - blobs[0]) * chunk):
                return False
        return True

    def _release(self, stream: _Stream) -> None:
        with self._lock:
            stream.users -= 1

    def _covers(self, stream: _Stream, end: int, shard: int) -> bool:
        """Whether the copy still holds the bytes up to ``end``, unchanged since its chunks were verified: a copy cut
        after its chunks were verified would be spliced short, and the kernel takes a short reply for the file's end
        (it shrank the file for the rest of the mount); a copy written to since (its change time moved: ``cp`` or
        ``rsync --inplace`` over it) may hold other bytes in any chunk (its change time and size are compared: two
        writes in one tick of the kernel's coarse clock leave the time as it was).  Every chunk verified in that copy is then
        verified again before it is spliced from it; the copy path reads them meanwhile (another copy, or EIO and a
        log line).  A copy written while it serves (a lazy cache, filled as it is read) is judged by its size."""
        try:
            st = os.fstat(stream.fd)
        except OSError:
            st = None
        if st is not None and st.st_size >= end and (self._filled[stream.source] or
                                                      self._changed[stream.source, shard] in (0, _identity(st))):
            return True
        self._forget(stream.source)  # every chunk verified in this copy: it may come back changed
        return False

    def _forget(self, source: int) -> None:
        """Every chunk verified in ``source``'s copies is to be verified again before it is served from there, by a read
        of its own (never on the word of the copy path: :meth:`vouch`)."""
        self._was_cut[source] = 1
        self._changed[source] = 0
        verified = np.frombuffer(self._memory, np.uint8, self._blobs, 8 * self._copies)
        verified[verified == source + 1] = 0

    def unreadable(self, located: Located, why: str) -> None:
        """The copy's bytes could not be read for a reply (a disk error under a splice: the reader got the error):
        said once, as the copy path says a failed read, and every chunk of that copy verified again before it is
        served from there (the copy path then finds another copy, or answers EIO)."""
        self._forget(located.stream.source)
        self._fault(located.entry, located.blobs[0], f"{self._sources[located.stream.source].name}: {why}")

    def _where(self, blob: int, shard: int, wait: bool) -> tuple[int, int] | None:
        """The first source that may hold the blob, and where it keeps it (None: that source cannot say)."""
        for i, source in enumerate(self._sources):
            if not self._in_place[i]:
                return None  # a peer: read by the copy path
            try:
                place = source.place(blob, shard, self._offset[blob], wait)  # type: ignore[attr-defined]
            except NotHeld:
                continue
            except (OSError, FanfsError):  # a copy gone bad: the copy path says so, and asks the next source
                return None
            return None if place is None else (i, place)
        return None

    def share_across_forks(self) -> None:
        """Before a mount forks its serving processes: the verification locks shared with them, so that a chunk is
        verified once by one of them (and a bad one logged once), not once by each.  (A reader in one process, such
        as an in-process fast path, makes cheap locks of its own at its first verification instead.)"""
        self._verifying = [multiprocessing.get_context("fork").Lock() for _ in range(VERIFY_LOCKS)]
        self._verifying_shared = True

    def _verify(self, stream: _Stream, blob: int, position: int) -> bool:
        """Read the blob's bytes in this copy once and check them; the page cache then holds them for the splice.
        (The kernel's read-ahead asks for neighbouring parts of one chunk at once: one thread reads it, the others wait.)"""
        locks = self._verifying
        if locks is None:
            with self._lock:
                locks = self._verifying = self._verifying or [threading.Lock() for _ in range(VERIFY_LOCKS)]
        with locks[blob % VERIFY_LOCKS]:
            return self._verified[blob] == stream.source + 1 or self._check(stream, blob, position)

    def _check(self, stream: _Stream, blob: int, position: int) -> bool:
        length = self._stored[blob]
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._buffers.buffer = bytearray(max(length, self._chunk))
        view = memoryview(buffer)[:length]
        try:
            got = os.preadv(stream.fd, [view], position)
        except OSError:
            return False
        if got != length or checksum(view) != self._checksum[blob]:
            self._sources[stream.source].rejected(blob)
            return False
        try:  # the copy as it was when its chunk was checked: a change since is seen by _covers
            changed = _identity(os.fstat(stream.fd))
        except OSError:
            return False
        shard = self._shard[stream.entry]
        if self._changed[stream.source, shard] == 0:
            self._changed[stream.source, shard] = changed
        elif self._changed[stream.source, shard] != changed:
            return False
        self._verified[blob] = stream.source + 1
        self._stats.bytes_verified += length
        return True

    def _stream(self, entry: int, source: int) -> _Stream | None:
        """This file's descriptor on the copy in ``source`` (opened now if it has none there), marked in use; None if
        the file's descriptor on another copy is in a reply right now (this read then takes the copy path)."""
        with self._lock:
            stream = self._streams.get(entry)
            if stream is not None:
                if stream.source == source:
                    self._streams.move_to_end(entry)
                    stream.users += 1
                    return stream
                if stream.users:
                    return None
                os.close(self._streams.pop(entry).fd)
        try:
            fd = self._sources[source].reopen(self._shard[entry], self._offset[self._first[entry]])  # type: ignore[attr-defined]
        except OSError:
            fd = None
        if fd is None:
            return None
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
        fresh = _Stream(fd, source, entry)
        fresh.users = 1
        with self._lock:
            if entry in self._streams:  # another thread opened one meanwhile: this one serves this read, then goes
                self._streams[-1 - fd] = fresh
            else:
                self._streams[entry] = fresh
            idle = [key for key, s in self._streams.items() if not s.users][:max(0, len(self._streams) - STREAMS)]
            for key in idle:  # least recently used first, never one in a reply
                os.close(self._streams.pop(key).fd)
        return fresh

    def after_fork(self) -> None:
        """In a forked serving process: descriptors and read-ahead state of its own (the parent's are closed here)."""
        self._lock = threading.Lock()
        if not self._verifying_shared:
            self._verifying = None  # another thread of the parent may have held one at the fork
        _close_streams(self._streams)

    def close(self) -> None:
        with self._lock:
            _close_streams(self._streams)
        self._close_memory()


def _close_streams(streams: OrderedDict[int, _Stream]) -> None:
    for stream in streams.values():
        os.close(stream.fd)
    streams.clear()


def _identity(st: os.stat_result) -> int:
    """A copy's change time and size in one number (64 bits; 0 is never one): any write moves one or the other."""
    return (st.st_ctime_ns ^ (st.st_size << 20) ^ st.st_size) & 0x7FFF_FFFF_FFFF_FFFF or 1
