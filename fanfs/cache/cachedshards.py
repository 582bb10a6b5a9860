"""A node's lazy cache as a shard source (``--stage lazy``): the blobs its :class:`~.localcache.DiskCache` holds, and
the blobs it keeps fetched into it at their first read.

A copy from here that fails the store's check is dropped by a thread of this source's, never by the reader that found
it: a serving loop's read must wait neither for a reader of that blob in another process (a drop waits for its lock)
nor for the disk that frees the blob's blocks.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ..errors import NotHeld, WouldWait
from ..store.sources import ShardSource
from .localcache import AHEAD, KEPT, REPORT_EVERY, DiskCache

log = logging.getLogger("fanfs")


class CachedShards(ShardSource):
    """A node's blobs from its :class:`DiskCache`: any blob that is there (kept, or fetched ahead of a read), and the
    blobs it keeps (``keep``, a bool per blob) fetched from ``shared`` at their first read.  Others are NotHeld: a
    peer or the shared store serves them."""

    written_while_serving = True  # filled as it is read: its change time moves by design (fanfs.store.extents)

    def __init__(self, cache: DiskCache, keep: np.ndarray, shared: ShardSource, name: str) -> None:
        self.cache = cache
        self.held = keep  # what a peer may ask this node for (its peer server checks it)
        self._keep = memoryview(keep)
        self.shared = shared
        self.name = name
        self.hits = self.hit_bytes = self.fills = self.fill_bytes = self.unkept = self.unkept_bytes = self.dropped = 0
        self._warned = -REPORT_EVERY
        self._lock = threading.Lock()
        self._rejected: list[int] = []  # blobs whose copies failed the check, to drop
        self._dropping: threading.Thread | None = None  # the thread dropping them, while there are some

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        data = self._here(blob, length, True)
        if data is not None:
            return data
        data, fetched, why = self.cache.fill(blob, lambda: self.shared.read(blob, shard, offset, length))
        if fetched:
            self.fills += 1
            self.fill_bytes += len(data)
        else:
            self.hits += 1
            self.hit_bytes += len(data)
        if why:
            self.unkept, self.unkept_bytes = self.unkept + 1, self.unkept_bytes + len(data)
            now = time.monotonic()
            if now - self._warned >= REPORT_EVERY:
                self._warned = now
                log.warning("cannot keep blob %d in %s: %s; it is read through from %s (%d so far)", blob,
                            self.cache.directory, why, self.shared.name, self.unkept)
        return data

    def read_resident(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        """A blob here whose bytes are in memory; WouldWait for any other (a fill from the shared store waits)."""
        data = self._here(blob, length, False)
        if data is None:
            raise WouldWait
        return data

    def _here(self, blob: int, length: int, wait: bool) -> bytes | None:
        """The copy here (counted as a hit), or None if the node keeps the blob but has no copy yet; NotHeld if it
        does not keep it."""
        data = self.cache.read(blob, length, wait)
        if data is not None:
            self.hits += 1
            self.hit_bytes += len(data)
            return data
        if not self._keep[blob]:
            raise NotHeld("not kept by this node")
        return None

    def place(self, blob: int, shard: int, offset: int, wait: bool = True) -> int | None:
        """A kept blob that is here (never dropped while the mount serves); None for others (read them)."""
        if (state := self.cache.state(blob)) < AHEAD and not self._keep[blob]:
            raise NotHeld("not kept by this node")
        return int(self.cache.slot[blob]) if state == KEPT else None

    def holds_in_place(self, blob: int) -> bool:
        return self.cache.state(blob) == KEPT  # written before it was marked kept: what was read is what is there

    def served_in_place(self, blob: int, length: int, from_start: bool) -> None:
        self.hits, self.hit_bytes = self.hits + from_start, self.hit_bytes + length

    def reopen(self, shard: int, offset: int) -> int | None:
        return self.cache.reopen()

    def rejected(self, blob: int) -> None:
        """The copy this gave failed the Store's check: it is dropped (by a thread: see the module), so that a read
        from then on fetches it again.  Until then the copy is read and rejected again, never served."""
        with self._lock:
            self._rejected.append(blob)
            if self._dropping is None:
                self._dropping = threading.Thread(target=self._drop_rejected, name="fanfs-drop", daemon=True)
                self._dropping.start()

    def _drop_rejected(self) -> None:
        while True:
            with self._lock:
                if not self._rejected:
                    self._dropping = None
                    return
                blob = self._rejected.pop()
            kept = self.cache.state(blob) == KEPT
            if self.cache.drop(blob, wait=True) and kept:
                self.dropped += 1

    def counters(self) -> dict[str, dict[str, int]]:
        """This process's figures, which add up over a node's processes (``fanfs stats``)."""
        return {"cache": {"hit_blobs": self.hits, "hit_bytes": self.hit_bytes, "fills": self.fills,
                          "fill_bytes": self.fill_bytes, "unkept": self.unkept, "unkept_bytes": self.unkept_bytes,
                          "dropped": self.dropped,
                          **getattr(self.shared, "fill_counts", {})}}  # where the fills came from, if it says

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._rejected, self._dropping = [], None  # the parent's thread is not here
        self.cache.after_fork()

    def close(self) -> None:
        with self._lock:
            dropping = self._dropping
        if dropping is not None:
            dropping.join()  # its drops, before the cache's files close
        self.cache.close()
