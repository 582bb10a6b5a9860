"""Pack a source tree into a store: walk, cut into shards, compress in parallel, write atomically.

Each worker process builds one whole shard file (:mod:`.shards`) and returns only its small tables;
the parent assembles the index.  The store is built under ``STORE.partial-PID-...`` beside STORE (with
a marker naming this pack) and renamed into place only once its index is durable, so an interrupted
pack never leaves anything that mounts as complete, and never touches anything but a store.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import errno
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codecs import Codec, Raw, Zstd
from ..records import RecordKind
from ..store.format import FILE, INDEX_NAME, SHARD_DIR, shard_name
from ..store.index import build_index
from ..store.schema import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, header, new_columns
from ..store.walk import Tree, walk
from ..util.progress import Progress
from ..util.units import human_size
from ..util.workers import process_pool
from .destination import commit, prepare_destination, start_partial
from .shards import NoSpace, PackError, ShardJob, ShardResult, pack_shard

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
    skipped: list[str]
    seconds: float


_progress_counter: Any = None


def _init_worker(counter: Any) -> None:
    global _progress_counter
    _progress_counter = counter


def _advance(nbytes: int) -> None:
    with _progress_counter.get_lock():
        _progress_counter.value += nbytes


def _pack_shard(job: ShardJob) -> ShardResult:
    return pack_shard(job, _advance)


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
SHARDS_PER_JOB = 4


def shard_target(total: int, limit: int, jobs: int) -> int:
    """Source bytes per shard: at most ``limit``, but small enough that ``jobs`` workers all have shards
    to pack (about four each, not below 1 MiB).  Placement is per blob, so the cut does not affect it."""
    return min(limit, max(MIN_SHARD, -(-total // (SHARDS_PER_JOB * jobs))))


def _plan_shards(tree: Tree, shard_size: int) -> list[list[int]]:
    """Cut the files, in tree order, into shards of about ``shard_size`` source bytes."""
    shards: list[list[int]] = [[]]
    filled = 0
    for entry in tree.files():
        size = tree.size[entry]
        if shards[-1] and filled + size > shard_size:
            shards.append([])
            filled = 0
        shards[-1].append(entry)
        filled += size
    return shards


def pack(src: str, store: str, options: PackOptions | None = None,
         on_warning: Callable[[str], None] | None = None) -> PackReport:
    """Pack ``src`` into a new store at ``store``; raises a FanfsError with a one-line reason on failure."""
    opts = options or PackOptions()
    started = time.monotonic()
    tree = walk(src)
    for note in tree.skipped:
        if on_warning:
            on_warning(f"skipped {note}")
    prepare_destination(store, src, opts.force)
    tmp = None
    try:
        with _deferred_interrupt():  # a Ctrl-C while the directory is made comes once the clean-up below knows it
            tmp = start_partial(store)
        try:
            report = _pack_into(tmp, tree, opts, started)
        except NoSpace:
            raise _no_space(tmp, store, tree) from None
        commit(tmp, store)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.store = store
    report.skipped = tree.skipped
    return report


def _no_space(tmp: str, store: str, tree: Tree) -> PackError:
    """Name the full file system and about how much more the store needs, at the ratio reached so far."""
    written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    total = sum(tree.size[e] for e in tree.files())
    done = int(_progress_counter.value) if _progress_counter is not None else 0
    need = max(written * total // max(done, 1) - written, 1) if done else total
    mount, fstype = _file_system(tmp)
    st = os.statvfs(os.path.dirname(tmp))
    return PackError(f"no space left on {mount} ({fstype}) for the store {store}: it needs about "
                     f"{human_size(need)} more at the ratio so far ({human_size(written)} written for "
                     f"{human_size(done)} of {human_size(total)} of source; {human_size(st.f_bavail * st.f_frsize)} "
                     "free): free space or pack to another place")


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


def _pack_into(tmp: str, tree: Tree, opts: PackOptions, started: float) -> PackReport:
    store_id = uuid.uuid4().bytes
    codecs, default_codec, raw_codec = _codec_table(opts)
    total = sum(tree.size[e] for e in tree.files())
    shard_files = _plan_shards(tree, shard_target(total, opts.shard_size, opts.jobs))
    jobs = [ShardJob(n, os.path.join(tmp, SHARD_DIR, shard_name(n)), store_id,
                     [(e, tree.abspath(e)) for e in entries], codecs, opts.kinds, default_codec, raw_codec, opts.plan)
            for n, entries in enumerate(shard_files)]
    results = _run_jobs(jobs, opts, total)
    return _write_index(tmp, tree, opts, store_id, codecs, results, started)


def _run_jobs(jobs: Sequence[ShardJob], opts: PackOptions, total: int) -> list[ShardResult]:
    global _progress_counter
    counter = _progress_counter = mp.get_context("fork").Value("Q", 0)
    results: list[ShardResult] = []
    with Progress(total, "pack", enabled=opts.progress, unit="B") as bar, _deferred_interrupt() as interrupted, \
            process_pool(max(1, min(opts.jobs, len(jobs))), _init_worker, (counter,)) as pool:
        pending = {pool.submit(_pack_shard, job) for job in jobs}
        while pending:
            if interrupted():
                raise KeyboardInterrupt
            done, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_COMPLETED)
            for future in done:
                results.append(future.result())
            bar.update_to(counter.value)
    return sorted(results, key=lambda r: r.shard)


def _write_index(tmp: str, tree: Tree, opts: PackOptions, store_id: bytes, codecs: list[Codec],
                 results: list[ShardResult], started: float) -> PackReport:
    n = len(tree.paths)
    cols = new_columns(ENTRY_COLUMNS, n)
    for key in ("parent", "type", "mode", "mtime", "size", "first", "count"):  # what the walk found
        cols[key][:] = getattr(tree, key)
    targets = bytearray()
    for entry, target in tree.targets.items():
        cols["first"][entry], cols["count"][entry] = len(targets), len(target)
        targets += target
    blob_parts: dict[str, list[np.ndarray]] = {}
    base = 0
    stats: dict[int, list[int]] = {}
    fallbacks: list[tuple[str, str, str]] = []
    for result in results:
        f = result.files
        entries = f["entry"]
        for key in ("record", "layers", "codec", "size", "checksum", "count"):
            cols[key][entries] = f[key]
        cols["first"][entries] = f["first"] + base
        cols["shard"][entries] = result.shard
        for key, column in result.blobs.items():
            blob_parts.setdefault(key, []).append(column)
        base += result.blobs["blob_raw"].size
        fallbacks += result.fallbacks
        for codec, (files, raw, stored) in result.stored_by_codec.items():
            acc = stats.setdefault(codec, [0, 0, 0])
            acc[0] += files
            acc[1] += raw
            acc[2] += stored
    cols.update(new_columns(BLOB_COLUMNS, 0))
    for key, parts in blob_parts.items():
        cols[key] = np.concatenate(parts)
    cols.update(new_columns(SHARD_COLUMNS, len(results)))
    cols["shard_size"][:] = [r.size for r in results]
    cols["shard_checksum"][:] = [r.checksum for r in results]
    files = tree.files()
    bytes_in = sum(tree.size[e] for e in files)
    bytes_stored = int(cols["blob_stored"].sum())
    file_rows = cols["type"] == FILE
    records = {kind.name: {"files": int(((cols["record"] == kind.kind_id) & file_rows).sum()),
                           "fallbacks": sum(1 for k, _, _ in fallbacks if k == kind.name), **(kind.pack_config() or {})}
               for kind in opts.kinds}
    held = [kind for kind in opts.kinds if records[kind.name]["files"]]
    meta = header(
        format_version=max([1, *(kind.since_format for kind in held)]),  # older fanfs keep reading what they can
        store_id=store_id, source=os.fsdecode(tree.root), codecs=[c.get_config() for c in codecs],
        codec_stats={str(c): {"files": v[0], "raw": v[1], "stored": v[2]} for c, v in sorted(stats.items())},
        records=records, plan=opts.plan.describe() if opts.plan else None,  # class -> codec index (fanfs.pack.plan)
        totals={"entries": n, "files": len(files), "dirs": tree.type.count(0), "symlinks": len(tree.targets),
                "bytes_in": bytes_in, "bytes_presented": int(cols["size"][file_rows].sum()),
                "bytes_stored": bytes_stored, "shards": len(results)})
    dictionaries = opts.plan.dictionaries() if opts.plan else {}
    try:
        build_index(os.path.join(tmp, INDEX_NAME), meta, tree.paths, cols, bytes(targets), dictionaries)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(tmp) from None
        raise
    return PackReport("", len(files), meta["totals"]["dirs"], len(tree.targets), bytes_in, bytes_stored,
                      len(results), {k: v["files"] for k, v in records.items()}, fallbacks, [],
                      time.monotonic() - started)
