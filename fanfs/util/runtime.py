"""The per-user runtime directory: control sockets, daemon logs, cached fidelity curves.

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


class RuntimeDirError(FanfsError):
    """The runtime directory is not safe to use."""


def runtime_dir() -> str:
    """The checked runtime directory (created if missing)."""
    explicit = os.environ.get(RUNTIME_VARIABLE)
    if explicit:
        return _private(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        _check(xdg, os.lstat(xdg))
        return _private(os.path.join(xdg, "fanfs"))
    return _private(os.path.join(tempfile.gettempdir(), f"fanfs-{os.getuid()}"))


def _private(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise RuntimeDirError(f"cannot create the runtime directory {path}: {err.strerror}; "
                              "set FANFS_RUNTIME_DIR to a private directory") from None
    _check(path, os.lstat(path))
    return path


def _check(path: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        return
    raise RuntimeDirError(f"runtime directory {path} {problem}: refusing to use it, since another user could "
                          "intercept fanfs there; remove it or set FANFS_RUNTIME_DIR to a private directory")


def create_private(path: str, *, append: bool = False) -> int:
    """Open a file in the runtime directory for writing, never through a symlink; returns the descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    try:
        return os.open(path, flags, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RuntimeDirError(f"{path} is a symbolic link: refusing to write through it") from None
        raise
