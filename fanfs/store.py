"""The core: open a store and read it, with no FUSE and no MPI involved.

``Store`` resolves paths to entries, presents attributes, and reads a file at a fidelity.  Blob bytes
come from a chain of :class:`ShardSource` objects (local shard files first; peers later), each copy
checked against the index's checksum before it is decoded, so a bad copy is skipped or turned into
an EIO, never into wrong bytes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat as statmod
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cache import BlobCache
from .codecs import Codec, codec_from_config
from .format import (DIR, FILE, INDEX_NAME, RECORD_JPEG, SHARD_DIR, SHARD_HEADER, StoreError, check_shard_header,
                     checksum, shard_name)
from .index import Index
from .jpeg import EOI

log = logging.getLogger("fanfs")

FULL = 0xFFFF
"""Fidelity meaning "every layer": the original bytes (or, for JPEG records, the full progressive file)."""
MAX_LAYERS = 64


class NotHeld(StoreError):
    """A source does not hold this shard by design (another node does): not a fault, not logged."""


class DataError(OSError):
    """No good copy of some bytes could be had: the read fails with EIO (and the reason is logged)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


class ShardSource:
    """Somewhere shard bytes can be read from."""

    name = "source"

    def read(self, shard: int, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalShards(ShardSource):
    """Shard files in a directory (``STORE/shards`` or a node-local staging directory)."""

    def __init__(self, directory: str, store_id: bytes) -> None:
        self.directory = directory
        self.name = directory
        self._store_id = store_id
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def path(self, shard: int) -> str:
        return os.path.join(self.directory, shard_name(shard))

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            with self._lock:
                fd = self._fds.get(shard)
                if fd is None:
                    fd = os.open(self.path(shard), os.O_RDONLY)
                    try:
                        check_shard_header(os.pread(fd, SHARD_HEADER.size, 0), shard, self._store_id, self.path(shard))
                    except StoreError:
                        os.close(fd)
                        raise
                    self._fds[shard] = fd
        return fd

    def read(self, shard: int, offset: int, length: int) -> bytes:
        return os.pread(self._fd(shard), length, offset)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


@dataclass
class Stats:
    """What a store served; ``fanfs stats`` shows it."""

    opens: int = 0
    reads: int = 0
    bytes_presented: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    decode_seconds: float = 0.0
    errors: int = 0
    stored_by_layer: np.ndarray = field(default_factory=lambda: np.zeros(MAX_LAYERS, np.int64))
    by_source: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        layers = self.stored_by_layer
        used = int(np.flatnonzero(layers).max()) + 1 if layers.any() else 0
        return {"opens": self.opens, "reads": self.reads, "bytes_presented": self.bytes_presented,
                "bytes_stored_read": int(layers.sum()), "stored_by_layer": layers[:used].tolist(),
                "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "decode_seconds": round(self.decode_seconds, 6), "errors": self.errors,
                "by_source": dict(self.by_source)}


class Store:
    """An opened store.  ``sources`` default to the store's own shard directory."""

    def __init__(self, root: str, *, cache_size: int = 1 << 30, sources: Sequence[ShardSource] | None = None,
                 check_shards: bool = True, index: Index | None = None) -> None:
        """``index``: the store's index already loaded (a cluster node receives it broadcast)."""
        self.root = root
        if not os.path.isdir(root):
            raise StoreError(f"{root}: no such store directory")
        self.index = index if index is not None else Index(os.path.join(root, INDEX_NAME))
        meta = self.index.meta
        self.meta = meta
        self.id = bytes.fromhex(meta["store_id"])
        self.chunk_size = int(meta["chunk_size"])
        self.codecs: list[Codec] = [codec_from_config(c, self.index.dictionaries) for c in meta["codecs"]]
        self.sources: list[ShardSource] = list(sources) if sources is not None else [
            LocalShards(os.path.join(root, SHARD_DIR), self.id)]
        if check_shards:
            self.check_shards()
        self.cache = BlobCache(cache_size)
        self.stats = Stats()
        ix = self.index
        # Plain Python views of the hot columns would cost memory; numpy item access is fast enough.
        self._type, self._record, self._first, self._count = ix.type, ix.record, ix.first, ix.count
        self._layers, self._raw, self._shard = ix.layers, ix.blob_raw, ix.shard
        self._uid, self._gid = os.getuid(), os.getgid()

    # --- metadata -------------------------------------------------------------------------------

    def check_shards(self) -> None:
        """Refuse a store whose shard files are missing, cut short or foreign (an unfinished copy)."""
        sizes = self.index.shard_size
        directory = os.path.join(self.root, SHARD_DIR)
        for shard in range(sizes.size):
            path = os.path.join(directory, shard_name(shard))
            try:
                with open(path, "rb") as f:
                    check_shard_header(f.read(SHARD_HEADER.size), shard, self.id, path)
                    size = os.fstat(f.fileno()).st_size
            except FileNotFoundError:
                raise StoreError(f"{self.root}: incomplete store: shard {shard_name(shard)} is missing") from None
            if size != int(sizes[shard]):
                raise StoreError(f"{self.root}: incomplete store: shard {shard_name(shard)} has {size} bytes, "
                                 f"the index says {int(sizes[shard])}")

    def lookup(self, path: bytes) -> int:
        """Entry of a relative path (``b""`` is the root); FileNotFoundError if absent."""
        entry = self.index.lookup(path)
        if entry < 0:
            raise FileNotFoundError(errno.ENOENT, "no such file in the store", os.fsdecode(path))
        return entry

    def size_at(self, entry: int, fidelity: int = FULL) -> int:
        """Bytes a file presents at a fidelity (a JPEG record: its first k layers and an EOI)."""
        if self._record[entry] != RECORD_JPEG:
            return int(self.index.size[entry])
        layers = int(self._layers[entry])
        if fidelity >= layers:
            return int(self.index.size[entry])
        first = int(self._first[entry])
        return int(self._raw[first:first + fidelity].sum()) + len(EOI)

    def getattr(self, entry: int, fidelity: int = FULL) -> dict[str, int]:
        """``os.stat``-like attributes (owner: whoever opened the store; the store is read-only)."""
        ix = self.index
        kind = int(self._type[entry])
        mtime = int(ix.mtime[entry])
        size = self.size_at(entry, fidelity) if kind == FILE else int(ix.size[entry])
        return {"st_mode": int(ix.mode[entry]), "st_ino": entry + 1, "st_nlink": 2 if kind == DIR else 1,
                "st_uid": self._uid, "st_gid": self._gid, "st_size": size, "st_blocks": (size + 511) // 512,
                "st_blksize": 1 << 17, "st_mtime": mtime, "st_atime": mtime, "st_ctime": mtime}

    def listdir(self, entry: int) -> list[tuple[bytes, int, int]]:
        """(name, inode, mode) of each child, sorted by name."""
        if self._type[entry] != DIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        first, count = int(self._first[entry]), int(self._count[entry])
        return list(zip(self.index.children(entry), range(first + 1, first + count + 1),
                        self.index.mode[first:first + count].tolist()))

    def readlink(self, entry: int) -> bytes:
        if not statmod.S_ISLNK(int(self.index.mode[entry])):
            raise OSError(errno.EINVAL, "not a symbolic link")
        return self.index.target(entry)

    # --- data -----------------------------------------------------------------------------------

    def _fetch(self, entry: int, blob: int, layer: int) -> bytes:
        """Verified stored bytes of a blob from the first source that has a good copy."""
        ix = self.index
        shard = int(self._shard[entry])
        offset, length = int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
        expected = int(ix.blob_checksum[blob])
        problems = []
        for source in self.sources:
            try:
                data = source.read(shard, offset, length)
            except NotHeld:
                continue
            except (OSError, StoreError) as err:
                problems.append(f"{source.name}: {err}")
                continue
            if len(data) == length and checksum(data) == expected:
                self.stats.stored_by_layer[min(layer, MAX_LAYERS - 1)] += length
                self.stats.by_source[source.name] = self.stats.by_source.get(source.name, 0) + length
                if problems:
                    log.warning("%s: used %s after: %s", self._describe(entry, blob), source.name, "; ".join(problems))
                return data
            problems.append(f"{source.name}: checksum mismatch" if len(data) == length else
                            f"{source.name}: short read ({len(data)} of {length} bytes)")
        self.stats.errors += 1
        message = f"{self._describe(entry, blob)}: no good copy ({'; '.join(problems)})"
        log.error("EIO %s", message)
        raise DataError(message)

    def _describe(self, entry: int, blob: int) -> str:
        shard = shard_name(int(self._shard[entry]))
        return f"{os.fsdecode(self.index.path(entry))} (shard {shard}, blob {blob} at {int(self.index.blob_offset[blob])})"

    def blob(self, entry: int, blob: int, layer: int = 0, keep: bool = True) -> bytes:
        """Decoded bytes of one blob, through the cache.

        ``keep=False`` for a blob that one read covers whole: the kernel's page cache holds those bytes
        already, and keeping them here would cost memory and fresh-page faults on every read (measured:
        a cold 110 KB read took 110 us of CPU with a 1 GiB cache, 34 us without).
        """
        data = self.cache.get(blob)
        if data is not None:
            self.stats.cache_hits += 1
            return data
        self.stats.cache_misses += 1
        raw_size = int(self._raw[blob])
        stored_size = int(self.index.blob_stored[blob])
        if stored_size == 0:
            return bytes(raw_size)  # a hole of a sparse file
        stored = self._fetch(entry, blob, layer)
        if stored_size == raw_size:
            data = stored
        else:
            started = time.perf_counter()
            try:
                data = self.codecs[int(self.index.codec[entry])].decode(stored, raw_size)
            except Exception as err:  # a verified blob that does not decode: a bug or a codec mismatch
                self.stats.errors += 1
                log.error("EIO %s: decode failed: %s", self._describe(entry, blob), err)
                raise DataError(f"decode failed: {err}") from None
            self.stats.decode_seconds += time.perf_counter() - started
        if keep:
            self.cache.put(blob, data)
        return data

    def read(self, entry: int, offset: int, size: int, fidelity: int = FULL) -> bytes:
        """Bytes ``[offset, offset+size)`` of a file as presented at ``fidelity``."""
        first, count = int(self._first[entry]), int(self._count[entry])
        self.stats.reads += 1
        if self._record[entry] == RECORD_JPEG:
            data = self._read_layers(entry, first, min(fidelity, count), count, offset, size)
        elif count == 1:
            whole = offset == 0 and size >= int(self._raw[first])
            data = self.blob(entry, first, keep=not whole)[offset:offset + size]
        else:
            data = self._read_chunks(entry, first, count, offset, size)
        self.stats.bytes_presented += len(data)
        return data

    def _read_chunks(self, entry: int, first: int, count: int, offset: int, size: int) -> bytes:
        chunk = self.chunk_size
        end = min(offset + size, int(self.index.size[entry]))
        parts = []
        pos = offset
        while pos < end:
            i = pos // chunk
            if i >= count:
                break
            start = pos - i * chunk
            whole = start == 0 and end - pos >= int(self._raw[first + i])
            piece = self.blob(entry, first + i, keep=not whole)[start:start + end - pos]
            parts.append(piece)
            pos += len(piece)
        return b"".join(parts)

    def _read_layers(self, entry: int, first: int, shown: int, layers: int, offset: int, size: int) -> bytes:
        """A JPEG record: the first ``shown`` layers, then an EOI unless every layer is shown."""
        parts = []
        pos = 0
        end = offset + size
        for layer in range(shown):
            length = int(self._raw[first + layer])
            if pos + length > offset and pos < end:
                whole = offset <= pos and pos + length <= end
                data = self.blob(entry, first + layer, layer, keep=not whole)
                parts.append(data[max(0, offset - pos):end - pos])
            pos += length
            if pos >= end:
                break
        if shown < layers and pos < end:
            parts.append(EOI[max(0, offset - pos):end - pos])
        return b"".join(parts)

    def read_file(self, path: str | bytes, fidelity: int = FULL) -> bytes:
        """Whole file by path (convenience for tools and tests)."""
        entry = self.lookup(os.fsencode(path).strip(b"/"))
        return self.read(entry, 0, self.size_at(entry, fidelity), fidelity)

    def close(self) -> None:
        for source in self.sources:
            source.close()
