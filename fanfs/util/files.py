"""Opening files that must be regular files: never blocks on a FIFO, never follows a planted symlink.

A store's index and shards, a plan or a scan script may have been replaced by a FIFO (an ``open`` of it
would block forever) or a device; every such open goes through :func:`open_regular`, which opens with
``O_NONBLOCK`` and refuses, with one line, anything ``fstat`` does not call a regular file.
"""

from __future__ import annotations

import errno
import os
import stat

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
