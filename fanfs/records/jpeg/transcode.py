"""Lossless baseline -> progressive JPEG transcoding, keeping every marker (EXIF, ICC, COM).

The default progression goes through libturbojpeg's ``tjTransform`` via ctypes (in-process, 7-40 ms per
photo here); a scan script, which tjTransform cannot take, goes through the ``jpegtran`` binary.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import threading

from .markers import JpegError, end_of_image, frame, looks_like_jpeg, split_layers
from .scans import ScanScript

TJXOP_NONE = 0
TJXOPT_PROGRESSIVE = 32  # libjpeg-turbo 2.1 turbojpeg.h; progressive implies Huffman optimisation
TJFLAG_STOPONWARNING = 8192
TJFLAG_LIMITSCANS = 32768  # refuse progressive input with > 500 scans (CPU exhaustion)
TJERR_WARNING = 0


class _TjRegion(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _TjTransform(ctypes.Structure):
    _fields_ = [("r", _TjRegion), ("op", ctypes.c_int), ("options", ctypes.c_int),
                ("data", ctypes.c_void_p), ("customFilter", ctypes.c_void_p)]


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_XFORM = _TjTransform(op=TJXOP_NONE, options=TJXOPT_PROGRESSIVE)  # read-only, shared


def _libturbojpeg() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise JpegError(f"libturbojpeg not available: {e}") from None
            lib.tjInitTransform.restype = ctypes.c_void_p
            lib.tjInitTransform.argtypes = []
            lib.tjTransform.restype = ctypes.c_int
            lib.tjTransform.argtypes = [
                ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ulong),
                ctypes.POINTER(_TjTransform), ctypes.c_int]
            lib.tjGetErrorStr2.restype = ctypes.c_char_p
            lib.tjGetErrorStr2.argtypes = [ctypes.c_void_p]
            lib.tjGetErrorCode.restype = ctypes.c_int
            lib.tjGetErrorCode.argtypes = [ctypes.c_void_p]
            lib.tjFree.restype = None
            lib.tjFree.argtypes = [ctypes.c_void_p]
            lib.tjDestroy.restype = ctypes.c_int
            lib.tjDestroy.argtypes = [ctypes.c_void_p]
            _lib = lib
        return _lib


class _Transformer:
    """One tjhandle and its output slots, per thread (a tjhandle is not thread-safe)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.handle = lib.tjInitTransform()
        if not self.handle:
            raise JpegError("tjInitTransform failed")
        self.buf = ctypes.c_void_p()
        self.size = ctypes.c_ulong(0)

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.tjDestroy(self.handle)

    def progressive(self, data: bytes) -> bytes:
        lib, buf, size = self.lib, self.buf, self.size
        buf.value = None  # NULL: let the library allocate the output
        size.value = 0
        rc = lib.tjTransform(self.handle, data, len(data), 1, ctypes.byref(buf), ctypes.byref(size),
                             ctypes.byref(_XFORM), TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS)
        try:
            if rc != 0:
                kind = "warning" if lib.tjGetErrorCode(self.handle) == TJERR_WARNING else "error"
                msg = (lib.tjGetErrorStr2(self.handle) or b"?").decode(errors="replace").strip()
                raise JpegError(f"transcoder refused ({kind}): {msg}")
            return ctypes.string_at(buf.value, size.value)
        finally:
            if buf.value:
                lib.tjFree(buf)


_local = threading.local()


def _transformer() -> _Transformer:
    t = getattr(_local, "t", None)
    if t is None:
        t = _local.t = _Transformer(_libturbojpeg())
    return t


def _jpegtran(data: bytes, script: ScanScript) -> bytes:
    """``jpegtran -scans``, the script given as a file in memory (``/dev/fd/N``): a worker killed mid-transcode
    (the OOM killer's SIGKILL) leaves no file behind, as a temporary file in /tmp would be left."""
    fd = os.memfd_create("fanfs-scans")
    try:
        os.write(fd, script.text.encode())
        try:
            p = subprocess.run(["jpegtran", "-copy", "all", "-optimize", "-strict", "-scans", f"/dev/fd/{fd}"],
                               input=data, capture_output=True, check=False, pass_fds=(fd,))
        except FileNotFoundError:
            raise JpegError("jpegtran not installed (needed for custom scan scripts)") from None
    finally:
        os.close(fd)
    if p.returncode != 0 or not p.stdout:
        msg = p.stderr.decode(errors="replace").strip().replace("\n", "; ")
        raise JpegError(f"transcoder refused: {msg or f'jpegtran exit {p.returncode}'}")
    return p.stdout


def to_progressive(data: bytes, scan_script: ScanScript | None = None) -> bytes:
    """Losslessly transcode a JPEG to progressive, keeping every marker (EXIF, ICC, COM).

    Raises JpegError on anything the transcoder refuses or warns about (truncated or corrupt
    entropy data decode with warnings into garbage), and on bytes after the image's EOI, which a
    transcode would drop: an MPO's second image, a motion photo's video, a camera's trailer.  They
    cannot ride along after the transcode either: an MPO locates its images by offsets that the
    transcode moves.  An input that is already a well-formed progressive JPEG comes back unchanged
    when no script is given.
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    if not looks_like_jpeg(data[:4]):
        raise JpegError("not a JPEG")
    after = len(data) - end_of_image(data)
    if after:
        raise JpegError(f"bytes after EOI ({after:,})")
    sof = frame(data)
    if scan_script is None:
        out = _transformer().progressive(data)  # also validates the whole entropy stream
        if sof.marker == 0xC2:
            split_layers(data)
            return data
    else:
        out = _jpegtran(data, scan_script.fitted(sof.components))
    split_layers(out)  # never hand out something the reader cannot split
    return out
