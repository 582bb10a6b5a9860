"""A node of a lazily staged job (``--stage lazy``): it serves at once and fills its cache as it reads.

Nothing is copied before the mount serves.  A node's first read of a blob it keeps (:mod:`.capacity`: those
placement gives it, within its ``--capacity``) copies the blob from the shared store into the node's cache
(:class:`fanfs.cache.localcache.DiskCache`), checked; later reads are local, and a peer that asks for such a blob
before the node has read it gets it fetched then; another holder copies it from the first (:class:`FirstHolderFirst`).
So the shared file system is read once per kept blob per job, replicas or not, and nobody waits for a copy of the
whole dataset.  A blob no node keeps is read through from the
shared store each time; the cache stays within the capacity.  A crash or a second mount resumes from what the
cache holds (:meth:`~fanfs.cache.localcache.DiskCache.recover`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FanfsError
from ..records import Presentation
from ..store import Store
from ..store.format import SHARD_DIR
from ..store.index import Index
from .cachedshards import CachedShards
from .localcache import AHEAD, KEPT, SPENT, DiskCache
from ..store.sources import HeldShards, ShardSource
from ..util.checksum import checksum
from ..util.units import human_size
from .capacity import CachePlan, plan_cache
from ..peers.placement import Placement
from .stage import make_local_dir

if TYPE_CHECKING:
    from ..peers.peer import PeerClient

log = logging.getLogger("fanfs")

EVERY_BYTE = 1 << 62  # a read's size that covers any file


@dataclass
class LazyShare:
    """A lazily staged node's sources: its cache (``local``), the shared store read through (``shared``); and what
    the node keeps (``plan``) and its cache files.  Read as a :class:`~.stage.StagedShare` is."""

    presentation: Presentation  # the one whose blobs the cache keeps first
    staged: np.ndarray  # every blob: any may be read here
    local: CachedShards
    shared: HeldShards
    plan: CachePlan
    cache: DiskCache
    rank: int  # the node's
    kept_at_start: int = 0  # blobs the cache kept when the daemon started (a cache resumed), for ``fanfs stats``

    def stats(self, counters: dict[str, Any]) -> dict[str, Any]:
        """For ``fanfs stats``: as a staged share's, and what the cache may hold and holds (the blobs it keeps now:
        those it kept at the start, plus those fetched and kept since, less bad copies dropped), its hits, what it
        fetched and what was read through."""
        cache, plan = self.cache, self.plan
        kept = cache.states == KEPT
        return {"staged": dict(self.presentation), "shared_bytes": counters["by_source"].get(self.shared.name, 0),
                "cache": {"capacity": plan.capacity, "window": plan.window,
                          "keeps_bytes": plan.kept_bytes(self.rank), "share_bytes": plan.share_bytes(self.rank),
                          "held_bytes": cache.held_bytes(), "kept_bytes": cache.held_bytes((KEPT,)),
                          "kept_blobs": int(kept.sum()), "kept_stored_bytes": int(cache.stored[kept].sum()),
                          "kept_at_start": self.kept_at_start,
                          "ahead_bytes": cache.held_bytes((AHEAD, SPENT)), **counters.get("cache", {}),
                          "read_through_bytes": counters["by_source"].get(self.shared.name, 0)}}

    def counters(self) -> dict[str, Any]:
        """The cache's hits and fills in this serving process (summed for ``fanfs stats``)."""
        return self.local.counters()


def lazy_share(store_root: str, local_dir: str, index: Index, placement: Placement, rank: int,
               presentation: Presentation, capacity: int | None, owner: bool) -> LazyShare:
    """Node ``rank``'s share of a lazily staged job.  ``owner``: the node's serving daemon (it makes the local
    directory, starts or resumes the cache, and has its readers' touches seen); else an in-process reader."""
    store_id = bytes.fromhex(index.meta["store_id"])
    plan = plan_cache(index, placement, presentation, capacity)
    keep = plan.kept(rank)
    blobs = index.blob_stored.size
    shared = HeldShards(os.path.join(store_root, SHARD_DIR), store_id, np.ones(blobs, bool), name="shared store",
                        scattered=True)
    if owner:
        make_local_dir(local_dir)
    cache = DiskCache(local_dir, index, store_id, owner=owner)
    kept_at_start = 0
    if owner:
        dropped = cache.recover(keep)
        kept_at_start = int((cache.states == KEPT).sum())
        held = cache.held_bytes()
        log.info("cache in %s: %s on disk from before%s; keeps up to %s of its %s share%s", local_dir,
                 human_size(held), f" ({dropped:,} blobs dropped: cut short, fetched ahead, or now over the budget)"
                 if dropped else "", human_size(plan.kept_bytes(rank)), human_size(plan.share_bytes(rank)),
                 f" (capacity {human_size(capacity)})" if capacity is not None else "")
        _warn_if_short(local_dir, plan.kept_bytes(rank) + plan.window - held, capacity)
    local = CachedShards(cache, keep, shared, local_dir)
    return LazyShare(presentation, np.ones(blobs, bool), local, shared, plan, cache, rank, kept_at_start)


class FirstHolderFirst(ShardSource):
    """Where a node's cache fetches a blob it keeps: from the blob's first holder that keeps it, in the order every
    reader asks its holders (:meth:`Placement.in_turn`), when that is a peer (which fetches it from the shared store
    if it has not yet); from the shared store when it is this node, or the peer fails or gives a bad copy.  So with
    replicas the shared store is still read once per kept blob per job: the other holders copy it over the nodes'
    links, which a shared file system's one link is not."""

    def __init__(self, shared: ShardSource, client: "PeerClient", placement: Placement, plan: CachePlan,
                 checksums: np.ndarray) -> None:
        self.shared, self.client, self.placement, self.plan = shared, client, placement, plan
        self._checksum = memoryview(checksums)
        self.name = shared.name
        self.fill_counts = {"peer_fills": 0, "peer_fill_bytes": 0}  # in this process: copies a peer gave

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        holder = next((h for h in self.placement.in_turn(blob) if self.plan.keeps(h, blob)), self.client.rank)
        if holder != self.client.rank:
            try:
                data = self.client.read(holder, blob)
                if len(data) == length and checksum(data) == self._checksum[blob]:
                    self.fill_counts["peer_fills"] += 1
                    self.fill_counts["peer_fill_bytes"] += length
                    return data
            except (OSError, FanfsError) as err:
                log.debug("blob %d from rank %d for this node's cache: %s; from the shared store", blob, holder, err)
        return self.shared.read(blob, shard, offset, length)


def _warn_if_short(local_dir: str, more: int, capacity: int | None) -> None:
    """Say at the start if the cache cannot grow to what it may hold: reads then find the disk full."""
    free = shutil.disk_usage(local_dir).free
    if more > free:
        log.warning("%s has %s free, but this node's cache may grow by %s%s: what does not fit is read through from "
                    "the shared store%s", local_dir, human_size(free), human_size(more),
                    f" (--capacity {human_size(capacity)})" if capacity is not None else "",
                    "; a smaller --capacity chooses what is kept" if capacity is None or capacity > free else "")


def view_blobs(store: Store, entry: int, view: int) -> tuple[int, int]:
    """The blobs ``(first, count)`` that reading a file whole at ``view`` asks for (for a record, the run of its
    layers the view shows; else all its blobs)."""
    first, count = store.kind(entry).blob_run(store.index, entry, view, 0, EVERY_BYTE)
    if count:
        return first, count
    return int(store.index.first[entry]), int(store.index.count[entry])


def cached_is_local(store_of: Callable[[], Store], cache: DiskCache) -> Callable[[int, int], bool]:
    """A store's ``is_local`` for a lazily staged node: a read is served in the FUSE loop when every blob it asks
    for is in the cache (kept, or fetched ahead and not read yet: neither is dropped while a read wants it)."""
    def is_local(entry: int, view: int) -> bool:
        return cache.present(*view_blobs(store_of(), entry, view))
    return is_local


