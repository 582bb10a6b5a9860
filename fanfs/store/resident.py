"""Reading only what is in memory: whether bytes of a file would come from the page cache or wait on its device.

A serving loop answers a request inline only when that cannot wait on a disk (every other reader's requests queue
behind it); anything else goes to threads that may wait, several at once.  Two questions:

* :meth:`NoWaitReads.pread`: the bytes, if they are all in the page cache (``preadv2`` with ``RWF_NOWAIT``, Linux
  4.14+, into a fresh ``bytes`` as ``os.pread`` makes one, so the read costs no copy more); else
  :class:`~fanfs.errors.WouldWait`.  A file system that refuses ``RWF_NOWAIT`` is read plainly if it never waits
  (tmpfs, ramfs), else only where :func:`in_memory` says the pages are there.
* :func:`in_memory`: whether a range is all in the page cache, without reading it (for a spliced reply, whose bytes
  this process never reads, and for a read-ahead that skips what is there).  The kernel answers in one of three
  ways, the first it offers (measured here, ext4 on a virtio disk, 110 KB / 1 MiB ranges):

  - ``cachestat(2)``, Linux 6.5+: 1.5 us;
  - ``mincore(2)`` over a mapping of the range, every kernel: 7 / 15 us.  Since Linux 5.0 (and RHEL 8's 4.18) it
    tells the truth only about a file the process owns or may write (or holds CAP_FOWNER for); of any other file it
    says every page is in memory.  So it is asked only about files this user owns (a node's staged copy, a user's
    own store) or as root;
  - a ``preadv2(RWF_NOWAIT)`` read of the range into a scratch buffer, Linux 4.14+: 10 / 108 us (it copies).

  Where none can say, the answer is False: the caller then hands the read to a thread, or reads the range ahead.
  :data:`ANSWERS` counts which way answered (``fanfs stats`` shows it).

A record kind reads a file through a reader (:class:`fanfs.records.base.Reader`): for a read that must not wait, that
is :class:`InMemory`, the store's blobs but WouldWait for any that is not in memory, counted only once the whole read
is done (:class:`Tally`).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from typing import Any

from ..errors import WouldWait
from ..records import FULL
from ..records.base import Span
from ..util.cbytes import BYTES_DATA, IoVec, new_bytes
from .stats import Stats

_libc = ctypes.CDLL(None, use_errno=True)
_preadv2 = _libc.preadv2
_preadv2.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_int, ctypes.c_long, ctypes.c_int]
_preadv2.restype = ctypes.c_ssize_t
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_mmap = _libc.mmap
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mmap.restype = ctypes.c_void_p
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_mincore = _libc.mincore
_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_fstatfs = _libc.fstatfs
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]

SYS_CACHESTAT = 451
"""cachestat's number on every architecture Linux numbers new calls alike on (x86_64, aarch64, ppc64le, s390x...)."""
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MAP_FAILED = ctypes.c_void_p(-1).value
_LOW_BITS = bytes(i & 1 for i in range(256))  # mincore's byte per page: bit 0 says resident, the others are reserved
_NEVER_WAITS = {0x01021994, 0x858458F6}  # tmpfs, ramfs (statfs f_type): their pages are memory
_PROBE_MAX = 4 << 20
"""Bytes a probe read copies at most at once (a longer range is probed in steps)."""


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [("cache", ctypes.c_uint64), ("dirty", ctypes.c_uint64), ("writeback", ctypes.c_uint64),
                ("evicted", ctypes.c_uint64), ("recently_evicted", ctypes.c_uint64)]


class Unsupported(OSError):
    """The file's file system refuses to read without waiting (``RWF_NOWAIT``): tmpfs, which never waits, or a file
    system of an older kernel."""


ANSWERS = {"cachestat": 0, "mincore": 0, "probe": 0, "unknown": 0}
"""How many :func:`in_memory` questions each way answered in this process ("unknown": none could)."""
_state = threading.local()
_cachestat_works = True  # until the kernel says it has no such call (before 6.5) or forbids it (a seccomp policy)
_owner_caps: tuple[int, bool] | None = None  # (euid, CAP_FOWNER held) for the last euid seen


def pread_resident(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` of ``fd`` if every one is in the page cache; else WouldWait (a short read too:
    part of it missing, or the file ends before: the thread that waits finds out which); Unsupported where the file
    system refuses ``RWF_NOWAIT`` (or the kernel has no ``preadv2``)."""
    data = new_bytes(None, length)  # not yet seen by anyone: filled here before it is returned
    vec = IoVec(id(data) + BYTES_DATA, length)
    got = _preadv2(fd, ctypes.byref(vec), 1, offset, os.RWF_NOWAIT)
    if got == length:
        return data
    if got < 0:
        code = ctypes.get_errno()
        if code == errno.EAGAIN:
            raise WouldWait
        if code in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise Unsupported(code, os.strerror(code))
        raise OSError(code, os.strerror(code))
    raise WouldWait


class NoWaitReads:
    """Reads that must not wait on a device, of the files of one place (a shard directory, a cache file); remembers
    whether its file system refuses ``RWF_NOWAIT``, and then whether it never waits anyway."""

    __slots__ = ("_way",)

    def __init__(self) -> None:
        self._way = "nowait"  # then "plain" (tmpfs, ramfs) or "checked" (in_memory, then a plain read)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        """As :func:`pread_resident`, on any file system."""
        if length <= 0:
            return b""
        if self._way == "nowait":
            try:
                return pread_resident(fd, length, offset)
            except Unsupported:
                self._way = "plain" if never_waits(fd) else "checked"
        if self._way == "checked" and not in_memory(fd, offset, length):
            raise WouldWait
        return os.pread(fd, length, offset)


def never_waits(fd: int) -> bool:
    """Whether the file's pages are memory itself (tmpfs, ramfs): a read of it never waits on a device."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first field, a long
    if _fstatfs(fd, buffer) != 0:
        return False
    return ctypes.c_long.from_buffer(buffer).value in _NEVER_WAITS


def in_memory(fd: int, offset: int, length: int) -> bool:
    """Whether every page of ``[offset, offset + length)`` of ``fd`` is in the page cache (False where the kernel
    cannot say: the caller then acts as if they were not)."""
    if length <= 0:
        return True
    first = offset // _PAGE * _PAGE
    span = -(-(offset + length) // _PAGE) * _PAGE - first
    if _cachestat_works:
        answer = _cachestat(fd, first, span)
        if answer is not None:
            ANSWERS["cachestat"] += 1
            return answer
    if _mincore_tells_truth(fd):
        answer = _mincore_says(fd, first, span)
        if answer is not None:
            ANSWERS["mincore"] += 1
            return answer
    answer = _probe(fd, offset, length)
    ANSWERS["probe" if answer is not None else "unknown"] += 1
    return bool(answer)


def _cachestat(fd: int, first: int, span: int) -> bool | None:
    global _cachestat_works
    stat = _CacheStat()
    if _syscall(SYS_CACHESTAT, fd, ctypes.byref(_CacheStatRange(first, span)), ctypes.byref(stat), 0) == 0:
        return int(stat.cache) * _PAGE >= span
    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):  # a kernel before 6.5, or a policy that forbids it
        _cachestat_works = False
    return None


def _mincore_tells_truth(fd: int) -> bool:
    """Whether mincore reports the page cache of this file to this process: its owner, or CAP_FOWNER (root)."""
    global _owner_caps
    euid = os.geteuid()
    if _owner_caps is None or _owner_caps[0] != euid:
        _owner_caps = euid, _holds_cap_fowner()
    try:
        return _owner_caps[1] or os.fstat(fd).st_uid == euid
    except OSError:
        return False


def _holds_cap_fowner() -> bool:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 3))  # CAP_FOWNER
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mincore_says(fd: int, first: int, span: int) -> bool | None:
    address = _mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, first)
    if address in (None, _MAP_FAILED):
        return None
    try:
        pages = span // _PAGE
        vector = getattr(_state, "vector", None)
        if vector is None or len(vector) < pages:
            vector = _state.vector = ctypes.create_string_buffer(max(pages, 256))
        if _mincore(address, span, vector) != 0:
            return None
        return vector.raw[:pages].translate(_LOW_BITS).count(0) == 0
    finally:
        _munmap(address, span)


def _probe(fd: int, offset: int, length: int) -> bool | None:
    """Read the range without waiting into a scratch buffer: all of it came (True), or not (False); None where the
    file system refuses to read so (tmpfs, ramfs: True, they never wait)."""
    scratch = getattr(_state, "scratch", None)
    if scratch is None:
        scratch = _state.scratch = ctypes.create_string_buffer(_PROBE_MAX)
    end = offset + length
    while offset < end:
        step = min(end - offset, _PROBE_MAX)
        got = _preadv2(fd, ctypes.byref(IoVec(ctypes.addressof(scratch), step)), 1, offset, os.RWF_NOWAIT)
        if got < 0:
            code = ctypes.get_errno()
            if code == errno.EAGAIN:
                return False
            return True if code in (errno.EOPNOTSUPP, errno.ENOSYS) and never_waits(fd) else None
        if got < step:
            return False
        offset += step
    return True


class Tally:
    """What one read that must not wait did, added to the store's :class:`Stats` only once the whole read was answered:
    a read the serving loop gives up on (WouldWait: a blob not in memory) is made again by a thread, and counted
    there, once, by what it did."""

    __slots__ = ("cache_hits", "cache_misses", "_stored")

    def __init__(self) -> None:
        self.cache_hits = self.cache_misses = 0
        self._stored: list[tuple[int, str, int]] = []

    def stored(self, layer: int, source: str, length: int) -> None:
        self._stored.append((layer, source, length))

    def commit(self, stats: Stats) -> None:
        """Add what the read did to ``stats``, and start over for the next read."""
        stats.cache_hits += self.cache_hits
        stats.cache_misses += self.cache_misses
        for layer, source, length in self._stored:
            stats.stored(layer, source, length)
        self.discard()

    def discard(self) -> None:
        self.cache_hits = self.cache_misses = 0
        self._stored.clear()


class InMemory:
    """The store as a record kind reads it for a read that must not wait (a serving loop's): the same blobs, verified
    and decoded, but :class:`~fanfs.errors.WouldWait` for any blob that is not in memory (a cache, the page cache),
    and counted only once the read is done (:class:`Tally`).  One per thread: :meth:`Store.spans` makes it."""

    def __init__(self, store: Any) -> None:
        """``store``: the :class:`~fanfs.store.Store` it reads."""
        self._store = store
        self.index, self.chunk_size, self.cache = store.index, store.chunk_size, store.cache
        self.tally = Tally()

    def blob(self, entry: int, blob: int, layer: int = 0, keep: bool = True, stream: bool = False) -> bytes:
        return self._store.blob(entry, blob, layer, keep, stream, self.tally, False)

    def read(self, entry: int, offset: int, size: int, view: int = FULL) -> bytes:
        return join(self._store.kind(entry).spans(self, entry, view, offset, size))

    def fault(self, entry: int, blob: int, why: str) -> OSError:
        return self._store.fault(entry, blob, why)


def join(spans: list[Span]) -> bytes:
    """The bytes of ``spans`` as one bytes object (no copy for a span that is a whole bytes object)."""
    if len(spans) == 1:
        data, start, length = spans[0]
        return data if start == 0 and length == len(data) and type(data) is bytes else data[start:start + length]
    return b"".join(data[start:start + length] for data, start, length in spans)
