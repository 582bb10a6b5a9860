"""The index at scale: every path resolves, listings are sorted slices, lookups stay exact."""

from __future__ import annotations

import os
import stat

import numpy as np

from fanfs.store import Store
from fanfs.store.format import DIR, FILE
from fanfs.store.index import Index, build_index
from fanfs.store.schema import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, header, new_columns


def test_every_path_of_a_large_index_resolves(tmp_path):
    """300k entries, path hashes on both sides of 2**63 (the lookup's speed is measured by tools/bench/bench_index.py)."""
    dirs, per_dir = 300, 1000
    paths = [b""] + [b"d%05d" % d for d in range(dirs)]
    paths += [b"d%05d/f%06d.JPEG" % (d, i) for d in range(dirs) for i in range(per_dir)]
    n = len(paths)
    columns = new_columns(ENTRY_COLUMNS, n)
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
    columns.update(new_columns(BLOB_COLUMNS, 0), **new_columns(SHARD_COLUMNS, 0))
    path = os.path.join(tmp_path, "index")
    totals = {"entries": n, "files": n - dirs - 1, "dirs": dirs + 1, "symlinks": 0, "bytes_in": 0,
              "bytes_presented": 0, "bytes_stored": 0, "shards": 0}
    meta = header(store_id=bytes(16), source="synthetic", codecs=[{"id": "raw"}], codec_stats={}, totals=totals)
    build_index(path, meta, paths, columns, b"", {})
    index = Index(path)
    assert (index.hash_sorted >= 2**63).any() and (index.hash_sorted < 2**63).any()
    assert all(index.lookup(p) == e for e, p in enumerate(paths))
    assert index.lookup(b"d00001/nope") == -1 and index.lookup(b"d00001/") == -1
    assert index.children(0)[:2] == [b"d00000", b"d00001"]
    assert index.children(5)[-1] == b"f000999.JPEG"


def test_the_index_benchmark_writes_what_pack_writes(tmp_path):
    """tools/bench/bench_index.py's synthetic stores are written through the packer's schema: the same header keys and
    totals, and they open, validated whole."""
    from bench_index import synthesise
    from fanfs_command import fanfs
    names = synthesise(tmp_path / "synthetic", files=50, dirs=5, shards=2)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a")
    fanfs("pack", tmp_path / "src", tmp_path / "packed", "--quiet")
    synthetic, packed = Store(str(tmp_path / "synthetic")), Store(str(tmp_path / "packed"))
    assert synthetic.meta.keys() == packed.meta.keys()
    assert synthetic.meta["totals"].keys() == packed.meta["totals"].keys()
    assert all(synthetic.lookup(name.encode()) >= 0 for name in names)
    synthetic.close()
    packed.close()
