"""Directories only this user may write: the runtime directory (control sockets, daemon logs, cached
fidelity curves) and, through :func:`private_dir`, node-local shard directories and (closed to others
altogether: it holds a private key) a node's directory.

``$FANFS_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/fanfs`` (a private tmpfs per user on most
systems), else ``fanfs-UID`` in the temporary directory.  On a shared node another user may create
that last name first (a directory, a symlink, a file), to plant an impostor socket in it or to make
fanfs refuse: a name this user does not own is passed over for ``fanfs-UID.1``, ``.2``... and the
directory is the first of those names that is this user's, found the same way by every command
(mount, stats, ctl, umount), or else the first free one, made.  Whatever squats the names, nobody else
can own one of this user's (a user cannot give away a directory), remove it (the temporary directory is
sticky) nor make fanfs refuse it.  A directory of this user's that others may write is refused, with
one line.  Files in it are created with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile

from ..errors import FanfsError


RUNTIME_VARIABLE = "FANFS_RUNTIME_DIR"


class UnsafeDirError(FanfsError):
    """A directory fanfs would keep its files in is not safe to use."""


_RUNTIME_REMEDY = f"remove it or set {RUNTIME_VARIABLE} to a private directory"


def runtime_dir(create: bool = True) -> str:
    """The checked runtime directory (created if missing).  ``create=False``, for a client: a runtime directory
    given (a job's, inside its node directory) that is not there is FileNotFoundError, never made again (a reader's
    last word to a mount, as its job ends, would leave it behind the job's cleanup)."""
    explicit = os.environ.get(RUNTIME_VARIABLE)
    if explicit:
        if not create and not os.path.lexists(explicit):
            raise FileNotFoundError(errno.ENOENT, "no runtime directory", explicit)
        return private_dir(explicit, "runtime directory", _RUNTIME_REMEDY)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        private_dir(xdg, "runtime directory", _RUNTIME_REMEDY, create=False)
        return private_dir(os.path.join(xdg, "fanfs"), "runtime directory", _RUNTIME_REMEDY)
    base = tempfile.gettempdir()
    try:
        found = _temporary_runtime_dir(base, os.getuid())
    except OSError as err:
        raise UnsafeDirError(f"cannot make a runtime directory in {base}: {err.strerror}; set TMPDIR to a directory "
                             f"of this node, or {RUNTIME_VARIABLE} to a private one") from None
    return private_dir(found, "runtime directory", _RUNTIME_REMEDY, create=False)


def _temporary_runtime_dir(base: str, uid: int) -> str:
    """``fanfs-UID`` in ``base``, or the first ``fanfs-UID.N`` that is this user's, or else the first that is free
    (made).  Names another user took are passed over.  Names of this user's are looked for in the whole directory
    before one is made: a squatter who removes the name before yours must not make a second runtime directory
    (the mounts in yours would not be found)."""
    first = os.path.join(base, f"fanfs-{uid}")
    if _owned(first, uid):
        return first
    slot = re.compile(rf"fanfs-{uid}\.([1-9][0-9]{{0,8}})")
    with os.scandir(base) as entries:
        slots = sorted(int(m[1]) for entry in entries if (m := slot.fullmatch(entry.name)))
    for n in slots:
        if _owned(f"{first}.{n}", uid):
            return f"{first}.{n}"
    n = 0
    while True:
        path = f"{first}.{n}" if n else first
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            if _owned(path, uid):  # made by another command of this user's meanwhile
                return path
        n += 1


def _owned(path: str, uid: int) -> bool:
    """Whether ``path`` is a directory of this user's (a symlink or a file is nobody's runtime directory: even one
    this user owns may be another user's hard link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def private_dir(path: str, what: str, remedy: str, *, create: bool = True, closed: bool = False) -> str:
    """``path``, created 0700 if missing (never its parents) unless ``create`` is False, and refused with one
    line (naming ``what`` it is for, ending with ``remedy``) unless it is a real directory, not a symlink,
    owned by this user and writable by nobody else: where another user could plant or replace what fanfs
    keeps there (sockets, logs, staged shards), fanfs does not keep anything.  ``closed``: nobody else may even
    list or enter it (0700), for a directory that holds a secret."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise UnsafeDirError(f"cannot create the {what} {path}: {os.path.dirname(path)} does not exist; "
                                 "create it, or pick another place") from None
        except OSError as err:
            raise UnsafeDirError(f"cannot create the {what} {path}: {err.strerror}; {remedy}") from None
    try:
        st = os.lstat(path)
    except OSError as err:
        raise UnsafeDirError(f"{what} {path}: {err.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    elif closed and st.st_mode & 0o077:
        raise UnsafeDirError(f"{what} {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}) and would hold "
                             f"a private key: chmod 700 it, or {remedy}")
    else:
        return path
    raise UnsafeDirError(f"{what} {path} {problem}: refusing to use it, since another user could "
                         f"tamper with fanfs's files there; {remedy}")


def create_private(path: str, *, append: bool = False) -> int:
    """Open a file in the runtime directory for writing, never through a symlink; returns the descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    try:
        return os.open(path, flags, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeDirError(f"{path} is a symbolic link: refusing to write through it") from None
        raise
