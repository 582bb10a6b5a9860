"""A shuffle that reads the disk nearly in sequence, for a training that may choose its order.

A full shuffle reads a store's files in random order: every file is a random read of a cold disk, and a node's
read-ahead can only fetch what the order names, file by file.  :func:`shard_aware_order` shuffles the *shards*,
then the files within a window of ``window`` consecutive shards of that order (WebDataset's shard shuffle and
sample buffer; FFCV's quasi-random order).  A cold epoch then reads each shard once, window after window: the
mount, told the order (:class:`ShardShuffleSampler` tells it, as :class:`~fanfs.train.OrderSampler` does), reads
each window's shards ahead in long sequential runs instead of a random read per file.

What it gives up: the files of a batch come from ``window`` shards, not from all of them, and a file's neighbours
in an epoch are bound to its shard's.  How much that costs depends on what a shard holds.  Modelled on ImageNet-1k
(1,281,167 files, 1,000 classes, 525 shards of 256 MiB; ``tools/bench/bench_shuffle.py``), mean distinct classes in a
batch of 256, against a full shuffle's 225:

* packed from the tree, in its order (one class directory after another: 1.9 classes per shard): window 1: 3 (1%),
  4: 12 (5%), 8: 22 (10%), 16: 42 (19%), 32: 76 (34%), 64: 121 (54%), 128: 166 (74%);
* packed in a shuffled order (shards that mix classes, as WebDataset's are written): 225 at every window.

So on a store packed in tree order the window must be large (and the read-ahead budget hold a window's shards to
read them in sequence: 8 GiB for 32 shards of 256 MiB); a store whose shards mix their classes loses nothing at any
window, and reads each shard front to back with a budget of one or two shards.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..store.format import INDEX_NAME
from ..store.index import Index
from .mount import mount_status
from .order import OrderSampler, dataset_paths, the_mountpoint

WINDOW = 4
"""Shards whose files are shuffled together, by default: within the default read-ahead budget (512 MiB) for shards
of up to 128 MiB (the module says what a window costs in randomness)."""


def shard_aware_order(shards: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of the files whose shards are ``shards`` (one per file; any file not in the store, -1, is a shard
    of its own): the shards shuffled, then the files of each ``window`` consecutive shards shuffled together."""
    if window < 1:
        raise ValueError(f"a window of {window} shards: give at least 1")
    shards = np.asarray(shards, np.int64)
    names, which = np.unique(shards, return_inverse=True)
    place = np.empty(names.size, np.int64)
    place[rng.permutation(names.size)] = np.arange(names.size)  # each shard's position in the shuffled order
    group = place[which] // window
    return np.lexsort((rng.random(shards.size), group))


def shards_of(mountpoint: str, paths: Sequence[str]) -> np.ndarray:
    """The shard of each of ``paths`` (files under ``mountpoint``, absolute or relative to it; -1 for a path the
    mounted store does not hold), from the mounted store's index."""
    index = Index(os.path.join(mount_status(mountpoint)["store"], INDEX_NAME))
    root = os.fsencode(os.path.abspath(mountpoint)).rstrip(b"/") + b"/"
    out = np.full(len(paths), -1, np.int64)
    shard = memoryview(index.shard)
    for i, path in enumerate(paths):
        name = os.fsencode(path)
        if name.startswith(b"/"):
            name = name[len(root):] if name.startswith(root) else b"\0"  # elsewhere: not in this store
        entry = index.lookup(name.strip(b"/"))
        if entry >= 0:
            out[i] = shard[entry]
    return out


def _whole(name: str, value: Any) -> int:
    """A seed or an epoch: a whole number, 0 or more (they seed NumPy's generator), else a ValueError saying so."""
    try:
        number = operator.index(value)
    except TypeError:
        number = -1
    if number < 0:
        raise ValueError(f"{name} must be a whole number, 0 or more, not {value!r}")
    return number


class ShardShuffle:
    """The indices ``0 .. n-1`` of a dataset in a shard-aware order (:func:`shard_aware_order`), a new one each epoch
    (seeded by ``seed`` and the epoch, so every rank computes the same); with ``num_replicas`` ranks, rank ``rank``
    takes one contiguous part of it (its own shards), padded to an equal length as ``DistributedSampler`` pads."""

    def __init__(self, shards: np.ndarray, *, window: int = WINDOW, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} of {num_replicas} replicas")
        if window < 1:
            raise ValueError(f"a window of {window} shards: give at least 1")
        self.shards, self.window, self.seed = np.asarray(shards, np.int64), window, _whole("seed", seed)
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.per_rank = -(-self.shards.size // num_replicas)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _whole("epoch", epoch)

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self) -> Iterator[int]:
        order = shard_aware_order(self.shards, self.window, np.random.default_rng((self.seed, self.epoch)))
        if order.size and order.size < self.per_rank * self.num_replicas:
            order = np.resize(order, self.per_rank * self.num_replicas)
        part = order[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]
        return iter(part.tolist())


class ShardShuffleSampler(OrderSampler):
    """An :class:`~fanfs.train.OrderSampler` over a :class:`ShardShuffle` of ``dataset``: yields a shard-aware order
    and tells the mount at ``mountpoint`` (default ``$FANFS_MNT``) this epoch's paths and the next's, so a mount of
    any kind reads each window's shards ahead, in sequence.  ``window``: shards shuffled together (the module says
    what it costs); ``num_replicas``/``rank``: a job's ranks, as ``DistributedSampler`` takes them."""

    def __init__(self, dataset: Any, *, window: int = WINDOW, mountpoint: str | os.PathLike | None = None,
                 paths: Sequence[str] | None = None, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 stream: str | None = None) -> None:
        path_of = dataset_paths(paths if paths is not None else dataset)
        count = len(paths) if paths is not None else len(dataset)
        shards = shards_of(the_mountpoint(mountpoint), [path_of(i) for i in range(count)])
        super().__init__(dataset, ShardShuffle(shards, window=window, seed=seed, num_replicas=num_replicas, rank=rank),
                         mountpoint=mountpoint, paths=paths, stream=stream)
