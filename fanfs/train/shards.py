"""A shuffle that reads the disk nearly in sequence, for a training that may choose its order.

A full shuffle reads a store's files in random order: every file is a random read of a cold disk, and a node's
read-ahead can only fetch what the order names, file by file.  :func:`shard_aware_order` shuffles the *shards*,
then the files within a window of ``window`` consecutive shards of that order (WebDataset's shard shuffle and
sample buffer; FFCV's quasi-random order).  A cold epoch then reads each shard once, window after window: the
mount, told the order (:class:`ShardShuffleSampler` tells it, as :class:`~fanfs.train.OrderSampler` does), reads
ahead within one window's shards instead of anywhere in the store.  By default the window is the most shards whose
bytes fit the mount's read-ahead budget (:func:`fitting_window`: its ``--prefetch``, or a lazy cache's window), so
the read-ahead may run through a whole window ahead of the readers.

What it gives up: the files of a batch come from ``window`` shards, not from all of them, and a file's neighbours
in an epoch are bound to its shard's.  How much that costs depends on what a shard holds.  Modelled on ImageNet-1k
(1,281,167 files, 1,000 classes; ``tools/bench/bench_shuffle.py``), mean distinct classes in a batch of 256, against
a full shuffle's 225:

* packed in a shuffled order (shards that mix classes, as WebDataset's are written): 225 at every window;
* packed from the tree, in its order (one class directory after another): about as many classes as a window holds
  shards, whatever their size: 6 for the 2 shards of 256 MiB (pack's default) that the default 512 MiB budget
  holds, 20 for 16 of 32 MiB, 65 for 64 of 8 MiB; 151 for 256 shards of 8 MiB in a 2 GiB budget.

So for a store packed from a class-per-directory tree, pick the shard size at pack time (``--shard-size``) and the
budget at mount time (``--prefetch``) so that a window holds as many shards as the batch should see classes, or
keep a full shuffle (:class:`~fanfs.train.OrderSampler`).
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..store.format import INDEX_NAME
from ..store.index import Index
from ..util.units import human_size
from .mount import mount_status, read_ahead_budget
from .order import OrderSampler, dataset_paths, the_mountpoint

log = logging.getLogger("fanfs")


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


def fitting_window(sizes: np.ndarray, budget: int) -> int:
    """The most shards whose bytes fit ``budget`` however they fall in a window (the largest of ``sizes``, summed);
    1 if not even the largest does."""
    summed = np.cumsum(np.sort(np.asarray(sizes, np.int64))[::-1])
    return max(1, int(np.searchsorted(summed, budget, side="right")))


def shards_of(mountpoint: str, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The shard of each of ``paths`` (files under ``mountpoint``, absolute or relative to it; -1 for a path the
    mounted store does not hold), and the size in bytes of each shard of the mounted store, from its index."""
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
    return out, np.array(index.shard_size, np.int64)


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
    takes one contiguous part of it (its own shards).  As ``DistributedSampler`` pads: each rank gets ceil(n /
    ``num_replicas``) indices, the parts together being the epoch's order followed by its start again, so every
    index comes at least once an epoch and exactly once where ``num_replicas`` divides n."""

    def __init__(self, shards: np.ndarray, *, window: int, seed: int = 0, num_replicas: int = 1,
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
    any kind reads ahead within each window's shards.  ``window``: shards shuffled together (the module says what it
    costs; :attr:`window` holds it), by default the most of the dataset's shards that the mount's read-ahead budget
    holds (:attr:`budget`, :func:`fitting_window`); a larger one is taken with a warning.  ``num_replicas``/``rank``:
    a job's ranks, as ``DistributedSampler`` takes them; every rank must choose the same window (their mounts the
    same budget, as a job's nodes have, or the same ``window`` given)."""

    def __init__(self, dataset: Any, *, window: int | None = None, mountpoint: str | os.PathLike | None = None,
                 paths: Sequence[str] | None = None, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 stream: str | None = None) -> None:
        path_of = dataset_paths(paths if paths is not None else dataset)
        count = len(paths) if paths is not None else len(dataset)
        mnt = the_mountpoint(mountpoint)
        shards, sizes = shards_of(mnt, [path_of(i) for i in range(count)])
        try:
            self.budget = read_ahead_budget(mnt)
        except FanfsError as err:
            log.warning("fanfs: %s does not say how far it reads ahead (%s): a window of 1 shard", mnt, err)
            self.budget = 0
        held = sizes[np.unique(shards[shards >= 0])]
        fits = fitting_window(held, self.budget)
        if window is not None and window > fits and self.budget:
            log.warning("fanfs: a window of %d shards holds up to %s of %s, beyond its read-ahead budget of %s (%d "
                        "fit): the read-ahead cannot run through a window; mount with a larger --prefetch, or leave "
                        "the window to fanfs", window, human_size(np.sort(held)[::-1][:window].sum()), mnt,
                        human_size(self.budget), fits)
        self.window = fits if window is None else window
        super().__init__(dataset, ShardShuffle(shards, window=self.window, seed=seed, num_replicas=num_replicas,
                                               rank=rank), mountpoint=mnt, paths=paths, stream=stream)
