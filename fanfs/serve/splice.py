"""Spliced replies: a read answered with bytes of a file this process has open, moved by the kernel from that
file's page cache into the reply (libfuse's ``fuse_reply_data``), so that they never enter this process.

libfuse 3.14 splices when the connection wants ``FUSE_CAP_SPLICE_WRITE`` (:class:`.lowlevel.Session` asks for it
when given a ``max_read``) and the reply fits the pipe it keeps per thread.  The trap measured here: it asks for a
pipe of the reply plus three pages and a header, a pipe may not exceed ``/proc/sys/fs/pipe-max-size`` (1 MiB; more
needs CAP_SYS_RESOURCE), and once growing a pipe failed it copies every reply through memory for good, without a
word (1 MiB requests asked for 1,060,880 bytes).  :func:`splice_size` keeps every request below that, or says why
not to splice at all.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os

from .lowlevel import lib
from .structs import BUF_FD_SEEK, BUF_IS_FD, FuseBufvec1, c_req

log = logging.getLogger("fanfs")

_reply_data = ctypes.CFUNCTYPE(ctypes.c_int, c_req, ctypes.POINTER(FuseBufvec1), ctypes.c_int, use_errno=True)(
    ("fuse_reply_data", lib))
_PASSING = {0, errno.EAGAIN, errno.EINVAL, errno.EPERM, errno.EBUSY}
"""What libfuse 3.14 leaves in errno when a splice it tried gave way to its copy path, which then sent the reply: a
pipe it could not grow, a splice the kernel refused for this pair of files.  Anything else left there is the error of
the read of the copy (EIO from the disk), which libfuse answered the request with itself."""
_PIPE_EXTRA_PAGES = 3  # libfuse 3.14: one page per iovec (the header) and per buffer, and one more
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SMALLEST = 128 << 10
"""Requests smaller than this are not worth splicing: a copy path in requests of up to 1 MiB beats splices of a few
pages each (a pipe-max-size of 4 KiB left every request at 4 KiB)."""


def pipe_max_size() -> int:
    """The largest pipe this process may make (``/proc/sys/fs/pipe-max-size``; 1 MiB where it cannot be read)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def splice_size() -> tuple[int, str | None]:
    """The request size (``max_read``) whose spliced reply libfuse sends as one splice (at most 1 MiB, the kernel's),
    or 0 and why splicing is not worth it here: a pipe that small, or one libfuse could not size (it would then copy
    every reply through memory, silently).  Decided before the session is made: ``max_read`` is a mount option."""
    page = os.sysconf("SC_PAGE_SIZE")
    size = min(1 << 20, (pipe_max_size() - _PIPE_EXTRA_PAGES * page - 16) // page * page)
    if size < SMALLEST:
        return 0, f"pipe-max-size {pipe_max_size():,} bytes leaves {max(size, 0):,}-byte requests to splice"
    read_end, write_end = os.pipe()
    try:  # grown as libfuse will grow each of its threads' pipes: this user's pipe-user-pages-soft may refuse it
        fcntl.fcntl(read_end, F_SETPIPE_SZ, size + _PIPE_EXTRA_PAGES * page + 16)
    except OSError as err:
        return 0, f"a pipe of {size + _PIPE_EXTRA_PAGES * page + 16:,} bytes is refused ({err.strerror})"
    finally:
        os.close(read_end)
        os.close(write_end)
    return size, None


def reply_fd(req: int, fd: int, position: int, length: int) -> int:
    """Reply with ``length`` bytes at ``position`` of the file open at ``fd`` (spliced: see the module).  0: the reply
    was sent.  An errno: the copy could not be read (libfuse 3.14 then answers the request with that error itself, and
    returns 0 as for a reply sent: only errno tells).  Its negative: the reply could not be sent (the request
    interrupted, the mount gone), logged here."""
    bufvec = FuseBufvec1(count=1, size=length, flags=BUF_IS_FD | BUF_FD_SEEK, fd=fd, pos=position)
    ctypes.set_errno(0)
    failed = _reply_data(req, ctypes.byref(bufvec), 0)
    if failed:
        log.warning("a spliced reply of %d bytes was not sent: %s", length, os.strerror(-failed))
        return -abs(failed)
    code = ctypes.get_errno()
    return 0 if code in _PASSING else code
