"""Reading ahead of a node's readers into the page cache (:mod:`.follow` follows their order): a mount straight on a
store, or on a node's staged copies, whose next files lie on a local disk.

For each next file, the ranges of its blobs (at the presentation shown now) in the files this node keeps open, a
shard's neighbouring blobs merged into one range, are handed to the kernel (``posix_fadvise(WILLNEED)``: it queues
the reads and returns), so many reads of a cold disk are in flight at once, ahead of the readers, and a file's
read then finds its bytes in memory and is answered in the serving loop.  The budget is the bytes asked for files
no reader has read yet (``fanfs mount --prefetch``); once read or given up, a file's pages are the kernel's to
keep or drop.  A file whose bytes are all in memory already takes none of it; blobs this node reads from a peer or
from a store on a network file system are not read ahead (a peer's are the lazy cache's business, :mod:`.prefetch`).
"""

from __future__ import annotations

import os

from ..errors import FanfsError, NotHeld
from ..records import Presentation
from ..store import Store
from ..store.sources import Descriptors
from ..util.units import human_size
from ..store.resident import in_memory
from .follow import Issued, OrderFollower
from .lazy import view_blobs

GAP = 256 << 10
"""Bytes between two blobs of one shard below which they are read ahead as one range (reading the gap costs less
than a second seek)."""


class PageCacheAhead(OrderFollower):
    """Has the kernel read the next files' blobs from this node's files into its page cache, within ``budget`` bytes."""

    what = "reading ahead"
    inline = True  # posix_fadvise queues the reads and returns: measured, 6 pool threads took 40% of the daemon's CPU

    @property
    def how(self) -> str:
        return f"reading the next files ahead into the page cache, within {human_size(self.budget)} (--prefetch)"

    def __init__(self, store: Store, presentation: Presentation, budget: int) -> None:
        super().__init__(store, presentation, budget)
        self._files = [source for source in store.sources if isinstance(source, Descriptors)]
        ix = store.index.items
        self._shard, self._offset, self._stored = ix.shard, ix.blob_offset, ix.blob_stored
        self.counts.update({"in_memory": 0, "advised": 0})  # files asked of the kernel (it reads what it will)

    def plan(self, entry: int, view: int) -> Issued | None:
        first, count = view_blobs(self.store, entry, view)
        shard, offsets, stored = self._shard[entry], self._offset, self._stored
        runs: list[list[int]] = []  # [fd, start, end]
        for blob in range(first, first + count):
            length = stored[blob]
            fd = self._descriptor(blob, shard) if length else None
            if fd is None:
                continue
            start = offsets[blob]
            if runs and runs[-1][0] == fd and 0 <= start - runs[-1][2] <= GAP:
                runs[-1][2] = max(runs[-1][2], start + length)
            else:
                runs.append([fd, start, start + length])
        if not runs:
            return None
        if all(in_memory(fd, start, end - start) for fd, start, end in runs):
            self.count("in_memory")
            return None
        return Issued(entry, 0, sum(end - start for _, start, end in runs), runs)

    def _descriptor(self, blob: int, shard: int) -> int | None:
        """The descriptor of the first copy this node keeps of the blob (None: none it may read ahead)."""
        for source in self._files:
            try:
                return source.descriptor(blob, shard)
            except NotHeld:
                continue
            except (OSError, FanfsError):  # a copy gone bad: its read says so
                return None
        return None

    def fetch(self, item: Issued) -> None:
        for fd, start, end in item.work:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        self.count("advised", item.held)
