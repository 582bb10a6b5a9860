"""Issue 13.2: staging only the layers a fidelity reads, and serving above it from the shared store.

A store of real photos as progressive records, staged at K=2 (one node without a launcher, then three
under mpiexec): the local copies hold only the first two layers of every shard; a mount at K serves
from them alone; raised to full (mount option or ``ctl``), it reads the other layers from the shared
store, byte-exact, and ``stats`` says how much.  A missing shared store gives EIO above K, never
wrong bytes, and K still works.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fanfs_command import fanfs, force_unmount
from test_cluster import NODES, Job, finish, mpiexec

from fanfs.peers.placement import place
from fanfs.cache.stage import STAGED_NAME
from fanfs.records import FULL, Presentation, blobs_read
from fanfs.store import Store

K = 2
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from photo_samples import make_photo_set
    base = tmp_path_factory.mktemp("stagek")
    make_photo_set(base / "src", 40)
    (base / "src" / "notes.txt").write_text("a plain file is always staged\n" * 100)
    fanfs("pack", base / "src", base / "store", "--progressive-jpeg", "--shard-size", "256K", "--quiet")
    store = Store(str(base / "store"))
    names = sorted(p.name for p in (base / "src").iterdir())
    expected = {k: {n: store.read_file(n, k) for n in names} for k in (K, FULL)}
    read_at_k = blobs_read(store.index, Presentation(fidelity=K))
    store.close()
    return base / "store", names, expected, read_at_k


def staged_bytes(local: Path) -> int:
    """Bytes the local copies really occupy (sparse: holes take none)."""
    return sum(p.stat().st_blocks * 512 for p in local.iterdir() if p.name.isdigit())


def test_info_shows_the_capacity_gained(photos):
    store, _, _, read_at_k = photos
    index = Store(str(store), check_shards=False).index
    info = json.loads(fanfs("info", store, "--fidelity", str(K), "--nodes", "3", "--replicas", "2", "--json").stdout)
    at_k = int(index.blob_stored[read_at_k].sum())
    assert info["staged"]["stored_bytes"] == at_k < int(index.blob_stored.sum())
    assert info["staged"]["capacity_gain"] == round(int(index.blob_stored.sum()) / at_k, 3) > 1.5
    assert sum(info["placement"]["staged_node_bytes"]) == 2 * at_k
    text = fanfs("info", store, "--fidelity", str(K), "--nodes", "3").stdout
    assert f"at fidelity {K}:" in text and "staged at fidelity 2" in text


def test_staging_at_k_reads_no_byte_past_the_prefix(photos, tmp_path):
    """Each shard's run of blobs is read whole by one call, so the kernel's read-ahead could only fetch what the node
    does not stage: over a shared file system's link, every byte of the store (measured: 3.9 MB read into the page
    cache to stage 335 KB at K=1, before).  The shared shards' pages read at K are what was staged, give or take a
    page at each end of a shard's run."""
    if shutil.which("fincore") is None:
        pytest.skip("needs util-linux's fincore")
    store = photos[0]
    shards = sorted((store / "shards").iterdir())
    for shard in shards:  # out of the page cache: what staging reads comes back in
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    report = json.loads(fanfs("stage", store, tmp_path / "local", "--fidelity", str(K), "--json", "--quiet").stdout)
    copied = report["nodes"][0]["copied_bytes"]
    read = subprocess.run(["fincore", "--bytes", "--raw", "--noheadings", "-o", "RES", *shards], capture_output=True,
                          text=True, check=True).stdout.split()
    assert copied <= sum(map(int, read)) <= copied + 2 * PAGE * len(shards), (copied, read)


@pytest.mark.slow
def test_one_node_staged_at_k_serves_k_locally_and_more_from_the_shared_store(photos, tmp_path, mount):
    store, names, expected, read_at_k = photos
    local = tmp_path / "local"
    report = json.loads(fanfs("stage", store, local, "--fidelity", str(K), "--json", "--quiet").stdout)
    index = Store(str(store), check_shards=False).index
    at_k = int(index.blob_stored[read_at_k].sum())
    assert report["nodes"][0]["copied_bytes"] == at_k and report["presentation"]["fidelity"] == K
    assert staged_bytes(local) < at_k + 64 * 1024 < int(index.blob_stored.sum())  # only the prefix is on disk
    with mount(store, "--local-dir", local, "--fidelity", str(K)) as mnt:
        assert {n: (mnt / n).read_bytes() for n in names} == expected[K]
        stats = json.loads(fanfs("stats", mnt, "--json").stdout)
        assert stats["staged"]["fidelity"] == str(K) and stats["shared_bytes"] == 0
        fanfs("ctl", mnt, "--fidelity", "full")
        assert {n: (mnt / n).read_bytes() for n in names} == expected[FULL]
        stats = json.loads(fanfs("stats", mnt, "--json").stdout)
        above = int(index.blob_stored[~read_at_k].sum())
        assert stats["shared_bytes"] == above and stats["by_source"][str(local)] >= at_k
        assert set(stats["by_source"]) == {str(local), "shared store"}
        assert "read from the shared store (above it" in fanfs("stats", mnt).stdout


@pytest.mark.slow
def test_above_k_without_the_shared_store_is_eio_and_k_still_works(photos, tmp_path, mount):
    store, names, expected, _ = photos
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    local = tmp_path / "local"
    fanfs("stage", copy, local, "--fidelity", str(K), "--quiet")
    with mount(copy, "--local-dir", local, "--fidelity", "full") as mnt:
        shutil.rmtree(copy / "shards")  # the shared file system lost the store's shards
        jpeg = next(n for n in names if n.endswith(".jpg"))
        with pytest.raises(OSError) as caught:
            (mnt / jpeg).read_bytes()
        assert caught.value.errno == 5  # EIO, never wrong bytes
        fanfs("ctl", mnt, "--fidelity", str(K))
        assert {n: (mnt / n).read_bytes() for n in names} == expected[K]  # the staged layers still serve


def test_restaging_higher_copies_only_the_new_layers(photos, tmp_path):
    store, names, expected, read_at_k = photos
    local = tmp_path / "local"
    fanfs("stage", store, local, "--fidelity", "1", "--quiet")
    index = Store(str(store), check_shards=False).index
    at_1 = blobs_read(index, Presentation(fidelity=1))
    report = json.loads(fanfs("stage", store, local, "--fidelity", str(K), "--json", "--quiet").stdout)
    node = report["nodes"][0]
    assert node["copied_bytes"] == int(index.blob_stored[read_at_k & ~at_1].sum())
    assert node["skipped_bytes"] == int(index.blob_stored[at_1].sum())
    assert json.loads((local / STAGED_NAME).read_text())["fidelity"] == K


def test_a_broken_staging_record_is_one_line(photos, tmp_path):
    store = photos[0]
    local, mnt = tmp_path / "local", tmp_path / "mnt"
    fanfs("stage", store, local, "--fidelity", str(K), "--quiet")
    (local / STAGED_NAME).write_text("{not json")
    mnt.mkdir()
    done = fanfs("mount", store, mnt, "--local-dir", local, check=False)
    force_unmount(mnt)
    assert done.returncode == 1 and "not a staging record" in done.stderr and "stage again" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_job_staged_at_k_reads_above_k_from_the_shared_store_not_from_peers(photos, tmp_path):
    store, names, expected, read_at_k = photos
    index = Store(str(store), check_shards=False).index
    with Job(store, tmp_path, 1, "--stage", "--fidelity", str(K)) as job:
        for rank, mnt in enumerate(job.mounts):
            assert {n: (mnt / n).read_bytes() for n in names} == expected[K]
        fanfs("ctl", job.mounts[1], "--fidelity", "full")
        assert {n: (job.mounts[1] / n).read_bytes() for n in names} == expected[FULL]
        stats = [job.stats(rank) for rank in range(NODES)]
    placement = place(index.blob_stored, NODES, 1)
    for s in stats:
        cluster = s["cluster"]
        assert s["staged"]["fidelity"] == str(K) and cluster["refused"] == cluster["failed"] == 0, s  # nobody asked a peer
        assert cluster["remote_failures"] == cluster["remote_timeouts"] == 0, s  # for what no node has
    assert stats[1]["shared_bytes"] == int(index.blob_stored[~read_at_k].sum())
    assert stats[0]["shared_bytes"] == stats[2]["shared_bytes"] == 0
    for rank in range(NODES):
        assert staged_bytes(tmp_path / f"local{rank}") <= int(index.blob_stored[placement.held(rank) & read_at_k].sum()) \
            + 64 * 1024


def test_stage_fidelity_under_mpiexec(photos, tmp_path):
    store, _, _, read_at_k = photos
    index = Store(str(store), check_shards=False).index
    with mpiexec("stage", store, tmp_path / "local{rank}", "--fidelity", str(K), "--quiet", "--json",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=120)
        finish(proc, 10)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert sum(n["copied_bytes"] for n in report["nodes"]) == int(index.blob_stored[read_at_k].sum())
    for rank in range(NODES):
        assert json.loads((tmp_path / f"local{rank}" / STAGED_NAME).read_text())["fidelity"] == K
