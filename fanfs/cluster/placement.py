"""Which nodes hold which shards: a deterministic map from (shard sizes, nodes, replicas) to holders.

Rule: shards in decreasing size (ties: lower shard number first); each goes to the ``replicas``
distinct nodes that hold the fewest bytes so far (ties: lower node number).  This is greedy
largest-first bin packing ("LPT"), which keeps every node within one shard of the mean byte load,
so staging time and local disk use are even across the job.  Every node computes the same map from
the index alone: nothing about placement is stored or sent.

Why not rendezvous (HRW) hashing: it moves few shards when the node count changes, but a job's node
count is fixed for its life and restaging is a fresh copy anyway, while HRW's balance is only
statistical (with a few shards per node, some nodes get twice the mean).  Balance wins here.

A reader asks the holders of a shard in an order rotated by its own rank and the shard number, so
with replicas the remote reads of a job spread over all copies instead of all hitting the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.units import human_size


@dataclass(frozen=True)
class Placement:
    """``holders[shard]``: the ``replicas`` distinct nodes holding a shard; ``node_bytes[node]``: their load."""

    holders: np.ndarray
    node_bytes: np.ndarray
    nodes: int
    replicas: int

    def shards_of(self, node: int) -> np.ndarray:
        """Shard numbers this node holds, ascending."""
        return np.flatnonzero((self.holders == node).any(axis=1))

    def holds(self, node: int) -> np.ndarray:
        """Boolean per shard: does this node hold it."""
        return (self.holders == node).any(axis=1)

    def remote_holders(self, shard: int, reader: int) -> list[int]:
        """Holders other than ``reader``, in the order ``reader`` should ask them."""
        row = self.holders[shard].tolist()
        start = (reader + shard) % len(row)
        return [node for node in row[start:] + row[:start] if node != reader]


def place(shard_sizes: np.ndarray, nodes: int, replicas: int) -> Placement:
    """The placement of shards of these sizes on ``nodes`` nodes, each shard on ``replicas`` nodes.

    More replicas than nodes cannot be distinct: they are capped at the node count.
    """
    if nodes < 1 or replicas < 1:
        raise ValueError(f"need at least one node and one replica (got {nodes} nodes, {replicas} replicas)")
    replicas = min(replicas, nodes)
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    holders = np.empty((sizes.size, replicas), dtype=np.int32)
    load = np.zeros(nodes, dtype=np.int64)
    for shard in np.lexsort((np.arange(sizes.size), -sizes)).tolist():
        chosen = np.argsort(load, kind="stable")[:replicas]  # stable: ties go to the lower node number
        holders[shard] = chosen
        load[chosen] += sizes[shard]
    return Placement(holders, load, nodes, replicas)


def format_placement(placement: Placement) -> str:
    """Per-node shards and bytes, for ``fanfs info --nodes N --replicas R``."""
    total = int(placement.node_bytes.sum())
    mean = total / placement.nodes
    lines = [f"placement  {placement.nodes} nodes, {placement.replicas} replicas per shard: "
             f"{human_size(total)} in all, {human_size(mean)} per node on average",
             "node     shards       bytes   of mean"]
    for node in range(placement.nodes):
        node_bytes = int(placement.node_bytes[node])
        lines.append(f"{node:<6} {placement.shards_of(node).size:>8,} {human_size(node_bytes):>11} "
                     f"{(node_bytes / mean if mean else 0):>8.0%}")
    return "\n".join(lines)
