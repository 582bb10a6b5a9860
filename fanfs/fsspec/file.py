"""A file of the store opened for reading: seekable, buffered, read straight from the store at its view.

``FanfsFile`` is an ``io.BufferedReader`` over :class:`RawFile`, so ``read``/``readinto``/``readline``/
``peek``/``seek`` run in C and ``read()`` of a whole file is one :meth:`Store.read` (the store then keeps
nothing: a blob read whole is not cached).  The buffer holds the whole file up to a chunk (1 MiB), so a
decoder's many small reads (PIL reads a JPEG's markers a few bytes at a time) cost one store read; a
larger file is read a chunk at a time.
"""

from __future__ import annotations

import errno
import io
import os
from typing import Any

from ..store import Store

BUFFER = 1 << 20
"""Largest buffer of an open file: one chunk of a plain file."""


class RawFile(io.RawIOBase):
    """Unbuffered, seekable reads of one file of ``store`` at ``view`` (``size`` bytes as presented)."""

    mode = "rb"

    def __init__(self, store: Store, entry: int, view: int, size: int, name: str) -> None:
        super().__init__()
        self._store, self._entry, self._view, self.size, self.name = store, entry, view, size, name
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        pos = self._pos
        n = self.size - pos if size is None or size < 0 else min(size, self.size - pos)
        if n <= 0:
            return b""
        data = self._store.read(self._entry, pos, n, self._view)
        self._pos = pos + len(data)
        return data

    def readall(self) -> bytes:
        return self.read()

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

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


class FanfsFile(io.BufferedReader):
    """A file opened by :meth:`FanfsFileSystem.open`: ``size``, ``path`` and ``fs`` as fsspec's files have."""

    def __init__(self, fs: Any, path: str, raw: RawFile, buffer_size: int | None = None) -> None:
        super().__init__(raw, buffer_size or max(1, min(raw.size, BUFFER)))
        self.fs, self.path, self.size = fs, path, raw.size

    def info(self) -> dict[str, Any]:
        return self.fs.info(self.path)
