"""Reading ahead of a lazily staged node's readers when the order they read in is known (NoPFS's idea).

The node is told the order (``fanfs ctl --order FILE``, or :class:`fanfs.train.OrderSampler` from the training
itself): one *stream* of files per reader that tells it, epochs one after another.  A few threads then fetch the
blobs of the next files of every stream that are not in the node's cache, at the presentation shown now: those the
node keeps from the shared store into the cache, for good; the others from a holder that keeps them (a peer) or
else from the shared store, into the cache's *window* (:func:`fanfs.cache.capacity.window_bytes`) as blobs
fetched ahead.  So the readers find what they open local, and the network and the shared store work while they
compute.  Without an order nothing of this runs.

How far ahead: at most :data:`AHEAD_FILES` files whose fetches were issued and which no reader has read since,
and the window's bytes.  The readers' progress is seen in the tick each read leaves on its blob (a shared array the
node's cache source writes, :class:`fanfs.cache.localcache.CachedShards`).  A file read before its fetch was issued
means the readers are ahead: the prefetcher skips forward.  Files no reader read while later ones were (an order not
quite followed) are given up after :data:`SLACK` positions.  A blob fetched ahead is never dropped before it is read
or given up (a read is waiting for it); then it is the first to go when the window needs room.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FanfsError, NotHeld
from ..records import Presentation
from ..store import Store
from .localcache import AHEAD, KEPT, SPENT, TICKS_PER_SECOND, tick
from .lazy import LazyShare, view_blobs
from .order import order_command
from ..peers.peer import RemoteBlobs

log = logging.getLogger("fanfs")

AHEAD_FILES = 256  # files fetched and not yet read, at most, over all streams
THREADS = 6  # fetches in flight
SLACK = 64  # positions a file may lag behind read ones before it is given up (readers of a loader interleave)
RECENT = 1.0  # seconds: a file read this recently when its turn comes was read already (the readers are ahead)
POLL = 0.01


@dataclass
class Stream:
    """One reader's order: entries, epochs back to back, and the next position to look at."""

    entries: np.ndarray
    position: int = 0


@dataclass
class Issued:
    """A file whose blobs are being fetched or were."""

    probe: int  # a blob every read of the file asks for: its tick says whether the file was read since
    since: int  # tick at issue
    window: list[int]  # the blobs it fetches into the window
    done: bool = False  # its fetches have ended


class Prefetcher:
    """Fetches ahead of a node's readers along their streams (one thread coordinating, :data:`THREADS` fetching)."""

    def __init__(self, store: Store, share: LazyShare, remotes: list[RemoteBlobs], presentation: Presentation) -> None:
        """``presentation``: the one shown now (set :attr:`presentation` at a switch): the blobs it reads are fetched."""
        assert share.cache is not None and share.plan is not None and share.touched is not None
        self.store, self.share, self.remotes = store, share, remotes
        self.cache = share.cache
        self.ticks = memoryview(share.touched)
        self.presentation = presentation
        self._keep = memoryview(share.local.held)
        self._footprint = share.plan.footprint
        self._window_max = share.plan.window
        self._shard_of = store.index.shard
        self._streams: dict[str, Stream] = {}
        self._turn = 0
        self._issued: deque[Issued] = deque()
        self._window: dict[int, int] = {}  # blob -> footprint: what this prefetcher put in the window, not dropped yet
        self.window_used = 0  # their bytes
        self._droppable: deque[int] = deque()  # window blobs read or given up, oldest first
        self._wake = threading.Condition()
        self._closed = False
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="fanfs-prefetch")
        self._thread: threading.Thread | None = None
        self.counts = {"files": 0, "skipped": 0, "given_up": 0, "kept_fills": 0, "from_peers": 0, "from_shared": 0,
                       "bytes": 0, "dropped": 0, "failed": 0}

    @property
    def ordered(self) -> bool:
        """Whether it was given an order (without one, nothing of this runs)."""
        return bool(self._streams)

    def order(self, name: str, entries: np.ndarray) -> None:
        """Follow ``entries`` (files, in the order one reader opens them) as stream ``name`` from now on."""
        with self._wake:
            self._streams[name] = Stream(np.asarray(entries, np.int64))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fanfs-ahead", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        with self._wake:
            return {**self.counts, "streams": {name: {"files": int(s.entries.size), "position": s.position}
                                               for name, s in self._streams.items()},
                    "window_bytes": self.window_used, "outstanding": len(self._issued)}

    # --- the coordinating thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                self._settle()
                while not self._closed and self._issue_one():
                    pass
                self._wake.wait(POLL)

    def _settle(self) -> None:
        """Retire, from the oldest, the issued files that were read since, or given up (unread while a file issued
        :data:`SLACK` later was read); their window blobs may be dropped from then on."""
        ticks, issued = self.ticks, self._issued
        last_read = -1
        for i, item in enumerate(issued):
            if item.done and ticks[item.probe] >= item.since:
                last_read = i
        while issued and issued[0].done:
            item = issued[0]
            if ticks[item.probe] < item.since:
                if last_read < SLACK:
                    break
                self.counts["given_up"] += 1
                for blob in item.window:
                    self.cache.spend(blob)
            issued.popleft()
            last_read -= 1
            self._droppable.extend(item.window)

    def _next_stream(self) -> Stream | None:
        """The next stream with files left, in turn."""
        names = list(self._streams)
        for k in range(len(names)):
            stream = self._streams[names[(self._turn + k) % len(names)]]
            if stream.position < stream.entries.size:
                self._turn = (self._turn + k + 1) % len(names)
                return stream
        return None

    def _issue_one(self) -> bool:
        """Look at the next file of the next stream and issue its fetches if it needs any; False when there is
        nothing to do now (no stream has files left, too many are in flight, or the window is full)."""
        if len(self._issued) >= AHEAD_FILES or (stream := self._next_stream()) is None:
            return False
        entry = int(stream.entries[stream.position])
        first, count = view_blobs(self.store, entry, self.store.view(entry, self.presentation))
        blobs = [b for b in range(first, first + count) if self.cache.state(b) < AHEAD]
        now = tick()
        if not blobs or now - self.ticks[first] < RECENT * TICKS_PER_SECOND:  # local, or read just now: we are late
            stream.position += 1
            self.counts["skipped"] += bool(blobs)
            return True
        ahead = [b for b in blobs if not self._keep[b]]
        need = sum(int(self._footprint[b]) for b in ahead if b not in self._window)
        if need > self._window_max:  # never fits: read through when it is read
            stream.position += 1
            return True
        if need and not self._room(need):
            return False
        stream.position += 1
        for blob in ahead:
            if blob not in self._window:
                self._window[blob] = int(self._footprint[blob])
        self.window_used += need
        item = Issued(first, now, ahead)
        self._issued.append(item)
        self.counts["files"] += 1
        self._pool.submit(self._fetch, item, blobs, int(self._shard_of[entry]))
        return True

    def _room(self, need: int) -> bool:
        """Whether ``need`` more bytes fit the window, dropping blobs read or given up (oldest first) to make room;
        a blob fetched ahead again since, or held by a read now, stays."""
        held: deque[int] = deque()
        while self.window_used + need > self._window_max and self._droppable:
            blob = self._droppable.popleft()
            state = self.cache.state(blob)
            if blob not in self._window or state == AHEAD:
                continue  # dropped already, or wanted again (its new file retires it later)
            if state != SPENT or self.cache.drop(blob):
                self.window_used -= self._window.pop(blob)
                self.counts["dropped"] += 1
            else:
                held.append(blob)
        self._droppable.extendleft(reversed(held))
        return self.window_used + need <= self._window_max

    # --- fetching (the pool's threads) -----------------------------------------------------------------

    def _fetch(self, item: Issued, blobs: list[int], shard: int) -> None:
        """Fetch ``blobs`` of one file (in ``shard``): the node's own into the cache for good, the others into the
        window from a peer that keeps them or from the shared store."""
        ix, shared, origin = self.store.index, self.share.shared, self.share.local.shared  # origin: of kept blobs
        try:
            got = self._from_peers(item.window, shard)
            for blob in blobs:
                offset, length = int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
                data = got.get(blob)
                source = "kept_fills" if self._keep[blob] else "from_peers" if data is not None else "from_shared"
                _, fetched, why = self.cache.fill(
                    blob, lambda: data if data is not None else (origin if self._keep[blob] else shared).read(
                        blob, shard, offset, length),
                    KEPT if self._keep[blob] else AHEAD)
                if fetched and not why:
                    self._count(source, length)
        except (OSError, FanfsError) as err:
            self._count("failed", 0)
            log.debug("fetching ahead in shard %d failed: %s", shard, err)
        except Exception:
            log.exception("fetching ahead failed")
        finally:
            with self._wake:
                item.done = True
                self._wake.notify()

    def _from_peers(self, blobs: list[int], shard: int) -> dict[int, bytes]:
        """What holders that keep them give of ``blobs`` (none kept here), a run in one round trip if they are one."""
        out: dict[int, bytes] = {}
        if not blobs or not self.remotes:
            return out
        stored = self.store.index.blob_stored
        if len(blobs) > 1 and blobs[-1] - blobs[0] == len(blobs) - 1:
            for remote in self.remotes:
                try:
                    data = remote.read_run(blobs[0], len(blobs))
                except (NotHeld, OSError, FanfsError):
                    continue
                pos = 0
                for blob in blobs:
                    out[blob] = data[pos:pos + int(stored[blob])]
                    pos += int(stored[blob])
                return out
        offsets = self.store.index.blob_offset
        for blob in blobs:
            for remote in self.remotes:
                try:
                    out[blob] = remote.read(blob, shard, int(offsets[blob]), int(stored[blob]))
                    break
                except (NotHeld, OSError, FanfsError):
                    continue
        return out

    def _count(self, what: str, nbytes: int) -> None:
        with self._wake:
            self.counts[what] += 1
            self.counts["bytes"] += nbytes


def follow_orders(store: Store, share: LazyShare, remotes: list[RemoteBlobs], presentation: Presentation,
                  mountpoint: str) -> tuple[Prefetcher, dict[str, Callable[[dict[str, Any]], dict[str, Any]]]]:
    """A lazily staged node's prefetcher, and the control command that gives it orders (``fanfs ctl --order``)."""
    prefetcher = Prefetcher(store, share, remotes, presentation)
    return prefetcher, {"order": order_command(prefetcher.order, store.index, mountpoint)}
