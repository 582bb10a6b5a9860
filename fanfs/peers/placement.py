"""Which nodes hold which blobs: a deterministic map from (blob sizes, nodes, replicas) to holders.

Rule: the store's blobs, in blob-number order (file by file, shard by shard), are cut into ``nodes``
contiguous ranges of equal stored bytes (a blob goes to the node its byte midpoint falls in); node i
is the primary holder of range i, and the next ``replicas - 1`` nodes (i+1, i+2, ... modulo nodes)
hold it too.  Every node computes the same map from the index alone; nothing is stored or sent.

Why blobs, not shards: a shard is hundreds of MB, so a dataset small next to ``nodes x shard size``
was not spread at all (one shard, three nodes: 300% / 0% / 0% of the mean).  Ranges of blobs make
every node's load equal to within one blob, whatever the shards; in the layer-major layout a node's
blobs of a shard are one byte range per layer, which it stages into a sparse local copy of the shard.
Contiguous ranges keep a file on one node (but for the few at a range's edge), and replicas on
distinct nodes follow from the rotation.  A reader asks the holders of a blob in an order rotated by
its own rank and the blob number, spreading remote load over replicas; in a lazily staged job by the blob
number alone, so that every reader asks the same holder first and that one fetches it from the shared store.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ..util.units import human_size


@dataclass(frozen=True)
class Placement:
    """``bounds[i]:bounds[i+1]``: node i's primary blob range; ``node_bytes[i]``: bytes node i holds in all."""

    bounds: np.ndarray
    node_bytes: np.ndarray
    node_blobs: np.ndarray
    nodes: int
    replicas: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "_bounds", self.bounds.tolist())

    def primary(self, blob: int) -> int:
        return bisect_right(self._bounds, blob) - 1  # type: ignore[attr-defined]

    def holders(self, blob: int) -> list[int]:
        first = self.primary(blob)
        return [(first + k) % self.nodes for k in range(self.replicas)]

    def holds(self, node: int, blob: int) -> bool:
        return (node - self.primary(blob)) % self.nodes < self.replicas

    def holds_range(self, node: int, first: int, count: int) -> bool:
        """Whether ``node`` holds every blob of ``[first, first + count)`` (a file's blobs)."""
        if count == 0:
            return True
        a, b = self.primary(first), self.primary(first + count - 1)
        span = (b - a) % self.nodes
        return all((node - (a + k)) % self.nodes < self.replicas for k in range(span + 1))

    def ranges_of(self, node: int) -> list[tuple[int, int]]:
        """The blob ranges ``node`` holds (its own, then the ones it replicates), empty ones left out."""
        out = []
        for k in range(self.replicas):
            p = (node - k) % self.nodes
            lo, hi = self._bounds[p], self._bounds[p + 1]  # type: ignore[attr-defined]
            if hi > lo:
                out.append((lo, hi))
        return out

    def held(self, node: int) -> np.ndarray:
        """Whether ``node`` holds each blob (a bool per blob)."""
        mask = np.zeros(int(self.bounds[-1]), bool)
        for lo, hi in self.ranges_of(node):
            mask[lo:hi] = True
        return mask

    def held_bytes(self, weights: np.ndarray) -> np.ndarray:
        """Per node, the sum of ``weights`` (one per blob) over the blobs it holds: e.g. the stored
        bytes of only the layers a job stages."""
        total = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
        primary = total[self.bounds[1:]] - total[self.bounds[:-1]]
        return np.asarray(sum(np.roll(primary, k) for k in range(self.replicas)), np.int64)

    def in_turn(self, blob: int, reader: int = 0) -> list[int]:
        """The holders of ``blob`` in the order a reader of rank ``reader`` asks them: rotated by the reader and the
        blob (``reader`` 0 for an order every reader shares, rotated by the blob alone)."""
        row = self.holders(blob)
        start = (reader + blob) % len(row)
        return row[start:] + row[:start]

    def remote_holders(self, blob: int, reader: int, spread: bool = True) -> list[int]:
        """Holders other than ``reader``, in the order ``reader`` should ask them (``spread``: an order of its own;
        else the order every reader shares)."""
        return [node for node in self.in_turn(blob, reader if spread else 0) if node != reader]


def place(blob_bytes: np.ndarray, nodes: int, replicas: int) -> Placement:
    """The placement of blobs of these stored sizes on ``nodes`` nodes, each on ``replicas`` of them.

    More replicas than nodes cannot be distinct: they are capped at the node count.  A store whose
    blobs are all empty is cut by blob count instead.
    """
    if nodes < 1 or replicas < 1:
        raise ValueError(f"need at least one node and one replica (got {nodes} nodes, {replicas} replicas)")
    replicas = min(replicas, nodes)
    weight = np.asarray(blob_bytes, dtype=np.float64)
    if weight.size and not weight.sum():
        weight = np.ones_like(weight)
    total = float(weight.sum())
    midpoint = np.cumsum(weight) - weight / 2
    node_of = np.minimum((midpoint * nodes / total).astype(np.int64), nodes - 1) if total else np.zeros(0, np.int64)
    bounds = np.searchsorted(node_of, np.arange(nodes + 1), side="left").astype(np.int64)
    bounds[-1] = weight.size
    sizes = np.asarray(blob_bytes, dtype=np.int64)
    primary_bytes = np.add.reduceat(sizes, bounds[:-1]) if sizes.size else np.zeros(nodes, np.int64)
    primary_bytes[bounds[:-1] == bounds[1:]] = 0  # reduceat gives the next blob for an empty range
    primary_blobs = np.diff(bounds)
    node_bytes = sum(np.roll(primary_bytes, k) for k in range(replicas))
    node_blobs = sum(np.roll(primary_blobs, k) for k in range(replicas))
    return Placement(bounds, np.asarray(node_bytes, np.int64), np.asarray(node_blobs, np.int64), nodes, replicas)


def format_placement(placement: Placement, staged: tuple[str, np.ndarray] | None = None) -> str:
    """Per-node blobs and bytes and the spread, for ``fanfs info --nodes N --replicas R``; with ``staged``
    (a label such as "fidelity 2" and the bytes each node stages then), those too."""
    total = int(placement.node_bytes.sum())
    mean = total / placement.nodes
    spread = (placement.node_bytes / mean if mean else np.ones(placement.nodes))
    lines = [f"placement  {placement.nodes} nodes, {placement.replicas} replicas: {human_size(total)} held in all, "
             f"{human_size(mean)} per node on average; every node within "
             f"{100 * float(np.abs(spread - 1).max()):.1f}% of the mean",
             "node       blobs       bytes   of mean" + (f"   staged at {staged[0]}" if staged else "")]
    for node in range(placement.nodes):
        lines.append(f"{node:<6} {int(placement.node_blobs[node]):>9,} {human_size(int(placement.node_bytes[node])):>11} "
                     f"{spread[node]:>8.1%}" + (f"   {human_size(int(staged[1][node])):>11}" if staged else ""))
    return "\n".join(lines)
