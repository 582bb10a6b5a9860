"""Issue 49: the shard-aware order gives each rank an equal part and every file to some rank, every epoch.

:class:`fanfs.train.ShardShuffle` (what :class:`~fanfs.train.ShardShuffleSampler` yields) pads as ``DistributedSampler``
does: with n files and R ranks each rank gets ceil(n / R) indices, and the ranks' parts, one after another, are the
epoch's order followed by its start again.  A break of that ceiling division (a floor) drops the last n mod R files
of every epoch on uneven ranks, and every file when there are more ranks than files; the mounted test had 120 files
on 2 ranks only.  Here: tiny stores, one shard, uneven shards, more ranks than shards or files, files not in the
store, many windows and epochs.  Pure arithmetic: no mount.
"""

from __future__ import annotations

import numpy as np
import pytest

from fanfs.train import ShardShuffle
from fanfs.train.shards import fitting_window


def _layouts() -> dict[str, np.ndarray]:
    """The shard of each file, in store order, for stores of every awkward shape."""
    rng = np.random.default_rng(49)
    uneven = np.repeat(np.arange(7), [1, 9, 2, 5, 1, 13, 3])
    return {"empty": np.zeros(0, np.int64), "one file": np.zeros(1, np.int64), "two files": np.zeros(2, np.int64),
            "one shard": np.zeros(13, np.int64), "a shard a file": np.arange(11), "uneven shards": uneven,
            "uneven, files not in the store": np.where(rng.random(uneven.size) < 0.2, -1, uneven),
            "120 files in 30 shards": np.repeat(np.arange(30), 4), "random": np.sort(rng.integers(0, 9, 101))}


@pytest.mark.parametrize("layout", list(_layouts()))
def test_every_rank_gets_an_equal_part_and_every_file_comes_every_epoch(layout):
    shards = _layouts()[layout]
    n = shards.size
    for ranks in (1, 2, 3, 4, 5, 7, 8, 16, 33):
        for window in (1, 2, 3, 64):
            for epoch in (0, 1, 5):
                parts = []
                for rank in range(ranks):
                    sampler = ShardShuffle(shards, window=window, seed=11, num_replicas=ranks, rank=rank)
                    sampler.set_epoch(epoch)
                    parts.append(list(sampler))
                    assert len(parts[-1]) == len(sampler) == -(-n // ranks), (layout, ranks, window, epoch)
                joined = np.array([i for part in parts for i in part], np.int64)
                case = (layout, ranks, window, epoch)
                assert np.array_equal(np.sort(joined[:n]), np.arange(n)), case  # the epoch's order: every file once
                assert np.array_equal(joined[n:], np.resize(joined[:n], joined.size - n)), case  # then its start again
                assert joined.size - n < ranks or n == 0, case  # no more padding than DistributedSampler's


def test_every_rank_computes_the_same_order_and_a_new_one_each_epoch():
    shards = _layouts()["uneven shards"]
    epochs = []
    for epoch in range(3):
        whole = ShardShuffle(shards, window=2, seed=3)
        whole.set_epoch(epoch)
        epochs.append(list(whole))
        parts = []
        for rank in range(3):
            part = ShardShuffle(shards, window=2, seed=3, num_replicas=3, rank=rank)
            part.set_epoch(epoch)
            parts += list(part)
        assert parts[:shards.size] == epochs[-1]  # the ranks' parts, in rank order, are the one process's order
    assert epochs[0] != epochs[1] != epochs[2]


def test_bad_ranks_and_windows_are_refused():
    for kwargs, said in (({"window": 0}, "a window of 0 shards"), ({"window": 1, "rank": 2, "num_replicas": 2},
                                                                  "rank 2 of 2 replicas")):
        with pytest.raises(ValueError, match=said):
            ShardShuffle(np.zeros(3, np.int64), **kwargs)


def test_the_window_that_fits_a_budget_holds_its_largest_shards():
    mib = 1 << 20
    assert fitting_window(np.full(30, 256 * mib), 512 * mib) == 2  # pack's default shards, the mount's default budget
    assert fitting_window(np.full(30, 256 * mib + 4096), 512 * mib) == 1  # a header more: only one fits
    assert fitting_window(np.array([100, 10, 10, 10, 300]), 400) == 2  # however they fall: the two largest
    assert fitting_window(np.array([100, 10, 10, 10, 300]), 10_000) == 5
    assert fitting_window(np.array([300]), 0) == fitting_window(np.zeros(0), 512 * mib) == 1  # at least one
