"""Plain files: the original bytes, in one layer of independently compressed 1 MiB chunks.

A file up to a chunk is one blob (an empty file none); a larger one is cut into chunks, so a read at
any offset decodes one chunk, and a chunk wholly inside a hole of a sparse file is stored as nothing.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import numpy as np

from ..util.checksum import Digest, checksum
from ..util.source_file import SourceFile
from .base import Columns, Packed, Reader, RecordKind, Span, expand, register

CHUNK_SIZE = 1 << 20


@register
class PlainFiles(RecordKind):
    kind_id = 0
    name = "plain"
    label = "plain files"

    def read(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> bytes:
        spans = self.spans(reader, entry, view, offset, size)
        if len(spans) == 1:
            data, start, length = spans[0]
            return data[start:start + length]
        return b"".join(data[start:start + length] for data, start, length in spans)

    def whole_blob(self, index: Columns, entry: int, view: int) -> int:  # a file of one chunk: nearly every file
        return index.items.first[entry] if index.items.count[entry] == 1 else -1

    def spans(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> list[Span]:
        """Each chunk's part of the read as its decoded bytes and where in them, unsliced: the kernel splits a large
        read into requests that need not match chunks, and a request is then sent from the chunks themselves, each
        decoded once (one read covers it whole) or kept for the next request (it covers a part)."""
        ix = reader.index.items
        first, count = ix.first[entry], ix.count[entry]
        end = min(offset + size, ix.size[entry])
        if offset >= end:
            return [(b"", 0, 0)]
        raw = ix.blob_raw
        chunk = reader.chunk_size if count > 1 else end
        spans = []
        pos = offset
        for i in range(pos // chunk, count):  # bounded by the file's blobs, whatever the index says
            if pos >= end:
                break
            start = pos - i * chunk
            length = min(end - pos, chunk - start)
            whole = start == 0 and length >= raw[first + i]
            data = reader.blob(entry, first + i, 0, not whole, count > 1)
            if len(data) < start + length:
                raise reader.fault(entry, first + i, f"chunk {i} ends before the file's size")
            spans.append((data, start, length))
            pos += length
        return spans

    def blob_run(self, index: Columns, entry: int, view: int, offset: int, size: int) -> tuple[int, int]:
        """The chunks that bytes ``[offset, offset + size)`` touch: a request that the kernel did not align with
        the chunks (most of a large file's) asks a peer for both of its chunks in one round trip."""
        count, chunk = int(index.count[entry]), int(index.meta["chunk_size"])
        end = min(offset + size, int(index.size[entry]))
        if count < 2 or offset >= end:
            return (0, 0)
        first = offset // chunk
        return (int(index.first[entry]) + first, min(count, -(-end // chunk)) - first)

    def matches_source(self, reader: Reader, entry: int, source: SourceFile) -> str | None:
        """Chunk by chunk; a chunk stored as a hole is compared with the source only where the source has data
        (``SEEK_DATA``), so a sparse 5 GiB file is not read as 5 GiB of zeros on both sides."""
        ix = reader.index
        first, count, size = int(ix.first[entry]), int(ix.count[entry]), int(ix.size[entry])
        chunk = reader.chunk_size
        for i in range(count):
            start, end = i * chunk, min(size, (i + 1) * chunk)
            if ix.blob_stored[first + i] == 0 and source.data_from(start) >= end:
                continue  # a hole on both sides
            if source.pread(end - start, start) != reader.read(entry, start, end - start):
                return f"bytes differ from the source in chunk {i} (offset {start})"
        return "the source is longer than the stored file" if source.pread(1, size) else None

    def check(self, index: Columns, entries: np.ndarray) -> str | None:
        chunk = int(index.meta["chunk_size"])
        size = index.size[entries]
        count = index.count[entries].astype(np.int64)
        if (index.layers[entries] != 1).any():
            return "a plain file with more than one layer"
        if (count != -(-size.astype(np.int64) // chunk)).any():
            return "a plain file whose chunk count does not match its size"
        single = count == 1  # most files: one blob holding the whole file
        if (index.blob_raw[index.first[entries[single]]] != size[single]).any():
            return "a plain file whose blob size is not its size"
        multi = entries[count > 1]
        if multi.size:
            many = index.count[multi].astype(np.int64)
            blobs, owner = expand(index.first[multi], many)
            position = blobs - np.repeat(index.first[multi].astype(np.int64), many)
            last = position == np.repeat(many, many) - 1
            expected = np.where(last, index.size[multi][owner].astype(np.int64) - position * chunk, chunk)
            if (index.blob_raw[blobs] != expected).any():
                return "a plain file whose chunk sizes do not add up to its size"
        return None

    def pack(self, source: SourceFile, head: bytes) -> Packed:
        if source.size <= CHUNK_SIZE:
            data = source.read_all()
            return Packed([[data] if data else []], len(data), checksum(data))
        digest = Digest()
        return Packed([_chunks(source, digest)], source.size, digest=digest)


_HOLE = bytes(CHUNK_SIZE)


def _chunks(source: SourceFile, digest: Digest) -> Iterator[bytes | int]:
    """The chunks of a large file; an int for a chunk that lies wholly in a hole (stored as nothing)."""
    pos, size = 0, source.size
    while pos < size:
        n = min(CHUNK_SIZE, size - pos)
        if source.data_from(pos) >= pos + n:
            digest.update(_HOLE[:n])
            yield n
        else:
            data = source.pread(n, pos)
            if len(data) != n:
                raise OSError(errno.EIO, "file changed size while being packed")
            digest.update(data)
            yield data
        pos += n
