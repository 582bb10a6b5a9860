"""On-disk format of a store: constants, the shard header, and the index file container.

A store is one directory::

    STORE/index             global metadata: JSON header + numpy columns, checksummed as a whole
    STORE/shards/000000     blobs, layer-major, behind a small header naming the store
    STORE/fidelity.json     optional: the fidelity curve measured once and saved with the store (:mod:`.saved`)

The index container is ``MAGIC, version, JSON length, JSON, columns (64-byte aligned), xxh3-64 of all
that``.  Columns are ``numpy.frombuffer`` views of a private copy of the file, so opening an index of millions
of entries costs one read and checksum pass and no Python object per entry.  Its head is checked first: a file that
is not one, or whose size is not what its header lays out, is refused before the rest of it is read, whatever its
size.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import xxhash

from ..errors import StoreError
from ..util.checksum import checksum  # noqa: F401  (re-exported: the store's checksum)
from ..util.deadline import Deadline, Stalled, close_within, deadline_for, within
from ..util.files import open_regular
from ..util.units import human_size
from .trust import sealed_memory

FORMAT_VERSION = 5
"""The newest index format this fanfs writes: 5 when it holds extents, 4 when files share blobs (hard links), 3 when a
store holds JPEG resolution tiers, 2 when it holds float records (kinds and layouts older formats lack), else 1."""
FORMATS = (1, 2, 3, 4, 5)
SHARED_BLOBS_FORMAT = 4
"""The first format in which two files may name the same blobs (hard links)."""
"""Index formats this fanfs reads (every store ever written must keep reading byte-exactly)."""
SHARD_VERSION = 1
"""The shard container's version (unchanged by formats 2 and 3: blobs behind a header)."""
INDEX_MAGIC = b"FANFSIDX"
SHARD_MAGIC = b"FANFSSHD"
INDEX_NAME = "index"
SHARD_DIR = "shards"
SAVED_NAMES = ("fidelity.json",)
"""Optional files a store may hold beside its index: measurements saved with it (:mod:`.saved`).  An older fanfs
never opens them."""
SHARD_HEADER = struct.Struct("<8sII16s32x")  # magic, shard version, shard number, store id

_INDEX_HEAD = struct.Struct("<8sIIQ")  # magic, version, reserved, JSON length
MAX_HEADER = 64 << 20
"""Bytes an index's JSON header may take: a real one holds the store's settings and its column table (kilobytes)."""
_ALIGN = 64

# Entry types.  (How a file's blobs present it is its record kind: fanfs.records.)
DIR, FILE, SYMLINK = 0, 1, 2


_BLOCK = 1 << 20


def read_blocks(f: BinaryIO) -> Iterator[memoryview]:
    """A file's bytes as views of one reused buffer, small enough to stay in cache while hashed and copied."""
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    while n := f.readinto(buf):
        yield view[:n]


def digest_file(f: BinaryIO, on_block: Callable[[int], None] | None = None) -> tuple[int, int]:
    """(size, checksum) of the rest of an open file; ``on_block(n)`` after each block (progress)."""
    digest = xxhash.xxh3_64()
    size = 0
    for block in read_blocks(f):
        digest.update(block)
        size += len(block)
        if on_block:
            on_block(len(block))
    return size, digest.intdigest()


def shard_name(shard: int) -> str:
    return f"{shard:06d}"


def shard_header(shard: int, store_id: bytes) -> bytes:
    return SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, shard, store_id)


def check_shard_header(head: bytes, shard: int, store_id: bytes, where: str) -> None:
    if len(head) < SHARD_HEADER.size:
        raise StoreError(f"{where}: shard is truncated")
    magic, version, number, sid = SHARD_HEADER.unpack_from(head)
    if magic != SHARD_MAGIC or version != SHARD_VERSION:
        raise StoreError(f"{where}: not a fanfs shard of version {SHARD_VERSION}")
    if number != shard or sid != store_id:
        raise StoreError(f"{where}: shard belongs to another store or position (shard {number})")


def write_index(path: str, meta: Mapping[str, Any], columns: Mapping[str, np.ndarray]) -> int:
    """Write the index container durably (temp name, fsync, rename); returns its size.

    The container carries the format named by ``meta["format"]``.
    """
    layout: dict[str, list[Any]] = {}
    offset = 0
    for name, column in columns.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = [column.dtype.str, offset, int(column.size)]
        offset += column.nbytes
    head_json = json.dumps({**meta, "columns": layout}, sort_keys=True).encode()
    version = meta.get("format") if meta.get("format") in FORMATS else FORMAT_VERSION  # else: refused when read
    head = _INDEX_HEAD.pack(INDEX_MAGIC, int(version), 0, len(head_json)) + head_json
    base = -(-len(head) // _ALIGN) * _ALIGN
    digest = xxhash.xxh3_64()
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        def put(data: bytes | memoryview) -> None:
            out.write(data)
            digest.update(data)

        put(head.ljust(base, b"\0"))
        pos = 0
        for name, column in columns.items():
            start = layout[name][1]
            put(b"\0" * (start - pos))
            put(memoryview(np.ascontiguousarray(column)).cast("B"))
            pos = start + column.nbytes
        out.write(struct.pack("<Q", digest.intdigest()))
        out.flush()
        os.fsync(out.fileno())
        size = out.tell()
    os.replace(tmp, path)
    return size


def read_index(path: str, data: mmap.mmap | bytes | bytearray | None = None, checked: bool = False
               ) -> tuple[dict[str, Any], dict[str, np.ndarray], int, int, str | None, mmap.mmap | bytes | bytearray]:
    """Read an index into memory of this process's own (:func:`read_index_file`), verify its checksum and version, and
    return (meta, read-only columns, its size, its checksum, the file's identity: see :mod:`.trust`; None for ``data``
    or a file written to meanwhile; the memory the columns are views of).

    The columns are views of a private copy, never a mapping of the file: what was verified is what is served,
    whatever happens to the file afterwards (rewritten in place, or cut short by ``cp`` or ``rsync --inplace``
    over the store: a shared mapping served another file's bytes, or died of SIGBUS).  ``data``: the index file's
    bytes already in memory (broadcast to the nodes of a job): the columns are views of it, no copy; ``checked``: bytes
    whose checksum was verified already and that nobody can have changed since (a mount's sealed memory, handed to an
    in-process reader), so not read whole again.
    """
    read_from = None
    if data is None:
        data, read_from = read_index_file(path)
    view = memoryview(data)
    json_len, digest = _check_index(path, len(data), lambda length, offset: view[offset:offset + length], not checked)
    return (*_parse_index(data, json_len), digest, read_from, data)


def read_index_file(path: str) -> tuple[mmap.mmap | bytes, str | None]:
    """The index file's bytes in sealed memory (the serving processes forked later and in-process readers share it),
    and the file's identity (:mod:`.trust`; None if it was written to while it was read).  On a network file system each step is
    waited on for ``--store-timeout`` at most (:mod:`fanfs.util.deadline`): a stalled one is Stalled, not a hang."""
    from .trust import file_identity
    reads = deadline_for(os.path.dirname(path) or ".")
    try:
        fd = within(reads, path, open_regular, path)
    except FileNotFoundError:
        raise StoreError(f"{os.path.dirname(path) or '.'}: no index: not a fanfs store, or its pack did not "
                         "finish (run 'fanfs pack' again)") from None
    except Stalled:
        raise
    except OSError as err:
        raise StoreError(f"{path}: cannot open the index: {err.strerror}") from None
    try:
        before = within(reads, path, file_identity, fd)
        size = within(reads, path, os.fstat, fd).st_size
        _check_head(path, size, lambda length, offset: within(reads, path, os.pread, fd, length, offset))
        data = _read_private(fd, path, reads)
        return data, before if within(reads, path, file_identity, fd) == before else None  # not written to meanwhile
    finally:
        close_within(reads, [fd])


def _read_private(fd: int, path: str, reads: Deadline | None) -> mmap.mmap | bytes:
    """The whole file at ``fd`` in sealed memory of this process's (:mod:`.sealed`), each block waited on for ``reads``'
    time (a short read: the file was cut meanwhile, refused)."""
    size = within(reads, path, os.fstat, fd).st_size
    if not size:
        return b""
    memory_here = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if size > memory_here:
        raise StoreError(f"{path}: an index of {human_size(size)}, more than this node's memory "
                         f"({human_size(memory_here)}): it is corrupt, or no index")

    def fill(view: memoryview) -> None:
        pos = 0
        while pos < size:
            got = within(reads, path, os.preadv, fd, [view[pos:min(size, pos + _BLOCK)]], pos)
            if got <= 0:
                raise StoreError(f"{path}: index is truncated ({pos} of {size} bytes): it changed while it was read")
            pos += got

    try:
        return sealed_memory(size, fill)
    except OSError as err:
        raise StoreError(f"{path}: cannot read the index ({human_size(size)}) into memory: {err.strerror}") from None


def _check_head(path: str, size: int, pread: Callable[[int, int], bytes | memoryview]) -> int:
    """Check an index's head before the rest is read (a file of any size may lie where the index belongs): its magic
    and version, and that the column table of its JSON header lays out exactly ``size`` bytes, as every index fanfs
    writes does; returns the JSON's length."""
    if size < _INDEX_HEAD.size + 8:
        raise StoreError(f"{path}: index is truncated ({size} bytes)")
    magic, version, _, json_len = _INDEX_HEAD.unpack(bytes(pread(_INDEX_HEAD.size, 0)))
    if magic != INDEX_MAGIC:
        raise StoreError(f"{path}: not a fanfs index")
    if version not in FORMATS:
        raise StoreError(f"{path}: store format version {version}, this fanfs reads versions "
                         f"{', '.join(map(str, FORMATS))}; "
                         "repack the source with this fanfs")
    if json_len > min(MAX_HEADER, size - _INDEX_HEAD.size - 8):
        raise StoreError(f"{path}: index header of {json_len:,} bytes in a file of {size:,}: the index is corrupt or "
                         "truncated; copy the store again or repack")
    layout = _layout(_header(bytes(pread(json_len, _INDEX_HEAD.size)), path))
    base = -(-(_INDEX_HEAD.size + json_len) // _ALIGN) * _ALIGN
    end = base + max((offset + count * dtype.itemsize for dtype, offset, count in layout.values()), default=0) + 8
    if size != end:
        raise StoreError(f"{path}: index of {size:,} bytes whose header lays out {end:,}: the index is corrupt or "
                         "truncated; copy the store again or repack")
    return json_len


def _check_index(path: str, size: int, pread: Callable[[int, int], bytes | memoryview],
                 whole: bool = True) -> tuple[int, int]:
    """Verify an index's head (:func:`_check_head`) and checksum through ``pread(length, offset)`` (``whole=False``:
    its head only); returns its JSON length and checksum."""
    json_len = _check_head(path, size, pread)
    digest = xxhash.xxh3_64()
    pos, end = 0, size - 8
    (expected,) = struct.unpack("<Q", bytes(pread(8, end)))
    if not whole:
        return json_len, expected
    while pos < end:
        block = pread(min(1 << 20, end - pos), pos)
        if not block:
            break
        digest.update(block)
        pos += len(block)
    if pos != end or digest.intdigest() != expected:
        raise StoreError(f"{path}: index checksum mismatch: the index is corrupt or truncated; "
                         "copy the store again or repack")
    return json_len, expected


_COLUMN_DTYPES = frozenset({"|u1", "<u2", "<u4", "<u8", "<i8"})
"""The only column types an index may declare (a crafted one could otherwise ask numpy for objects)."""


def _header(text: bytes, path: str | None = None) -> dict[str, Any]:
    """An index's JSON header, with a column table; anything else is one StoreError (naming ``path`` if given)."""
    where = f"{path}: " if path else ""
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise StoreError(f"{where}index header is not valid JSON ({err}): the store is corrupt; repack it") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("columns"), dict):
        raise StoreError(f"{where}index header has no column table: the store is corrupt; repack it")
    return meta


def _layout(meta: dict[str, Any]) -> dict[str, tuple[np.dtype, int, int]]:
    """The column table of an index's header: name -> (type, offset, count); a malformed entry is one StoreError."""
    layout = {}
    for name, entry in meta["columns"].items():
        if not (isinstance(entry, list) and len(entry) == 3 and entry[0] in _COLUMN_DTYPES
                and all(type(v) is int and v >= 0 for v in entry[1:])):
            raise StoreError(f"index column {name!r} has a bad layout {entry!r}: the store is corrupt; repack it")
        layout[name] = (np.dtype(entry[0]), entry[1], entry[2])
    return layout


def _parse_index(buffer: mmap.mmap | bytes | bytearray,
                 json_len: int) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """The JSON header and column views of a checked index (:func:`_check_index`)."""
    start = _INDEX_HEAD.size
    meta = _header(bytes(buffer[start:start + json_len]))
    base = -(-(start + json_len) // _ALIGN) * _ALIGN
    columns = {}
    for name, (dtype, offset, count) in _layout(meta).items():  # each within the index (_check_head)
        column = np.frombuffer(buffer, dtype=dtype, count=count, offset=base + offset)
        column.flags.writeable = False  # a broadcast buffer is a bytearray; the index is read-only all the same
        columns[name] = column
    del meta["columns"]
    return meta, columns, len(buffer)
