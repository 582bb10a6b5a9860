"""One shard file, built by one worker: files cut into layers by their record kinds, written layer-major.

Layer 0 of every file comes first, then layer 1 of every file, and so on, so the first K layers of a
whole shard are one prefix; side layers (:class:`fanfs.records.Packed`) follow, side layer j of every file
together, so each is one range of its own.  Blob numbers are file-major (a file's blobs are one contiguous
range: its layers', then its side layers').  Groups after layer 0 are spilled to temporary files beside
the shard while it is built (memory stays bounded whatever the shard holds) and appended in order at the end.  Writes go through our own buffer
on a raw descriptor: a failed write is reported once, never replayed by a close.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ..codecs import Codec, pays
from ..errors import FanfsError
from ..ingest import Data
from ..ingest.tree import MTIME_MAX, MTIME_MIN
from .batch import OnDisk, Payload, Ref, source_of
from ..records import Packed, PlainFiles, RecordKind
from ..store.format import shard_header
from ..store.schema import BLOB_COLUMNS
from ..util.checksum import Digest, checksum
from ..util.files import open_regular
from ..util.source_file import OpenFile, SourceFile

_BUFFER = 1 << 20
T = TypeVar("T")
HEAD = 4096  # bytes a kind sniffs (and a plan classifies) a file by
SIDE_GROUP = 1 << 16
"""Where side layer j is laid out: group SIDE_GROUP + j, after every layer index (a shard's groups go in order)."""


class PackError(FanfsError):
    """The pack could not finish; nothing was left behind."""


class NoSpace(PackError):
    """The store's file system filled up (the parent says where and how much more is needed)."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


class _Output:
    """An append-only file with a running checksum and a write buffer of our own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.digest = Digest()
        self.pos = 0
        self._buf = bytearray()

    def append(self, data: bytes | memoryview) -> int:
        pos = self.pos
        self.digest.update(data)
        self._buf += data
        self.pos += len(data)
        if len(self._buf) >= _BUFFER:
            self.flush()
        return pos

    def pad_to(self, align: int) -> None:
        """Zeros up to the next multiple of ``align`` (bytes of no blob: the shard's checksum covers them)."""
        if self.pos % align:
            self.append(bytes(align - self.pos % align))

    def flush(self) -> None:
        with memoryview(self._buf) as view:
            done = 0
            while done < len(view):
                done += os.write(self.fd, view[done:])
        self._buf.clear()

    def close(self, sync: bool) -> None:
        if self.fd < 0:
            return
        try:
            if sync:
                self.flush()
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1


@dataclass
class ShardJob:
    shard: int
    path: str
    store_id: bytes
    files: list[tuple[int, Ref, str]]  # (member id, the path to open or its bytes' slice of payload, its name)
    codecs: list[Codec]
    kinds: list[RecordKind]  # tried in order on files they claim; plain files otherwise
    default_codec: int
    raw_codec: int
    plan: object = None  # selection plan: .codec_index(head) per content class
    payload: Payload | None = None  # archive members' bytes (.batch)


@dataclass
class ShardResult:
    shard: int
    size: int
    checksum: int
    files: dict[str, np.ndarray]
    blobs: dict[str, np.ndarray]
    fallbacks: list[tuple[str, str, str]]  # (kind, path, reason) of files a kind refused
    adopted: list[tuple[str, str, str]]  # (kind, path, why) of plain files a kind adopted, saying why
    stored_by_codec: dict[int, list[int]] = field(default_factory=dict)  # codec -> [files, raw, stored]


class ShardWriter:
    """Appends a shard's blobs layer-major; ``add`` one file at a time, then ``close``."""

    def __init__(self, path: str, header: bytes) -> None:
        self.path = path
        self.out = _Output(path)
        self.out.append(header)
        self._spills: dict[int, _Output] = {}
        self.offset: list[int] = []
        self.stored: list[int] = []
        self.raw: list[int] = []
        self.checksum: list[int] = []
        self._spilled: list[tuple[int, int]] = []  # (blob, group) whose offset is relative to its spill file

    def add(self, packed: Packed, codec: Codec | None) -> tuple[int, int]:
        """Write (or spill) a file's blobs, compressed with ``codec`` unless None; returns (first blob, count)."""
        first = len(self.raw)
        if packed.align:
            self.out.pad_to(packed.align)
        groups = [*enumerate(packed.layers), *((SIDE_GROUP + j, blobs) for j, blobs in enumerate(packed.side))]
        for group, blobs in groups:
            for item in blobs:
                blob = len(self.raw)
                if isinstance(item, int):  # a hole: stored as nothing
                    self._slot(self.out.pos if group == 0 else 0, 0, item, 0)
                    if group:
                        self._spilled.append((blob, group))
                    continue
                stored = item
                if codec is not None and (packed_bytes := pays(codec, item)) is not None:
                    stored = packed_bytes
                target = self.out if group == 0 else self._spill(group)
                self._slot(target.append(stored), len(stored), len(item), checksum(stored))
                if group:
                    self._spilled.append((blob, group))
        return first, len(self.raw) - first

    def _slot(self, offset: int, stored: int, raw: int, digest: int) -> None:
        self.offset.append(offset)
        self.stored.append(stored)
        self.raw.append(raw)
        self.checksum.append(digest)

    def _spill(self, group: int) -> _Output:
        spill = self._spills.get(group)
        if spill is None:
            spill = self._spills[group] = _Output(f"{self.path}.layer{group}")
        return spill

    def close(self) -> tuple[int, int]:
        """Append the spilled groups in order, sync; returns (size, checksum) of the shard file."""
        bases = {}
        for group in sorted(self._spills):
            spill = self._spills[group]
            spill.flush()
            bases[group] = self.out.pos
            with open(spill.path, "rb", buffering=0) as f:
                while block := f.read(_BUFFER):
                    self.out.append(block)
        for blob, group in self._spilled:
            self.offset[blob] += bases.get(group, self.out.pos)
        self.out.close(sync=True)
        self.abort()
        return self.out.pos, self.out.digest.intdigest()

    def abort(self) -> None:
        """Close everything without writing more; remove the spill files."""
        for spill in self._spills.values():
            try:
                spill.close(sync=False)
            finally:
                if os.path.exists(spill.path):
                    os.unlink(spill.path)
        self._spills.clear()
        self.out.close(sync=False)

    def blob_columns(self) -> dict[str, np.ndarray]:
        """The index's blob columns of this shard (offsets within it; the parent renumbers nothing else)."""
        written = {"blob_offset": self.offset, "blob_stored": self.stored, "blob_raw": self.raw,
                   "blob_checksum": self.checksum}
        return {name: np.array(written[name], dtype) for name, dtype in BLOB_COLUMNS.items()}


def pack_shard(job: ShardJob) -> ShardResult:
    """Build one shard file from its files; runs in a worker process."""
    writer = ShardWriter(job.path, shard_header(job.shard, job.store_id))
    columns: dict[str, list[int]] = {k: [] for k in ("entry", "record", "layers", "first", "count", "codec",
                                                     "size", "checksum")}
    fallbacks: list[tuple[str, str, str]] = []
    adopted: list[tuple[str, str, str]] = []
    by_codec: dict[int, list[int]] = {}
    try:
        for entry, ref, name in job.files:
            source, kind, packed, head = _cut(job, source_of(ref, job.payload), name, fallbacks)
            try:
                if packed.compress:
                    codec = job.plan.codec_index(head) if job.plan is not None else job.default_codec
                else:
                    codec = job.raw_codec
                if kind is _PLAIN:
                    kind, packed, codec = _adopted(job, source, packed, codec, name, fallbacks, adopted)
                first, count = _written(name, lambda: writer.add(packed, job.codecs[codec] if packed.compress else None))
                if isinstance(ref, OnDisk):
                    _unchanged(ref, source, name)
            finally:
                _close(source)  # streamed layers read it until they are written
            for key, value in (("entry", entry), ("record", kind.kind_id), ("layers", len(packed.layers)),
                               ("first", first), ("count", count), ("codec", codec), ("size", packed.size),
                               ("checksum", packed.final_checksum())):
                columns[key].append(value)
            stat = by_codec.setdefault(codec, [0, 0, 0])
            stat[0] += 1
            stat[1] += packed.size
            stat[2] += sum(writer.stored[first:first + count])
        size, digest = _written(None, writer.close)
    except BaseException:
        writer.abort()
        raise
    files = {k: np.array(v, np.uint64 if k == "checksum" else np.int64) for k, v in columns.items()}
    return ShardResult(job.shard, size, digest, files, writer.blob_columns(), fallbacks, adopted, by_codec)


def _adopted(job: ShardJob, source: SourceFile, packed: Packed, codec: int, name: str,
             fallbacks: list[tuple[str, str, str]],
             adopted: list[tuple[str, str, str]]) -> tuple[RecordKind, Packed, int]:
    """A plain file as the first kind that adopts it once its codec is known (an extent: its bytes stored raw, laid
    out to be read in place); why a kind did is reported in ``adopted``, why it did not as that kind's fallback."""
    for kind in job.kinds:
        try:
            adopts, why = kind.adopts(source, job.codecs[codec], codec == job.raw_codec, job.plan is not None)
        except OSError as err:
            raise PackError(f"cannot read {name}: {err.strerror or err}") from None
        if adopts:
            if why:
                adopted.append((kind.name, name, why))
            return kind, kind.adopt(packed), job.raw_codec
        if why and not (fallbacks and fallbacks[-1][1] == name):  # a file another kind let go is listed once, there
            fallbacks.append((kind.name, name, why))
    return _PLAIN, packed, codec


def _unchanged(ref: OnDisk, source: SourceFile, name: str) -> None:
    """Refuse a file whose size or mtime moved since the walk: it was being written while it was read (GNU tar says
    "file changed as we read it"), and its bytes may be half old, half new."""
    if isinstance(source, OpenFile):
        st = os.fstat(source.fd)
        held = ref.mtime in (MTIME_MIN, MTIME_MAX)  # an mtime beyond the index's range was held at its edge
        if st.st_size != ref.size or (st.st_mtime_ns != ref.mtime and not held):
            what = f"size {ref.size:,} -> {st.st_size:,}" if st.st_size != ref.size else "modified"
            raise PackError(f"{name} changed while it was packed ({what}): pack again once nothing writes to the source")


class _SourceFailure(Exception):
    """Reading the source failed (kept apart from write failures, which are the store's)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _cut(job: ShardJob, data: Data, name: str,
         fallbacks: list[tuple[str, str, str]]) -> tuple[SourceFile, RecordKind, Packed, bytes]:
    """Open the source file (a path) or take its bytes, and let the first kind that claims it cut it (plain if
    none manages).  Returns the source too: a large file's layers are read from it while they are written."""
    source: SourceFile
    if isinstance(data, bytes):
        try:
            source = OpenFile(open_regular(data, follow=False))
        except OSError as err:
            raise PackError(f"cannot read {name}: {err.strerror}") from None
        except FanfsError as err:
            raise PackError(f"cannot pack {err} (it changed since the walk)") from None
    else:
        source = data
    try:
        head = source.pread(HEAD, 0)
        chosen: RecordKind = _PLAIN
        packed: Packed | str = ""
        for kind in job.kinds:
            if kind.claims(head):
                packed = kind.pack(source, head)
                if isinstance(packed, Packed):
                    chosen = kind
                else:
                    fallbacks.append((kind.name, name, packed))
                break
        if not isinstance(packed, Packed):
            packed = _PLAIN.pack(source, head)
    except OSError as err:
        _close(source)
        raise PackError(f"cannot read {name}: {err.strerror or err}") from None
    except BaseException:
        _close(source)
        raise
    packed.layers = [_reading(blobs) for blobs in packed.layers]
    packed.side = [_reading(blobs) for blobs in packed.side]
    return source, chosen, packed, head


def _close(source: SourceFile) -> None:
    if isinstance(source, OpenFile):
        os.close(source.fd)


_PLAIN = PlainFiles()


def _reading(blobs: Iterable[bytes | int]) -> Iterator[bytes | int]:
    """A layer's blobs with read errors marked as the source's (streamed layers read while being written)."""
    it = iter(blobs)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except OSError as err:
            raise _SourceFailure(err.strerror or str(err)) from None
        yield item


def _written(name: str | None, write: Callable[[], T]) -> T:
    """Run a write of the shard; a full disk is NoSpace, a source that failed mid-read names the source."""
    try:
        return write()
    except _SourceFailure as failure:
        raise PackError(f"cannot read {name or '?'}: {failure.reason}") from None
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(err.filename or "") from None
        raise PackError(f"cannot write the store: {err.strerror or err}") from None
