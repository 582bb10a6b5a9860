"""Decoded blobs kept in memory: a byte-bounded LRU (:class:`BlobCache`), and the chunks of large files read in
parts, the last few kept, each found, verified and decoded once (:class:`StreamChunks`).

The kernel cuts a large read into requests that do not follow the chunks, so a chunk is wanted by two
requests (1 MiB ones off the chunks' edges) or eight (the kernel's 128 KiB), often at the same moment in
several threads (a file on a peer is read by worker threads) or serving processes.  The last chunks are kept
in a small cache whose memory the next ones reuse (in the store's large cache, a 150 MB file read in parts
faulted in fresh pages all the way and pushed out the small files); a chunk that one thread loads is waited
for by the others of its process, and one that another serving process loads is waited for through
:class:`~.shared.SharedChunks`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import WouldWait
from .shared import SharedChunks

STREAM_CACHE = 8 << 20
"""Bytes of chunks kept between the requests that read parts of them (per serving process)."""
LOADING_WAIT = 60.0
"""Seconds a thread waits for another that loads the chunk it wants (longer than any peer's timeout)."""


class BlobCache:
    """Maps blob number -> decoded bytes; evicts least recently used past ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._items: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: int) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: int, data: bytes) -> None:
        if len(data) > self.capacity // 4:
            return  # one huge blob would flush everything else
        with self._lock:
            if key in self._items:
                return
            self._items[key] = data
            self.used += len(data)
            while self.used > self.capacity:
                _, old = self._items.popitem(last=False)
                self.used -= len(old)

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread of the parent may have held the old one at the fork)."""
        self._lock = threading.Lock()


class StreamChunks:
    """The chunks of large files of one store in one process; ``shared`` set (before a fork) to share them."""

    def __init__(self, capacity: int = STREAM_CACHE) -> None:
        self.cache = BlobCache(capacity)
        self.shared: SharedChunks | None = None
        self._loading: dict[int, _Loading] = {}  # chunks being loaded now, by blob
        self._lock = threading.Lock()

    def load(self, blob: int, keep: bool, load: Callable[[], bytes], stats: Any, share: bool = False,
             wait: bool = True) -> bytes:
        """A chunk not in :attr:`cache`: ``load()``-ed here, or taken from the thread or process that loads it.
        ``keep``: it is read in parts (kept for the next request); ``share``: with the other processes, if it is
        read in parts and decoding it costs more than reading it again (see :mod:`.shared`).  ``wait=False``:
        WouldWait rather than wait for another thread or process that loads it."""
        with self._lock:
            loading = self._loading.get(blob)
            mine = loading is None
            if mine:
                loading = self._loading[blob] = _Loading()
            elif not wait:
                raise WouldWait
            else:
                loading.waiters += 1
        if not mine:
            loading.done.wait(LOADING_WAIT)
            data = self.cache.get(blob)
            if data is not None:
                stats.cache_hits += 1
                return data  # else the loader failed (or is slower than a peer's timeout): try here, as it did
        data = None
        try:
            data = self._load(blob, keep and share, load, stats, wait)
            return data
        finally:
            if mine:
                kept = data is not None and (keep or loading.waiters > 0)
                if kept:  # before the entry goes: a thread that looks after that finds it
                    self.cache.put(blob, data)
                if self._loaded(blob, loading) and data is not None and not kept:
                    self.cache.put(blob, data)  # a waiter came after the look above
                loading.done.set()  # failed (data None): each waiter then tries for itself
            elif data is not None and keep:
                self.cache.put(blob, data)

    def _load(self, blob: int, share: bool, load: Callable[[], bytes], stats: Any, wait: bool) -> bytes:
        shared = self.shared if share else None
        data = shared.get_or_claim(blob, wait) if shared is not None else None
        if data is not None:  # another serving process loaded it
            stats.cache_hits += 1
            return data
        try:
            data = load()
        except BaseException:
            if shared is not None:
                shared.abandon(blob)
            raise
        stats.cache_misses += 1
        if shared is not None:
            shared.put(blob, data)
        return data

    def _loaded(self, blob: int, loading: _Loading) -> int:
        """A chunk's load is over: forget it; returns how many threads wait for it."""
        with self._lock:
            del self._loading[blob]
            return loading.waiters

    def after_fork(self) -> None:
        """In a forked child: new locks, and no load of another thread in flight."""
        self.cache.after_fork()
        self._loading, self._lock = {}, threading.Lock()


class _Loading:
    """A chunk one thread is loading: how many others wait for it, and the event that ends their wait."""

    __slots__ = ("waiters", "done")

    def __init__(self) -> None:
        self.waiters = 0
        self.done = threading.Event()
