"""The core: open a store and read it, with no FUSE and no MPI involved.

``Store`` resolves paths to entries and reads a file at a *view* (its record kind's name for one
presentation; :data:`FULL` for the whole file).  Blob bytes come from a chain of shard sources (local
shard files first; peers in a cluster), each copy checked against the index's checksum before it is
decoded, so a bad copy is skipped or turned into an EIO, never into wrong bytes.  What the bytes of a
file mean is its record kind's business (:mod:`fanfs.records`); this module has no per-kind branch.
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import re
import stat as statmod
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from ..codecs import Codec, CodecError, codec_from_config
from ..errors import DataError, FanfsError, NotHeld, StoreError, WouldWait
from ..records import FULL, Presentation, RecordKind, kind_table, kinds
from ..records.base import Span
from ..util.deadline import deadline_for, within
from .stream import BlobCache, StreamChunks
from .extents import ExtentPlaces
from .format import DIR, FILE, INDEX_NAME, SHARD_DIR, checksum, shard_name
from .index import Index
from .shared import ReportTimes, SharedChunks
from .resident import InMemory, Tally, join
from .stats import ReadClock, Stats, tick
from .sources import InPlace, LocalShards, ReadsInMemory, ReadsRuns, ShardSource, check_shard_files, fetch_run

log = logging.getLogger("fanfs")
ONCE = " (logged once for this shard and cause)"

KEEP_OPEN = 256
"""A store of at most this many shards keeps the descriptors its open check made (more: each is opened when first
read, so that a store of thousands of shards does not take that many descriptors at once)."""
_NUMBERS = re.compile(r"\d+")
"""What a problem's text says of one blob or one file (offsets, sizes, a shard file's name): not part of its cause."""


class Store:
    """An opened store.  ``sources`` default to the store's own shard directory."""

    def __init__(self, root: str, *, cache_size: int = 1 << 30, sources: Sequence[ShardSource] | None = None,
                 check_shards: bool = True, index: Index | None = None,
                 is_local: Callable[[int, int], bool] | None = None) -> None:
        """``index``: the store's index already loaded (a cluster node receives it broadcast).
        ``is_local(entry, view)``: whether the blobs a file reads at ``view`` are all on this node (a job
        node's placement and staged layers); by default every file's are, unless the store is on a network file
        system."""
        self.root = root
        if (index is None or sources is None) and not within(deadline_for(root), root, os.path.isdir, root):
            raise StoreError(f"{root}: no such store directory")  # (a stalled file system: Stalled, not a hang)
        self.index = index if index is not None else Index(os.path.join(root, INDEX_NAME))
        meta = self.index.meta
        self.meta = meta
        self.id = bytes.fromhex(meta["store_id"])
        self.chunk_size = int(meta["chunk_size"])
        try:
            self.codecs: list[Codec] = [codec_from_config(c, self.index.dictionaries) for c in meta["codecs"]]
        except CodecError as err:
            raise StoreError(f"{root}: {err}") from None
        own = LocalShards(os.path.join(root, SHARD_DIR), self.id) if sources is None else None
        if own is not None and is_local is None and own.deadline is not None:
            is_local = _on_a_server  # a network file system's: its reads are never made in a FUSE loop
        self.sources: list[ShardSource] = list(sources) if own is None else [own]
        if check_shards:
            check_shard_files(root, self.index.shard_size, self.id, own if self.index.shard_size.size <= KEEP_OPEN else None)
        self.cache = BlobCache(cache_size)
        self.stream = StreamChunks()
        self.stats = Stats()
        self._kinds: list[RecordKind] = kind_table()  # type: ignore[assignment]  (validated: every id is known)
        ix = self.index
        items = ix.items  # columns read on every read: an item is a Python int (~60 ns), not a numpy scalar (~250 ns)
        self._type, self._record, self._shard = items.type, items.record, items.shard
        self._raw, self._stored = items.blob_raw, items.blob_stored
        self._offset, self._checksum = items.blob_offset, items.blob_checksum
        self._reported = ReportTimes()
        self.is_local: Callable[[int, int], bool] = is_local or (lambda entry, view: True)
        # Sources that give a run of one file's blobs in one round trip (peers): a read of several blobs this node
        # lacks fetches them at once, and _fetch takes them from this thread's ``ahead`` (blob -> bytes, source);
        # sources whose blobs an extent may be spliced from (InPlace)
        self._run_sources = [source for source in self.sources if isinstance(source, ReadsRuns)]
        self._runs = bool(self._run_sources)
        self._in_place = [isinstance(source, InPlace) for source in self.sources]
        self._ahead = threading.local()  # per thread: ``blobs``, a peer's run (above), and ``in_memory`` (InMemory)
        # per source, how to read a blob only if it is in memory (None: it cannot say; a read that must not wait
        # then leaves it to a thread that may), for reads made with ``wait=False`` (a serving loop's)
        self._resident = [source.read_resident if isinstance(source, ReadsInMemory) else None
                          for source in self.sources]
        in_place = np.isin(ix.record, [kind.kind_id for kind in kinds().values() if kind.in_place]) & (ix.type == FILE)
        self.extents = ExtentPlaces(ix, in_place, self.sources, self.stats, self.chunk_size, self.fault) if in_place.any() else None
        self.touched: memoryview | None = None  # per entry, the clock at its last read (see follow_reads)
        self.read_clock: ReadClock | None = None
        self.clock: Callable[[], int] = int
        _OPEN.add(self)

    def follow_reads(self, shared: mmap.mmap | None = None) -> memoryview:
        """Note the :func:`.stats.tick` of every read of each file from now on (:class:`.stats.ReadClock`), in memory
        shared by the processes forked after this (a mount's serving processes) and by every process that maps its
        memfd (the mount hands it to ``fanfs run``'s readers, which pass their mapping as ``shared``).  Returns that
        memory, a uint32 per entry."""
        if self.read_clock is None:
            self.read_clock = ReadClock(self.index.entries, shared)
            self.touched = self.read_clock.ticks
        self.clock = tick
        if self.extents is not None:
            self.extents.touched, self.extents.clock = self.touched, tick
        return self.read_clock.ticks

    # --- metadata -------------------------------------------------------------------------------

    def lookup(self, path: bytes) -> int:
        """Entry of a relative path (``b""`` is the root); FileNotFoundError if absent."""
        entry = self.index.lookup(path)
        if entry < 0:
            raise FileNotFoundError(errno.ENOENT, "no such file in the store", os.fsdecode(path))
        return entry

    def kind(self, entry: int) -> RecordKind:
        """The record kind of a file (plain for directories and symlinks, which have none)."""
        return self._kinds[self._record[entry]]

    def view(self, entry: int, presentation: Presentation) -> int:
        """The view a file is presented at under ``presentation`` (FULL for anything but a layered record)."""
        if self._type[entry] != FILE:
            return FULL
        return self._kinds[self._record[entry]].view(self.index, entry, presentation)

    def size_at(self, entry: int, view: int = FULL) -> int:
        """Bytes a file presents at ``view`` (a directory or symlink: its recorded size)."""
        if self._type[entry] != FILE:
            return int(self.index.size[entry])
        return self._kinds[self._record[entry]].size(self, entry, view)

    def listdir(self, entry: int) -> list[tuple[bytes, int, int]]:
        """(name, inode, mode) of each child, sorted by name."""
        if self._type[entry] != DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        first, count = int(self.index.first[entry]), int(self.index.count[entry])
        return list(zip(self.index.children(entry), range(first + 1, first + count + 1),
                        self.index.mode[first:first + count].tolist()))

    def readlink(self, entry: int) -> bytes:
        if not statmod.S_ISLNK(int(self.index.mode[entry])):
            raise OSError(errno.EINVAL, "not a symbolic link")
        return self.index.target(entry)

    # --- data -----------------------------------------------------------------------------------

    def _fetch(self, entry: int, blob: int, layer: int, tally: Stats | Tally, wait: bool) -> bytes:
        """Verified stored bytes of a blob from the first source that has a good copy (``wait=False``: only from one
        that has it in memory, else WouldWait), counted in ``tally``."""
        if self._runs and (ahead := getattr(self._ahead, "blobs", None)) and (got := ahead.pop(blob, None)):
            data, name = got
            tally.stored(layer, name, len(data))
            return data
        shard = self._shard[entry]
        offset, length = self._offset[blob], self._stored[blob]
        expected = self._checksum[blob]
        problems, causes = [], []  # what each source said, and its kind (one cause, whichever blob meets it)
        for i, source in enumerate(self.sources):
            try:
                if wait:
                    data = source.read(blob, shard, offset, length)
                elif (resident := self._resident[i]) is not None:
                    data = resident(blob, shard, offset, length)
                else:
                    raise WouldWait
            except NotHeld:
                continue
            except (OSError, FanfsError) as err:  # e.g. a shard gone, cut short, or replaced by a FIFO
                problems.append(f"{source.name}: {err}")
                causes.append(f"{source.name}: {getattr(err, 'errno', None) or type(err).__name__}")
                continue
            if len(data) == length and checksum(data) == expected:
                tally.stored(layer, source.name, length)
                if (self.extents is not None and self._in_place[i] and self.extents.is_extent[entry]
                        and source.holds_in_place(blob)):  # type: ignore[attr-defined]
                    self.extents.vouch(blob, shard, i)  # these very bytes lie where an extent's read will splice them from
                if problems and self._first_report(shard, f"used {source.name} after: {'; '.join(causes)}"):
                    log.warning("%s: used %s after: %s%s", self._describe(entry, blob), source.name, "; ".join(problems),
                                ONCE)
                return data
            problems.append(f"{source.name}: checksum mismatch" if len(data) == length else
                            f"{source.name}: short read ({len(data)} of {length} bytes)")
            causes.append(f"{source.name}: a bad copy")
            source.rejected(blob)
        raise self.fault(entry, blob, f"no good copy ({'; '.join(problems) or 'no source holds it'})",
                         "no good copy: " + "; ".join(causes))

    def fault(self, entry: int, blob: int, why: str, cause: str | None = None) -> DataError:
        """The EIO for a blob that cannot be had or used: counted, and logged as one line naming the file, shard and
        blob, once per ``cause`` in its shard (by default ``why`` without its numbers); the caller raises it."""
        self.stats.errors += 1
        message = f"{self._describe(entry, blob)}: {why}"
        if self._first_report(self._shard[entry], cause if cause is not None else _NUMBERS.sub("#", why)):
            log.error("EIO %s%s", message, ONCE)
        return DataError(message)

    def _first_report(self, shard: int, cause: str) -> bool:
        """Log a trouble once per cause: a shard's problem (its copy gone, its source stalled, its blobs failing their
        check), whichever of its blobs meet it, however often and in whichever serving process (the kernel retries a
        failed read at once; a training reads every file of a shard)."""
        return self._reported.due(hash((shard, cause)), math.inf)

    def _describe(self, entry: int, blob: int) -> str:
        shard = shard_name(self._shard[entry])
        return f"{os.fsdecode(self.index.path(entry))} (shard {shard}, blob {blob} at {self._offset[blob]})"

    def blob(self, entry: int, blob: int, layer: int = 0, keep: bool = True, stream: bool = False,
             tally: Stats | Tally | None = None, wait: bool = True) -> bytes:
        """Decoded bytes of one blob, through the cache, counted in ``tally`` (the store's stats by default);
        ``wait=False``: WouldWait unless it is in memory (:class:`.resident.InMemory`).

        ``keep=False`` for a blob that one read covers whole: the kernel's page cache holds those bytes
        already, and keeping them here would cost memory and fresh-page faults on every read (measured:
        a cold 110 KB read took 110 us of CPU with a 1 GiB cache, 34 us without).  ``stream=True`` for a chunk
        of a large file: kept, if at all, only among the last few (``stream.STREAM_CACHE``), whose memory the next
        ones reuse, each loaded once by the threads and serving processes that want it (:mod:`.stream`).
        """
        if tally is None:
            tally = self.stats
        cache = self.stream.cache if stream else self.cache
        if keep or stream:  # a blob one read covers whole is never kept: nothing to look up
            data = cache.get(blob)
            if data is not None:
                tally.cache_hits += 1
                return data
        if stream:
            share = self._stored[blob] not in (0, self._raw[blob])  # a chunk to decode: see fanfs.store.shared
            return self.stream.load(blob, keep, lambda: self._load(entry, blob, layer, tally, wait), tally, share, wait)
        data = self._load(entry, blob, layer, tally, wait)
        tally.cache_misses += 1
        if keep:
            cache.put(blob, data)
        return data

    def _load(self, entry: int, blob: int, layer: int, tally: Stats | Tally, wait: bool) -> bytes:
        """A blob's bytes from its sources, verified and decoded (no cache)."""
        raw_size = self._raw[blob]
        stored_size = self._stored[blob]
        if stored_size == 0:
            return bytes(raw_size)  # a hole of a sparse file
        stored = self._fetch(entry, blob, layer, tally, wait)
        if stored_size == raw_size:
            data = stored
        else:
            started = time.perf_counter()
            try:  # the codec yields at most raw_size bytes, which the index's validation bounded per kind
                data = self.codecs[int(self.index.codec[entry])].decode(stored, raw_size)
            except Exception as err:  # a verified blob that does not decode: a crafted store, a bug or a codec mismatch
                raise self.fault(entry, blob, f"decode failed: {err}") from None
            if len(data) != raw_size:
                raise self.fault(entry, blob, f"decoded {len(data)} bytes, expected {raw_size}")
            self.stats.decode_seconds += time.perf_counter() - started
        return data

    def read(self, entry: int, offset: int, size: int, view: int = FULL) -> bytes:
        """Bytes ``[offset, offset+size)`` of a file as presented at ``view``."""
        if offset == 0:
            blob = self._kinds[self._record[entry]].whole_blob(self.index, entry, view)
            if blob >= 0 and size >= self._raw[blob]:
                return self._whole(entry, blob)
        return join(self.spans(entry, offset, size, view))

    def _whole(self, entry: int, blob: int) -> bytes:
        """A file read whole that is one blob: that blob's bytes, counted as :meth:`spans` counts a read."""
        if self.touched is not None:
            self.touched[entry] = self.clock()
        data = self.blob(entry, blob, 0, False)
        if len(data) != self.index.items.size[entry]:
            raise self.fault(entry, blob, "the file's blob is not the file's size")
        self.stats.reads += 1
        self.stats.bytes_presented += len(data)
        return data

    def spans(self, entry: int, offset: int, size: int, view: int = FULL, wait: bool = True) -> list[Span]:
        """The same bytes as :meth:`read`, as pieces ``data[start:start + length]`` left unsliced: a FUSE reply is
        sent from the pieces themselves, so a request that the kernel cut from a large read costs no copy.
        ``wait=False``: WouldWait, and nothing counted, unless every blob it needs is in memory (a serving loop's
        read, which must never wait on a disk: it hands the read to a thread then)."""
        kind = self._kinds[self._record[entry]]
        here = self._ahead
        if self.touched is not None:
            self.touched[entry] = self.clock()
        if not wait:
            reader = getattr(here, "in_memory", None)
            if reader is None:
                reader = here.in_memory = InMemory(self)
            try:
                spans = kind.spans(reader, entry, view, offset, size)
            except BaseException:
                reader.tally.discard()
                raise
            reader.tally.commit(self.stats)
        elif self._runs and not self.is_local(entry, view):
            first, count = kind.blob_run(self.index, entry, view, offset, size)
            here.blobs = fetch_run(self._run_sources, first, count, self._stored, self._checksum) if count > 1 else None
            try:
                spans = kind.spans(self, entry, view, offset, size)
            finally:
                here.blobs = None
        else:
            spans = kind.spans(self, entry, view, offset, size)
        self.stats.reads += 1
        for span in spans:
            self.stats.bytes_presented += span[2]
        return spans

    def readinto(self, entry: int, offset: int, buffer: memoryview, view: int = FULL) -> int:
        """Bytes of a file as presented at ``view`` from ``offset`` into ``buffer`` (as many as it holds, up to the
        file's end); how many.  An extent's are read from the node's verified copy straight into ``buffer``, no copy
        in this process (:meth:`.extents.ExtentPlaces.locate`); any other file's are its spans', copied once."""
        extents = self.extents
        if extents is not None and extents.is_extent[entry]:
            located = extents.locate(entry, offset, len(buffer))
            if located is not None:
                got = -1
                try:
                    got = os.preadv(located.fd, [buffer[:located.length]], located.position)
                finally:
                    extents.served(located, got == located.length, spliced=False)
                if got == located.length:
                    return got  # else the copy was cut since it was located: the copy path says what there is
        pos = 0
        for data, start, length in self.spans(entry, offset, len(buffer), view):
            buffer[pos:pos + length] = memoryview(data)[start:start + length]
            pos += length
        return pos

    def read_file(self, path: str | bytes, view: int = FULL) -> bytes:
        """Whole file by path (convenience for tools and tests)."""
        entry = self.lookup(os.fsencode(path).strip(b"/"))
        if self._type[entry] != FILE:
            raise IsADirectoryError(errno.EISDIR, "not a file", os.fsdecode(path))
        return self.read(entry, 0, self.size_at(entry, view), view)

    def share_across_forks(self) -> None:
        """Before a mount forks its serving processes: each chunk of a large file loaded (:mod:`.shared`) and each
        extent's chunk verified (:mod:`.extents`) once by them, not once by each."""
        self.stream.shared = SharedChunks(self.chunk_size)
        if self.extents is not None:
            self.extents.share_across_forks()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker of a process that opened the store): renew the locks another
        thread may have held at the fork, in the cache and the sources.  Runs by itself (``os.register_at_fork``)."""
        self.cache.after_fork()
        self.stream.after_fork()
        if self.extents is not None:
            self.extents.after_fork()
        for source in self.sources:
            source.after_fork()

    def stop_waiting(self) -> None:
        """The mount is ending: reads waiting on a stalled source give up now (EIO), so that its daemon ends."""
        for source in self.sources:
            source.stop_waiting()

    def close(self) -> None:
        _OPEN.discard(self)
        if self.read_clock is not None:
            self.read_clock.close()
        if self.extents is not None:
            self.extents.close()
        for source in self.sources:
            source.close()


def _on_a_server(entry: int, view: int) -> bool:
    return False


_OPEN: weakref.WeakSet[Store] = weakref.WeakSet()
"""Every open store of this process, for :meth:`Store.after_fork` in a forked child."""


def _after_fork_in_child() -> None:
    for store in list(_OPEN):
        store.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
