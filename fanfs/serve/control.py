"""The control channel of a mount, the client's end: a Unix socket outside the mount, one JSON request per connection
(the daemon's end, and the mount point's lock: :mod:`.listener`).

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
import hashlib
import json
import os
import pwd
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import FanfsError, UsageError
from .. import records
from ..records import FULL
from ..util.mounts import mount_owner, mounted
from ..util.runtime import runtime_dir

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_MESSAGE = 1 << 16
FDS = "_fds"
"""A handler's answer may list descriptors under this key: they are passed with it (``SCM_RIGHTS``), not written."""


def runtime_name(mountpoint: str, *, real: bool = False) -> str:
    """The name, less its suffix, of ``mountpoint``'s control socket, lock and log in a runtime directory.  ``real``:
    the path is real already (the mount table's), and is not looked at (a hung mount would not answer)."""
    return hashlib.sha1(os.fsencode(mountpoint if real else os.path.realpath(mountpoint))).hexdigest()[:16]


def _stem(mountpoint: str, create: bool = True) -> str:
    return os.path.join(runtime_dir(create), runtime_name(mountpoint))


def socket_path(mountpoint: str, *, create: bool = True) -> str:
    """The control socket's path (``create=False``: a client's, which makes no runtime directory)."""
    return _stem(mountpoint, create) + ".sock"


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
        return _dial(socket_path(mountpoint, create=False), timeout, os.getuid(), mountpoint)
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
    name = runtime_name(mountpoint)
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
    with _connect(mountpoint, timeout) as sock:
        pid = peer_credentials(sock)[0]
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
