"""Reading a stream socket in whole messages."""

from __future__ import annotations

import errno
import socket
import time


def recv_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    """Exactly ``n`` bytes; ConnectionResetError if the other end closes first (no partial message).

    ``deadline`` (time.monotonic): TimeoutError once it passes, however the bytes trickle in (a socket
    timeout alone bounds each recv, so one byte every few seconds would never end).
    """
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, "timed out")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionResetError(errno.ECONNRESET, "the other end closed the connection")
        got += k
    return buf
