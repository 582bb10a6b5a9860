"""A minimal ctypes binding of libfuse 3's low-level API: the requests a read-only file system answers.

Why low level (docs/design.rst, "FUSE"): inode numbers are ours, so every (entry, view) pair can be its own
inode whose size and bytes never change (a fidelity switch only changes which inode a name resolves
to), and a reply may be sent later from another thread, so the single request loop never waits on a
peer or a slow decode.  ``open`` and ``opendir`` answer ENOSYS: the kernel then stops sending them
(and release) and keeps every inode's page cache, which an immutable inode makes always right.

Only what a read-only tree needs is bound: lookup, getattr, readlink, read, readdirplus, statfs; the
kernel refuses writes on the ``ro`` mount itself.  Every listing is "plus" (names with their attributes:
READDIRPLUS without the kernel's AUTO heuristic, which asks for them only in a listing's first page, so
the kernel never sends a plain READDIR): a reader that lists a directory first (a training dataset does)
then opens every file without a lookup request of its own, which halves the requests per file of a
first pass.
``struct fuse_file_info`` (bitfields whose layout moved between libfuse releases) is never read or
written; the C layouts that are live in :mod:`.structs`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import FanfsError
from ..util.cbytes import BYTES_DATA, IoVec
from . import readahead
from .structs import (  # noqa: F401  (re-exported: the front builds its replies from them)
    ATTR_OFFSET, CAP_READDIRPLUS_AUTO, CAP_SPLICE_WRITE, CONN_CAPABLE, CONN_MAX_READ, CONN_MAX_READAHEAD, CONN_WANT, INIT, INO,
    INO_FI, LOOKUP, READ, Args, EntryParam, FuseBuf, LowLevelOps, Stat, StatVfs, c_ino, c_req, pack_stat, set_entry_ino,
)

log = logging.getLogger("fanfs")
_vp = ctypes.c_void_p

SONAME = "libfuse3.so.3"
SUPPORTED = (300, 316)
"""libfuse 3.0 to 3.16 (``fuse_version()`` 300..316): the soname and API this binding declares.  3.17
moved to ``libfuse3.so.4`` with versioned entry points, which this binding does not know."""


class LibfuseError(FanfsError):
    """No libfuse 3 that this binding knows could be loaded."""


def _load() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(SONAME)
    except OSError as err:
        found = ctypes.util.find_library("fuse3")
        raise LibfuseError(f"cannot load {SONAME} ({err})" + (f"; found {found}, which this binding does not know"
                                                             if found and found != SONAME else "")
                           + f": fanfs needs libfuse {_supported()} (Debian/Ubuntu: the fuse3 package)") from None
    try:
        lib.fuse_version.restype, lib.fuse_version.argtypes = ctypes.c_int, []
        version = lib.fuse_version()
    except AttributeError:
        raise LibfuseError(f"{SONAME} is not libfuse 3 (it has no fuse_version): fanfs needs libfuse {_supported()}") from None
    if not SUPPORTED[0] <= version <= SUPPORTED[1]:
        raise LibfuseError(f"{SONAME} is libfuse {version // 100}.{version % 100}: fanfs needs libfuse {_supported()}")
    sig = {
        "fuse_session_new": (_vp, [ctypes.POINTER(Args), ctypes.POINTER(LowLevelOps), ctypes.c_size_t, _vp]),
        "fuse_session_mount": (ctypes.c_int, [_vp, ctypes.c_char_p]),
        "fuse_session_loop": (ctypes.c_int, [_vp]),
        "fuse_session_unmount": (None, [_vp]),
        "fuse_session_destroy": (None, [_vp]),
        "fuse_session_fd": (ctypes.c_int, [_vp]),
        "fuse_set_signal_handlers": (ctypes.c_int, [_vp]),
        "fuse_remove_signal_handlers": (None, [_vp]),
        "fuse_reply_err": (ctypes.c_int, [c_req, ctypes.c_int]),
        "fuse_reply_entry": (ctypes.c_int, [c_req, ctypes.POINTER(EntryParam)]),
        "fuse_reply_attr": (ctypes.c_int, [c_req, ctypes.POINTER(Stat), ctypes.c_double]),
        "fuse_reply_readlink": (ctypes.c_int, [c_req, ctypes.c_char_p]),
        "fuse_reply_buf": (ctypes.c_int, [c_req, ctypes.c_char_p, ctypes.c_size_t]),
        "fuse_reply_statfs": (ctypes.c_int, [c_req, ctypes.POINTER(StatVfs)]),
        "fuse_add_direntry_plus": (ctypes.c_size_t, [c_req, _vp, ctypes.c_size_t, ctypes.c_char_p,
                                                     ctypes.POINTER(EntryParam), ctypes.c_int64]),
        "fuse_lowlevel_notify_inval_entry": (ctypes.c_int, [_vp, c_ino, ctypes.c_char_p, ctypes.c_size_t]),
        "fuse_session_receive_buf": (ctypes.c_int, [_vp, ctypes.POINTER(FuseBuf)]),
        "fuse_session_process_buf": (None, [_vp, ctypes.POINTER(FuseBuf)]),
    }
    for fname, (restype, argtypes) in sig.items():
        try:
            func = getattr(lib, fname)
        except AttributeError:
            raise LibfuseError(f"{SONAME} (libfuse {version // 100}.{version % 100}) lacks {fname}: fanfs needs "
                               f"libfuse {_supported()}") from None
        func.restype, func.argtypes = restype, argtypes
    return lib


def _supported() -> str:
    return f"3.{SUPPORTED[0] % 100}-3.{SUPPORTED[1] % 100} ({SONAME})"


lib = _load()
"""The loaded libfuse, its functions declared (:mod:`.splice` declares the one it adds)."""
_libc = ctypes.CDLL(None)
_libc.free.argtypes, _libc.free.restype = [_vp], None
reply_err = lib.fuse_reply_err
reply_buf = lib.fuse_reply_buf
_reply_at = ctypes.CFUNCTYPE(ctypes.c_int, c_req, _vp, ctypes.c_size_t)(("fuse_reply_buf", lib))


_reply_iov = ctypes.CFUNCTYPE(ctypes.c_int, c_req, ctypes.POINTER(IoVec), ctypes.c_int)(("fuse_reply_iov", lib))


def reply_spans(req: int, spans: Sequence[tuple[bytes, int, int]]) -> None:
    """Reply with the pieces ``data[start:start + length]`` straight from their memory, not from sliced or joined
    copies: the kernel's copy into the file's pages is the only one (a piece that is not bytes is copied)."""
    if len(spans) == 1:
        data, start, length = spans[0]
        if type(data) is bytes:
            _reply_at(req, id(data) + BYTES_DATA + start, length)
            return
    if any(type(data) is not bytes for data, _, _ in spans):
        joined = b"".join(bytes(memoryview(data)[start:start + length]) for data, start, length in spans)
        reply_buf(req, joined, len(joined))
        return
    iov = (IoVec * len(spans))(*((id(data) + BYTES_DATA + start, length) for data, start, length in spans))
    _reply_iov(req, iov, len(spans))


def answer(req: int, handler: Callable[..., None], *args: object) -> bool:
    """Run ``handler(req, *args)``, which replies to the request; whatever it raises (a failed reply too, any
    BaseException) is answered with an error, so no request is left unanswered and no reader hangs.  Whether the
    handler answered it (False: the error)."""
    try:
        handler(req, *args)
        return True
    except OSError as err:
        reply_err(req, err.errno or errno.EIO)
    except BaseException:
        log.exception("request failed")
        reply_err(req, errno.EIO)
    return False


class FileSystem(Protocol):
    """The requests :class:`Session` forwards; each must reply exactly once (maybe later, from any thread)."""

    def lookup(self, req: int, parent: int, name: bytes) -> None: ...
    def getattr(self, req: int, ino: int) -> None: ...
    def readlink(self, req: int, ino: int) -> None: ...
    def read(self, req: int, ino: int, offset: int, size: int) -> None: ...
    def readdirplus(self, req: int, ino: int, offset: int, size: int) -> None: ...
    def statfs(self, req: int, ino: int) -> None: ...
    def ready(self, session: "Session") -> None: ...


class Session:
    """One mount: ``Session(fs, mountpoint, options).loop()`` serves until unmounted or signalled.

    Request callbacks run in the loop thread, one at a time; a reply may be sent from any thread.
    Any exception escaping a callback is answered with EIO and logged, so a request never goes unanswered.
    """

    def __init__(self, fs: FileSystem, mountpoint: str, options: Sequence[str], *, debug: bool = False,
                 readahead_bytes: int = 0, max_read: int = 0) -> None:
        """``readahead_bytes``: the kernel's readahead window asked for in this mount's files (0: its default;
        :mod:`.readahead`); ``self.readahead`` is the window in force once INIT is answered.  ``max_read``: replies
        will be spliced (:mod:`.splice`), in requests of at most this many bytes (0: none will); ``self.splicing``
        says whether the kernel agreed, once INIT is answered."""
        self.fs = fs
        self.mountpoint = mountpoint
        self.readahead_bytes = readahead_bytes
        self.readahead: int | None = None
        self.max_read = max_read
        self.splicing = False
        if self.max_read:
            options = [*options, f"max_read={self.max_read}"]  # and the same in INIT: 3.14 refuses a mismatch (EPROTO)
        argv = [b"fanfs", b"-o", ",".join(options).encode()] + ([b"-d"] if debug else [])
        self._argv = (ctypes.c_char_p * len(argv))(*argv)
        self._args = Args(len(argv), self._argv, 0)
        self._callbacks = {
            "init": INIT(self._init),
            "lookup": LOOKUP(self._guard(fs.lookup)),
            "getattr": INO_FI(self._guard(lambda req, ino, fi: fs.getattr(req, ino))),
            "readlink": INO(self._guard(fs.readlink)),
            "open": INO_FI(self._enosys),
            "opendir": INO_FI(self._enosys),
            "read": READ(self._guard(lambda req, ino, size, off, fi: fs.read(req, ino, off, size))),
            "readdirplus": READ(self._guard(lambda req, ino, size, off, fi: fs.readdirplus(req, ino, off, size))),
            "statfs": INO(self._guard(fs.statfs)),
        }
        self._ops = LowLevelOps(**{name: ctypes.cast(cb, _vp) for name, cb in self._callbacks.items()})
        self._se = lib.fuse_session_new(ctypes.byref(self._args), ctypes.byref(self._ops),
                                         ctypes.sizeof(self._ops), None)
        if not self._se:
            raise OSError(errno.EINVAL, f"libfuse refused the mount options {','.join(options)}")
        self._mounted = self._ready = False
        self._lock = threading.Lock()

    @staticmethod
    def _enosys(req: int, ino: int, fi: int) -> None:
        reply_err(req, errno.ENOSYS)

    @staticmethod
    def _guard(handler):
        return lambda req, *args: answer(req, handler, *args)

    def _init(self, userdata: int, conn: int) -> None:
        # libfuse has set its defaults in conn->want (READDIRPLUS and READDIRPLUS_AUTO, as readdirplus is bound):
        # every listing page plus, not only the first (``struct fuse_conn_info``: want is its 7th unsigned int)
        want = ctypes.c_uint.from_address(conn + CONN_WANT)
        want.value &= ~CAP_READDIRPLUS_AUTO
        if self.max_read:
            ctypes.c_uint.from_address(conn + CONN_MAX_READ).value = self.max_read
            self.splicing = bool(ctypes.c_uint.from_address(conn + CONN_CAPABLE).value & CAP_SPLICE_WRITE)
            if self.splicing:
                want.value |= CAP_SPLICE_WRITE
            else:
                log.warning("the kernel does not offer spliced replies (FUSE_CAP_SPLICE_WRITE): large files are copied "
                            "through this process")
        # The kernel takes the smaller of the device's readahead and this reply's: so ours is never the smaller
        limit = ctypes.c_uint.from_address(conn + CONN_MAX_READAHEAD)
        limit.value = max(limit.value, self.readahead_bytes)
        self.readahead = (readahead.raise_to(self.mountpoint, self.readahead_bytes) if self.readahead_bytes
                          else readahead.current(self.mountpoint))
        self._ready = True
        try:
            self.fs.ready(self)
        except Exception:
            log.exception("init failed")

    def mount(self) -> None:
        _close_on_exec()
        failed, reason = _with_stderr(lambda: lib.fuse_session_mount(self._se, os.fsencode(self.mountpoint)))
        if failed:
            raise MountError(f"cannot mount at {self.mountpoint}: {reason or 'libfuse gave no reason'}"
                             + ("" if "allow_other" in reason else f"; {WITHOUT_MOUNT}"))
        self._mounted = True

    def loop(self) -> int:
        """Mount and serve; returns 0 after an unmount, or the number of the signal that ended the loop."""
        self.mount()
        # libfuse takes over only signals left at their default action: Python's own (or a caller's)
        # handlers could run only between bytecodes of the main thread, which the loop never returns to.
        main = threading.current_thread() is threading.main_thread()
        stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if main else ()
        previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in stops}
        pipe = signal.getsignal(signal.SIGPIPE) if main else None
        lib.fuse_set_signal_handlers(self._se)
        try:
            return lib.fuse_session_loop(self._se)
        finally:
            # Ours again before libfuse lets go (it resets only its own handlers, to the default action:
            # a second SIGTERM in between, as a job's end sends, killed the daemon); libfuse also resets
            # SIGPIPE, which Python ignores, to its default (death on a write to a closed socket).
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            lib.fuse_remove_signal_handlers(self._se)
            if pipe is not None:
                signal.signal(signal.SIGPIPE, pipe)
            self.unmount()

    def serve_until_ready(self) -> None:
        """Answer the kernel's first requests here until INIT has been answered (before forking the processes
        that serve the rest: INIT is answered once, by the owner of the session)."""
        buf = FuseBuf()
        try:
            while not self._ready:
                got = lib.fuse_session_receive_buf(self._se, ctypes.byref(buf))
                if got == -errno.EINTR:
                    continue
                if got <= 0:
                    raise MountError(f"the kernel closed the mount at {self.mountpoint} before it served")
                lib.fuse_session_process_buf(self._se, ctypes.byref(buf))
        finally:
            _libc.free(buf.mem)

    def loop_here(self) -> int:
        """Serve this process's share of the requests of a mount its parent made (a forked serving process):
        no signal handling and no unmount, which are the parent's; returns when the mount ends."""
        return lib.fuse_session_loop(self._se)

    def unmount(self) -> None:
        """End the mount now (from the parent of forked serving processes: their loops then end)."""
        with self._lock:
            if self._mounted:
                lib.fuse_session_unmount(self._se)
                self._mounted = False

    def ended(self) -> bool:
        """Whether the kernel has ended the mount's connection (unmounted, or aborted): its /dev/fuse descriptor then
        polls as an error (asked for no event, so requests coming in do not count); after this process's own
        unmount libfuse has closed it (-1)."""
        fd = lib.fuse_session_fd(self._se)
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, 0)
        return bool(poller.poll(0))

    def abandon(self) -> None:
        """Leave the mount in place and end its connection (the caller's descriptor is the last one: its serving
        processes are gone): every request held is failed (ECONNABORTED) and every access from then on fails with
        ENOTCONN, which says the file system's server is gone, until the mount point is unmounted."""
        with self._lock:
            self._mounted = False
        self.close()

    def invalidate_entry(self, parent: int, name: bytes) -> int:
        """Drop the kernel's dentry ``parent/name`` (from any thread but the loop's; 0 or -errno)."""
        with self._lock:
            if not self._mounted:
                return -errno.ENOTCONN
            return lib.fuse_lowlevel_notify_inval_entry(self._se, parent, name, len(name))

    def close(self) -> None:
        if self._se:
            lib.fuse_session_destroy(self._se)
            self._se = None


class MountError(FanfsError):
    """The kernel mount could not be made; the message carries libfuse's (or fusermount3's) reason."""


WITHOUT_MOUNT = ("where FUSE is not allowed, serve without a mount: --no-mount (FANFS_MOUNT=0 in a job), whose files "
                 "the training reads in-process")
"""What a user may do where a node offers no FUSE (the end of a failed mount's line)."""


def _with_stderr(call: Callable[[], int]) -> tuple[int, str]:
    """``call()`` with file descriptor 2 captured (libfuse and the fusermount3 it runs report there): its
    result and the last line written, which is also passed on to the real stderr (the daemon's log)."""
    captured = os.memfd_create("fanfs-libfuse", os.MFD_CLOEXEC)
    saved = os.dup(2)
    os.dup2(captured, 2)
    try:
        result = call()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    text = os.pread(captured, 1 << 16, 0)
    os.close(captured)
    if text:
        os.write(2, text)
    lines = [line.strip() for line in text.decode(errors="replace").splitlines() if line.strip()]
    return result, lines[-1] if lines else ""


def _close_on_exec() -> None:
    """Let no descriptor of this process reach libfuse's auto-unmount helper (``fusermount3``, forked and
    exec'd at mount, outliving a daemon that dies).

    Descriptors a launcher passed in (an MPI job's PMI socket, its stdio sockets, the MPI library's
    own) are inheritable; held open by the helper after the daemon died, they made MPICH's launcher
    take the dead rank for a hung one and kill every other node's daemon.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


def reply_entry(req: int, param: EntryParam) -> None:
    lib.fuse_reply_entry(req, ctypes.byref(param))


def reply_attr(req: int, attr: Stat, timeout: float) -> None:
    lib.fuse_reply_attr(req, ctypes.byref(attr), timeout)


def reply_readlink(req: int, target: bytes) -> None:
    lib.fuse_reply_readlink(req, target)


def reply_statfs(req: int, stats: StatVfs) -> None:
    lib.fuse_reply_statfs(req, ctypes.byref(stats))


def add_direntry_plus(req: int, buf: ctypes.Array, used: int, name: bytes, param: EntryParam, next_offset: int) -> int:
    """Append one entry with its attributes (as a lookup's reply) at ``used`` in ``buf``; returns its size
    (larger than what is left: not added)."""
    return lib.fuse_add_direntry_plus(req, ctypes.addressof(buf) + used, len(buf) - used, name,
                                       ctypes.byref(param), next_offset)
