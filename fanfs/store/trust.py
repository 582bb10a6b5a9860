"""What was validated is trusted: index files this user validated on this node, and a mount's validated index in memory
nobody can change.

Validating an index of 1.28 M entries costs ~0.35 s of CPU (:mod:`.validate`), at every mount and every
``Store()``.  An index *file* is trusted without it only when this user's private runtime directory
(:mod:`fanfs.util.runtime`: 0700, refused if another user could write it) records that it was validated
and it is still the same file: same device, inode, size, modification and change times, and the same
checksum.  The change time moves with every write and rename and no user can set it back, so a file
rewritten, replaced or copied since is validated again, whatever its checksum.  Only records this user's
own fanfs wrote are read; an unusable runtime directory just means validating every time.

The index a mount validated is kept in memory of its own, whatever happens to the file afterwards (:mod:`.format`).
That memory is a ``memfd`` here, sealed once written (``F_SEAL_WRITE``, ``F_SEAL_SHRINK``, ``F_SEAL_GROW``, then
``F_SEAL_SEAL``): nobody, the daemon included, can change a byte of it or cut it short again.  So the same pages can
be handed to every in-process reader of the node (``fanfs run``, through the mount's control socket): one copy of a
162 MiB index per node, not one per DataLoader worker, and still the bytes that were validated.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Callable

from ..errors import FanfsError
from ..util.files import closed_with
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


_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SealedMemory(mmap.mmap):
    """A read-only mapping of a sealed memfd; ``fd`` is the memfd (this process's, close-on-exec), to pass on while
    the mapping lives: it is closed when the mapping is collected, unless :meth:`detach` handed it over."""

    fd: int
    _release: Callable[[], None]

    def detach(self) -> int:
        """The memfd, now the caller's to close."""
        self._release.detach()  # type: ignore[attr-defined]  (a weakref.finalize)
        return self.fd


def sealed_memory(size: int, fill: Callable[[memoryview], None], name: str = "fanfs-index") -> SealedMemory:
    """``size`` (> 0) bytes that ``fill(view)`` writes once, then sealed and mapped read-only."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        writable = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(writable)
        try:
            fill(view)
        except BaseException:
            view.release()
            with contextlib.suppress(BufferError):  # a read given up on (a stalled file system) may still fill a part
                writable.close()  # (then the mapping goes with the process)
            raise
        view.release()
        writable.close()  # a writable mapping left would make F_SEAL_WRITE fail (EBUSY)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        memory = SealedMemory(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        raise
    memory.fd = fd
    memory._release = closed_with(memory, [fd])
    return memory


def sealed_copy(data: bytes | bytearray | memoryview | mmap.mmap) -> SealedMemory:
    """``data`` (an index broadcast to a job's nodes) copied into sealed memory."""
    source = memoryview(data).cast("B")

    def fill(view: memoryview) -> None:
        view[:] = source

    return sealed_memory(len(source), fill)


def is_sealed(fd: int) -> bool:
    """Whether ``fd`` is a memfd sealed as :func:`sealed_memory` seals it (a reader checks what it was handed)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS == _SEALS
    except OSError:
        return False
