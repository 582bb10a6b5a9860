"""The control channel of a mount: a Unix socket outside the mount, one JSON request per connection.

It never appears in the mounted tree (an ImageFolder over the mount root sees only the dataset), and
it works on a read-only mount where xattrs could not be set.  The socket's path is derived from the
mount point, in the private runtime directory (:mod:`fanfs.util.runtime`); both ends check the other's
credentials (``SO_PEERCRED``), so neither an impostor daemon nor another user's client is answered.
Each mount point also has a lock file there, held by its daemon for its lifetime: a second mount of
the same point is refused instead of stacking on the first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import FanfsError, UsageError
from .. import records
from ..records import FULL
from ..util.mounts import mounted
from ..util.runtime import create_private, runtime_dir

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_MESSAGE = 1 << 16
FDS = "_fds"
"""A handler's answer may list descriptors under this key: they are passed with it (``SCM_RIGHTS``), not written."""


def _stem(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), hashlib.sha1(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:16])


def socket_path(mountpoint: str) -> str:
    return _stem(mountpoint) + ".sock"


def log_path(mountpoint: str) -> str:
    return _stem(mountpoint) + ".log"


def was_mounted(mountpoint: str) -> bool:
    """Whether a fanfs mount of this user's served at ``mountpoint`` (on this node, since its runtime directory
    was made): its log, or the mark it leaves when it ends (:meth:`MountLock.remove`)."""
    return any(os.path.exists(_stem(mountpoint) + suffix) for suffix in (".log", ".ended"))


@contextlib.contextmanager
def _address(path: str) -> Iterator[str]:
    """An AF_UNIX address for ``path`` however deep it lies (an address holds at most 107 bytes, and a
    job's runtime directory may lie deep in $FANFS_LOCAL): beyond that, its directory through /proc/self/fd."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


class ControlError(FanfsError, OSError):
    """No fanfs daemon answers for that mount point, or it refused the request."""


class DaemonEnded(ControlError):
    """A dead mount: its daemon ended (a kill -9, the OOM killer) without unmounting it."""


def _connect(sock: socket.socket, mountpoint: str) -> None:
    """Connect to the daemon of ``mountpoint``.  Its socket there with nothing listening, on a mount point that is
    still mounted, is a daemon that ended without unmounting (it removes its socket as it ends): said so."""
    path = socket_path(mountpoint)
    try:
        with _address(path) as address:
            sock.connect(address)
    except OSError as err:
        if err.errno == errno.ECONNREFUSED and mounted(mountpoint):
            raise DaemonEnded(f"{mountpoint} is a dead mount: its fanfs daemon has ended (killed?); 'fanfs umount "
                              f"{mountpoint}' removes it, then mount again") from None
        raise ControlError(f"no fanfs daemon answers for {mountpoint} ({err.strerror})") from None


def daemon_ended(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is a dead mount of this user's fanfs (:class:`DaemonEnded`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            _connect(sock, mountpoint)
        except DaemonEnded:
            return True
        except ControlError:
            pass
    return False


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
            os.unlink(self.path)
        self.release()


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, as the kernel says (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def _peer_uid(sock: socket.socket) -> int:
    return peer_credentials(sock)[1]


def request(mountpoint: str, message: dict[str, Any], timeout: float = 30.0,
            needs: Iterable[str] = ()) -> dict[str, Any]:
    """Send one request to the daemon of ``mountpoint`` and return its JSON answer, which holds ``needs`` (keys the
    caller reads); one line (ControlError) for a daemon that ended before it answered, did not answer within
    ``timeout`` seconds, or answered something else (another fanfs's daemon)."""
    answer, fds, _ = request_with_fds(mountpoint, message, timeout, needs=needs)
    for fd in fds:  # none was asked for
        os.close(fd)
    return answer


def request_with_fds(mountpoint: str, message: dict[str, Any], timeout: float = 30.0, max_fds: int = 0,
                     needs: Iterable[str] = ()) -> tuple[dict[str, Any], list[int], int]:
    """:func:`request`, and the descriptors the daemon passed with its answer (at most ``max_fds``, the caller's to
    close) and its pid (as the kernel says: ``SO_PEERCRED``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        _connect(sock, mountpoint)
        pid, uid = peer_credentials(sock)
        if uid != os.getuid():
            raise ControlError(f"the control socket of {mountpoint} is served by uid {uid}, not by you: "
                               "refusing to talk to it")
        try:
            sock.sendall(json.dumps(message).encode() + b"\n")
            data, fds = _recv_line(sock, max_fds)
        except TimeoutError:
            raise ControlError(f"the daemon of {mountpoint} did not answer within {timeout:g} s (its log: "
                               f"{log_path(mountpoint)})") from None
    if not data:
        raise ControlError(f"the daemon of {mountpoint} ended before it answered (its log: {log_path(mountpoint)})")
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "error" in answer:
        problem = str(answer["error"])
    elif not isinstance(answer, dict) or not all(key in answer for key in needs):
        problem = (f"the daemon of {mountpoint} sent an answer this fanfs cannot read (is it another version's? "
                   f"'fanfs umount {mountpoint}' and mount again)")
    else:
        return answer, fds, pid
    for fd in fds:
        os.close(fd)
    raise ControlError(problem)


def presenter(mountpoint: str, setting: str) -> Callable[[int], dict[str, Any]]:
    """``apply(value)``: set one presentation setting (``precision``, ``fidelity``) of a running mount.

    Files opened afterwards get it; what is open keeps its bytes.  For :class:`fanfs.tune.plateau.PlateauSchedule`,
    from the training process (DataLoader workers need nothing: they open files after the change).
    """
    known = records.setting(setting)  # UsageError naming the settings if there is none of that name

    def apply(value: int) -> dict[str, Any]:
        if type(value) is not int or not 0 < value <= FULL:
            raise UsageError(f"{known.name} must be a positive whole number or FULL, not {value!r}")
        return request(mountpoint, {"cmd": "present", setting: value}, timeout=600)

    return apply


def _recv_line(sock: socket.socket, max_fds: int = 0) -> tuple[bytes, list[int]]:
    """One newline-terminated JSON message (or what came before the peer closed), at most MAX_MESSAGE bytes, and the
    descriptors passed with it (at most ``max_fds``: any more the kernel closes)."""
    data, fds = b"", []
    try:
        while not data.endswith(b"\n"):
            if max_fds:
                chunk, passed, _, _ = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
                fds += passed
            else:
                chunk = sock.recv(MAX_MESSAGE)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_MESSAGE:
                raise ControlError(f"control message longer than {MAX_MESSAGE} bytes")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return data, fds


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
        """A request's handler and message; ValueError if it is none (or not this user's)."""
        conn.settimeout(10)
        if _peer_uid(conn) != os.getuid():
            raise ValueError("not your mount")
        message = json.loads(_recv_line(conn)[0])
        if not isinstance(message, dict):
            raise ValueError("a request is a JSON object")
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
