"""Pack sources (directories, archives) into a store: read, cut into shards, compress in parallel, write atomically.

Files are cut into shard jobs in source order as they are read (:mod:`fanfs.ingest`); each job is packed by a
worker into one whole shard file (:mod:`.shards`) that returns only its small tables, and the index is
assembled here once every source is read.  The store is built under ``STORE.partial-PID-...`` beside STORE
(with a marker naming this pack, and a keeper process that removes it should this one be killed) and renamed
into place only once its index is durable, so an interrupted pack never leaves anything that mounts as complete,
and never touches anything but a store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from ..codecs import Codec, Raw, Zstd
from ..ingest import DEFAULT_MAX_EXPANSION, Ingest, Spool, Tree
from ..records import RecordKind
from ..store.format import SHARD_DIR, shard_name
from ..util.progress import Progress
from ..util.units import human_size
from .batch import Batch, Payload
from .destination import commit, prepare_destination, start_partial
from .index import write_store_index
from .janitor import Janitor
from .runner import ShardRunner, local_runner
from .shards import NoSpace, PackError, ShardJob, ShardResult

__all__ = ["PackError", "PackOptions", "PackReport", "pack"]


@dataclass
class PackOptions:
    codec: Codec = field(default_factory=lambda: Zstd(3))
    shard_size: int = 256 << 20
    jobs: int = max(1, os.cpu_count() or 1)
    force: bool = False
    kinds: list[RecordKind] = field(default_factory=list)  # record kinds to try, in order (plain otherwise)
    plan: Any = None  # selection plan: .codecs(), .codec_index(head) for per-class codecs
    progress: bool = True
    expand_archives: bool = False  # an archive inside a source becomes a directory of its members
    max_expansion: float = DEFAULT_MAX_EXPANSION  # an archive's members may hold this many times its bytes (0: any)


@dataclass
class PackReport:
    store: str
    files: int
    dirs: int
    symlinks: int
    bytes_in: int
    bytes_stored: int
    shards: int
    records: dict[str, int]  # kind name -> files stored as that kind (plain files not counted)
    fallbacks: list[tuple[str, str, str]]  # (kind, path, reason) of files kept as plain files
    skipped: int
    seconds: float
    adopted: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, path, why) of plain files it adopted
    hard_links: int = 0
    shards_by_rank: list[int] | None = None  # under mpiexec/srun: shards each rank packed


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Turn SIGINT into a flag the caller checks between waits; one it has not seen is raised at the end.

    A KeyboardInterrupt raised while ``fork()`` runs Python's at-fork hooks is swallowed ("Exception
    ignored"), so a Ctrl-C landing as the pool starts a worker would be lost and the pack would go on.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    hits: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda *_: hits.append(1))
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, previous)
    if hits:  # it came after the caller's last look (as the pool shut down): still a Ctrl-C
        raise KeyboardInterrupt


MIN_SHARD = 1 << 20
SHARDS_AT_LEAST = 64
MAX_HELD_SHARD = 64 << 20


def shard_target(total: int | None, limit: int, held: bool = False) -> int:
    """Source bytes per shard: at most ``limit``, but a small tree is cut into at least 64 shards (not below
    1 MiB) so that any number of workers and ranks has shards to pack; the cut depends on the sources and
    ``limit`` only, never on how many pack them.  Shards of archive members (``held``: their bytes travel in
    memory) hold at most 64 MiB.  Placement is per blob, so the cut does not affect it."""
    target = limit if total is None else min(limit, max(MIN_SHARD, -(-total // SHARDS_AT_LEAST)))
    return min(target, MAX_HELD_SHARD) if held else target


RunnerFactory = Callable[[int], AbstractContextManager[ShardRunner]]
"""Makes the runner of a pack from its ``jobs`` (default: :func:`.runner.local_runner`)."""


def pack(srcs: Sequence[str] | str, store: str, options: PackOptions | None = None,
         on_warning: Callable[[str], None] | None = None, runner: RunnerFactory = local_runner) -> PackReport:
    """Pack ``srcs`` into a new store at ``store``; raises a FanfsError with a one-line reason on failure."""
    opts = options or PackOptions()
    started = time.monotonic()
    sources = [srcs] if isinstance(srcs, str) else list(srcs)
    ingest = Ingest(sources, expand_archives=opts.expand_archives, max_expansion=opts.max_expansion,
                    warn=on_warning or (lambda text: None))
    try:
        total = ingest.walk()
        prepare_destination(store, [s.path for s in ingest.sources if s.path != "-"], opts.force)
        report = _build(ingest, store, total, opts, runner, started)
    finally:
        ingest.close()
    report.store = store
    return report


def _build(ingest: Ingest, store: str, total: int | None, opts: PackOptions, runner: RunnerFactory,
           started: float) -> PackReport:
    janitor = Janitor()
    tmp = None
    finished = {"source": 0, "stored": 0}  # shards packed whole so far: the ratio a full disk's estimate uses
    try:
        try:
            with _deferred_interrupt():  # a Ctrl-C while the directory is made comes once the clean-up below knows it
                tmp = start_partial(store)
                janitor.watch(tmp)
            try:
                report = _pack_into(tmp, ingest, total, opts, runner, started, finished)
            except NoSpace:
                raise _no_space(tmp, store, total, finished) from None
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT):  # a spool file of a large archive member
                    raise _no_space(tmp, store, total, finished) from None
                raise
            commit(tmp, store, opts.force)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        janitor.done()
    return report


def _no_space(tmp: str, store: str, total: int | None, finished: dict[str, int]) -> PackError:
    """Name the full file system and about how large the whole store would be: the source at the ratio of the shards
    packed whole so far (their source and stored bytes), or the source's size if none was (an upper bound, as a
    store is not larger than its source but for a few headers).  Bytes written so far are no guide: a shard being
    written, its spill files and an archive's spool are there in part."""
    mount, fstype = _file_system(tmp)
    st = os.statvfs(os.path.dirname(tmp))
    free = st.f_bavail * st.f_frsize + sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    if total and finished["source"]:
        need = f"about {human_size(total * finished['stored'] // finished['source'])} in all (at the ratio of the " \
               f"{human_size(finished['source'])} of source packed whole so far)"
    elif total:
        need = f"up to {human_size(total)} in all (its source's size)"
    else:
        need = "more space"
    return PackError(f"no space left on {mount} ({fstype}) for the store {store}: it needs {need}, and "
                     f"{human_size(free)} was free for it: free space or pack to another place")


def _file_system(path: str) -> tuple[str, str]:
    """(mount point, file-system type) of ``path``, from /proc/self/mounts."""
    path = os.path.realpath(path)
    best = ("/", "?")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                    best = (point, fields[2])
    except OSError:
        pass
    return best


def _codec_table(opts: PackOptions) -> tuple[list[Codec], int, int]:
    codecs: list[Codec] = list(opts.plan.codecs()) if opts.plan else [opts.codec]
    if opts.codec not in codecs:
        codecs.append(opts.codec)
    if Raw() not in codecs:
        codecs.append(Raw())
    return codecs, codecs.index(opts.codec), codecs.index(Raw())


def _pack_into(tmp: str, ingest: Ingest, total: int | None, opts: PackOptions, runner: RunnerFactory,
               started: float, finished: dict[str, int]) -> PackReport:
    store_id = uuid.uuid4().bytes
    codecs, default_codec, raw_codec = _codec_table(opts)
    archives = any(source.walked is None or source.walked.archives for source in ingest.sources)  # streamed members
    target = shard_target(total, opts.shard_size, held=archives)
    spool = Spool(os.path.join(tmp, "spool"), in_memory=target)
    results: list[ShardResult] = []
    spooled: dict[int, list[bytes]] = {}  # shard -> spool files its job reads, removed once it is packed
    positions: dict[int, int] = {}  # shard -> source bytes read when it was cut (progress)
    cut = Batch()
    progress = {"bytes": 0, "files": 0}
    with Progress(total or 0, "pack", enabled=opts.progress, unit="B", count_total=ingest.files_known()) as bar, \
            _deferred_interrupt() as interrupted, runner(opts.jobs) as shards:

        def collect(timeout: float) -> None:
            if interrupted():
                raise KeyboardInterrupt
            for result in shards.finished(timeout):
                results.append(result)
                for path in spooled.pop(result.shard, []):
                    os.unlink(path)
                progress["bytes"] += positions[result.shard] - positions.get(result.shard - 1, 0)
                finished["source"] += positions[result.shard] - positions.get(result.shard - 1, 0)
                finished["stored"] += result.size
                progress["files"] += len(result.files["entry"])
            bar.update_to(progress["bytes"], count=progress["files"])

        def send() -> None:
            nonlocal cut
            while shards.in_flight() >= shards.window:  # every worker busy and one job waiting: memory stays bounded
                collect(0.2)
            n = len(positions)
            positions[n], spooled[n] = ingest.position(), cut.spooled
            shards.start(ShardJob(n, os.path.join(tmp, SHARD_DIR, shard_name(n)), store_id, cut.files, codecs,
                                  opts.kinds, default_codec, raw_codec, opts.plan,
                                  Payload(cut.held) if cut.held else None))
            cut = Batch()

        for file_id, member in ingest.files(spool):
            if cut.files and cut.bytes + member.size > target:
                send()
            cut.add(file_id, member)
            if interrupted():
                raise KeyboardInterrupt
        if cut.files or not positions:
            send()
        while shards.in_flight():
            collect(0.2)
    shutil.rmtree(spool.directory, ignore_errors=True)  # empty by now (each spooled member went with its shard)
    results.sort(key=lambda r: r.shard)
    tree = ingest.finish()
    return _report(write_store_index(tmp, tree, ingest, opts, store_id, codecs, results), tree, ingest, started)


def _report(summary: dict[str, Any], tree: Tree, ingest: Ingest, started: float) -> PackReport:
    totals = summary["totals"]
    return PackReport("", totals["files"], totals["dirs"], totals["symlinks"], totals["bytes_in"],
                      totals["bytes_stored"], totals["shards"], summary["records"], summary["fallbacks"],
                      ingest.skipped, time.monotonic() - started, summary["adopted"], len(tree.links))
