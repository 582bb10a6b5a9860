"""One staged copy of a store per node, shared by every job on it (``--stage shared``; in a Slurm job
``FANFS_STAGE=shared``, the default where the site sets ``$FANFS_SHARED_LOCAL``); docs/shared.rst says why so.

* A copy, ``BASE/fanfs-STOREID-TAG`` (TAG: the presentation), is the whole store at a presentation, staged as a
  node's share is (:mod:`.stage`), under a base the site makes once per node (root's or this user's, sticky if others
  may write it).  Its maker owns it; it is as readable as the store (its group the store's, or no group bit), writable
  by nobody else, read-only once complete.
* Its ``.lock`` carries open-file-description locks, which the kernel drops with their process: the stager's write
  lock while it copies (the ``.staged`` record last), and a read lock, the *lease*, of every job reading it.  A job
  waits for another's staging while the copy grows (:data:`STALL`, :data:`MIN_RATE`); else, or where the copy is not
  usable, it stages a private copy, with one warning line: no user can make another's job refuse or wait for ever.
* The index is never the copy's; every blob read from it is checked; an extent is spliced only from a copy this user
  or root owns (another owner could change it under a splice without moving its change time).
* Whoever releases the last lease on a copy it may remove (its owner; root) removes it, unless the site keeps unused
  copies (``$FANFS_SHARED_KEEP`` bytes, newest first); a job killed outright holds no lease: the next job here, or
  root's ``fanfs shared prune`` (an epilog), removes what nobody uses.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import stat
import tempfile
import time

import numpy as np

from ..records import Presentation, blobs_read
from ..store.format import INDEX_NAME, SHARD_DIR
from ..store.index import Index
from ..store.sources import HeldShards
from ..util.deadline import deadline_for, within
from ..util.files import file_lock
from ..util.privacy import readable_by_others
from .sharedbase import (LOCK_NAME, NEW, PREFIX, STALL, allocated, delete_tree, open_lock, prune_quietly, recorded,
                         remove_copy, same_lock)

log = logging.getLogger("fanfs")

MIN_RATE = 1 << 20
"""Bytes per second below which another job's staging is not waited for, however it trickles."""
POLL = 0.5


class Lease:
    """A read lock on a complete shared copy (:attr:`directory`, holding what :attr:`presentation` reads), held until
    :meth:`release` or its process ends: while any is held, nobody removes the copy."""

    def __init__(self, directory: str, fd: int, presentation: Presentation | None, owner: int) -> None:
        self.directory, self._fd, self.presentation, self.owner = directory, fd, presentation, owner

    @property
    def trusted(self) -> bool:
        """Whether nobody but this user and root can change the copy (an extent may be spliced from it)."""
        return self.owner in (0, os.getuid())

    def release(self) -> None:
        """End the lease; then, if nobody else uses the copy and this user may remove it, it goes (:func:`prune`)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            prune_quietly(os.path.dirname(self.directory))


class Claim:
    """This process's write lock on a shared copy it is to stage (new, or left incomplete by a job of this user's
    that ended): nobody reads it meanwhile."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory, self._fd = directory, fd

    def complete(self, presentation: Presentation) -> Lease:
        """The copy is staged (its ``.staged`` record written): made read-only, and the write lock made a lease in
        one step (nobody can remove it in between)."""
        for entry in os.scandir(self.directory):
            if entry.name != LOCK_NAME and entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & ~0o222)
        os.chmod(self.directory, stat.S_IMODE(os.stat(self.directory).st_mode) & ~0o222)
        file_lock(self._fd, fcntl.F_RDLCK)
        lease, self._fd = Lease(self.directory, self._fd, presentation, os.getuid()), -1
        return lease

    def abandon(self) -> None:
        """Staging failed or was stopped: the partial copy goes (under the write lock: nobody reads it)."""
        if self._fd >= 0:
            try:
                remove_copy(self.directory)
            finally:
                os.close(self._fd)
                self._fd = -1


def acquire(base: str, store_root: str, index: Index, presentation: Presentation) -> Lease | Claim | str:
    """A lease on a complete copy of the store in ``base`` holding every blob ``presentation`` reads (its own
    presentation's, or a fuller one's), waiting for a job that stages it; else a claim to stage it; else why neither
    (this node then stages a private copy).  Then the unused copies this user may remove are pruned (what jobs killed
    outright left, what the site's keep no longer holds)."""
    store_id = index.meta["store_id"]
    wanted = blobs_read(index, presentation)
    path = os.path.join(base, PREFIX + store_id + "".join(f"-{value:04x}" for value in presentation.values()))
    got: Lease | Claim | str | None = None
    while got is None:
        for found in sorted((entry.path for entry in os.scandir(base) if entry.name.startswith(PREFIX + store_id)),
                            key=lambda found: found != path):  # any complete copy holding the blobs, its own first
            if isinstance(lease := _wait(found, store_id, index, wanted, 0), Lease):
                got = lease
                break
        got = got or _claim(base, path, store_root) or _wait(path, store_id, index, wanted,
                                                              int(index.blob_stored[wanted].sum()))
    if not isinstance(got, str):
        prune_quietly(base)
    return got


def _claim(base: str, path: str, store_root: str) -> Claim | None:
    """A new copy at ``path``, made under a temporary name with its lock taken and then renamed into place (nobody
    ever sees it without its lock); None if ``path`` exists already."""
    index_path = os.path.join(store_root, INDEX_NAME)
    bits, group = within(deadline_for(os.path.join(store_root, SHARD_DIR)), index_path, _readers, index_path)
    made = tempfile.mkdtemp(prefix=f"{NEW}{os.path.basename(path)}-", dir=base)
    try:
        setgid = 0
        if bits & stat.S_IRGRP and not bits & stat.S_IROTH:
            try:  # the store's group, which this user may give it only if a member: else no group bit at all
                os.chown(made, -1, group)
                setgid = stat.S_ISGID  # what is made in it takes that group too
            except PermissionError:
                bits &= ~stat.S_IRGRP
        os.chmod(made, 0o700 | setgid | bits | bits >> 2)  # others: read and enter where they read the store
        fd = os.open(os.path.join(made, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o600 | bits)
            file_lock(fd, fcntl.F_WRLCK)
            os.rename(made, path)
        except BaseException:
            os.close(fd)
            raise
    except OSError:
        delete_tree(made)
        if os.path.lexists(path):
            return None  # another job's copy took the name first (or something else is there: looked at next)
        raise
    except BaseException:
        delete_tree(made)
        raise
    return Claim(path, fd)


def _readers(index_path: str) -> tuple[int, int]:
    """Who may read the store: the read bits its index grants (:func:`readable_by_others`), and its group."""
    return readable_by_others(index_path), os.stat(index_path).st_gid


def _wait(path: str, store_id: str, index: Index, wanted: np.ndarray, need: int) -> Lease | Claim | str | None:
    """A lease on the copy at ``path`` once nobody stages it (or a claim, to resume a copy of this user's left
    incomplete); why not (it is not usable, or its staging stalls); None if it went meanwhile (look again).  ``need``:
    the bytes a staging copies (0: neither wait for one nor resume it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a copy fanfs made"
    owner, mine = st.st_uid, st.st_uid == os.getuid()
    try:
        fd = open_lock(path, write=mine)
    except FileNotFoundError:
        return None if not os.path.lexists(path) else f"{path} is not a copy fanfs made (no {LOCK_NAME})"
    except OSError as err:
        return f"{path} (uid {owner}'s): {err.strerror}"
    started = changed = time.monotonic()
    grown = allocated(path)
    try:
        while True:
            if file_lock(fd, fcntl.F_RDLCK):  # nobody stages it now
                if not same_lock(fd, path):
                    return None
                held = recorded(path, store_id)
                if held is not None and not (wanted & ~blobs_read(index, held)).any():
                    lease, fd = Lease(path, fd, held, owner), -1
                    return lease
                if held is None and mine and need and file_lock(fd, fcntl.F_WRLCK):  # left incomplete: resume it
                    claim, fd = Claim(path, fd), -1
                    return claim
                file_lock(fd, fcntl.F_UNLCK)
                if held is not None or not mine or not need:
                    return f"{path} was left incomplete by uid {owner}'s job" if held is None else \
                        f"{path} holds {held.describe()}, not all this job reads"
            elif not need:
                return f"{path} is being staged or removed"
            now, size = time.monotonic(), allocated(path)
            if size != grown:
                grown, changed = size, now
            if now - changed > STALL or now - started > STALL + need / MIN_RATE:
                return f"{path} is staged by a job of uid {owner}'s that has not made it grow for {now - changed:.0f} s"
            time.sleep(POLL * random.uniform(0.5, 1.5))  # apart from another job of this user's looking at it too
    finally:
        if fd >= 0:
            os.close(fd)


class LeasedShards(HeldShards):
    """A node's shards in a shared copy, read under a lease of their own (this process's and the processes it forks:
    the last of them to end, however, ends it); closing the source releases it (:meth:`Lease.release`).  Extents are
    spliced from it only where :attr:`Lease.trusted`: else every read of one is read and checked by the copy path."""

    def __init__(self, directory: str, store_id: bytes, held: np.ndarray) -> None:
        super().__init__(directory, store_id, held)
        self.lease = None
        try:
            owner, fd = os.lstat(directory).st_uid, open_lock(directory)
            if file_lock(fd, fcntl.F_RDLCK) and same_lock(fd, directory):
                self.lease = Lease(directory, fd, None, owner)
            else:
                os.close(fd)
        except OSError:  # the copy is gone: its blobs are read from the shared store
            pass
        self.spliced = self.lease is not None and self.lease.trusted

    def place(self, blob: int, shard: int, offset: int, wait: bool = True) -> int | None:
        found = super().place(blob, shard, offset, wait)
        return found if self.spliced else None

    def holds_in_place(self, blob: int) -> bool:
        return self.spliced

    def copy_stats(self) -> dict[str, object]:
        """For ``fanfs stats``: the shared copy read, whose it is, whether it is leased and extents are spliced from it."""
        return {"directory": self.directory, "owner": self.lease and self.lease.owner, "spliced": self.spliced}

    def close(self) -> None:
        super().close()
        if self.lease is not None:
            self.lease.release()
