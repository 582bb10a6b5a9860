"""Where a store is built and how it replaces what was there, without ever destroying anything else.

A store is built in ``STORE.partial-PID-XXXX`` beside STORE, holding a marker (host, pid, boot id)
written before anything else, and renamed into place at the end.  ``--force`` replaces only an empty
directory or a recognisable fanfs store: never a tree that holds the source or lies inside it, never a
directory of other files, never a symlink.  Leftovers of killed packs are recognised by their marker
(a dead pid on this host), never by their name alone.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import uuid

from ..store.format import INDEX_MAGIC, INDEX_NAME, SAVED_NAMES, SHARD_DIR
from ..util.processes import pid_alive
from .janitor import PARTIAL_MARKER
from .shards import PackError

# PARTIAL_MARKER is written first into a store being built (and into a store being replaced): only a directory
# holding it, left by a pack that is no longer running on this host, is ever removed as stale.


def _is_store(path: str) -> bool:
    """Is ``path`` recognisably a fanfs store: an index with fanfs's magic and nothing but index, shards and the
    measurements saved with it?"""
    try:
        names = set(os.listdir(path))
        with open(os.path.join(path, INDEX_NAME), "rb") as f:
            magic = f.read(len(INDEX_MAGIC))
    except OSError:
        return False
    known = {INDEX_NAME, SHARD_DIR, PARTIAL_MARKER, *SAVED_NAMES}
    if magic != INDEX_MAGIC or not all(n in known or _half_saved(n) for n in names):
        return False
    shards = os.path.join(path, SHARD_DIR)
    return not os.path.exists(shards) or all(n.split(".")[0].isdigit() for n in os.listdir(shards))


def _half_saved(name: str) -> bool:
    """Is ``name`` what a save of a measurement killed midway leaves (``NAME.tmp-PID``, see store.saved)?"""
    saved, _, pid = name.rpartition(".tmp-")
    return saved in SAVED_NAMES and pid.isdigit()


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def prepare_destination(store: str, sources: list[str], force: bool) -> None:
    """Refuse an unusable STORE, and remove what killed packs of it left.

    ``--force`` replaces an empty directory or a fanfs store, never anything else: not a tree that
    holds a source or lies inside one, not a directory of other files, not a symbolic link.
    """
    real_store = os.path.realpath(store)
    for src in sources:
        real_src = os.path.realpath(src)
        if _inside(real_store, real_src):
            raise PackError(f"store {store} is inside the source {src}: pick a place outside it")
        if _inside(real_src, real_store):
            raise PackError(f"the source {src} is inside {store}: a store there would replace it; pick another place")
    if os.path.islink(store):
        raise PackError(f"{store} is a symbolic link: give the real path of the store")
    if os.path.lexists(store):
        if not os.path.isdir(store):
            raise PackError(f"{store} exists and is not a directory")
        if os.listdir(store):
            if not _is_store(store):
                raise PackError(f"{store} exists and is not a fanfs store: fanfs replaces only a store or an empty "
                                "directory, even with --force; remove it yourself or pick another place")
            if not force:
                raise PackError(f"{store} is a fanfs store already: use --force to replace it")
    parent = os.path.dirname(os.path.abspath(store))
    if not os.path.isdir(parent):
        raise PackError(f"cannot create {store}: {parent} does not exist")
    _remove_stale(parent, os.path.basename(os.path.abspath(store)))


def start_partial(store: str) -> str:
    """Make and claim the directory to build STORE in (beside it); return its path."""
    tmp = os.path.abspath(store) + f".partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.mkdir(tmp)
    _mark(tmp)
    os.mkdir(os.path.join(tmp, SHARD_DIR))
    return tmp


def _mark(directory: str) -> None:
    """Claim ``directory`` for this pack: host and pid, so a later pack knows whether it is still running."""
    with open(os.path.join(directory, PARTIAL_MARKER), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "boot": _boot_id()}, f)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _remove_stale(parent: str, name: str) -> None:
    """Remove partial or replaced stores of STORE that a pack left when it was killed (its marker says so)."""
    for entry in os.listdir(parent):
        if not (entry.startswith(name + ".partial-") or entry.startswith(name + ".old-")):
            continue
        path = os.path.join(parent, entry)
        try:
            with open(os.path.join(path, PARTIAL_MARKER)) as f:
                owner = json.load(f)
            host, pid, boot = owner["host"], int(owner["pid"]), owner.get("boot", "")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not something fanfs wrote: never touched
        if host == socket.gethostname() and (boot != _boot_id() or not pid_alive(pid)) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def commit(tmp: str, store: str, force: bool) -> None:
    """Put the finished store in place with renames (atomic on one file system).  A store another pack put there
    meanwhile is replaced only with ``force``, as one there before this pack began would be."""
    os.unlink(os.path.join(tmp, PARTIAL_MARKER))
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    old = None
    if os.path.lexists(store):
        if os.listdir(store):
            if not _is_store(store):  # it changed since the pack started: leave it alone
                raise PackError(f"{store} was changed during the pack and is no longer a fanfs store: not replaced")
            if not force:
                raise _made_meanwhile(store)
            _mark(store)
            old = os.path.abspath(store) + f".old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(store, old)
        else:
            os.rmdir(store)
    try:
        os.rename(tmp, store)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another pack's store landed there just now
            raise _made_meanwhile(store) from None
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _made_meanwhile(store: str) -> PackError:
    return PackError(f"{store} is a fanfs store made by another pack while this one ran: this one was not stored "
                     "(use --force to replace it)")
