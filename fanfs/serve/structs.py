"""The C layouts the FUSE binding (:mod:`.lowlevel`) passes to and from libfuse 3 and the kernel, as ctypes:
``struct stat`` per architecture, ``fuse_entry_param``, ``statvfs``, the request callbacks' signatures and
``fuse_lowlevel_ops``, and where ``want`` lies in ``fuse_conn_info``."""

from __future__ import annotations

import ctypes
import platform
import struct

c_ino = ctypes.c_uint64
c_req = ctypes.c_void_p


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64)]


if platform.machine() in ("x86_64", "AMD64"):
    class Stat(ctypes.Structure):
        _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64), ("st_nlink", ctypes.c_uint64),
                    ("st_mode", ctypes.c_uint32), ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                    ("_pad0", ctypes.c_int32), ("st_rdev", ctypes.c_uint64), ("st_size", ctypes.c_int64),
                    ("st_blksize", ctypes.c_int64), ("st_blocks", ctypes.c_int64), ("st_atim", Timespec),
                    ("st_mtim", Timespec), ("st_ctim", Timespec), ("_reserved", ctypes.c_int64 * 3)]
elif platform.machine() in ("aarch64", "arm64", "riscv64"):  # the generic kernel layout
    class Stat(ctypes.Structure):  # type: ignore[no-redef]
        _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64), ("st_mode", ctypes.c_uint32),
                    ("st_nlink", ctypes.c_uint32), ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                    ("st_rdev", ctypes.c_uint64), ("_pad1", ctypes.c_uint64), ("st_size", ctypes.c_int64),
                    ("st_blksize", ctypes.c_int32), ("_pad2", ctypes.c_int32), ("st_blocks", ctypes.c_int64),
                    ("st_atim", Timespec), ("st_mtim", Timespec), ("st_ctim", Timespec),
                    ("_unused", ctypes.c_uint32 * 2)]
else:
    raise ImportError(f"fanfs's FUSE binding knows struct stat on x86_64 and aarch64, not {platform.machine()}")


if platform.machine() in ("x86_64", "AMD64"):
    _STAT = struct.Struct("<QQQIIIiQqqqqqqqqq")  # dev ino nlink mode uid gid pad rdev size blksize blocks a/m/ctime

    def _stat_values(ino: int, mode: int, nlink: int, uid: int, gid: int, size: int, sec: int, nsec: int) -> tuple:
        return (0, ino, nlink, mode, uid, gid, 0, 0, size, 1 << 17, (size + 511) // 512, sec, nsec, sec, nsec, sec, nsec)
else:
    _STAT = struct.Struct("<QQIIIIQQqiiqqqqqqq")  # dev ino mode nlink uid gid rdev pad size blksize pad blocks times

    def _stat_values(ino: int, mode: int, nlink: int, uid: int, gid: int, size: int, sec: int, nsec: int) -> tuple:
        return (0, ino, mode, nlink, uid, gid, 0, 0, size, 1 << 17, 0, (size + 511) // 512, sec, nsec, sec, nsec, sec, nsec)


def pack_stat(target: ctypes.Structure, offset: int, ino: int, mode: int, nlink: int, uid: int, gid: int, size: int,
              mtime_ns: int) -> None:
    """Write a whole ``struct stat`` into ``target`` at ``offset`` in one call (a ctypes field at a time costs
    ~0.4 us each: a lookup's attributes were 5 us of its 9)."""
    sec, nsec = divmod(mtime_ns, 1_000_000_000)
    _STAT.pack_into(target, offset, *_stat_values(ino, mode, nlink, uid, gid, size, sec, nsec))


class EntryParam(ctypes.Structure):
    _fields_ = [("ino", c_ino), ("generation", ctypes.c_uint64), ("attr", Stat),
                ("attr_timeout", ctypes.c_double), ("entry_timeout", ctypes.c_double)]


ATTR_OFFSET = EntryParam.attr.offset
_INO = struct.Struct("<Q")


def set_entry_ino(param: EntryParam, ino: int) -> None:
    _INO.pack_into(param, 0, ino)


class StatVfs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulong) for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                    "f_files", "f_ffree", "f_favail", "f_fsid", "f_flag",
                                                    "f_namemax")] + [("_spare", ctypes.c_int * 6)]


class Args(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


_vp = ctypes.c_void_p
INIT = ctypes.CFUNCTYPE(None, _vp, _vp)
LOOKUP = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_char_p)
INO_FI = ctypes.CFUNCTYPE(None, c_req, c_ino, _vp)  # getattr, open, opendir
INO = ctypes.CFUNCTYPE(None, c_req, c_ino)  # readlink, statfs
READ = ctypes.CFUNCTYPE(None, c_req, c_ino, ctypes.c_size_t, ctypes.c_int64, _vp)  # read, readdirplus

# struct fuse_lowlevel_ops of libfuse 3.14, in order; what is left None gets libfuse's default reply.
_OPS = ("init", "destroy", "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink",
        "rmdir", "symlink", "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir",
        "readdir", "releasedir", "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr", "removexattr",
        "access", "create", "getlk", "setlk", "bmap", "ioctl", "poll", "write_buf", "retrieve_reply",
        "forget_multi", "flock", "fallocate", "readdirplus", "copy_file_range", "lseek")


class LowLevelOps(ctypes.Structure):
    _fields_ = [(name, _vp) for name in _OPS]


class FuseBuf(ctypes.Structure):
    """``struct fuse_buf`` as of 3.14, with room to spare for fields a later 3.x appends (libfuse writes it)."""

    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", _vp), ("fd", ctypes.c_int),
                ("pos", ctypes.c_int64), ("_spare", ctypes.c_byte * 64)]


class FuseBufvec1(ctypes.Structure):
    """``struct fuse_bufvec`` of one buffer (count, idx, off, then the buffers; only its first is 3.14's own size)."""

    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", _vp), ("fd", ctypes.c_int),
                ("pos", ctypes.c_int64)]


BUF_IS_FD, BUF_FD_SEEK = 1 << 1, 1 << 2  # enum fuse_buf_flags
# struct fuse_conn_info: proto_major, proto_minor, max_write, max_read, max_readahead, capable, want, ... (unsigned ints)
CONN_MAX_READ = 3 * ctypes.sizeof(ctypes.c_uint)
CONN_MAX_READAHEAD = 4 * ctypes.sizeof(ctypes.c_uint)
CONN_CAPABLE = 5 * ctypes.sizeof(ctypes.c_uint)
CONN_WANT = 6 * ctypes.sizeof(ctypes.c_uint)
CAP_SPLICE_WRITE = 1 << 7
CAP_READDIRPLUS_AUTO = 1 << 14
