"""A file of the store opened for reading: seekable, read straight from the store at its view.

A loader reads a file whole: ``read()`` from the start is one :meth:`Store.read` and keeps nothing
(the store keeps no blob read whole either).  A decoder reads a few bytes at a time (PIL reads a
JPEG's markers so): those reads are served from a *window* of the file, fetched whole by one store
read (the whole file up to a chunk, 1 MiB; chunk by chunk in a larger file).  No ``io.BufferedReader``:
its buffer is allocated at every open, and a whole read then costs a copy.
"""

from __future__ import annotations

import errno
import io
import os
from typing import Any

from ..store import Store

WINDOW = 1 << 20
"""Largest window of an open file: one chunk of a plain file, so a window is one blob read whole."""


class FanfsFile:
    """A file opened by :meth:`FanfsFileSystem.open`: ``size``, ``path`` and ``fs`` as fsspec's files have them.

    A plain class with slots, registered as an ``io.BufferedIOBase``: an instance of a subclass of io's
    classes costs ~10x as much to make and to drop, and a loader opens files by the million.
    """

    __slots__ = ("fs", "path", "size", "closed", "_store", "_entry", "_view", "_step", "_pos", "_start", "_window")
    mode = "rb"

    def __init__(self, fs: Any, store: Store, entry: int, view: int, size: int, path: str,
                 window: int | None = None) -> None:
        self.fs, self.path, self.size, self.closed = fs, path, size, False
        self._store, self._entry, self._view = store, entry, view
        self._step = window or max(1, min(size, WINDOW))
        self._pos = 0
        self._start = 0
        self._window = b""  # bytes of the file from offset _start

    @property
    def name(self) -> str:
        return self.path

    def close(self) -> None:
        self.closed = True
        self._window = b""

    def __enter__(self) -> FanfsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> FanfsFile:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines: list[bytes] = []
        total = 0
        for line in self:
            lines.append(line)
            total += len(line)
            if hint is not None and 0 < hint <= total:
                break
        return lines

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    readinto1 = readinto

    def writable(self) -> bool:
        return False

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a fanfs file read in-process has no file descriptor")

    def write(self, *args: Any) -> int:
        raise io.UnsupportedOperation("a fanfs file is read-only")

    writelines = truncate = write

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        pos = self._pos
        end = self.size if size is None or size < 0 else min(self.size, pos + size)
        if end <= pos:
            return b""
        start = self._start
        if start <= pos and end <= start + len(self._window):
            data = self._window[pos - start:end - start]
        elif end - pos >= self._step:  # as large as a window: straight from the store, nothing kept
            data = self._store.read(self._entry, pos, end - pos, self._view)
        else:
            data = self._gather(pos, end)
        self._pos = pos + len(data)
        return data

    read1 = read

    def _fill(self, pos: int) -> bool:
        """Make the window the one holding ``pos``; False past the end of the file."""
        start = pos - pos % self._step
        self._window = self._store.read(self._entry, start, self._step, self._view)
        self._start = start
        return pos < start + len(self._window)

    def _gather(self, pos: int, end: int) -> bytes:
        parts = []
        while pos < end and self._fill(pos):
            piece = self._window[pos - self._start:end - self._start]
            parts.append(piece)
            pos += len(piece)
        return b"".join(parts)

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the position on, without moving (at least one unless at the end)."""
        pos = self._pos
        if not self._start <= pos < self._start + len(self._window) and (pos >= self.size or not self._fill(pos)):
            return b""
        return self._window[pos - self._start:]

    def readline(self, size: int | None = -1) -> bytes:
        parts: list[bytes] = []
        left = -1 if size is None or size < 0 else size
        while left:
            window = self.peek()
            if not window:
                break
            stop = window.find(b"\n") + 1 or len(window)
            if 0 < left < stop:
                stop = left
            parts.append(window[:stop])
            self._pos += stop
            left -= stop if left > 0 else 0
            if parts[-1].endswith(b"\n"):
                break
        return b"".join(parts)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._pos
        elif whence == os.SEEK_END:
            offset += self.size
        elif whence != os.SEEK_SET:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if offset < 0:
            raise OSError(errno.EINVAL, f"negative seek position {offset}")
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos

    def info(self) -> dict[str, Any]:
        return self.fs.info(self.path)


io.BufferedIOBase.register(FanfsFile)
