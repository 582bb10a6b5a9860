"""How a node gets its blobs: the cache's one entry for whoever starts a node (a job's rank and its serving daemon,
a node mounting alone, an in-process reader of a node's view).

Three steps, each a call (after :func:`check_local_dir`): :func:`ready_copies` before the node serves (stage now, ``--stage``; nothing yet, ``--stage
lazy``; or the copies a ``fanfs stage`` left, checked), :func:`node_store` to read (the node's staged shards or lazy
cache first, then the peers holding the other blobs, then the shared store for what no node holds), and
:class:`CacheHooks`, what the node's mount adds for its cache (the figures, a lazy cache's counters, and its
prefetcher with the command that gives it an order).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FanfsError, StoreError
from ..records import Presentation, blobs_read
from ..serve.daemon import Hooks
from ..store import Store
from ..store.format import shard_name
from ..store.index import Index
from ..store.sources import HeldShards
from ..peers.peer import PeerClient, RemoteBlobs, StagedBlobs, remote_sources
from ..peers.placement import Placement, place
from ..peers.world import World
from ..util.runtime import private_dir
from .follow import OrderFollower
from .lazy import FirstHolderFirst, LazyShare, cached_is_local, lazy_share
from .order import Stream, order_command
from .pagecache import PageCacheAhead
from .prefetch import Prefetcher
from .sharedbase import shared_base
from .sharedcopy import Claim, Lease, LeasedShards, acquire
from .stage import LOCAL_DIR_REMEDY, StagedShare, held_parts, stage, staged_presentation, staged_share

log = logging.getLogger("fanfs")


def check_local_dir(local_dir: str, shared: str | None = None) -> None:
    """The node's local directory, if it exists (staging makes it), is safe to use: nobody else can write it (they
    could replace the copies); and so is the base of its ``shared`` copies (:func:`.sharedbase.shared_base`)."""
    if os.path.lexists(local_dir):
        private_dir(local_dir, "local directory", LOCAL_DIR_REMEDY, create=False)
    if shared is not None:
        shared_base(shared)


@dataclass
class ReadyCopies:
    """A node's local copies, ready to serve: where they are (``local_dir``), the presentation they hold, how they were
    made (``stage``: "shared" for a shared copy, whose lease the node holds until :meth:`release`)."""

    presentation: Presentation
    local_dir: str
    stage: str
    lease: Lease | None = None

    def release(self) -> None:
        """The node has ended: its lease on a shared copy goes (and the copy with it, if nobody else reads it)."""
        if self.lease is not None:
            self.lease.release()


def ready_copies(store_root: str, local_dir: str, how: str, replicas: int, world: World, index: Index,
                 presentation: Presentation, *, alone: bool, shared: str | None = None) -> ReadyCopies:
    """Make this node's local copies ready to serve (collective when staging, ``how`` "full" or "shared"); the
    presentation they hold (``how`` "lazy": the one whose blobs the cache keeps first).  ``how`` "shared": this node's
    copy of the whole store in ``shared`` (:mod:`.sharedcopy`), leased, staged by whichever job comes first, or, where
    none can be had, this job's own in ``local_dir``.  Staged copies of this node missing or short (a staging cut short,
    a disk wiped): an error for a node ``alone``, whose blobs nothing else holds; in a job a warning, their reads going
    to the replicas or the shared store."""
    if how == "lazy":
        return ReadyCopies(presentation, local_dir, how)
    if how == "shared":
        assert shared is not None
        ready = _shared_copy(store_root, local_dir, shared, world, index, presentation)
        replicas = world.size
    elif how:
        report = stage(store_root, local_dir, replicas, world, index, presentation=presentation)
        if report is not None:
            print(report.format(), flush=True)
        ready = ReadyCopies(presentation, local_dir, how)
    else:
        ready = ReadyCopies(staged_presentation(local_dir, index.meta["store_id"]) or Presentation(), local_dir, how)
    placement = place(index.blob_stored, world.size, replicas)
    missing = missing_shards(ready.local_dir, placement, world.rank, index, blobs_read(index, ready.presentation))
    if missing and alone and how != "shared":
        raise StoreError(f"{local_dir}: {len(missing)} of the store's shards are missing or incomplete "
                         f"(first: {shard_name(missing[0])}): run 'fanfs stage' or mount with --stage")
    if missing:
        log.warning("%s: %d shard copies of this node are missing or incomplete (first: %s); their reads go "
                    "to replicas or the shared store", ready.local_dir, len(missing), shard_name(missing[0]))
    return ready


def _shared_copy(store_root: str, local_dir: str, base: str, world: World, index: Index,
                 presentation: Presentation) -> ReadyCopies:
    """This node's lease on its shared copy of the whole store, staged now (collective) if no job did yet; else a copy
    of its own in ``local_dir``, and a warning saying why."""
    try:
        got: Lease | Claim | str = acquire(shared_base(base), store_root, index, presentation)
    except (FanfsError, OSError) as err:  # this node's alone: the job goes on with a copy of its own here
        got = f"{base}: {getattr(err, 'strerror', None) or err}"
    if isinstance(got, str):
        log.warning("%s: this job stages a copy of its own in %s", got, local_dir)
    target = local_dir if isinstance(got, str) else got.directory
    try:
        report = stage(store_root, target, world.size, world, index, presentation=presentation,
                       ready=isinstance(got, Lease), whole=True)
        if report is not None:
            print(report.format(), flush=True)
        lease = got.complete(presentation) if isinstance(got, Claim) else got if isinstance(got, Lease) else None
    except BaseException:
        if isinstance(got, Claim):
            got.abandon()
        elif isinstance(got, Lease):
            got.release()
        raise
    if lease is None:
        return ReadyCopies(presentation, local_dir, "full")
    return ReadyCopies(lease.presentation, lease.directory, "shared", lease)


def missing_shards(directory: str, placement: Placement, rank: int, index: Index, staged: np.ndarray) -> list[int]:
    """Shards of which this node holds staged blobs but has no local copy of full size."""
    missing = []
    for part in held_parts(index, placement, rank, staged):
        try:
            if os.stat(os.path.join(directory, shard_name(part.shard))).st_size == int(index.shard_size[part.shard]):
                continue
        except FileNotFoundError:
            pass
        missing.append(part.shard)
    return missing


@dataclass
class NodeStore:
    """A node's store, and the parts of it a node's figures are made of."""

    store: Store
    share: StagedShare | LazyShare
    remotes: list[RemoteBlobs]
    placement: Placement
    client: PeerClient | None
    facts: dict[str, Any]
    """What another process of this node needs, beside the peers, to build the same store (:func:`node_store` takes
    them back): an in-process reader of the node's mount (``fanfs run``), or of a node serving without one."""

    def counters(self) -> dict[str, Any]:
        """What this process counted of the node's cache and peers: counters that add up over the node's processes
        (its mount's serving processes, its in-process readers) for ``fanfs stats``."""
        return {**(self.client.counters() if self.client is not None else {}), **self.share.counters()}


def node_store(store_root: str, index: Index, rank: int, nodes: int, replicas: int, local_dir: str,
               staged: Presentation, client: PeerClient | None, cache_size: int, *, lazy: bool = False,
               capacity: int | None = None, owner: bool = False, shared: bool = False) -> NodeStore:
    """Node ``rank``'s store: the blobs placement gives it from ``local_dir`` (staged at ``staged``), the others from
    their holders through ``client`` (None: a node alone), layers no node staged from the shared store.  ``lazy``:
    ``local_dir`` is a cache the node fills as it reads, within ``capacity`` (:mod:`.lazy`; ``staged`` is the
    presentation whose blobs it keeps first, every blob not kept is read through); ``shared``: ``local_dir`` is a shared
    copy (:mod:`.sharedcopy`), read under a lease of this process's own; ``owner``: built by the node's serving daemon,
    not by an in-process reader."""
    placement = place(index.blob_stored, nodes, replicas)
    first, count = index.first, index.count
    share: StagedShare | LazyShare
    if lazy:
        lazily = lazy_share(store_root, local_dir, index, placement, rank, staged, capacity, owner)
        remotes = remote_sources(client, placement, lazily.plan, mine=lazily.local.held) if client else []
        if client:
            lazily.local.shared = FirstHolderFirst(lazily.shared, client, placement, lazily.plan, index.blob_checksum)
        is_local = cached_is_local(lambda: store, lazily.cache)
        share = lazily
    else:
        share = staged_share(store_root, local_dir, index, staged, placement.held(rank),
                             LeasedShards if shared else HeldShards)
        remotes = remote_sources(client, placement, StagedBlobs(share.staged)) if client else []

        def is_local(entry: int, view: int) -> bool:  # the staged layers of this node serve it
            return placement.holds_range(rank, int(first[entry]), int(count[entry])) \
                and store.kind(entry).reads_within(view, store.view(entry, staged))

    store = Store(store_root, cache_size=cache_size, sources=[share.local, *remotes, share.shared],
                  check_shards=False, index=index, is_local=is_local)
    facts = {"store": store_root, "store_id": index.meta["store_id"], "rank": rank, "nodes": nodes, "replicas": replicas,
             "local_dir": local_dir, "stage": "lazy" if lazy else "shared" if shared else "full", "capacity": capacity,
             "staged": dict(staged)}
    return NodeStore(store, share, remotes, placement, client, facts)


class CacheHooks:
    """What a mount adds for its cache (the serving daemon's, never an in-process reader's): its read-ahead of a known
    order (a lazily staged node's prefetcher into its cache, else the page cache's, within ``budget`` bytes;
    :mod:`.follow`), given an order by the control command ``order`` (``read_ahead`` says the budget) and the
    presentation shown as it is switched;
    and, for a node (``node``), the figures of its share for ``fanfs stats`` and a lazy cache's counters."""

    def __init__(self, store: Store, presentation: Presentation, mountpoint: str, budget: int,
                 node: NodeStore | None = None) -> None:
        self.share = node.share if node is not None else None
        self.node = node
        self.follower: OrderFollower | None = None
        if isinstance(self.share, LazyShare):
            self.follower = Prefetcher(store, self.share, node.remotes if node else [], presentation)
        elif budget > 0:
            self.follower = PageCacheAhead(store, presentation, budget)
        follow = self.follower.order if self.follower is not None else _no_budget
        budget = self.follower.budget if self.follower is not None else 0
        self.commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "order": order_command(follow, store.index, mountpoint, self.follower.how if self.follower else ""),
            "read_ahead": lambda message: {"budget": budget}}  # what a shard-aware sampler's window must fit

    def stats(self, counters: dict[str, Any]) -> dict[str, Any]:
        out = self.share.stats(counters) if self.share is not None else {}
        if self.follower is not None and self.follower.ordered:
            out["prefetch"] = self.follower.stats()
        return out

    def counters(self) -> dict[str, Any]:
        return self.share.counters() if self.share is not None else {}

    def present(self, presentation: Presentation) -> None:
        if self.follower is not None:
            self.follower.presentation = presentation

    def close(self) -> None:
        """The mount has ended: its read-ahead stops (before the store closes: it uses the store's descriptors)."""
        if self.follower is not None:
            self.follower.close()

    def hooks(self) -> Hooks:
        """What a mount alone adds (a job's node adds its peers' too)."""
        recipe = None
        if self.node is not None:
            facts = self.node.facts
            recipe = lambda: {"kind": "node", "facts": facts}  # noqa: E731 - its in-process readers read as it does
        return Hooks(counters=self.counters, commands=self.commands, extra_stats=self.stats, on_present=self.present,
                     recipe=recipe, close=self.close)


def store_hooks(presentation: Presentation, mountpoint: str, budget: int) -> Callable[[Store], Hooks]:
    """For ``fanfs mount STORE MNT`` (no local directory): the hooks of a mount straight on a store, once it is open."""
    return lambda store: CacheHooks(store, presentation, mountpoint, budget).hooks()


def _no_budget(name: str, stream: Stream) -> None:
    raise ValueError("this mount reads nothing ahead: its --prefetch budget is 0 (mount with --prefetch SIZE, e.g. "
                     "512M, to read the order's next files ahead)")
