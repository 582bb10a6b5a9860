"""Indexes this user validated on this node, so that a large one is not validated again at every open.

Validating an index of 1.28 M entries costs ~0.35 s of CPU (:mod:`.validate`), at every mount and every
``Store()``.  An index *file* is trusted without it only when this user's private runtime directory
(:mod:`fanfs.util.runtime`: 0700, refused if another user could write it) records that it was validated
and it is still the same file: same device, inode, size, modification and change times, and the same
checksum.  The change time moves with every write and rename and no user can set it back, so a file
rewritten, replaced or copied since is validated again, whatever its checksum.  Only records this user's
own fanfs wrote are read; an unusable runtime directory just means validating every time.
"""

from __future__ import annotations

import os

from ..errors import FanfsError
from ..util.runtime import create_private, runtime_dir

RECORD_NAME = "validated-indexes"
KEEP = 64  # records kept (most recent last)


def file_identity(fd: int) -> str:
    """The open file's device, inode, size and times: with its checksum, what a record holds."""
    st = os.fstat(fd)
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def _path() -> str | None:
    try:
        return os.path.join(runtime_dir(), RECORD_NAME)
    except (FanfsError, OSError):
        return None


def _records(path: str) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return os.read(fd, 1 << 16).decode(errors="replace").splitlines()
    finally:
        os.close(fd)


def was_validated(file_id: str, checksum: int) -> bool:
    path = _path()
    return path is not None and f"{file_id} {checksum:016x}" in _records(path)


def record_validated(file_id: str, checksum: int) -> None:
    """Remember a validated index file (the last KEEP of them); a runtime directory we cannot write is no error."""
    path = _path()
    if path is None:
        return
    ident = f"{file_id} {checksum:016x}"
    lines = [line for line in _records(path) if line != ident][-(KEEP - 1):] + [ident]
    try:
        fd = create_private(path + f".{os.getpid()}")
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(path + f".{os.getpid()}", path)
    except (FanfsError, OSError):
        pass
