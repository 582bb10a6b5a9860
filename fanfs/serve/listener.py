"""The control channel of a mount, the daemon's end: its socket server (one request at a time, but long ones on threads
of their own), and the lock a mount point's daemon holds while it serves.  The client's end, and what both share:
:mod:`.control`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..errors import FanfsError
from ..util.runtime import create_private
from .control import FDS, Handler, _address, _peer_uid, _recv_line, _stem, socket_path

INSPECTING = frozenset({"status", "stats"})
"""The requests a daemon answers root too (an administrator inspecting any user's mount); others, only its user."""


class MountLock:
    """The lock a mount point's daemon holds while it serves (``flock`` on a file in the runtime dir).

    The file is removed when the mount ends (:meth:`remove`), by a process still holding the lock and
    only if the path still names the file it locked; a new mount that opened the file before that
    finds, once it holds the lock, that the path names another file or none, and starts again.
    """

    def __init__(self, mountpoint: str) -> None:
        self.path = _stem(mountpoint) + ".lock"
        while True:
            self.fd = create_private(self.path, append=True)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self.fd)
                raise FanfsError(f"{mountpoint} is being mounted or served by another fanfs daemon: "
                                 f"'fanfs umount {mountpoint}' first") from None
            if self._named_by_path():
                return
            os.close(self.fd)  # removed by a mount that ended meanwhile: lock the file there now

    def _named_by_path(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Close this process's copy (a daemon forked with it holds the lock on)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        """The mount has ended (no process of it serves any more): remove the lock file, then release it."""
        if self.fd >= 0 and self._named_by_path():
            with contextlib.suppress(OSError):  # a mark only: 'fanfs umount' then knows a mount was here
                os.close(create_private(self.path.removesuffix(".lock") + ".ended"))
                _forget_old_marks(os.path.dirname(self.path))
            os.unlink(self.path)
        self.release()


ENDED_MARKS = 64
"""Marks of ended mounts a runtime directory keeps (the newest): a node of many mount points (a test suite, a
user's scripts) must not pile them up for ever."""


def _forget_old_marks(directory: str) -> None:
    """Remove all but the newest :data:`ENDED_MARKS` marks of ended mounts in ``directory``."""
    marks = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".ended"):
                with contextlib.suppress(OSError):
                    marks.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    for _, path in sorted(marks, reverse=True)[ENDED_MARKS:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class Background:
    """A handler that may take long (it reads a file the request names, of any size): answered on a thread of its own,
    :data:`BACKGROUND` at most at once, so that the control socket answers every other request meanwhile."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.handler(message)


BACKGROUND = 4
"""Requests of :class:`Background` handlers answered at once; one more is refused, in one line."""


def _answer(conn: socket.socket, handler: Handler, message: dict[str, Any], done: Callable[[], None] | None = None
            ) -> None:
    """Answer ``message`` with ``handler``'s answer or error (then ``done()``), and close the connection."""
    try:
        answer = handler(message)
    except Exception as err:  # a bad request must not take the daemon down
        answer = _refusal(err)
    finally:
        if done is not None:
            done()
    _send(conn, answer)


def _refusal(err: Exception) -> dict[str, Any]:
    """The answer to a request refused (ValueError, FanfsError, OSError: their message) or failed (any other)."""
    return {"error": str(err) if isinstance(err, (ValueError, FanfsError, OSError)) else f"{type(err).__name__}: {err}"}


def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
    """Send an answer (with the descriptors it lists under :data:`FDS`), and close the connection (a client gone
    meanwhile is no error)."""
    fds = answer.pop(FDS, [])
    with conn:
        try:
            data = json.dumps(answer).encode() + b"\n"
            socket.send_fds(conn, [data], fds) if fds else conn.sendall(data)
        except OSError:
            pass


class ControlServer:
    """Serves ``{"cmd": name, ...}`` requests with the given handlers on a daemon thread, once started (the
    socket is bound at once, before the mount: afterwards resolving the mount point's path would ask the
    very daemon that is not yet answering).  One request at a time, but those of a :class:`Background` handler.

    A handler raises ValueError (or a FanfsError) for a request it refuses; the client gets its message.  Its answer
    may pass descriptors (:data:`FDS`): a mount hands its in-process readers its shared memory so.
    """

    def __init__(self, mountpoint: str, handlers: dict[str, Handler]) -> None:
        self.path = socket_path(mountpoint)
        self.handlers = handlers
        self._background = threading.BoundedSemaphore(BACKGROUND)
        if os.path.lexists(self.path):
            os.unlink(self.path)  # left by a daemon that was killed: this mount point's lock is ours now
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _address(self.path) as address:
            self._sock.bind(address)
        os.chmod(self.path, 0o600)
        self._sock.listen(16)

    def start(self) -> None:
        """Answer requests from now on (a thread: started once no more serving process is to be forked)."""
        threading.Thread(target=self._serve, name="fanfs-control", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                handler, message = self._read(conn)
            except Exception as err:  # a JSON nested 30,000 deep too: the control thread lives on
                _send(conn, _refusal(err))
                continue
            if not isinstance(handler, Background):
                _answer(conn, handler, message)
            elif self._background.acquire(blocking=False):
                threading.Thread(target=_answer, args=(conn, handler, message, self._background.release),
                                 name="fanfs-control-background", daemon=True).start()
            else:
                _send(conn, {"error": f"{BACKGROUND} requests like this one are being answered: try again once one "
                                      "is"})

    def _read(self, conn: socket.socket) -> tuple[Handler, dict[str, Any]]:
        """A request's handler and message; ValueError if it is none (or not this user's: root may inspect it)."""
        conn.settimeout(10)
        if (peer := _peer_uid(conn)) not in (os.getuid(), 0):
            raise ValueError("not your mount")
        message = json.loads(_recv_line(conn)[0])
        if not isinstance(message, dict):
            raise ValueError("a request is a JSON object")
        if peer != os.getuid() and message.get("cmd") not in INSPECTING:
            raise ValueError(f"not your mount: root may only inspect it ({', '.join(sorted(INSPECTING))})")
        handler = self.handlers.get(message.get("cmd"))
        if handler is None:
            raise ValueError(f"unknown command {message.get('cmd')!r}")
        return handler, message

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
