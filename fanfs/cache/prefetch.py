"""Fetching ahead of a lazily staged node's readers (:mod:`.follow` follows their order): into its cache.

The blobs of the next files of every stream that are not in the node's cache, at the presentation shown now: those
the node keeps from the shared store into the cache, for good; the others from a holder that keeps them (a peer) or
else from the shared store, into the cache's *window* (:func:`fanfs.cache.capacity.window_bytes`, the budget) as
blobs fetched ahead.  So the readers find what they open local, and the network and the shared store work while they
compute.  A blob fetched ahead is never dropped before it is read or given up (a read is waiting for it); then it is
the first to go when the window needs room.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..errors import FanfsError, NotHeld
from ..peers.peer import RemoteBlobs
from ..records import Presentation
from ..store import Store
from ..util.units import human_size
from .follow import Issued, OrderFollower
from .lazy import LazyShare, view_blobs
from .localcache import AHEAD, KEPT, SPENT


class Prefetcher(OrderFollower):
    """Fetches ahead of a lazily staged node's readers into its cache, within the window its capacity leaves."""

    what = "fetching ahead"

    @property
    def how(self) -> str:
        return f"fetching the next files' blobs into its cache, within a window of {human_size(self.budget)}"

    def __init__(self, store: Store, share: LazyShare, remotes: list[RemoteBlobs], presentation: Presentation) -> None:
        super().__init__(store, presentation, share.plan.window)
        self.share, self.remotes, self.cache = share, remotes, share.cache
        self._keep = memoryview(share.local.held)
        self._footprint = share.plan.footprint
        self._shard_of = store.index.shard
        self._window: dict[int, int] = {}  # blob -> footprint: what this prefetcher put in the window, not dropped yet
        self._droppable: deque[int] = deque()  # window blobs read or given up, oldest first
        self.counts.update({"kept_fills": 0, "from_peers": 0, "from_shared": 0, "dropped": 0})

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "window_bytes": self.used}

    def plan(self, entry: int, view: int) -> Issued | None:
        first, count = view_blobs(self.store, entry, view)
        blobs = [b for b in range(first, first + count) if self.cache.state(b) < AHEAD]
        if not blobs:
            return None
        return Issued(entry, 0, sum(int(self._footprint[b]) for b in self._ahead(blobs) if b not in self._window), blobs)

    def _ahead(self, blobs: list[int]) -> list[int]:
        """Those of ``blobs`` that go to the window (the ones the node keeps are its own for good)."""
        return [b for b in blobs if not self._keep[b]]

    def room(self, need: int) -> bool:
        """Whether ``need`` more bytes fit the window, dropping blobs read or given up (oldest first) to make room;
        a blob fetched ahead again since, or held by a read now, stays."""
        held: deque[int] = deque()
        while self.used + need > self.budget and self._droppable:
            blob = self._droppable.popleft()
            state = self.cache.state(blob)
            if blob not in self._window or state == AHEAD:
                continue  # dropped already, or wanted again (its new file retires it later)
            if state != SPENT or self.cache.drop(blob):
                self.used -= self._window.pop(blob)
                self.counts["dropped"] += 1
            else:
                held.append(blob)
        self._droppable.extendleft(reversed(held))
        return self.used + need <= self.budget

    def take(self, item: Issued) -> None:
        super().take(item)
        for blob in self._ahead(item.work):
            self._window.setdefault(blob, int(self._footprint[blob]))

    def retire(self, item: Issued, read: bool) -> None:
        """A file read or given up: its window blobs stay, the first to go when the window needs room (a file given
        up: spent, so that they may)."""
        window = self._ahead(item.work)
        if not read:
            for blob in window:
                self.cache.spend(blob)
        self._droppable.extend(window)

    def fetch(self, item: Issued) -> None:
        """Fetch a file's blobs: the node's own into the cache for good, the others into the window from a peer that
        keeps them or from the shared store."""
        ix, shared, origin = self.store.index, self.share.shared, self.share.local.shared  # origin: of kept blobs
        shard = int(self._shard_of[item.entry])
        got = self._from_peers(self._ahead(item.work), shard)
        for blob in item.work:
            offset, length = int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
            data = got.get(blob)
            source = "kept_fills" if self._keep[blob] else "from_peers" if data is not None else "from_shared"
            _, fetched, why = self.cache.fill(
                blob, lambda: data if data is not None else (origin if self._keep[blob] else shared).read(
                    blob, shard, offset, length),
                KEPT if self._keep[blob] else AHEAD)
            if fetched and not why:
                self.count(source, length)

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
