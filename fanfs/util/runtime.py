"""Directories only this user may write: the runtime directory (control sockets, daemon logs, cached
fidelity curves) and, through :func:`private_dir`, node-local shard directories and (closed to others
altogether: it holds a private key) a node's directory.

``$FANFS_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/fanfs`` (a private tmpfs per user on most
systems), else ``fanfs-UID`` in the temporary directory.  On a shared node another user could create
that last one first and plant symlinks or an impostor socket in it, so the directory is created 0700
and refused, with one line, unless it is a real directory (not a symlink) owned by this user and
writable by nobody else.  Files in it are created with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

from ..errors import FanfsError


RUNTIME_VARIABLE = "FANFS_RUNTIME_DIR"


class UnsafeDirError(FanfsError):
    """A directory fanfs would keep its files in is not safe to use."""


_RUNTIME_REMEDY = f"remove it or set {RUNTIME_VARIABLE} to a private directory"


def runtime_dir() -> str:
    """The checked runtime directory (created if missing)."""
    explicit = os.environ.get(RUNTIME_VARIABLE)
    if explicit:
        return private_dir(explicit, "runtime directory", _RUNTIME_REMEDY)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        private_dir(xdg, "runtime directory", _RUNTIME_REMEDY, create=False)
        return private_dir(os.path.join(xdg, "fanfs"), "runtime directory", _RUNTIME_REMEDY)
    return private_dir(os.path.join(tempfile.gettempdir(), f"fanfs-{os.getuid()}"), "runtime directory",
                       _RUNTIME_REMEDY)


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
