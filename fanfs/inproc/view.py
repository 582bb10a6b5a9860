"""A mount as an in-process reader sees it: the mount's own store, opened once in this process from what the mount
hands over (:mod:`fanfs.serve.publish`), what it shows now, and whether it still serves.

Opened at the first open of a file under the mount, with one request to its control socket: the index comes as the
mount's sealed memory (mapped here, never copied, never checksummed again: the seals say nobody changed it since the
mount validated it), the presentation as the mount's shown memory (read at every open: a ``fanfs ctl`` switch reaches
the next open), and the *recipe* of this node's store: the store's own shards, or a job node's staged copy, lazy cache
and peers, as the node's mount reads them; where the mount reads ahead of a known order, its memory of reads, in
which this process notes its reads as the mount's serving processes do; and where the store holds extents, the
mount's record of the chunks verified in each copy, shared as its serving processes share it.  A forked child keeps
all of it (the store renews its locks).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

from ..errors import FanfsError
from ..records import Presentation
from ..serve.control import request_with_fds
from ..serve.shown import HEADER, ShownView, inode
from ..store import Store
from ..store.format import FILE, INDEX_NAME, SHARD_DIR
from ..store.index import Index
from ..store.sources import LocalShards
from ..store.trust import is_sealed
from ..util.files import readable

CACHE_SIZE = 16 << 20
"""Decoded blobs a reader process keeps (a file read whole keeps none: its bytes are the file object's)."""
ASK_TIMEOUT = 30.0
"""Seconds the first open under a mount waits for its daemon's answer (the daemon answers in milliseconds)."""
SHARED = ("index", "shown", "reads", "extents")
"""The memories a mount may share with a reader (:mod:`fanfs.serve.publish`), a descriptor each."""
PROBE = 0.001
"""Seconds between two looks at whether the daemon lives (a mount that ends cleanly says so at once, in its shown
memory; one whose daemon was killed is known ended within this long)."""


class MountGone(FanfsError):
    """The mount no longer serves (unmounted, its daemon ended): every open is the mount's to answer."""


class MountView:
    """The mount at ``mountpoint`` (a real path), as this process reads it."""

    FILE = FILE
    inode = staticmethod(inode)  # the mount's inode number of an entry at a view
    def __init__(self, mountpoint: str) -> None:
        answer, fds, pid = request_with_fds(mountpoint, {"cmd": "view"}, ASK_TIMEOUT, max_fds=len(SHARED))
        try:
            shared = dict(zip(answer.get("shared", ()), fds))
            if len(shared) != len(fds) or not is_sealed(shared.get("index", -1)) or "shown" not in shared:
                raise FanfsError(f"the daemon of {mountpoint} did not hand over its sealed index")
            index_memory = mmap.mmap(shared["index"], int(answer["index_bytes"]), mmap.MAP_SHARED, mmap.PROT_READ)
            self.shown = ShownView(mmap.mmap(shared["shown"], HEADER, mmap.MAP_SHARED, mmap.PROT_READ))
            memory = {name: mmap.mmap(shared[name], 0) for name in ("reads", "extents") if name in shared}
        finally:
            for fd in fds:
                os.close(fd)
        self.mountpoint = mountpoint
        root = str(answer["store"])
        index = Index(os.path.join(root, INDEX_NAME), data=index_memory, validated=True, checked=True)
        recipe = answer["recipe"]
        if recipe.get("kind") == "node":
            from ..cluster.nodeview import node_reader  # a job node's peers, cache and staging: only on a job's node
            key = bytes.fromhex(recipe["key"]) if recipe.get("key") else None
            node = node_reader(recipe["facts"], key, index, CACHE_SIZE, mountpoint)
            self.store, self._node_counters = node.store, node.counters  # its cache's and peers' counters
        else:
            shards = LocalShards(os.path.join(root, SHARD_DIR), bytes.fromhex(index.meta["store_id"]),
                                 network=bool(recipe.get("network")))
            self.store = Store(root, cache_size=CACHE_SIZE, index=index, sources=[shards], check_shards=False)
            self._node_counters = dict
        if "reads" in memory:
            self.store.follow_reads(memory["reads"])  # its read-ahead of a known order sees this process's reads
        extents = self.store.extents
        if "extents" in memory and extents is not None and answer["sources"] == [s.name for s in self.store.sources]:
            extents.adopt(memory["extents"])  # a chunk verified once for the node, not once per reader
        self.types = memoryview(index.type)  # per entry (a Python int each: read at every open)
        self._daemon = _Liveness(pid)
        self._probed = 0.0  # when the daemon was last seen alive
        self._lock = threading.Lock()
        self.files = self.bytes = self.to_mount = 0  # opened here, their bytes, and opens left to the mount
        self._said: dict[str, Any] = {}  # the counters of the mount's kind (:meth:`_counters`) last said to it

    def serving(self) -> bool:
        """Whether the mount serves now: its shown memory says so, and its daemon lived :data:`PROBE` ago."""
        if not self.shown.serving:
            return False
        now = time.monotonic()
        if now - self._probed < PROBE:
            return True
        if not self._daemon.alive():
            return False
        self._probed = now
        return True

    def view_of(self, entry: int) -> int:
        """The view the mount presents ``entry`` at now (FULL for the whole file)."""
        presentation: Presentation = self.shown.current()
        return self.store.view(entry, presentation)

    def count(self, files: int, size: int, to_mount: int) -> None:
        with self._lock:
            self.files += files
            self.bytes += size
            self.to_mount += to_mount

    def after_fork(self) -> None:
        """In a forked child: counts of its own, from zero, and a lock of its own."""
        self._lock = threading.Lock()
        self.files = self.bytes = self.to_mount = 0
        self._said = self._counters()  # the parent's to say

    def take_counts(self) -> dict[str, Any]:
        """What this process read here since it last said (and zero from now on): files and bytes presented, opens
        left to the mount, and ``counters`` as the mount's own serving processes count them (stored bytes by
        source; a job node's cache hits and fills, requests to peers) for the mount to add to its own."""
        with self._lock:
            counts: dict[str, Any] = {"files": self.files, "bytes": self.bytes, "to_mount": self.to_mount}
            self.files = self.bytes = self.to_mount = 0
            now = self._counters()
            counts["counters"], self._said = _since(now, self._said), now
        return counts

    def _counters(self) -> dict[str, Any]:
        return {"by_source": dict(self.store.stats.by_source), **self._node_counters()}


def _since(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """Counters ``now`` less what they were ``before`` (a largest value, ``*_max*``, is itself: the mount keeps the
    largest); those that did not move are left out."""
    moved: dict[str, Any] = {}
    for name, value in now.items():
        old = before.get(name)
        if isinstance(value, dict):
            value = _since(value, old if isinstance(old, dict) else {})
        elif "_max" not in name and old is not None:
            value -= old
        if value:
            moved[name] = value
    return moved


class _Liveness:
    """Whether the daemon (``pid``, as the kernel named it to this process) lives: a pidfd, where the kernel has them
    (Linux 5.3+: a zombie counts as ended, and a pid used again is not mistaken), else ``kill(pid, 0)``."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # Linux before 5.3 (RHEL 8), or a seccomp policy
            self._fd = None

    def alive(self) -> bool:
        if self._fd is not None:
            return not readable(self._fd, 0)  # readable once it ended (any thread may ask)
        try:
            os.kill(self._pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
