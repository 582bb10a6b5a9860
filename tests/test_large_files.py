"""Issue 28: large files through the mount in the largest requests the kernel allows, each chunk decoded once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs

from fanfs.serve import readahead
from fanfs.store import Store
from fanfs.util.mounts import mount_device

CHUNK = 1 << 20
CHUNKS = 12


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 12 MiB file that compresses (so every chunk is decoded, not just copied) and a small one."""
    base = tmp_path_factory.mktemp("large")
    src = base / "src"
    src.mkdir()
    values = np.random.default_rng(28).integers(-1000, 1000, CHUNKS * CHUNK // 4, dtype=np.int16).astype(np.float32)
    (src / "volume.bin").write_bytes(values.tobytes())
    (src / "small.txt").write_bytes(b"small\n")
    fanfs("pack", src, base / "store", "--quiet")
    return src, base / "store"


def stats(mnt: Path) -> dict:
    return json.loads(fanfs("stats", mnt, "--json").stdout)


def read_in_pieces(path: Path, piece: int = 64 << 10, start_at_end: bool = False) -> bytes:
    """Read a file sequentially in small read() calls, as a loader does (``start_at_end``: its last bytes first, as
    np.load reads a zip's directory, so the kernel's readahead windows then do not start at a chunk's edge)."""
    with open(path, "rb", buffering=0) as f:
        if start_at_end:
            f.seek(-5000, os.SEEK_END)
            f.read()
            f.seek(0)
        return b"".join(iter(lambda: f.read(piece), b""))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="raising a mount's readahead needs root")


@needs_root
@pytest.mark.parametrize("start_at_end", [False, True], ids=["from the start", "tail first"])
def test_a_large_file_arrives_in_requests_of_a_chunk_each_decoded_once(big, mount, start_at_end):
    src, store = big
    with mount(store) as mnt:
        assert read_in_pieces(mnt / "volume.bin", start_at_end=start_at_end) == (src / "volume.bin").read_bytes()
        got = stats(mnt)
        assert got["readahead"] == readahead.READAHEAD == readahead.current(str(mnt))
    # the kernel's default readahead (128 KiB) cut it into 96+ requests; now they are (up to) a chunk each
    assert got["reads"] <= CHUNKS + 4, got
    assert got["bytes_presented"] / got["reads"] >= CHUNK * 3 // 4
    # each chunk found, verified and decoded once, however the requests fell (the last one, read first, is long
    # gone from the few kept when the pass reaches it again)
    assert got["cache_misses"] == CHUNKS + start_at_end
    assert got["decode_seconds"] > 0


def test_requests_smaller_than_a_chunk_decode_it_once(big, mount):
    """With the kernel's own readahead (128 KiB requests, what a mount made without root gets), a chunk is read by
    eight requests: found, verified and decoded by the first, sent from the same bytes for the other seven."""
    src, store = big
    with mount(store, "--readahead", "0") as mnt:
        assert read_in_pieces(mnt / "volume.bin", start_at_end=True) == (src / "volume.bin").read_bytes()
        got = stats(mnt)
    assert got["reads"] >= 4 * CHUNKS, got
    assert got["cache_misses"] == CHUNKS + 1  # the last chunk twice: read first, and again at the end of the pass
    assert got["cache_hits"] >= got["reads"] - got["cache_misses"]


@pytest.mark.slow
@needs_root
def test_one_large_file_is_served_by_every_serving_process(big, mount):
    src, store = big
    with mount(store, "--workers", "2") as mnt:
        assert read_in_pieces(mnt / "volume.bin", piece=1 << 20) == (src / "volume.bin").read_bytes()
        assert (mnt / "small.txt").read_bytes() == b"small\n"
        got = stats(mnt)
    assert got["workers"] == 2 and all(n > 0 for n in got["reads_by_process"]), got
    assert got["cache_misses"] <= CHUNKS + 2  # a chunk cut across two requests may be found by both processes


def test_the_readahead_is_looked_up_without_asking_the_mount(big, mount):
    """The daemon finds its mount's device in /proc/self/mountinfo while it answers INIT: a look at the mount
    point itself would wait on the daemon (it hung the first version of this)."""
    _, store = big
    with mount(store, "--readahead", "0") as mnt:
        dev = os.stat(mnt).st_dev
        assert mount_device(str(mnt)) == f"{os.major(dev)}:{os.minor(dev)}"
        assert readahead.current(str(mnt)) == 128 << 10  # the kernel's default, left alone
        assert "\nreadahead " not in fanfs("stats", mnt).stdout
    assert mount_device(str(mnt)) is None


def test_spans_cut_nothing_and_join_to_the_bytes(big):
    """In-process: a read across chunks is one piece per chunk, each the chunk's own decoded bytes (no slice)."""
    src, store = big
    whole = (src / "volume.bin").read_bytes()
    with_store = Store(str(store))
    try:
        entry = with_store.lookup(b"volume.bin")
        spans = with_store.spans(entry, CHUNK - 4096, CHUNK)
        assert [(start, length) for _, start, length in spans] == [(CHUNK - 4096, 4096), (0, CHUNK - 4096)]
        assert all(len(data) == CHUNK for data, _, _ in spans)
        for offset, size in ((0, 10), (CHUNK - 1, 2), (3, 5 * CHUNK), (len(whole) - 7, 100), (len(whole), 10)):
            assert with_store.read(entry, offset, size) == whole[offset:offset + size]
    finally:
        with_store.close()
