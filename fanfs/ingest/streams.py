"""Archive bytes as one forward stream: a file, a pipe or standard input, decompressed on the way if need be.

Nothing here seeks: a source may be ``-`` or a pipe.  The kind of a stream is told by its first bytes, never
by its name (gzip, bzip2, xz, zstd, zip, tar).  :class:`ByteStream` is the buffered reader the tar parser
takes exact byte counts from; :class:`Counted` counts what was read from the source itself, so that an archive
whose members expand far beyond it (a decompression bomb) can be stopped early.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .members import IngestError

_BLOCK = 1 << 20
COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


class Readable(Protocol):
    def read(self, size: int = ...) -> bytes: ...


class Truncated(IngestError):
    """The stream ended before the bytes its format promised."""


class Counted:
    """The raw bytes of a source (a descriptor), with a count of those read and a few bytes pushed back."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.consumed = 0
        self._head = b""

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes (fewer at the end), read again by the next ``read``."""
        while len(self._head) < n and (more := os.read(self.fd, n - len(self._head))):
            self._head += more
        return self._head[:n]

    def read(self, size: int = -1) -> bytes:
        if self._head:
            n = len(self._head) if size < 0 else size
            data, self._head = self._head[:n], self._head[n:]
        else:
            data = os.read(self.fd, size if size >= 0 else _BLOCK)
        self.consumed += len(data)
        return data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def kind_of(head: bytes) -> str | None:
    """``gzip``, ``bzip2``, ``xz``, ``zstd``, ``zip`` or ``tar`` by a stream's first 512 bytes; None if none."""
    for magic, name in COMPRESSIONS.items():
        if head.startswith(magic):
            return name
    if head.startswith(ZIP_MAGICS):
        return "zip"
    if len(head) >= 512 and (head[257:262] == b"ustar" or _header_sum_ok(head)):
        return "tar"
    return None


def _header_sum_ok(block: bytes) -> bool:
    """A pre-POSIX (v7) tar header: no magic, but its checksum field adds up."""
    try:
        stored = int(block[148:156].replace(b"\0", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(block[:148]) + 256 + sum(block[156:512])


def decompressing(raw: Readable, compression: str) -> Readable:
    """A reader of the decompressed bytes of ``raw`` (one stream, or several concatenated, as the tools write)."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type]
    if compression == "bzip2":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[arg-type]
    if compression == "xz":
        return lzma.LZMAFile(raw, mode="rb")  # type: ignore[arg-type]
    import zstandard
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)  # type: ignore[arg-type]


DECODE_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)
"""What a decompressor raises on a truncated or corrupt stream (bzip2 and zstd raise OSError or their own)."""


def stream_error(err: BaseException, where: str, compression: str | None) -> IngestError:
    """One line for a stream that failed while being read."""
    if isinstance(err, IngestError):
        return err
    what = f"the {compression} stream" if compression else "the stream"
    if isinstance(err, EOFError):
        return Truncated(f"{where}: {what} ends early (truncated): fanfs reads only whole archives")
    if isinstance(err, OSError) and err.strerror and not isinstance(err, gzip.BadGzipFile):
        return IngestError(f"{where}: cannot read it: {err.strerror}")
    return IngestError(f"{where}: {what} is corrupt ({str(err) or type(err).__name__}): fanfs reads only whole, "
                       "sound archives")


class ByteStream:
    """Exact-size reads from a forward-only source, through a buffer of about a megabyte."""

    def __init__(self, source: Readable, on_read: Callable[[], None] | None = None) -> None:
        self._source = source
        self._buf = b""
        self._pos = 0
        self.offset = 0  # bytes taken so far: where the next read starts, for messages
        self._on_read = on_read

    def _read(self, n: int) -> bytes:
        data = self._source.read(n)
        if self._on_read is not None:
            self._on_read()
        return data

    def take(self, n: int) -> bytes | None:
        """Exactly ``n`` bytes, or None if the source ends first (what was there is consumed)."""
        if n < 0:
            raise IngestError(f"a read of {n:,} bytes: a stream is read forward only (a corrupt size?)")
        pos, buf = self._pos, self._buf
        if n <= len(buf) - pos:
            self._pos = pos + n
            self.offset += n
            return buf[pos:pos + n]
        parts, got = [buf[pos:]], len(buf) - pos
        self._buf, self._pos = b"", 0
        while got < n:
            more = self._read(max(_BLOCK, n - got))
            if not more:
                self.offset += got
                return None
            if got + len(more) > n:  # keep what lies beyond
                self._buf, self._pos = more, n - got
                more = more[:n - got]
            parts.append(more)
            got += len(more)
        self.offset += n
        return b"".join(parts)

    def pieces(self, n: int) -> Iterator[memoryview]:
        """``n`` bytes as consecutive views of at most a megabyte each; Truncated if the source ends first."""
        if n < 0:
            raise IngestError(f"a read of {n:,} bytes: a stream is read forward only (a corrupt size?)")
        while n > 0:
            if self._pos >= len(self._buf):
                self._buf, self._pos = self._read(_BLOCK), 0
                if not self._buf:
                    raise Truncated(f"{n:,} bytes missing")
            step = min(n, len(self._buf) - self._pos)
            piece = memoryview(self._buf)[self._pos:self._pos + step]
            self._pos += step
            self.offset += step  # taken once handed on (a nested archive's bytes read, as it decompresses them)
            n -= step
            yield piece

    def skip(self, n: int) -> None:
        for _ in self.pieces(n):
            pass

    def at_end(self) -> bool:
        if self._pos < len(self._buf):
            return False
        self._buf, self._pos = self._read(_BLOCK), 0
        return not self._buf
