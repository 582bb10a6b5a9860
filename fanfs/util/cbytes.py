"""Python bytes as C sees them: where a ``bytes`` object's data lies, and ``struct iovec``, for the calls that read
into or send from a bytes object's own memory (``preadv2`` into a fresh one; a FUSE reply from one) with no copy."""

from __future__ import annotations

import ctypes


class IoVec(ctypes.Structure):
    """``struct iovec``: a buffer's address and length."""

    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


BYTES_DATA = bytes.__basicsize__ - 1
"""Where a bytes object's data begins, from its address (CPython's layout: ``ob_sval`` ends the fixed part)."""
if ctypes.string_at(id(_probe := b"fanfs") + BYTES_DATA, 5) != _probe:
    raise ImportError("fanfs reads into and replies from bytes objects' memory, which needs CPython's bytes layout")

new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
"""``new_bytes(None, n)``: a fresh bytes object of ``n`` bytes, not yet seen by anyone, to fill before returning it."""
new_bytes.argtypes, new_bytes.restype = [ctypes.c_void_p, ctypes.c_ssize_t], ctypes.py_object
