"""The index at scale: every path resolves, listings are sorted slices, lookups stay exact."""

from __future__ import annotations

import os

import numpy as np

from fanfs.format import DIR, FILE
from fanfs.index import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, Index, build_index


def test_every_path_of_a_large_index_resolves(tmp_path):
    """300k entries, path hashes on both sides of 2**63 (the lookup's speed is measured by tools/bench_index.py)."""
    dirs, per_dir = 300, 1000
    paths = [b""] + [b"d%05d" % d for d in range(dirs)]
    paths += [b"d%05d/f%06d.JPEG" % (d, i) for d in range(dirs) for i in range(per_dir)]
    n = len(paths)
    columns = {name: np.zeros(n, dtype) for name, dtype in ENTRY_COLUMNS.items()}
    columns["type"][: dirs + 1] = DIR
    columns["type"][dirs + 1:] = FILE
    columns["first"][0], columns["count"][0] = 1, dirs
    columns["first"][1: dirs + 1] = dirs + 1 + np.arange(dirs) * per_dir
    columns["count"][1: dirs + 1] = per_dir
    columns.update({name: np.zeros(0, dtype) for name, dtype in {**BLOB_COLUMNS, **SHARD_COLUMNS}.items()})
    path = os.path.join(tmp_path, "index")
    build_index(path, {"store_id": "00" * 16}, paths, columns, b"", {})
    index = Index(path)
    assert (index.hash_sorted >= 2**63).any() and (index.hash_sorted < 2**63).any()
    assert all(index.lookup(p) == e for e, p in enumerate(paths))
    assert index.lookup(b"d00001/nope") == -1 and index.lookup(b"d00001/") == -1
    assert index.children(0)[:2] == [b"d00000", b"d00001"]
    assert index.children(5)[-1] == b"f000999.JPEG"
