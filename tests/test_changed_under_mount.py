"""Issue 39 (defects 1 and 2): a store's files changed under a running mount, as ``cp``, ``rsync --inplace`` or a
full disk change them.  A mount serves what it validated at open, or EIO and one log line: never another file's
bytes, never a shorter file, never a dead mount."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, stats_command
from support.crafting import rewrite

from fanfs.store.format import INDEX_NAME, SHARD_DIR, shard_name

MIB = 1 << 20


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("changed")
    src = base / "src"
    src.mkdir()
    rng = np.random.default_rng(39)
    for name in ("a.bin", "b.bin", "c.bin"):
        (src / name).write_bytes(rng.bytes(20_000))
    fanfs("pack", src, base / "store", "--quiet")
    return src, base / "store"


def _swapped_first(meta, columns):
    """a.bin's entry names b.bin's blobs and b.bin's a.bin's (each blob's checksum still matches its bytes)."""
    offsets, paths = columns["path_offset"], columns["paths"].tobytes()
    entry = {paths[offsets[e]:offsets[e + 1]]: e for e in range(offsets.size - 1)}
    a, b = entry[b"a.bin"], entry[b"b.bin"]
    columns["first"][[a, b]] = columns["first"][[b, a]]


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_an_index_changed_or_cut_in_place_under_a_mount_changes_nothing_it_serves(small_files, tmp_path, mount, workers):
    src, original = small_files
    store = tmp_path / "store"
    shutil.copytree(original, store)
    crafted = tmp_path / "crafted"
    shutil.copytree(original, crafted)
    rewrite(crafted, _swapped_first)  # a valid index of the same size that serves a.bin from b.bin's blobs
    index = store / INDEX_NAME
    with mount(store, "--workers", str(workers)) as mnt:
        assert (mnt / "c.bin").read_bytes() == (src / "c.bin").read_bytes()
        with open(index, "r+b") as f:  # in place: the same file, rewritten (what a mapping of it would see)
            f.write((crafted / INDEX_NAME).read_bytes())
        assert (mnt / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
        os.truncate(index, 100)  # cut in place: a mapping of it would be a SIGBUS
        assert (mnt / "b.bin").read_bytes() == (src / "b.bin").read_bytes()
        assert stats_command(mnt)["errors"] == 0  # the daemon still answers
