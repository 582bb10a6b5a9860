"""Spliced replies: a read answered with bytes of a file this process has open, moved by the kernel from that
file's page cache into the reply (libfuse's ``fuse_reply_data``), so that they never enter this process.

libfuse 3.14 splices when the connection wants ``FUSE_CAP_SPLICE_WRITE`` (:class:`.lowlevel.Session` asks for it
when given a ``max_read``) and the reply fits the pipe it keeps per thread.  The trap measured here: it asks for a
pipe of the reply plus three pages and a header, a pipe may not exceed ``/proc/sys/fs/pipe-max-size`` (1 MiB; more
needs CAP_SYS_RESOURCE), and once growing a pipe failed it copies every reply through memory for good, without a
word (1 MiB requests asked for 1,060,880 bytes).  :func:`max_read` keeps every request below that.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os

from .lowlevel import lib
from .structs import BUF_FD_SEEK, BUF_IS_FD, FuseBufvec1, c_req

log = logging.getLogger("fanfs")

lib.fuse_reply_data.restype = ctypes.c_int
lib.fuse_reply_data.argtypes = [c_req, ctypes.POINTER(FuseBufvec1), ctypes.c_int]
_PIPE_EXTRA_PAGES = 3  # libfuse 3.14: one page per iovec (the header) and per buffer, and one more
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
REFUSED = bool(os.environ.get("FANFS_DEBUG_SPLICE_REFUSED"))
"""Fault injection for tests: the pipe libfuse needs is refused (as a low pipe-max-size would), so nothing is spliced."""


def max_read() -> int:
    """The largest read request whose spliced reply libfuse sends as one splice (at most 1 MiB, the kernel's)."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        limit = 1 << 20
    return max(page, min(1 << 20, (limit - _PIPE_EXTRA_PAGES * page - 16) // page * page))


def pipe_problem(max_read: int) -> str | None:
    """Why libfuse could not size its pipe for a reply of ``max_read`` bytes in this process (it would then copy
    every reply, silently), or None: a pipe is made and grown as libfuse will grow each of its threads' pipes."""
    if REFUSED:
        return "refused (FANFS_DEBUG_SPLICE_REFUSED)"
    page = os.sysconf("SC_PAGE_SIZE")
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(read_end, F_SETPIPE_SZ, max_read + _PIPE_EXTRA_PAGES * page + 16)
    except OSError as err:
        return f"a pipe of {max_read + _PIPE_EXTRA_PAGES * page + 16:,} bytes is refused ({err.strerror})"
    finally:
        os.close(read_end)
        os.close(write_end)
    return None


def reply_fd(req: int, fd: int, position: int, length: int) -> bool:
    """Reply with ``length`` bytes at ``position`` of the file open at ``fd`` (spliced: see the module); whether the
    reply was sent.  libfuse 3.14 answers a failure to read those bytes as an error itself, and returns 0 as for a
    reply sent; a reply it could not send (the request interrupted, the mount gone) is a negative errno, logged."""
    bufvec = FuseBufvec1(count=1, size=length, flags=BUF_IS_FD | BUF_FD_SEEK, fd=fd, pos=position)
    failed = lib.fuse_reply_data(req, ctypes.byref(bufvec), 0)
    if failed:
        log.warning("a spliced reply of %d bytes was not sent: %s", length, os.strerror(-failed))
    return not failed
