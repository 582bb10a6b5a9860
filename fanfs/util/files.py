"""Opening files that must be regular files: never blocks on a FIFO, never follows a planted symlink; the file
locks that processes of a node share a file by; and descriptors: closed with the object that holds them, waited on
whatever their number.

A store's index and shards, a plan or a scan script may have been replaced by a FIFO (an ``open`` of it
would block forever) or a device; every such open goes through :func:`open_regular`, which opens with
``O_NONBLOCK`` and refuses, with one line, anything ``fstat`` does not call a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import stat
import struct
import weakref
from collections.abc import Callable

from ..errors import FanfsError


class NotRegularFile(FanfsError):
    """The path names a FIFO, device, socket or directory where a regular file belongs."""


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


def open_regular(path: str | bytes, *, follow: bool = True) -> int:
    """A read-only descriptor of the regular file at ``path`` (blocking mode restored); raises
    :class:`NotRegularFile` for anything else and OSError (e.g. FileNotFoundError) as ``os.open`` does."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise NotRegularFile(f"{os.fsdecode(path)} is a symbolic link, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotRegularFile(f"{os.fsdecode(path)} is {what}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | bytes, limit: int | None = None, *, follow: bool = True) -> bytes:
    """The whole content of a regular file (at most ``limit`` bytes, else an error naming the limit; not through
    a symbolic link unless ``follow``)."""
    fd = open_regular(path, follow=follow)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise FanfsError(f"{os.fsdecode(path)} is {size} bytes, more than the {limit} expected here")
        parts = []
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
            if limit is not None and sum(map(len, parts)) > limit:
                raise FanfsError(f"{os.fsdecode(path)} grew past the {limit} bytes expected here")
        return b"".join(parts)
    finally:
        os.close(fd)


_FLOCK = struct.Struct("hhxxxxqqixxxx")  # struct flock on 64-bit Linux


def file_lock(fd: int, kind: int, start: int = 0, length: int = 0, *, wait: bool = False) -> bool:
    """Take (``kind`` F_RDLCK or F_WRLCK) or drop (F_UNLCK) an open-file-description lock on ``length`` bytes of the
    file at ``start`` (0: to its end): held by the open file, whoever shares it (forked children), until it is closed
    or its process ends however it ends.  Whether it was taken: False if another open file holds a conflicting lock
    (``wait``: waits for it instead); a lock already held is changed in one step (read to write and back)."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))
        return True
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def lock_held(fd: int, start: int = 0, length: int = 0) -> int:
    """The kind of lock another open file holds on those bytes of the file at ``fd`` (F_RDLCK, F_WRLCK), F_UNLCK if
    none: asked without taking one (``fd`` may be read-only)."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, length, 0))
    return _FLOCK.unpack(answer)[0]


def closed_with(owner: object, fds: dict[int, int] | list[int]) -> Callable[[], None]:
    """Descriptors ``owner`` holds (the values of a dict, or a list, emptied in place), closed when it is collected
    or when the returned call is made, whichever comes first: a store dropped without ``close()`` keeps no shard or
    memfd open (a process that opens stores one after another would run out of descriptors)."""
    return weakref.finalize(owner, _close_held, fds)


def _close_held(fds: dict[int, int] | list[int]) -> None:
    held = list(fds.values()) if isinstance(fds, dict) else list(fds)
    fds.clear()
    for fd in held:
        with contextlib.suppress(OSError):
            os.close(fd)


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` is readable within ``timeout`` seconds (0: now).  ``poll``, not ``select``: a process holding
    more than 1,023 descriptors (a training job's files and sockets) gets numbers ``select`` refuses."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))
