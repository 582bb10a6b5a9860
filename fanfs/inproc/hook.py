"""``open()`` of a mount's file answered in the reader's own process (``fanfs run``): no lookup and no read handed
through the kernel to the mount's daemon and back.

Installed in every Python process of a command run under ``fanfs run`` (:mod:`.startup`), for the mounts it names
(``FANFS_RUN_MOUNTS``): ``builtins.open`` and ``io.open`` (so PIL, NumPy, ``torch.load``, pickle, json and
``Path.read_bytes``) answer a read-only open of a file of such a mount here, from the mount's own store as it presents
it at that moment (:mod:`.view`, :mod:`.files`).  Everything else is the mount's, unchanged, by the real ``open``: a
mode that writes, an opener, a descriptor, a directory, a symbolic link, a name with ``.``/``..``/``//`` in it or
that the store does not hold, a file whose bytes this process cannot read from the node's copies (the mount then
finds another copy or answers ``EIO``, and logs it), a mount that no longer serves.  C libraries' own ``open``
(h5py, DALI) and ``os.open`` go to the mount.  Nothing of fanfs's is ever raised to the caller: a failure of the fast
path is an open by the mount.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..errors import FanfsError
from .files import WHOLE, StoreFile, WholeFile, whole_file, wrapped

if TYPE_CHECKING:
    from .view import MountView

MOUNTS_VARIABLE = "FANFS_RUN_MOUNTS"
"""The mounts a process answers opens of in-process: a JSON list of mount points (real paths), set by ``fanfs run``."""
_MODES = frozenset({"r", "rb", "rt", "br", "tr"})
_real_open = builtins.open


class Mount:
    """One mount this process may answer opens of: its prefix, and its view once opened (at the first open under it;
    None again once it no longer serves, until a daemon answers there again)."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self.prefix = mountpoint.rstrip("/") + "/"
        self._view: MountView | None = None
        self._lock = threading.Lock()
        self.left = 0  # opens under it this process left to the mount (no view could be had)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._view is not None:
            self._view.after_fork()

    def view(self) -> MountView | None:
        """Its view, opened now if not yet; None if the mount does not serve (or no daemon of ours answers there)."""
        view = self._view
        if view is not None and view.serving():
            return view
        with self._lock:
            if self._view is not view:  # another thread opened it meanwhile
                return self._view
            if view is not None:
                _report(view)  # what it read under the ended mount
            from .view import MountView  # the store's modules: imported by the first open under a mount, not at start
            _quiet()
            try:
                self._view = MountView(self.mountpoint)
            except (FanfsError, OSError, ValueError, KeyError, TypeError):
                self._view = None
            return self._view if self._view is not None and self._view.serving() else None


_mounts: tuple[Mount, ...] = ()
_hooked = False  # the exit and fork hooks are registered (once per process)


def fanfs_open(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
               errors: str | None = None, newline: str | None = None, closefd: bool = True, opener: Any = None) -> Any:
    """``open()``, answered in this process for a file of a mount of ``fanfs run`` (see the module)."""
    if mode in _MODES and opener is None and closefd is True and (buffering == -1 or buffering == 0 and "b" in mode):
        try:
            opened = _in_process(file, mode, buffering, encoding, errors, newline)
        except Exception:  # noqa: BLE001 - never fanfs's error in the reader's program: the mount answers instead
            opened = None
        if opened is not None:
            return opened
    return _real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)


fanfs_open.__doc__ = _real_open.__doc__  # help(open) stays Python's


def _in_process(file: Any, mode: str, buffering: int, encoding: str | None, errors: str | None,
                newline: str | None) -> Any:
    """The file opened here, or None: the mount's to open."""
    path = file if type(file) is str else _path_of(file)
    if path is None:
        return None
    if path[:1] != "/":
        path = os.path.join(os.getcwd(), path)
    for mount in _mounts:
        if path.startswith(mount.prefix):
            break
    else:
        return None
    rel = path[len(mount.prefix):]
    if not rel or rel[0] == "." or rel[-1] == "/" or "//" in rel or "/." in rel:
        return None  # "." and ".." (and names that begin so) are the kernel's to resolve
    view = mount.view()
    if view is None:
        mount.left += 1
        return None
    try:
        raw = _opened(view, rel.encode("utf-8", "surrogateescape"), path, file if type(file) is str else os.fspath(file))
    except (FanfsError, OSError, ValueError):  # a copy this process cannot read: the mount finds another, or says EIO
        raw = None
    if raw is None:
        view.count(0, 0, 1)
        return None
    return wrapped(raw, mode, buffering, encoding, errors, newline)


def _path_of(file: Any) -> str | None:
    """A name given as bytes or a path-like object, as a str; None for a descriptor or anything open() refuses."""
    if type(file) is int:
        return None
    try:
        path = os.fspath(file)
    except TypeError:
        return None
    return os.fsdecode(path) if isinstance(path, bytes) else path


def _opened(view: MountView, rel: bytes, path: str, name: Any) -> StoreFile | WholeFile | None:
    """The file at ``rel`` of the view's store, as the mount presents it now; None if it is not a file there."""
    store = view.store
    entry = store.index.lookup(rel)
    if entry < 0 or view.types[entry] != view.FILE:
        return None
    at = view.view_of(entry)
    size = store.size_at(entry, at)
    view.count(1, size, 0)
    if size <= WHOLE:
        return whole_file(store.read(entry, 0, size, at), name, path, view.inode(entry, at))
    return StoreFile(store, entry, at, size, name, path, view.inode(entry, at))


def install(mountpoints: list[str]) -> None:
    """Answer opens under ``mountpoints`` in this process from now on (and in the processes it forks)."""
    global _mounts, _hooked
    _mounts = tuple(Mount(mountpoint) for mountpoint in mountpoints)
    builtins.open = io.open = fanfs_open
    if not _hooked:
        atexit.register(report)
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork)
        _hooked = True


def uninstall() -> None:
    """Every open goes through the mount again (what it read is said first, as at exit)."""
    global _mounts
    report()
    builtins.open = io.open = _real_open
    _mounts = ()


def install_from_environment() -> bool:
    """:func:`install` for the mounts ``FANFS_RUN_MOUNTS`` names; False if it names none."""
    text = os.environ.get(MOUNTS_VARIABLE, "")
    try:
        mountpoints = [str(m) for m in json.loads(text)] if text else []
    except ValueError:
        mountpoints = []
    if mountpoints:
        install(mountpoints)
    return bool(mountpoints)


def report() -> None:
    """Tell each mount what this process read in-process (``fanfs stats`` sums it over the processes)."""
    for mount in _mounts:
        view = mount._view
        if view is not None:
            _report(view, mount)


def _report(view: MountView, mount: Mount | None = None) -> None:
    counts = view.take_counts()
    if mount is not None:
        counts["to_mount"] += mount.left
        mount.left = 0
    if any(counts.values()):
        from ..serve.control import ControlError, request
        try:
            request(view.mountpoint, {"cmd": "in_process", **counts}, timeout=5)
        except (ControlError, OSError, ValueError):
            pass  # the mount has ended: nobody to tell


def _after_fork() -> None:
    """In a forked child: its parent says what it read before the fork; locks of its own (another thread of the
    parent may have held one at the fork)."""
    for mount in _mounts:
        mount.left = 0
        mount.after_fork()


class _Reporter:
    """What multiprocessing keeps (weakly) for :func:`_before_fork`'s hook."""


_REPORTER = _Reporter()
_registered = False


def _before_fork() -> None:
    """Before a fork (a DataLoader's workers, each epoch): the mounts' views opened here if they are not yet, so that
    the children inherit them (the store's modules imported, the index mapped) instead of each opening its own at its
    first file.  And before the first fork by multiprocessing: have each child it starts report at its end.
    multiprocessing ends a child without ``atexit``, having run its own finalizers, which it clears in the child first:
    so the report is registered there, by multiprocessing's own after-fork hook."""
    global _registered
    for mount in _mounts:
        with contextlib.suppress(Exception):  # the children open it themselves, or leave their opens to the mount
            mount.view()
    util = sys.modules.get("multiprocessing.util")
    if util is not None and not _registered:
        util.register_after_fork(_REPORTER, lambda _: util.Finalize(None, report, exitpriority=0))
        _registered = True


def _quiet() -> None:
    """A read this process could not make is left to the mount, which logs it: fanfs logs nothing here."""
    import logging
    logger = logging.getLogger("fanfs")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
