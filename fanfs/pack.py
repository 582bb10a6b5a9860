"""Pack a source tree into a store: walk, cut into shards, compress in parallel, write atomically.

Each worker process builds one whole shard file (layer-major: layer 0 of every file, then layer 1 of
every file, ...) and returns only the small blob/file tables; the parent assembles the index.  The
store is built under ``STORE.partial-PID`` next to STORE and renamed into place only once the index
is durable, so an interrupted pack never leaves anything that mounts as complete.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime
import errno
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from . import __version__
from .codecs import Codec, Raw, Zstd
from .format import (CHUNK_SIZE, FILE, FORMAT_VERSION, INDEX_MAGIC, INDEX_NAME, RECORD_JPEG, RECORD_PLAIN, SHARD_DIR,
                     StoreError, checksum, shard_header, shard_name)
from .index import build_index
from .progress import Progress
from .workers import process_pool
from .walk import Tree, walk

_HOLE = bytes(CHUNK_SIZE)


class PackError(StoreError):
    """The pack could not finish; nothing was left behind."""


@dataclass
class PackOptions:
    codec: Codec = field(default_factory=lambda: Zstd(3))
    shard_size: int = 256 << 20
    jobs: int = max(1, os.cpu_count() or 1)
    force: bool = False
    progressive_jpeg: bool = False
    scan_script: Any = None  # jpeg.ScanScript
    plan: Any = None  # selection plan: .codecs(), .codec_index(head) for per-class codecs
    progress: bool = True


@dataclass
class ShardJob:
    shard: int
    path: str
    store_id: bytes
    files: list[tuple[int, bytes]]  # (entry, absolute source path)
    codecs: list[Codec]
    default_codec: int
    raw_codec: int
    options: PackOptions


@dataclass
class ShardResult:
    shard: int
    size: int
    checksum: int
    files: dict[str, np.ndarray]
    blobs: dict[str, np.ndarray]
    jpeg_fallbacks: list[str]
    stored_by_codec: dict[int, list[int]]  # codec -> [files, raw bytes, stored bytes]


class _ShardWriter:
    """Appends blobs to one shard file, keeping a running checksum and the blob table."""

    def __init__(self, path: str, header: bytes) -> None:
        self.out = open(path, "wb", buffering=1 << 20)
        self.digest = xxhash.xxh3_64()
        self.pos = 0
        self.offset: list[int] = []
        self.stored: list[int] = []
        self.raw: list[int] = []
        self.checksum: list[int] = []
        self._append(header)

    def _append(self, data: bytes) -> int:
        self.out.write(data)
        self.digest.update(data)
        pos = self.pos
        self.pos += len(data)
        return pos

    def new_blob(self, raw_size: int) -> int:
        """Reserve a blob slot (its bytes may be written later, for layer-major order)."""
        for column, value in ((self.offset, 0), (self.stored, 0), (self.raw, raw_size), (self.checksum, 0)):
            column.append(value)
        return len(self.raw) - 1

    def put(self, blob: int, stored: bytes) -> None:
        self.offset[blob] = self._append(stored)
        self.stored[blob] = len(stored)
        self.checksum[blob] = checksum(stored)

    def hole(self, blob: int) -> None:
        self.offset[blob] = self.pos

    def close(self) -> tuple[int, int]:
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        return self.pos, self.digest.intdigest()


_progress_counter: Any = None


def _init_worker(counter: Any) -> None:
    global _progress_counter
    _progress_counter = counter


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Turn SIGINT into a flag the caller checks between waits.

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


def _advance(nbytes: int) -> None:
    if _progress_counter is not None:
        with _progress_counter.get_lock():
            _progress_counter.value += nbytes


def _compress(codec: Codec, data: bytes) -> bytes:
    packed = codec.encode(data)
    return packed if len(packed) < len(data) else data  # stored == raw means "raw" to the reader


def _read_small(path: bytes) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        parts = []
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _chunks(fd: int, size: int):
    """Yield the chunks of a large file; ``None`` for a chunk that lies wholly in a hole."""
    pos = 0
    while pos < size:
        n = min(CHUNK_SIZE, size - pos)
        try:
            data_at = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
            data_at = size
        if data_at >= pos + n:
            yield None, n
        else:
            data = os.pread(fd, n, pos)
            if len(data) != n:
                raise OSError(errno.EIO, "file changed size while being packed")
            yield data, n
        pos += n


def pack_shard(job: ShardJob) -> ShardResult:
    """Build one shard file from its files; runs in a worker process."""
    writer = _ShardWriter(job.path, shard_header(job.shard, job.store_id))
    files: dict[str, list[int]] = {k: [] for k in ("entry", "record", "layers", "first", "count", "codec",
                                                   "size", "checksum")}
    later: list[list[tuple[int, bytes]]] = []  # deferred blobs of layers >= 1, by layer
    fallbacks: list[str] = []
    by_codec: dict[int, list[int]] = {}
    for entry, path in job.files:
        first = len(writer.raw)
        try:
            if os.stat(path, follow_symlinks=False).st_size > CHUNK_SIZE:
                record, layers, codec_ix, size, digest = _put_large(writer, job, path)
            else:
                record, layers, codec_ix, size, digest = _put_small(writer, job, path, later, fallbacks)
        except OSError as err:
            writer.out.close()
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise PackError(f"no space left on the device of {os.path.dirname(os.path.dirname(job.path))}: "
                                "free space or pack to another place") from None
            raise PackError(f"cannot read {os.fsdecode(path)}: {err.strerror}") from None
        for key, value in (("entry", entry), ("record", record), ("layers", layers), ("first", first),
                           ("count", len(writer.raw) - first), ("codec", codec_ix), ("size", size),
                           ("checksum", digest)):
            files[key].append(value)
        stat = by_codec.setdefault(codec_ix, [0, 0, 0])
        stat[0] += 1
        stat[1] += size
    try:
        for layer in later:
            for blob, data in layer:
                writer.put(blob, data)
        size, digest = writer.close()
    except OSError as err:
        raise PackError(f"cannot write shard {job.path}: {err.strerror}") from None
    blobs = {"blob_offset": np.array(writer.offset, np.uint64), "blob_stored": np.array(writer.stored, np.uint32),
             "blob_raw": np.array(writer.raw, np.uint32), "blob_checksum": np.array(writer.checksum, np.uint64)}
    stored = blobs["blob_stored"]
    for ix, codec in enumerate(files["codec"]):
        a = files["first"][ix]
        by_codec[codec][2] += int(stored[a:a + files["count"][ix]].sum())
    return ShardResult(job.shard, size, digest, {k: np.array(v, np.uint64 if k == "checksum" else np.int64) for k, v in files.items()}, blobs,
                       fallbacks, by_codec)


def _put_small(writer: _ShardWriter, job: ShardJob, path: bytes, later: list[list[tuple[int, bytes]]],
               fallbacks: list[str]) -> tuple[int, int, int, int, int]:
    data = _read_small(path)
    _advance(len(data))
    if job.options.progressive_jpeg:
        from . import jpeg
        if jpeg.looks_like_jpeg(data[:4]):
            try:
                layers = jpeg.split_layers(jpeg.to_progressive(data, job.options.scan_script))
            except jpeg.JpegError as err:
                fallbacks.append(f"{os.fsdecode(path)}: {err}")
            else:
                for i, layer in enumerate(layers):
                    blob = writer.new_blob(len(layer))
                    if i == 0:
                        writer.put(blob, layer)
                    else:
                        while len(later) < i:
                            later.append([])
                        later[i - 1].append((blob, layer))
                full = b"".join(layers)
                return RECORD_JPEG, len(layers), job.raw_codec, len(full), checksum(full)
    codec_ix = job.options.plan.codec_index(data) if job.options.plan else job.default_codec
    if data:
        writer.put(writer.new_blob(len(data)), _compress(job.codecs[codec_ix], data))
    return RECORD_PLAIN, 1, codec_ix, len(data), checksum(data)


def _put_large(writer: _ShardWriter, job: ShardJob, path: bytes) -> tuple[int, int, int, int, int]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        digest = xxhash.xxh3_64()
        codec_ix = None
        for data, n in _chunks(fd, size):
            blob = writer.new_blob(n)
            if data is None:
                writer.hole(blob)
                digest.update(_HOLE[:n])
                _advance(n)
                continue
            if codec_ix is None:
                codec_ix = job.options.plan.codec_index(data) if job.options.plan else job.default_codec
            writer.put(blob, _compress(job.codecs[codec_ix], data))
            digest.update(data)
            _advance(n)
        return RECORD_PLAIN, 1, job.default_codec if codec_ix is None else codec_ix, size, digest.intdigest()
    finally:
        os.close(fd)


@dataclass
class PackReport:
    store: str
    files: int
    dirs: int
    symlinks: int
    bytes_in: int
    bytes_stored: int
    shards: int
    jpeg_records: int
    jpeg_fallbacks: list[str]
    skipped: list[str]
    seconds: float


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


PARTIAL_MARKER = ".fanfs-partial"
"""Written first into a store being built (and into a store being replaced): only a directory holding it,
left by a pack that is no longer running on this host, is ever removed as stale."""


def _is_store(path: str) -> bool:
    """Is ``path`` recognisably a fanfs store: an index with fanfs's magic and nothing but index and shards?"""
    try:
        names = set(os.listdir(path))
        with open(os.path.join(path, INDEX_NAME), "rb") as f:
            magic = f.read(len(INDEX_MAGIC))
    except OSError:
        return False
    if magic != INDEX_MAGIC or not names <= {INDEX_NAME, SHARD_DIR, PARTIAL_MARKER}:
        return False
    shards = os.path.join(path, SHARD_DIR)
    return not os.path.exists(shards) or all(n.split(".")[0].isdigit() for n in os.listdir(shards))


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _prepare_destination(store: str, src: str, force: bool) -> str:
    """Refuse an unusable STORE; return the temp directory to build in (beside STORE).

    ``--force`` replaces an empty directory or a fanfs store, never anything else: not a tree that
    holds SRC or lies inside it, not a directory of other files, not a symbolic link.
    """
    real_src, real_store = os.path.realpath(src), os.path.realpath(store)
    if _inside(real_store, real_src):
        raise PackError(f"store {store} is inside the source {src}: pick a place outside it")
    if _inside(real_src, real_store):
        raise PackError(f"the source {src} is inside {store}: a store there would replace it; pick another place")
    if os.path.islink(store):
        raise PackError(f"{store} is a symbolic link: give the real path of the store")
    if os.path.lexists(store):
        if not os.path.isdir(store):
            raise PackError(f"{store} exists and is not a directory")
        if os.listdir(store):
            if not _is_store(store):
                raise PackError(f"{store} exists and is not a fanfs store: fanfs replaces only a store or an empty "
                                "directory, even with --force; remove it yourself or pick another place")
            if not force:
                raise PackError(f"{store} is a fanfs store already: use --force to replace it")
    parent = os.path.dirname(os.path.abspath(store))
    if not os.path.isdir(parent):
        raise PackError(f"cannot create {store}: {parent} does not exist")
    _remove_stale(parent, os.path.basename(os.path.abspath(store)))
    tmp = os.path.abspath(store) + f".partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.mkdir(tmp)
    _mark(tmp)
    os.mkdir(os.path.join(tmp, SHARD_DIR))
    return tmp


def _mark(directory: str) -> None:
    """Claim ``directory`` for this pack: host and pid, so a later pack knows whether it is still running."""
    with open(os.path.join(directory, PARTIAL_MARKER), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "boot": _boot_id()}, f)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _remove_stale(parent: str, name: str) -> None:
    """Remove partial or replaced stores of STORE that a pack left when it was killed (its marker says so)."""
    for entry in os.listdir(parent):
        if not (entry.startswith(name + ".partial-") or entry.startswith(name + ".old-")):
            continue
        path = os.path.join(parent, entry)
        try:
            with open(os.path.join(path, PARTIAL_MARKER)) as f:
                owner = json.load(f)
            host, pid, boot = owner["host"], int(owner["pid"]), owner.get("boot", "")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not something fanfs wrote: never touched
        if host == socket.gethostname() and (boot != _boot_id() or not _pid_alive(pid)) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _commit(tmp: str, store: str) -> None:
    """Put the finished store in place with renames (atomic on one file system)."""
    os.unlink(os.path.join(tmp, PARTIAL_MARKER))
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    old = None
    if os.path.lexists(store):
        if os.listdir(store):
            if not _is_store(store):  # it changed since the pack started: leave it alone
                raise PackError(f"{store} was changed during the pack and is no longer a fanfs store: not replaced")
            _mark(store)
            old = os.path.abspath(store) + f".old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(store, old)
        else:
            os.rmdir(store)
    os.rename(tmp, store)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def pack(src: str, store: str, options: PackOptions | None = None,
         on_warning: Callable[[str], None] | None = None) -> PackReport:
    """Pack ``src`` into a new store at ``store``; raises StoreError with a one-line reason on failure."""
    opts = options or PackOptions()
    started = time.monotonic()
    tree = walk(src)
    for note in tree.skipped:
        if on_warning:
            on_warning(f"skipped {note}")
    tmp = _prepare_destination(store, src, opts.force)
    try:
        report = _pack_into(tmp, tree, opts, started)
        _commit(tmp, store)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.store = store
    report.skipped = tree.skipped
    return report


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
    shard_files = _plan_shards(tree, opts.shard_size)
    jobs = [ShardJob(n, os.path.join(tmp, SHARD_DIR, shard_name(n)), store_id,
                     [(e, tree.abspath(e)) for e in entries], codecs, default_codec, raw_codec, opts)
            for n, entries in enumerate(shard_files)]
    results = _run_jobs(jobs, opts, sum(tree.size[e] for e in tree.files()))
    return _write_index(tmp, tree, opts, store_id, codecs, results, started)


def _run_jobs(jobs: Sequence[ShardJob], opts: PackOptions, total: int) -> list[ShardResult]:
    counter = mp.get_context("fork").Value("Q", 0)
    results: list[ShardResult] = []
    with Progress(total, "pack", enabled=opts.progress, unit="B") as bar, _deferred_interrupt() as interrupted, \
            process_pool(max(1, min(opts.jobs, len(jobs))), _init_worker, (counter,)) as pool:
        pending = {pool.submit(pack_shard, job) for job in jobs}
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
    cols: dict[str, np.ndarray] = {
        "parent": np.array(tree.parent, np.uint32), "type": np.array(tree.type, np.uint8),
        "record": np.zeros(n, np.uint8), "mode": np.array(tree.mode, np.uint32),
        "mtime": np.array(tree.mtime, np.int64), "size": np.array(tree.size, np.uint64),
        "first": np.array(tree.first, np.uint64), "count": np.array(tree.count, np.uint32),
        "layers": np.zeros(n, np.uint16), "codec": np.zeros(n, np.uint8), "shard": np.zeros(n, np.uint32),
        "checksum": np.zeros(n, np.uint64),
    }
    targets = bytearray()
    for entry, target in tree.targets.items():
        cols["first"][entry], cols["count"][entry] = len(targets), len(target)
        targets += target
    blob_parts: dict[str, list[np.ndarray]] = {}
    base = 0
    stats: dict[int, list[int]] = {}
    fallbacks: list[str] = []
    jpeg_records = 0
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
        fallbacks += result.jpeg_fallbacks
        jpeg_records += int((f["record"] == RECORD_JPEG).sum())
        for codec, (files, raw, stored) in result.stored_by_codec.items():
            acc = stats.setdefault(codec, [0, 0, 0])
            acc[0] += files
            acc[1] += raw
            acc[2] += stored
    for key in ("blob_offset", "blob_stored", "blob_raw", "blob_checksum"):
        cols[key] = np.concatenate(blob_parts[key]) if blob_parts.get(key) else np.zeros(0)
    cols["shard_size"] = np.array([r.size for r in results], np.uint64)
    cols["shard_checksum"] = np.array([r.checksum for r in results], np.uint64)
    files = tree.files()
    bytes_in = sum(tree.size[e] for e in files)
    bytes_stored = int(cols["blob_stored"].sum())
    meta = {
        "format": FORMAT_VERSION, "store_id": store_id.hex(), "fanfs": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": os.fsdecode(tree.root), "chunk_size": CHUNK_SIZE,
        "codecs": [c.get_config() for c in codecs],
        "codec_stats": {str(c): {"files": v[0], "raw": v[1], "stored": v[2]} for c, v in sorted(stats.items())},
        "scan_script": opts.scan_script.text if opts.scan_script else None,
        "plan": opts.plan.describe() if opts.plan else None,  # class -> codec index (fanfs.plan)
        "totals": {"entries": n, "files": len(files), "dirs": tree.type.count(0), "symlinks": len(tree.targets),
                   "bytes_in": bytes_in, "bytes_presented": int(cols["size"][cols["type"] == FILE].sum()),
                   "bytes_stored": bytes_stored, "shards": len(results), "jpeg_records": jpeg_records,
                   "jpeg_fallbacks": len(fallbacks)},
    }
    dictionaries = opts.plan.dictionaries() if opts.plan else {}
    build_index(os.path.join(tmp, INDEX_NAME), meta, tree.paths, cols, bytes(targets), dictionaries)
    return PackReport("", len(files), meta["totals"]["dirs"], len(tree.targets), bytes_in, bytes_stored,
                      len(results), jpeg_records, fallbacks, [], time.monotonic() - started)
