"""What each node of a lazily staged job keeps (``--stage lazy``, ``--capacity SIZE``): the same answer on every node.

A node keeps the blobs placement gives it: all of them without a capacity.  With one, those that fit, best first:
the blobs the job's presentation reads before the others, then a record's prefix before its tail (lower layers
first: every fidelity needs them), then (:func:`plan_cache`) its own before its replicas, small before large; :func:`window_bytes` of the capacity is left for blobs
fetched ahead of the readers when their order is known (:mod:`.prefetch`), and the cache's state file counts too.
It is a pure function of the index, placement, capacity and presentation, so every node knows which holders of
a blob keep it and asks only those: a blob no holder keeps is read through from the shared store, never through
a peer (one hop, not two, and no peer's disk churns).

Each blob gets one priority for the whole job (its position in that order); a node keeps the blobs it holds up to
a threshold of its own, so the plan is a few numbers per node, not a mask per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..records import Presentation, blob_ranks, blobs_read
from .localcache import footprints, state_file_bytes
from ..util.units import human_size
from ..peers.placement import Placement

WINDOW_SHARE = 8  # a capacity's 1/8 is the window for blobs fetched ahead
WINDOW_MAX = 256 << 20  # and at most this (also the window of a node without a capacity)


def window_bytes(capacity: int | None) -> int:
    """Room for blobs fetched ahead of the readers (a node's window), out of ``capacity`` (None: no limit)."""
    return WINDOW_MAX if capacity is None else min(WINDOW_MAX, capacity // WINDOW_SHARE)


@dataclass
class CachePlan:
    """Which blobs each node keeps: those it holds as their ``k``-th holder (0: the blob's own node, then its
    replicas) whose ``priority[k]`` is at most the node's ``threshold``."""

    placement: Placement
    capacity: int | None
    window: int
    priority: np.ndarray  # [k, blob]: the blob's position in the job's order of worth as its k-th holder's
    threshold: np.ndarray  # per node: the worst priority it keeps (-1: none; a huge number: all it holds)
    footprint: np.ndarray  # a blob's bytes on disk in a cache

    def __post_init__(self) -> None:
        self._threshold = self.threshold.tolist()
        self._nodes = self.placement.nodes

    def keeps(self, node: int, blob: int) -> bool:
        k = (node - self.placement.primary(blob)) % self._nodes
        return k < self.placement.replicas and self.priority[k, blob] <= self._threshold[node]

    def keeps_run(self, node: int, first: int, count: int) -> bool:
        k = (node - self.placement.primary(first)) % self._nodes
        return bool(k < self.placement.replicas and self.placement.holds_range(node, first, count)
                    and (self.priority[k, first:first + count] <= self._threshold[node]).all())

    def kept(self, node: int) -> np.ndarray:
        """Whether ``node`` keeps each blob (a bool per blob)."""
        out = np.zeros(self.footprint.size, bool)
        bounds = self.placement.bounds
        for k in range(self.placement.replicas):
            lo, hi = int(bounds[(node - k) % self._nodes]), int(bounds[(node - k) % self._nodes + 1])
            out[lo:hi] = self.priority[k, lo:hi] <= self._threshold[node]
        return out

    def share_bytes(self, node: int) -> int:
        """The cache slots of every blob placement gives ``node`` (its share), in bytes: whole 4 KiB blocks."""
        return int(self.footprint[self.placement.held(node)].sum())

    def kept_bytes(self, node: int) -> int:
        """The cache slots of the blobs ``node`` keeps, in bytes: what its cache holds once filled, never more than
        the capacity less the window and the state file.  The one figure the mount's log, ``fanfs info --capacity``
        and ``fanfs stats`` give for what a node keeps."""
        return int(self.footprint[self.kept(node)].sum())

    def kept_anywhere(self) -> np.ndarray:
        """Whether some node keeps each blob (the others are read through from the shared store)."""
        out = np.zeros(self.footprint.size, bool)
        for node in range(self._nodes):
            out |= self.kept(node)
        return out


def plan_cache(index: Any, placement: Placement, presentation: Presentation, capacity: int | None) -> CachePlan:
    """The plan for a job's nodes at ``presentation`` (its reads come first), each with ``capacity`` bytes of local
    disk (None: each keeps all it holds).

    The order of worth: blobs the presentation reads, then by rank in their record (a prefix before a tail), then a
    blob's own node before its replicas (a node short of room covers more of the store with what no other node
    keeps), then small before large (the same bytes serve more reads, and what is left out is the fewest requests
    to the shared store; a node's cut then wastes no room), then blob order."""
    stored = index.blob_stored
    footprint = footprints(stored)
    blobs, replicas = stored.size, placement.replicas
    if capacity is None:
        return CachePlan(placement, None, window_bytes(None), np.zeros((replicas, blobs), np.int64),
                         np.full(placement.nodes, np.iinfo(np.int64).max, np.int64), footprint)
    number = np.tile(np.arange(blobs), replicas)
    k = np.repeat(np.arange(replicas), blobs)
    order = np.lexsort((number, np.tile(stored, replicas), k, np.tile(blob_ranks(index), replicas),
                        np.tile(~blobs_read(index, presentation), replicas)))
    priority = np.empty(replicas * blobs, np.int64)
    priority[order] = np.arange(priority.size)
    priority = priority.reshape(replicas, blobs)
    budget = capacity - state_file_bytes(blobs) - window_bytes(capacity)
    threshold = np.full(placement.nodes, -1, np.int64)
    bounds = placement.bounds
    for node in range(placement.nodes):
        ranges = [(int(bounds[(node - j) % placement.nodes]), int(bounds[(node - j) % placement.nodes + 1]), j)
                  for j in range(replicas)]
        held = np.concatenate([np.arange(lo, hi) for lo, hi, _ in ranges]) if ranges else np.zeros(0, np.int64)
        worth = np.concatenate([priority[j, lo:hi] for lo, hi, j in ranges]) if ranges else np.zeros(0, np.int64)
        real = stored[held] > 0
        held, worth = held[real], worth[real]
        ranked = np.argsort(worth, kind="stable")
        fits = int(np.searchsorted(np.cumsum(footprint[held[ranked]]), budget, side="right"))
        if fits:
            threshold[node] = worth[ranked[fits - 1]]
    return CachePlan(placement, capacity, window_bytes(capacity), priority, threshold, footprint)


@dataclass
class CapacityFigures:
    """What ``fanfs info --capacity`` shows: per node its share by placement and what it keeps of it (cache slots:
    :meth:`CachePlan.share_bytes`, :meth:`CachePlan.kept_bytes`); for the job, the bytes a presentation reads and
    how many of them some node keeps (the rest is read through)."""

    capacity: int | None
    window: int
    node_share_bytes: list[int]
    node_kept_bytes: list[int]
    read_bytes: int
    read_kept_bytes: int

    @classmethod
    def of(cls, plan: CachePlan, stored: np.ndarray, read: np.ndarray) -> "CapacityFigures":
        """The figures of ``plan`` for a store of blobs of ``stored`` bytes read where ``read`` (a bool per blob)."""
        weight = np.where(read, stored, 0).astype(np.int64)
        nodes = range(plan.placement.nodes)
        return cls(plan.capacity, plan.window, [plan.share_bytes(node) for node in nodes],
                   [plan.kept_bytes(node) for node in nodes], int(weight.sum()),
                   int(weight[plan.kept_anywhere()].sum()))

    def format(self) -> str:
        capacity = human_size(self.capacity) if self.capacity is not None else "unlimited"
        through = self.read_bytes - self.read_kept_bytes
        lines = [f"capacity   {capacity} per node ({human_size(self.window)} of it a window for blobs fetched ahead "
                 f"of the readers): {self.read_kept_bytes / max(1, self.read_bytes):.0%} of the bytes read are kept "
                 f"by a node, {human_size(through)} of {human_size(self.read_bytes)} read through from the shared "
                 "store each epoch",
                 "node       share        keeps   of its share   (cache slots: whole 4 KiB blocks)"]
        for node, (share, kept) in enumerate(zip(self.node_share_bytes, self.node_kept_bytes)):
            lines.append(f"{node:<6} {human_size(share):>9} {human_size(kept):>12} {kept / max(1, share):>9.0%}")
        return "\n".join(lines)
