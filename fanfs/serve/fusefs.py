"""The FUSE front: a thin layer over :class:`fanfs.store.Store` on libfuse's low-level API.

**Inodes are immutable.**  An inode number names an entry *and the view it is presented at*
(``ino = view << 32 | entry + 1``; view 0 is the full file, else the record kind's view, e.g. a JPEG
record's first K layers).
The size and bytes behind an inode never change, so the kernel may cache attributes, directory
entries and pages for a day, and a reader's ``open``/``fstat``/``read``/``mmap`` always agree: they all
go through one inode.  A fidelity switch changes only which inode a *name* resolves to: new lookups
get the new view; the kernel's cached names of records are invalidated afterwards (from the control
thread, never the loop's), so a switch reaches every name within moments, while files already open
keep their bytes.  Nothing is torn, however slow the invalidation: there is no window to race in.

``open`` answers ENOSYS (the kernel then keeps page caches and sends no open/release), so reads carry
no per-open state.  Listings are READDIRPLUS: every name comes with its inode and attributes, which the
kernel keeps as a looked-up name, so a reader that lists first (a dataset) opens every file with one
request, its read; such names are recorded and invalidated at a switch like looked-up ones.  The loop
is single-threaded (multithreaded Python daemons fight over the GIL) and never waits on the network: a read of a file whose blobs are not all on this node (a job mount) is
handed to a small pool of worker threads that reply when the bytes have come, while the loop goes on
serving the next request.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from ..records import FULL, Presentation, check_presentation, kinds
from ..errors import WouldWait
from ..store import Store
from ..store.format import DIR, FILE
from ..util.mounts import mount_source
from . import lowlevel as ll
from . import splice
from .shown import VIEW_SHIFT, Shown
from .workers import ServingProcesses

log = logging.getLogger("fanfs")

CACHE_SECONDS = 86400.0
ENTRY_MASK = (1 << VIEW_SHIFT) - 1
SETTLE_SECONDS = 0.2
"""After a switch, names whose lookup was in flight are invalidated again once this long has passed."""
DIRENTPLUS_MIN = 152
"""Bytes of the smallest listing row (``fuse_direntplus``: a 128-byte entry_out and a 24-byte dirent, then the name)."""
READ_THREADS = 4
"""Threads answering reads that wait on a peer or a disk (each mostly blocked in a socket, a ``pread`` or a splice).
More only queue on the interpreter lock: 2,000 cold 110 KB files from a disk, 4 readers, 1,250 of them handed over:
8 threads 150 us of daemon CPU per file (25 futex calls per read handed over), 4 threads 105-110 us, 2 threads 110 us
(and as many files/s), against 90 us when the loop waited for each read itself, at 0.6x the files/s."""


def reply_extent(req: int, store: Store, entry: int, view: int, offset: int, size: int, wait: bool = True) -> None:
    """Answer a read of an extent from its copy's pages (spliced), or by the copy path where that cannot be.
    ``wait=False``: WouldWait unless the pages are verified and in memory (nothing then waits on a disk)."""
    located = store.extents.locate(entry, offset, size, wait)  # type: ignore[union-attr]
    if located is None:
        ll.reply_spans(req, store.spans(entry, offset, size, view, wait))
        return
    failed = -1
    try:
        failed = splice.reply_fd(req, located.fd, located.position, located.length)
    finally:
        store.extents.served(located, failed == 0)  # type: ignore[union-attr]
    if failed > 0:  # libfuse answered the request with the read's error: say so once, as a failed copy read is
        store.extents.unreadable(located, os.strerror(failed))  # type: ignore[union-attr]


class Deferred:
    """Threads that answer read requests the loop hands over (their bytes are not in memory: they wait on a
    disk or a peer), replying to the kernel themselves; several disk reads are in flight at once.  ``answered``
    counts the reads they answered."""

    def __init__(self, store: Store, threads: int = READ_THREADS) -> None:
        self.store = store
        self.answered = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name="fanfs-read", daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, req: int, entry: int, view: int, offset: int, size: int, spliced: bool) -> None:
        """Answer the read (``spliced``: an extent, answered from its copy's pages) from a worker thread."""
        self._jobs.put((req, reply_extent if spliced else self._reply, self.store, entry, view, offset, size))

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if ll.answer(*job):
                self.answered += 1

    @staticmethod
    def _reply(req: int, store: Store, entry: int, view: int, offset: int, size: int) -> None:
        ll.reply_spans(req, store.spans(entry, offset, size, view))

    def close(self) -> None:
        """Let every worker finish the read it holds (a peer's answer or its timeout) before the session
        that its reply goes through is destroyed."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


class FanfsFS:
    """Answers the kernel's requests from a store; ``presentation`` chooses the views of layered records."""

    def __init__(self, store: Store, presentation: Presentation, on_ready: Callable[[], None]) -> None:
        self.store = store
        self._shown = Shown(store.index.entries, check_presentation(store.index, presentation))
        self.session: ll.Session | None = None
        self._on_ready = on_ready
        ix = store.index
        self._ix = ix
        # per-request columns as memoryviews: indexing one gives a Python int (~60 ns; a numpy scalar + int() ~250)
        self._types, self._modes = memoryview(ix.type), memoryview(ix.mode)
        self._mtimes, self._sizes = memoryview(ix.mtime), memoryview(ix.size)
        self._viewed = [(kind, np.flatnonzero((ix.record == kind_id) & (ix.type == FILE)))
                        for kind_id, kind in kinds().items() if kind.setting]
        self._layered = np.zeros(ix.entries, bool)  # files whose view follows the presentation
        for _, entries in self._viewed:
            self._layered[entries] = True
        self._entries = ix.entries
        self._named = self._shown.named
        self._is_layered, self._name_views = memoryview(self._layered), memoryview(self._named)  # per request
        self._switch_lock = threading.Lock()  # one switch at a time
        self._uid, self._gid = os.getuid(), os.getgid()
        self._entry = ll.EntryParam(attr_timeout=CACHE_SECONDS, entry_timeout=CACHE_SECONDS)
        self._plus = ll.EntryParam(attr_timeout=CACHE_SECONDS, entry_timeout=CACHE_SECONDS)
        self._negative = ll.EntryParam(ino=0, attr_timeout=CACHE_SECONDS, entry_timeout=CACHE_SECONDS)
        self._attr = ll.Stat()
        self._deferred: Deferred | None = None  # started with the first read that needs it
        self._spliced: memoryview | None = None  # per entry: whether its reads are spliced (once the kernel agreed)
        self.lookups = 0  # lookup requests answered, and names answered in listings with their attributes
        self.listed = 0
        self.in_memory = 0  # reads answered in the loop (their bytes were in memory); deferred: by worker threads
        totals = store.meta["totals"]
        self._statfs = ll.StatVfs(f_bsize=4096, f_frsize=4096, f_blocks=-(-totals["bytes_presented"] // 4096),
                                  f_files=totals["entries"], f_namemax=255)

    @property
    def presentation(self) -> Presentation:
        """The presentation now (set by whichever process of the mount switched it last)."""
        return self._shown.current()

    # --- inodes and views ---------------------------------------------------------------------

    def view(self, entry: int) -> int:
        """The view bits of an entry's inode now: 0 (full) or its kind's view under the presentation."""
        if self._is_layered[entry]:
            view = self.store.view(entry, self.presentation)
            if view != FULL:
                return view
        return 0

    def _decode(self, ino: int) -> tuple[int, int]:
        entry = (ino & ENTRY_MASK) - 1
        view = ino >> VIEW_SHIFT
        if not 0 <= entry < self._entries or (view and not self._is_layered[entry]) or view >= FULL:
            raise OSError(errno.ESTALE, "unknown inode")
        return entry, view

    def _fill(self, target: ll.ctypes.Structure, offset: int, entry: int, view: int) -> int:
        """Attributes of ``entry`` at ``view`` into the ``struct stat`` at ``offset`` of ``target`` (owner: whoever
        mounted; the store is read-only); returns the inode number."""
        ino = view << VIEW_SHIFT | (entry + 1)
        size = self.store.size_at(entry, view) if view else self._sizes[entry]
        ll.pack_stat(target, offset, ino, self._modes[entry], 2 if self._types[entry] == DIR else 1, self._uid, self._gid,
                     size, self._mtimes[entry])
        return ino

    # --- requests -------------------------------------------------------------------------------

    def ready(self, session: ll.Session) -> None:
        self.session = session
        if session.splicing and self.store.extents is not None:
            self._spliced = self.store.extents.is_extent
        self._shown.serve(True)
        self._on_ready()

    @property
    def shown(self) -> Shown:
        """What the mount shows now, in memory in-process readers may map (its ``fd``)."""
        return self._shown

    def readahead(self) -> int | None:
        """The kernel's readahead window in this mount's files, in bytes (None: not known)."""
        return self.session.readahead if self.session is not None else None

    def lookup(self, req: int, parent: int, name: bytes) -> None:
        self.lookups += 1
        parent_entry, _ = self._decode(parent)
        base = self._ix.path(parent_entry)
        entry = self._ix.lookup(base + b"/" + name if base else name)
        if entry < 0:
            ll.reply_entry(req, self._negative)  # cached: the store never changes
            return
        view = self.view(entry)
        if self._is_layered[entry]:
            self._name_views[entry] = view + 1
        param = self._entry
        ll.set_entry_ino(param, self._fill(param, ll.ATTR_OFFSET, entry, view))
        ll.reply_entry(req, param)

    def getattr(self, req: int, ino: int) -> None:
        entry, view = self._decode(ino)
        self._fill(self._attr, 0, entry, view)
        ll.reply_attr(req, self._attr, CACHE_SECONDS)

    def readlink(self, req: int, ino: int) -> None:
        entry, _ = self._decode(ino)
        ll.reply_readlink(req, self.store.readlink(entry))

    def read(self, req: int, ino: int, offset: int, size: int) -> None:
        """Answered here when every byte is in memory (a blob in a cache or the page cache, an extent's verified pages):
        the loop never waits on a disk, nor a peer; any other read goes to worker threads, several at once."""
        entry, view = self._decode(ino)
        view = view or FULL
        store = self.store
        spliced = self._spliced is not None and self._spliced[entry]
        if store.is_local(entry, view):
            try:
                if spliced:
                    reply_extent(req, store, entry, view, offset, size, wait=False)
                else:
                    ll.reply_spans(req, store.spans(entry, offset, size, view, wait=False))
                self.in_memory += 1
                return
            except WouldWait:
                pass
        if self._deferred is None:
            self._deferred = Deferred(store)
        self._deferred.submit(req, entry, view, offset, size, spliced)

    @property
    def deferred(self) -> int:
        """Reads handed to worker threads and answered there."""
        return self._deferred.answered if self._deferred is not None else 0

    def close(self) -> None:
        self._shown.serve(False)  # in-process readers leave every open to the mount from now on
        self.store.stop_waiting()
        if self._deferred is not None:
            self._deferred.close()

    def readdirplus(self, req: int, ino: int, offset: int, size: int) -> None:
        """A directory's rows from ``offset`` on (".", "..", then its children), each also a lookup's answer (the
        kernel keeps them as names): recorded like one, so that a switch invalidates these names too."""
        entry, _ = self._decode(ino)
        if self._types[entry] != DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        # only the rows this reply can hold (a listing of N names in pages was N names per page: O(N^2))
        start, fits = max(0, offset - 2), size // DIRENTPLUS_MIN + 1
        rows = [(b".", entry), (b"..", int(self._ix.parent[entry]))][offset:]
        first = int(self._ix.first[entry]) + start
        rows += [(name, first + i) for i, name in enumerate(self._ix.children(entry, start, start + fits))]
        buf = ll.ctypes.create_string_buffer(size)
        used = 0
        param = self._plus
        for position, (name, child) in enumerate(rows, offset):
            view = self.view(child)
            ll.set_entry_ino(param, self._fill(param, ll.ATTR_OFFSET, child, view))
            n = ll.add_direntry_plus(req, buf, used, name, param, position + 1)
            if used + n > size:
                break
            if self._is_layered[child]:
                self._name_views[child] = view + 1
            used += n
            self.listed += 1
        ll.reply_buf(req, buf.raw[:used], used)

    def statfs(self, req: int, ino: int) -> None:
        ll.reply_statfs(req, self._statfs)

    # --- switching views ------------------------------------------------------------------------

    def set_presentation(self, presentation: Presentation) -> dict[str, int]:
        """Present records under ``presentation`` to every lookup from now on; drop the kernel's stale names.

        Returns how many names were invalidated.  Reads of files already open are unaffected.
        """
        check_presentation(self._ix, presentation)
        with self._switch_lock:
            self._shown.set(presentation)
            invalidated = self._invalidate_stale()
            time.sleep(SETTLE_SECONDS)  # lookups answered just before the switch are in flight: catch them too
            invalidated += self._invalidate_stale()
        log.info("presenting %s: %d cached names invalidated", presentation.describe(), invalidated)
        return {**presentation, "invalidated": invalidated}

    def _invalidate_stale(self) -> int:
        named = self._named
        current = np.zeros(self._entries, np.uint16)
        for kind, entries in self._viewed:
            views = kind.views(self._ix, entries, self.presentation)
            current[entries] = np.where(views == FULL, 0, views) + 1
        stale = np.flatnonzero((named != 0) & (named != current))
        named[stale] = 0  # before the invalidation: a lookup racing with it records itself again
        session = self.session
        done = 0
        for entry in stale.tolist():
            if session is None:
                break
            path = self._ix.path(entry)
            parent = int(self._ix.parent[entry]) + 1
            if session.invalidate_entry(parent, path.rpartition(b"/")[2]) in (0, -errno.ENOENT):
                done += 1
        return done


def serve(store: Store, mountpoint: str, fs: FanfsFS, *, allow_other: bool = False, debug: bool = False,
          workers: int = 1, readahead: int = 0, serving: Callable[[ServingProcesses | None], None] = lambda processes: None,
          counters: Callable[[], dict] = dict) -> int:
    """Mount and serve until unmounted or signalled; returns 0 or the signal that ended the mount.

    ``workers``: serving processes (:mod:`.workers`); 1 serves from this process's own loop.  ``serving(p)`` is
    called once they are there (with their handle; None for one loop) and before any request is served,
    to start this process's threads; ``counters()``: a serving process's own counters.
    """
    options = ["ro", "default_permissions", f"fsname={mount_source(store.root)}", "subtype=fanfs"]
    if allow_other:
        options.append("allow_other")
    max_read = 0
    if store.extents is not None:
        max_read, problem = splice.splice_size()
        if problem:
            log.warning("large files are copied through this process, not spliced: %s (pipe-max-size, or this user's "
                        "pipe-user-pages-soft in /proc/sys/fs, is too low)", problem)
    session = ll.Session(fs, mountpoint, options, debug=debug, readahead_bytes=readahead, max_read=max_read)
    try:
        if workers <= 1:
            serving(None)
            return session.loop()
        store.share_across_forks()
        processes = ServingProcesses(session, workers, counters, on_exit=fs.close)
        return processes.run(lambda: serving(processes))
    finally:
        fs.close()
        session.close()

