"""Reading ahead of a node's readers when the order they read in is known (NoPFS's idea), within a budget.

The node is told the order (``fanfs ctl --order FILE``, or a sampler of :mod:`fanfs.train` from the training itself):
one *stream* of files per reader that tells it, epochs one after another.  A coordinating thread looks at the next
files of every stream, in turn, and has what their reads will need fetched ahead by a few threads, at the
presentation shown now, so the readers find it in memory or on the node's disk.  What "fetched" means is a
subclass's: :class:`~.prefetch.Prefetcher` fills a lazily staged node's cache (from a peer or the shared store),
:class:`~.pagecache.PageCacheAhead` has the kernel read a node's copies or the store into its page cache.  Without an
order nothing of this runs.  A stream's order is read from its file a piece at a time as the coordinating thread
reaches it (:class:`~.order.Stream`): of an order of any length, memory holds a piece.

How far ahead: at most :data:`AHEAD_FILES` files whose fetches were issued and which no reader has read since, and
the *budget*: bytes fetched ahead for files not read yet (a subclass says what a file holds of it, and when it gives
it back).  The readers' progress is seen in the tick each read leaves on its file (:meth:`fanfs.store.Store.
follow_reads`, written by every serving process and every reader of ``fanfs run``).  A file read just now when its
turn comes means the readers are ahead: it is skipped.  Files no reader read while later ones were (an order not
quite followed) are given up after :data:`SLACK` positions.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import FanfsError
from ..records import Presentation
from ..store import Store
from ..store.stats import TICKS_PER_SECOND, tick
from ..util.units import human_size
from .order import Stream

log = logging.getLogger("fanfs")

AHEAD_FILES = 256  # files fetched and not yet read, at most, over all streams
THREADS = 6  # fetches in flight
SLACK = 64  # positions a file may lag behind read ones before it is given up (readers of a loader interleave)
STALE = 30.0  # seconds after which a file fetched ahead and not read since is given up (the kernel may hold it: a
# file whose pages the kernel keeps from an earlier read is read without a request, so no read of it is ever seen)
RECENT = 1.0  # seconds: a file read this recently when its turn comes was read already (the readers are ahead)
POLL = 0.01
MAX_STREAMS = 64
"""Streams followed at once: a new name past them replaces the one told least recently (each holds its order's file
open, and ``fanfs stats`` lists them all)."""


@dataclass
class Issued:
    """A file whose fetches were issued: what it holds of the budget (``held`` bytes) until a reader reads it or it
    is given up, and what its fetches are."""

    entry: int
    since: int  # tick at issue
    held: int
    work: list[Any] = field(default_factory=list)  # what to fetch, in the subclass's terms
    done: bool = False  # its fetches have ended


class OrderFollower:
    """Follows the readers' streams, issuing fetches ahead of them; a subclass plans and makes the fetches."""

    what = "read ahead"
    inline = False
    """Whether a fetch is made by the coordinating thread itself (one that only asks the kernel and returns: a pool's
    threads cost more than the call), not by the pool's."""

    @property
    def how(self) -> str:
        """How it reads ahead, for a user (``fanfs ctl --order`` says it)."""
        return f"reading ahead within {human_size(self.budget)}"

    def __init__(self, store: Store, presentation: Presentation, budget: int) -> None:
        """``presentation``: the one shown now (set :attr:`presentation` at a switch); ``budget``: bytes ahead, at most."""
        self.store, self.presentation, self.budget = store, presentation, budget
        self.ticks = store.follow_reads()
        self.used = 0  # bytes of the budget held now
        self.waiting = ""  # what the coordinating thread waits for, if it does: "readers", "budget" or "orders"
        self._streams: dict[str, Stream] = {}  # the one told least recently first
        self._replaced: list[Stream] = []  # for the coordinating thread to close (it may be reading them)
        self._turn = 0
        self._issued: deque[Issued] = deque()
        # The lock guards what other threads change or read: the streams (order, stats), the counts (the pool's
        # threads), each issued file's ``done``.  The coordinating thread holds it for one step of bookkeeping at a
        # time, never while it reads an order's file or asks the kernel about a file (plan): a walk over files in
        # memory already (a warm epoch, millions of them) never keeps stats or a new order waiting.
        self._wake = threading.Condition()
        self._closed = False
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="fanfs-ahead")
        self._thread: threading.Thread | None = None
        self.counts = {"files": 0, "skipped": 0, "given_up": 0, "bytes": 0, "failed": 0, "too_large": 0}

    @property
    def ordered(self) -> bool:
        """Whether it was given an order (without one, nothing of this runs)."""
        return bool(self._streams)

    def order(self, name: str, stream: Stream) -> None:
        """Follow ``stream`` (files, in the order one reader opens them) as stream ``name`` from now on, in place of
        the one of that name (or, past :data:`MAX_STREAMS`, of the one told least recently)."""
        with self._wake:
            if self._closed:
                raise ValueError("the mount is ending: it takes no order")
            if name in self._streams:
                self._replaced.append(self._streams.pop(name))
            self._streams[name] = stream
            while len(self._streams) > MAX_STREAMS:
                self._replaced.append(self._streams.pop(next(iter(self._streams))))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fanfs-follow", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        """Stop following: the coordinating thread and the fetches end (before the store closes: they use its
        descriptors), then the orders' files are closed."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._thread is None or not self._thread.is_alive():  # else it may still read them: the exit closes them
            for stream in (*self._streams.values(), *self._replaced):
                stream.end()

    def stats(self) -> dict[str, Any]:
        with self._wake:
            return {**self.counts, "streams": {name: {"files": s.files, "position": s.position}
                                               for name, s in self._streams.items()},
                    "budget": self.budget, "ahead_bytes": self.used, "ahead_files": len(self._issued),
                    "waiting": self.waiting}

    # --- what a subclass gives ------------------------------------------------------------------------

    def plan(self, entry: int, view: int) -> Issued | None:
        """The fetches a file's read at ``view`` needs (``held``: the bytes of the budget they take), or None if it
        needs none (its bytes are at hand)."""
        raise NotImplementedError

    def room(self, need: int) -> bool:
        """Whether ``need`` more bytes fit the budget now (a subclass may free some first)."""
        return self.used + need <= self.budget

    def take(self, item: Issued) -> None:
        """``item`` is issued: it holds its bytes of the budget from now on."""
        self.used += item.held

    def fetch(self, item: Issued) -> None:
        """Fetch what ``item`` planned (in a pool thread); raise OSError or FanfsError if it failed."""
        raise NotImplementedError

    def retire(self, item: Issued, read: bool) -> None:
        """``item`` was read (``read``) or given up: what it held of the budget may go."""
        self.used -= item.held

    # --- the coordinating thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                self._settle()
                replaced, self._replaced = self._replaced, []
            for stream in replaced:
                stream.end()
            while not self._closed and self._issue_one():
                pass
            with self._wake:
                if not self._closed:
                    self._wake.wait(POLL)

    def _settle(self) -> None:
        """Retire, from the oldest, the issued files that were read since, or given up (unread while a file issued
        :data:`SLACK` later was read, or for :data:`STALE` seconds)."""
        ticks, issued = self.ticks, self._issued
        last_read = -1
        for i, item in enumerate(issued):
            if item.done and ticks[item.entry] >= item.since:
                last_read = i
        stale = tick() - STALE * TICKS_PER_SECOND
        while issued and issued[0].done:
            item = issued[0]
            read = ticks[item.entry] >= item.since
            if not read:
                if last_read < SLACK and item.since > stale:
                    break
                self.counts["given_up"] += 1
            issued.popleft()
            last_read -= 1
            self.retire(item, read)

    def _next_stream(self) -> Stream | None:
        """The next stream with files left, in turn."""
        names = list(self._streams)
        for k in range(len(names)):
            stream = self._streams[names[(self._turn + k) % len(names)]]
            if not stream.ended:
                self._turn = (self._turn + k + 1) % len(names)
                return stream
        return None

    def _issue_one(self) -> bool:
        """Look at the next file of the next stream and issue its fetches if it needs any; False when there is
        nothing to do now (:attr:`waiting` says why: too many files fetched ahead, the budget full, or no stream has
        files left).  The lock is held for the bookkeeping alone (see :meth:`__init__`)."""
        with self._wake:
            stream = self._next_stream() if len(self._issued) < AHEAD_FILES else None
            if stream is None:
                self.waiting = "readers" if len(self._issued) >= AHEAD_FILES else "orders"
                return False
        entry = stream.next()
        if entry is None:  # a piece of the order without a file of the store, or its end
            return True
        now = tick()
        if now - self.ticks[entry] < RECENT * TICKS_PER_SECOND:  # read just now: the readers are ahead of us
            with self._wake:
                stream.advance()
                self.counts["skipped"] += 1
            return True
        item = self.plan(entry, self.store.view(entry, self.presentation))
        if item is not None and item.held <= self.budget and item.held and not self.room(item.held):
            self.waiting = "budget"
            return False
        with self._wake:
            self.waiting = ""
            stream.advance()
            if item is None:  # at hand already
                return True
            if item.held > self.budget:  # never fits: read when it is read
                self.counts["too_large"] += 1
                return True
            item.since = now
            self.take(item)
            self._issued.append(item)
            self.counts["files"] += 1
        if self.inline:
            self._fetch(item)
        else:
            self._pool.submit(self._fetch, item)
        return True

    def _fetch(self, item: Issued) -> None:
        try:
            self.fetch(item)
        except (OSError, FanfsError) as err:  # a failed fetch ahead costs only the read's own wait, which says why
            with self._wake:
                self.counts["failed"] += 1
            log.debug("%s of entry %d failed: %s", self.what, item.entry, err)
        except Exception:
            log.exception("%s failed", self.what)
        finally:
            with self._wake:
                item.done = True
                self._wake.notify()

    def count(self, what: str, nbytes: int = 0) -> None:
        """One more ``what`` (``nbytes`` more bytes fetched ahead), from any thread."""
        with self._wake:
            self.counts[what] = self.counts.get(what, 0) + 1
            self.counts["bytes"] += nbytes
