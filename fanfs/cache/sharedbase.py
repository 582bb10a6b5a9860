"""A node's base of shared copies (:mod:`.sharedcopy`): its check, what is in it, and the removal of what nobody uses.

A copy is ``BASE/fanfs-STOREID-TAG``; a copy being made is ``.new-...`` until it takes its name (with its lock taken),
one being removed ``.removing-...`` (out of every job's way).  Whether a job uses a copy is the lock on its ``.lock``:
a read lock (a job's lease), a write lock (its stager, or a removal), none (nobody: it may go).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass

from ..errors import FanfsError, UsageError
from ..records import Presentation
from ..util.files import file_lock, lock_held
from ..util.units import parse_size
from .stage import STAGED_NAME, staged_presentation

log = logging.getLogger("fanfs")

SHARED_VARIABLE = "FANFS_SHARED_LOCAL"
KEEP_VARIABLE = "FANFS_SHARED_KEEP"
LOCK_NAME = ".lock"
PREFIX = "fanfs-"
NEW, REMOVING = ".new-", ".removing-"  # a copy being made, before it takes its name; one being removed
_COPY = re.compile(r"fanfs-[0-9a-f]{32}(-[0-9a-f]{4})+")
STALL = 60.0
"""Seconds a job waits for another's staging of a copy while the copy does not grow."""


def shared_base(path: str) -> str:
    """``path`` (its real path), checked as the base of a node's shared copies: a directory root or this user owns,
    sticky if others may write it (else they could remove or replace the copies in it).  One line saying what to do
    otherwise.  (One this user may not write, a group's, costs its jobs a private copy each, not a refusal.)"""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as err:
        problem = f"cannot be used ({err.strerror})"
    else:
        if not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory"
        elif st.st_uid not in (0, os.getuid()):
            problem = f"belongs to uid {st.st_uid}, who could remove or replace the copies in it"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problem = f"may be written by others but is not sticky (mode {stat.S_IMODE(st.st_mode):o}): any of " \
                      "them could remove or replace the copies in it"
        else:
            return real
    raise FanfsError(f"{SHARED_VARIABLE}: {path} {problem}: an administrator makes it once on every node, open to all "
                     f"and sticky as /tmp is (install -d -m 1777 {real}), or unset {SHARED_VARIABLE} to stage each "
                     "job's own copy")


def keep_size() -> int:
    """Bytes of shared copies a node keeps when no job uses them (``$FANFS_SHARED_KEEP``; default 0: none)."""
    text = os.environ.get(KEEP_VARIABLE, "").strip()
    try:
        return parse_size(text) if text else 0
    except ValueError as err:
        raise UsageError(f"{KEEP_VARIABLE}: {err}") from None


def open_lock(path: str, write: bool = False) -> int:
    """A descriptor of the copy's lock file (``write``: to take a write lock: its owner's, or root's)."""
    return os.open(os.path.join(path, LOCK_NAME), (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC)


def recorded(path: str, store_id: str | None = None) -> Presentation | None:
    """What the copy's ``.staged`` record says it holds (of store ``store_id``, else the one its name says); None if it
    is incomplete (or the record is not one)."""
    try:
        return staged_presentation(path, store_id or os.path.basename(path)[len(PREFIX):].split("-")[0])
    except (FanfsError, OSError):
        return None


def same_lock(fd: int, path: str) -> bool:
    """Whether ``fd`` is still the lock file of the copy at ``path`` (not one removed or replaced meanwhile)."""
    try:
        here, there = os.fstat(fd), os.lstat(os.path.join(path, LOCK_NAME))
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def allocated(path: str) -> int:
    """Bytes the files of a directory take on disk (a staging copies into sparse files: their size says nothing)."""
    try:
        with os.scandir(path) as entries:
            return sum(entry.stat(follow_symlinks=False).st_blocks * 512 for entry in entries)
    except OSError:  # gone meanwhile
        return 0


def lock_state(path: str) -> int | None:
    """The lock a job holds on the copy's lock file (F_RDLCK: leased; F_WRLCK: staged or removed; F_UNLCK: none);
    None if this user cannot tell (no such file, or closed to it)."""
    try:
        fd = open_lock(path)
    except OSError:
        return None
    try:
        return lock_held(fd)
    finally:
        os.close(fd)


@dataclass
class SharedCopy:
    """One entry of a node's shared copies, as ``fanfs shared list`` shows it."""

    path: str
    owner: int
    bytes: int
    presentation: Presentation | None  # None: incomplete
    staged_at: float  # when it was complete (its record's time); 0 if it is not
    lock: int | None  # what :func:`lock_state` says


def copies(base: str) -> list[SharedCopy]:
    """The copies in ``base`` (of any store, any user's), oldest staged first."""
    found = []
    with os.scandir(base) as entries:
        for entry in entries:
            if _COPY.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                held = recorded(entry.path)
                try:
                    staged_at = os.stat(os.path.join(entry.path, STAGED_NAME)).st_mtime if held is not None else 0.0
                    owner = entry.stat(follow_symlinks=False).st_uid
                except OSError:
                    continue
                found.append(SharedCopy(entry.path, owner, allocated(entry.path), held, staged_at,
                                        lock_state(entry.path)))
    return sorted(found, key=lambda copy: copy.staged_at)


def prune(base: str, keep: int = 0) -> list[str]:
    """Remove what nobody uses of the shared copies in ``base`` that this user may remove (its own; root's: all):
    copies left incomplete, what a staging or a removal killed outright left, and complete copies while all the copies
    there take more than ``keep`` bytes (the oldest staged first).  The paths removed."""
    root, removed = os.geteuid() == 0, []
    with os.scandir(base) as entries:
        for entry in entries:
            if _left(entry, root):
                delete_tree(entry.path)
                removed.append(entry.path)
    found = copies(base)
    total = sum(copy.bytes for copy in found)
    for copy in sorted(found, key=lambda copy: (copy.presentation is not None, copy.staged_at)):
        if copy.lock != fcntl.F_UNLCK or not (root or copy.owner == os.getuid()):
            continue
        try:
            fd = open_lock(copy.path, write=True)
        except OSError:
            continue
        try:  # decided under the write lock, as the copy is now
            if file_lock(fd, fcntl.F_WRLCK) and same_lock(fd, copy.path) and \
                    (recorded(copy.path) is None or total > keep):
                remove_copy(copy.path)
                removed.append(copy.path)
                total -= copy.bytes
        finally:
            os.close(fd)
    return removed


def _left(entry: os.DirEntry, root: bool) -> bool:
    """Whether ``entry`` is what a staging or a removal killed outright left, that this user may remove."""
    if not entry.name.startswith((NEW + PREFIX, REMOVING + PREFIX)) or not entry.is_dir(follow_symlinks=False):
        return False
    st = entry.stat(follow_symlinks=False)
    if not (root or st.st_uid == os.getuid()):
        return False
    lock = None if entry.name.startswith(REMOVING) else lock_state(entry.path)
    return entry.name.startswith(REMOVING) or lock == fcntl.F_UNLCK or \
        lock is None and time.time() - st.st_mtime > STALL  # a claim killed before it made its lock file


def prune_quietly(base: str) -> None:
    """:func:`prune` with the site's keep; a failure is a warning (the next prune tries again)."""
    try:
        prune(base, keep_size())
    except (OSError, FanfsError) as err:
        log.warning("%s: cannot remove the unused shared copies: %s", base, getattr(err, "strerror", None) or err)


def remove_copy(path: str) -> None:
    """Remove a copy nobody uses (the caller holds its write lock): out of the way first, under a name no job looks
    for, so that none finds it half removed."""
    gone = os.path.join(os.path.dirname(path), f"{REMOVING}{os.path.basename(path)}-{secrets.token_hex(4)}")
    os.rename(path, gone)
    delete_tree(gone)


def delete_tree(path: str) -> None:
    try:
        os.chmod(path, 0o700)  # a complete copy's directory is read-only, even to its owner
    except FileNotFoundError:
        return
    shutil.rmtree(path, onerror=_cannot_delete)


def _cannot_delete(func: object, path: str, info: tuple) -> None:
    if not isinstance(info[1], FileNotFoundError):
        log.warning("cannot remove %s: %s", path, info[1].strerror)
