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
import pwd
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import FanfsError, UsageError
from .. import records
from ..records import FULL
from ..util.mounts import mount_owner, mounted
from ..util.runtime import create_private, runtime_dir

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_MESSAGE = 1 << 16


INSPECTING = frozenset({"status", "stats"})
"""The requests a daemon answers root too (an administrator inspecting any user's mount); others, only its user."""


def _name(mountpoint: str) -> str:
    return hashlib.sha1(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:16]


def _stem(mountpoint: str) -> str:
    return os.path.join(runtime_dir(), _name(mountpoint))


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


def _connect(mountpoint: str, timeout: float) -> socket.socket:
    """A socket connected to the daemon of ``mountpoint``: the one in this user's runtime directory or, if there is
    none there (a job's mount, whose runtime directory is the job's own; root inspecting another user's mount), the
    one its daemon bound elsewhere (:func:`_bound_elsewhere`), served by the mount's user.  Its socket here with
    nothing listening, on a mount point still mounted, is a daemon that ended without unmounting (it removes its
    socket as it ends): said so."""
    try:
        return _dial(socket_path(mountpoint), timeout, os.getuid(), mountpoint)
    except ControlError:
        raise
    except OSError as err:
        if err.errno == errno.ECONNREFUSED and mounted(mountpoint):
            raise DaemonEnded(f"{mountpoint} is a dead mount: its fanfs daemon has ended (killed?); 'fanfs umount "
                              f"{mountpoint}' removes it, then mount again") from None
        failure = err.strerror
    owner = mount_owner(mountpoint)
    if owner is not None and os.getuid() not in (owner, 0):
        raise ControlError(f"{mountpoint} is mounted by {user_name(owner)}, not by you: only they (or root, to "
                           "inspect it) can talk to its daemon")
    for path in _bound_elsewhere(mountpoint):
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's (a ControlError): never spoken to
            sock = _dial(path, min(timeout, 5.0), os.getuid() if owner is None else owner, mountpoint)
            sock.settimeout(timeout)
            return sock
    raise ControlError(f"no fanfs daemon answers for {mountpoint} ({failure})")


def _dial(path: str, timeout: float, uid: int, mountpoint: str) -> socket.socket:
    """A socket connected to ``path``, served by ``uid``: another user's socket (an impostor daemon) is closed before a
    byte is sent."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        with _address(path) as address:
            sock.connect(address)
        if (served := _peer_uid(sock)) != uid:
            whom = "you" if uid == os.getuid() else f"uid {uid}, whose mount it is"
            raise ControlError(f"the control socket of {mountpoint} is served by uid {served}, not by {whom}: refusing "
                               "to talk to it")
    except BaseException:
        sock.close()
        raise
    return sock


def _bound_elsewhere(mountpoint: str) -> list[str]:
    """Paths of Unix sockets bound with the name of ``mountpoint``'s control socket in any directory, from the kernel's
    list of this network namespace's sockets (``/proc/net/unix``): whoever bound them (the caller checks who serves
    one before it speaks).  One bound through ``/proc/self/fd`` (a runtime directory deeper than an address holds) is
    found beside the lock file that the process holding it keeps open (:func:`_beside_its_lock`)."""
    name = _name(mountpoint)
    try:
        with open("/proc/net/unix", errors="replace") as f:
            rows = [row for line in f if len(row := line.rstrip("\n").split(None, 7)) == 8
                    and row[7].endswith(f"/{name}.sock")]
    except OSError:
        return []
    found = [row[7] for row in rows if row[7].startswith("/") and not row[7].startswith("/proc/")]
    deep = {f"socket:[{row[6]}]" for row in rows if row[7].startswith("/proc/")}
    return found + (_beside_its_lock(deep, name) if deep else [])


def _beside_its_lock(sockets: set[str], name: str) -> list[str]:
    """The control sockets ``name.sock`` beside the lock files ``name.lock`` held open by the processes that hold one of
    ``sockets`` (``socket:[INODE]``): a daemon holds both (only this user's processes, or root's view of all, are
    seen)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        links = set()
        with contextlib.suppress(OSError):  # another user's process, or gone
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        if sockets & links:
            found += [link.removesuffix(".lock") + ".sock" for link in links if link.endswith(f"/{name}.lock")]
    return found


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid with no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def daemon_ended(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is a dead mount of this user's fanfs (:class:`DaemonEnded`)."""
    try:
        _connect(mountpoint, 5.0).close()
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


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def request(mountpoint: str, message: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the daemon of ``mountpoint`` and return its JSON answer."""
    with _connect(mountpoint, timeout) as sock:
        sock.sendall(json.dumps(message).encode() + b"\n")
        data = _recv_line(sock)
    try:
        answer = json.loads(data or b"{}")
    except ValueError:
        raise ControlError(f"the daemon of {mountpoint} sent a malformed answer") from None
    if not isinstance(answer, dict):
        raise ControlError(f"the daemon of {mountpoint} sent a malformed answer")
    if "error" in answer:
        raise ControlError(str(answer["error"]))
    return answer


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


def _recv_line(sock: socket.socket) -> bytes:
    """One newline-terminated JSON message (or what came before the peer closed), at most MAX_MESSAGE bytes."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(MAX_MESSAGE)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_MESSAGE:
            raise ControlError(f"control message longer than {MAX_MESSAGE} bytes")
    return data


class ControlServer:
    """Serves ``{"cmd": name, ...}`` requests with the given handlers on a daemon thread, once started (the
    socket is bound at once, before the mount: afterwards resolving the mount point's path would ask the
    very daemon that is not yet answering).

    A handler raises ValueError (or a FanfsError) for a request it refuses; the client gets its message.
    """

    def __init__(self, mountpoint: str, handlers: dict[str, Handler]) -> None:
        self.path = socket_path(mountpoint)
        self.handlers = handlers
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
            with conn:
                try:
                    conn.settimeout(10)
                    if (peer := _peer_uid(conn)) not in (os.getuid(), 0):
                        raise ValueError("not your mount")
                    message = json.loads(_recv_line(conn))
                    if not isinstance(message, dict):
                        raise ValueError("a request is a JSON object")
                    if peer != os.getuid() and message.get("cmd") not in INSPECTING:
                        raise ValueError(f"not your mount: root may only inspect it ({', '.join(sorted(INSPECTING))})")
                    handler = self.handlers.get(message.get("cmd"))
                    if handler is None:
                        raise ValueError(f"unknown command {message.get('cmd')!r}")
                    answer = handler(message)
                except (ValueError, FanfsError, OSError) as err:
                    answer = {"error": str(err)}
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
