"""Files of a mount opened in the reader's own process: what ``open()`` returns under ``fanfs run``, built as Python
builds a file it opens (a raw file in an ``io.BufferedReader``, in an ``io.TextIOWrapper`` for text), so that code
that looks at the object (``isinstance(f, io.BufferedReader)``, ``name``, ``mode``, ``with``, ``seek``, ``readinto``,
``fileno()``) finds a file of the mount.

A file of at most a chunk (1 MiB: nearly every file of a dataset) is read whole when it is opened: one ``pread`` of its
blobs, verified and decoded by the store, then every read is a slice of those bytes (a whole read is the bytes
themselves, no copy).  A larger file is read as it is asked for; an extent (a large file stored raw) straight from
the node's verified copy into the caller's buffer (:meth:`fanfs.store.Store.readinto`).  ``fileno()`` opens the same
file on the mount, positioned where this file is, for what needs a real descriptor (``mmap``, ``numpy.fromfile``,
``os.fstat``).
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import time
from typing import Any

from ..util.cbytes import BYTES_DATA, new_bytes

WHOLE = 1 << 20
"""Files up to this size are read whole when opened (one chunk: one blob per layer)."""
SETTLE = 2.0
"""Seconds ``fileno()`` waits for the mount's name of a file to show the view this file was opened at."""


class StoreFile(io.RawIOBase):
    """A file of a mount larger than :data:`WHOLE`, read from ``store`` at ``view`` as it is asked for."""

    def __init__(self, store: Any, entry: int, view: int, size: int, name: Any, path: str, ino: int) -> None:
        self._store, self._entry, self._view, self._size = store, entry, view, size
        self._pos = 0
        self._name, self._path, self._ino = name, path, ino
        self._fd = -1

    @property
    def name(self) -> Any:
        """The name it was opened by, as a file of the mount has it (a path-like object's ``os.fspath``)."""
        return self._name

    @property
    def mode(self) -> str:
        return "rb"

    def readable(self) -> bool:
        self._check()
        return True

    def seekable(self) -> bool:
        self._check()
        return True

    def isatty(self) -> bool:
        self._check()
        return False

    def readinto(self, buffer: Any) -> int:
        self._check()
        view = memoryview(buffer).cast("B")
        pos, n = self._pos, min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        n = self._read(pos, view[:n])
        self._pos = pos + n
        return n

    def _read(self, pos: int, view: memoryview) -> int:
        """Bytes from ``pos`` into ``view``: from the store here, or, where this process cannot read them (a copy cut
        or bad under it), from the mount, which finds another copy or answers EIO, and logs it."""
        try:
            return self._store.readinto(self._entry, pos, view, self._view)
        except (OSError, ValueError):
            return os.preadv(self.fileno(), [view], pos)

    def readall(self) -> bytes:
        self._check()
        pos = self._pos
        if pos >= self._size:
            return b""
        out = new_bytes(None, self._size - pos)  # filled here before anyone sees it
        view, got = _writable(out), 0
        while got < len(out):  # a read through the mount may come short of an error: the next one raises it
            n = self._read(pos + got, view[got:])
            if n <= 0:
                break
            got += n
        self._pos = pos + got
        return out if got == len(out) else out[:got]

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check()
        if whence == os.SEEK_CUR:
            offset += self._pos
        elif whence == os.SEEK_END:
            offset += self._size
        elif whence != os.SEEK_SET:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if offset < 0:
            raise OSError(22, "Invalid argument")  # as lseek(2) answers
        self._pos = offset
        return offset

    def tell(self) -> int:
        self._check()
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        raise io.UnsupportedOperation("truncate")

    def fileno(self) -> int:
        """A real descriptor of this file on the mount, positioned where this file is (:func:`mount_descriptor`)."""
        self._check()
        if self._fd < 0:
            self._fd = mount_descriptor(self._path, self._ino, None)
        os.lseek(self._fd, self._pos, os.SEEK_SET)
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()

    def __repr__(self) -> str:
        return f"<fanfs in-process file name={self._name!r} mode='rb'>"

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


class WholeFile(io.BytesIO):
    """A file of a mount read whole when opened (at most :data:`WHOLE` bytes): its bytes, held as a BytesIO holds
    them (no copy: a whole read returns them, a part is sliced), under a BufferedReader as a FileIO is."""

    __slots__ = ("_name", "_path", "_ino", "_fd")

    readall = io.BytesIO.read  # what a BufferedReader asks of its raw file for a whole read: the bytes themselves

    @property
    def name(self) -> Any:
        """The name it was opened by, as a file of the mount has it (a path-like object's ``os.fspath``)."""
        return self._name

    @property
    def mode(self) -> str:
        return "rb"

    def fileno(self) -> int:
        """A real descriptor of this file on the mount, positioned where this file is (:func:`mount_descriptor`)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if self._fd < 0:
            self._fd = mount_descriptor(self._path, self._ino, self.getbuffer())
        os.lseek(self._fd, self.tell(), os.SEEK_SET)
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        io.BytesIO.close(self)

    def __repr__(self) -> str:
        return f"<fanfs in-process file name={self._name!r} mode='rb'>"


def whole_file(data: bytes, name: Any, path: str, ino: int) -> WholeFile:
    raw = WholeFile(data)
    raw._name, raw._path, raw._ino, raw._fd = name, path, ino, -1
    return raw


def mount_descriptor(path: str, ino: int, data: Any) -> int:
    """A descriptor of the file at ``path`` on the mount as this process presents it (the mount's inode ``ino``: one
    inode per view, so ``fstat``, ``mmap`` and ``read`` of it agree with this file).  A switch of the presentation
    reaches the kernel's cached names within moments: a name that resolves to another view is opened again, for
    :data:`SETTLE` seconds at most; then a file read whole (``data``) is handed over as a sealed copy of its bytes in
    memory, and a larger one is ESTALE (its view is no longer the mount's)."""
    deadline = time.monotonic() + SETTLE
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino == ino:
            return fd
        os.close(fd)
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if data is None:
        raise OSError(errno.ESTALE, "the file's view is no longer the one the mount shows", path)
    from ..store.trust import sealed_copy
    copy = sealed_copy(data)
    fd = copy.detach()  # the caller's
    copy.close()
    return fd


def _writable(data: bytes) -> memoryview:
    """The memory of a fresh bytes object, writable (it is filled once, before anyone else sees it)."""
    return memoryview((ctypes.c_char * len(data)).from_address(id(data) + BYTES_DATA)).cast("B")


def wrapped(raw: StoreFile | WholeFile, mode: str, buffering: int, encoding: str | None, errors: str | None,
            newline: str | None) -> Any:
    """``raw`` as ``open()`` would hand over a file of ``mode`` and ``buffering``: itself (unbuffered binary), in a
    BufferedReader (binary), or in a TextIOWrapper over that (text, whose ``mode`` is the one asked for)."""
    if buffering == 0:
        return raw
    buffered = io.BufferedReader(raw, buffering if buffering > 1 else io.DEFAULT_BUFFER_SIZE)
    if "b" in mode:
        return buffered
    text = io.TextIOWrapper(buffered, encoding, errors, newline, line_buffering=buffering == 1)
    text.mode = mode
    return text
