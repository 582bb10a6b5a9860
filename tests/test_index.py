"""The index at scale: every path resolves, listings are sorted slices, lookups stay exact."""

from __future__ import annotations

import os
import stat

import numpy as np

from fanfs.store.format import DIR, FILE, FORMAT_VERSION
from fanfs.store.index import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, Index, build_index


def test_every_path_of_a_large_index_resolves(tmp_path):
    """300k entries, path hashes on both sides of 2**63 (the lookup's speed is measured by tools/bench_index.py)."""
    dirs, per_dir = 300, 1000
    paths = [b""] + [b"d%05d" % d for d in range(dirs)]
    paths += [b"d%05d/f%06d.JPEG" % (d, i) for d in range(dirs) for i in range(per_dir)]
    n = len(paths)
    columns = {name: np.zeros(n, dtype) for name, dtype in ENTRY_COLUMNS.items()}
    columns["type"][: dirs + 1] = DIR
    columns["type"][dirs + 1:] = FILE
    columns["mode"][: dirs + 1] = stat.S_IFDIR | 0o755
    columns["mode"][dirs + 1:] = stat.S_IFREG | 0o644
    columns["layers"][dirs + 1:] = 1
    columns["parent"][1: dirs + 1] = 0
    columns["parent"][dirs + 1:] = np.repeat(np.arange(1, dirs + 1), per_dir)
    columns["first"][0], columns["count"][0] = 1, dirs
    columns["first"][1: dirs + 1] = dirs + 1 + np.arange(dirs) * per_dir
    columns["count"][1: dirs + 1] = per_dir
    columns.update({name: np.zeros(0, dtype) for name, dtype in {**BLOB_COLUMNS, **SHARD_COLUMNS}.items()})
    path = os.path.join(tmp_path, "index")
    totals = {"entries": n, "files": n - dirs - 1, "dirs": dirs + 1, "symlinks": 0, "bytes_in": 0,
              "bytes_presented": 0, "bytes_stored": 0, "shards": 0}
    meta = {"format": FORMAT_VERSION, "store_id": "00" * 16, "chunk_size": 1 << 20, "codecs": [{"id": "raw"}],
            "totals": totals}
    build_index(path, meta, paths, columns, b"", {})
    index = Index(path)
    assert (index.hash_sorted >= 2**63).any() and (index.hash_sorted < 2**63).any()
    assert all(index.lookup(p) == e for e, p in enumerate(paths))
    assert index.lookup(b"d00001/nope") == -1 and index.lookup(b"d00001/") == -1
    assert index.children(0)[:2] == [b"d00000", b"d00001"]
    assert index.children(5)[-1] == b"f000999.JPEG"
