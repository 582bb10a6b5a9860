"""Reading a stream socket in whole messages."""

from __future__ import annotations

import errno
import socket


def recv_exactly(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes; ConnectionResetError if the other end closes first (no partial message)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionResetError(errno.ECONNRESET, "the other end closed the connection")
        got += k
    return buf
