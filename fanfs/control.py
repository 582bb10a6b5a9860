"""The control channel of a mount: a Unix socket outside the mount, one JSON request per connection.

It never appears in the mounted tree (an ImageFolder over the mount root sees only the dataset), and
it works on a read-only mount where xattrs could not be set.  The socket's path is derived from the
mount point, so ``fanfs ctl MNT`` needs nothing but MNT.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def runtime_dir() -> str:
    path = os.environ.get("FANFS_RUNTIME_DIR") or f"/tmp/fanfs-{os.getuid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _stem(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), hashlib.sha1(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:16])


def socket_path(mountpoint: str) -> str:
    return _stem(mountpoint) + ".sock"


def log_path(mountpoint: str) -> str:
    return _stem(mountpoint) + ".log"


class ControlError(OSError):
    """No fanfs daemon answers for that mount point."""


def request(mountpoint: str, message: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the daemon of ``mountpoint`` and return its JSON answer."""
    path = socket_path(mountpoint)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as err:
            raise ControlError(f"no fanfs daemon answers for {mountpoint} ({err.strerror})") from None
        sock.sendall(json.dumps(message).encode() + b"\n")
        data = _recv_line(sock)
    answer = json.loads(data or b"{}")
    if "error" in answer:
        raise ControlError(answer["error"])
    return answer


def _recv_line(sock: socket.socket) -> bytes:
    """One newline-terminated JSON message (or what came before the peer closed)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return data


class ControlServer:
    """Serves ``{"cmd": name, ...}`` requests with the given handlers on a daemon thread."""

    def __init__(self, mountpoint: str, handlers: dict[str, Handler]) -> None:
        self.path = socket_path(mountpoint)
        self.handlers = handlers
        if os.path.exists(self.path):
            os.unlink(self.path)  # left by a daemon that was killed; ismount() was checked before
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, name="fanfs-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(10)
                    message = json.loads(_recv_line(conn))
                    handler = self.handlers.get(message.get("cmd"))
                    answer = handler(message) if handler else {"error": f"unknown command {message.get('cmd')!r}"}
                except Exception as err:  # a bad request must not take the daemon down
                    answer = {"error": f"{type(err).__name__}: {err}"}
                try:
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    pass

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
        except OSError:
            pass
        self._sock.close()
