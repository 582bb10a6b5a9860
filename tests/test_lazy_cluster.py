"""Issue 30 on several nodes: lazily staged jobs under a real ``mpiexec`` (three "nodes" on this host).

Readers on every node race for the same unfetched blobs at every fidelity: every byte exact, and each holder
fetches each blob it keeps from the shared store once (as staging copies it once), whoever asked first.  A
daemon killed while it fetches a blob a peer asked for: the peer reads it through, nothing hangs.  A capacity of a
quarter of the share with the readers' order known: the nodes fetch ahead from their peers and the shared store
and never take more disk than the budget.  A node serving without a mount fills its cache for in-process readers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest
from support.inject import inject
from fanfs_command import fanfs, set_presentation
from test_cluster import MPIEXEC, NODES, Job
from test_fsspec_node import NodeJob
from test_lazy import disk_bytes, photos, read, states  # noqa: F401  (photos: a fixture)

from fanfs.peers.placement import place
from fanfs.records import FULL
from fanfs.store import Store
from fanfs.cache.localcache import FILLING, KEPT, state_file_bytes

pytestmark = [pytest.mark.slow,  # mpiexec jobs of 3 nodes
              pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")]


def _race(mnt: str, names: list[str], start, out) -> None:
    """A reader: at the common start, every file in the same order as every other reader (racing for its blobs)."""
    start.wait()
    out.put({n: read(Path(mnt) / n) for n in names})


def race(mounts: list[Path], names: list[str], per_node: int = 2) -> list[dict[str, bytes]]:
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(len(mounts) * per_node), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(m), names, start, out)) for m in mounts for _ in range(per_node)]
    for p in procs:
        p.start()
    got = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return got


def test_readers_on_every_node_race_for_unfetched_blobs_at_every_fidelity(photos, tmp_path):  # noqa: F811
    store, names, expected = photos
    index = Store(str(store), check_shards=False).index
    with Job(store, tmp_path, 2, "--stage", "lazy", "--fidelity", "1") as job:
        assert all(disk_bytes(tmp_path / f"local{rank}") <= 8192 for rank in range(NODES))  # served at once
        for k in (1, 2, 5, "full"):
            if k != 1:
                for mnt in job.mounts:
                    set_presentation(mnt, "fidelity", str(k))
            for got in race(job.mounts, names):
                assert got == expected[FULL if k == "full" else k], f"fidelity {k}"
        stats = [job.stats(rank)["cache"] for rank in range(NODES)]
    placement = place(index.blob_stored, NODES, 2)
    for rank, cache in enumerate(stats):
        kept = states(tmp_path / f"local{rank}") == KEPT
        held = placement.held(rank) & (index.blob_stored > 0)
        assert np.array_equal(kept, held), rank  # all it holds, since every node read every file
        assert cache["fills"] == int(kept.sum()) and cache["fill_bytes"] == int(index.blob_stored[kept].sum())
        assert cache["read_through_bytes"] == 0 and cache["unkept"] == 0
    # each holder keeps each blob it holds, whoever asked first; the shared store gave each blob once (to the holder
    # every reader asks first), the other holder copied it from that one
    assert sum(c["fill_bytes"] for c in stats) == 2 * int(index.blob_stored.sum())
    assert sum(c["fill_bytes"] - c["peer_fill_bytes"] for c in stats) == int(index.blob_stored.sum())


def test_a_daemon_killed_while_it_fetches_for_a_peer(photos, tmp_path, monkeypatch):  # noqa: F811
    store, names, expected = photos
    index = Store(str(store), check_shards=False).index
    placement = place(index.blob_stored, NODES, 1)

    def held_whole(rank: int) -> list[str]:
        """The photos whose every blob only ``rank`` holds."""
        entries = {n: index.lookup(n.encode()) for n in names if n.endswith(".jpg")}
        return [n for n, e in entries.items() if placement.primary(int(index.first[e])) == rank
                and placement.holds_range(rank, int(index.first[e]), int(index.count[e]))]
    rank = next(r for r in range(1, NODES) if len(held_whole(r)) >= 4)  # a peer of the reader's node
    theirs = held_whole(rank)
    with monkeypatch.context() as patch:
        inject(patch, "fanfs.cache.localcache:os.pwrite=faults.half_written(os.pwrite, 60)")  # every node: a fill waits with half its copy written
        job = Job(store, tmp_path, 1, "--stage", "lazy")
    with job:
        victim = job.pid(rank)
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        reader = ctx.Process(target=lambda: out.put(read(job.mounts[0] / theirs[0])))
        reader.start()
        deadline = time.monotonic() + 30
        while not (states(tmp_path / f"local{rank}") == FILLING).any():  # the peer fetches it for rank 0, slowly
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        assert out.get(timeout=30) == expected[FULL][theirs[0]]  # read through: nothing hangs, nothing is wrong
        reader.join(timeout=10)
        for n in theirs[1:4]:
            assert read(job.mounts[0] / n) == expected[FULL][n]
        assert os.path.ismount(job.mounts[0]) and job.proc.poll() is None
        cache = job.stats(0)["cache"]
        assert cache["read_through_bytes"] > 0
    assert "this node's daemon" in job.text()  # the launcher says which node died


def test_a_quarter_of_the_share_with_the_order_known(photos, tmp_path):  # noqa: F811
    store, names, expected = photos
    index = Store(str(store), check_shards=False).index
    placement = place(index.blob_stored, NODES, 1)
    capacity = int(placement.node_bytes.max()) // 4 + state_file_bytes(index.blob_stored.size)
    with Job(store, tmp_path, 1, "--stage", "lazy", "--capacity", str(capacity)) as job:
        orders = []
        for rank, mnt in enumerate(job.mounts):
            mine = random.Random(rank).sample(names, len(names))
            (tmp_path / f"order{rank}").write_text("\n".join(mine) + "\n\n" + "\n".join(mine) + "\n")
            fanfs("ctl", mnt, "--order", tmp_path / f"order{rank}")
            orders.append(mine)
        for epoch in range(2):
            for rank, mnt in enumerate(job.mounts):
                for n in orders[rank]:
                    assert read(mnt / n) == expected[FULL][n]
                    assert disk_bytes(tmp_path / f"local{rank}") <= capacity
        stats = [job.stats(rank) for rank in range(NODES)]
        text = fanfs("stats", job.mounts[0]).stdout
    for s in stats:
        ahead, cache = s["prefetch"], s["cache"]
        assert ahead["files"] > 0 and ahead["failed"] == 0 and cache["held_bytes"] <= capacity
        assert cache["hit_blobs"] > 0
    assert sum(s["prefetch"]["from_peers"] for s in stats) > 0 and sum(s["prefetch"]["from_shared"] for s in stats) > 0
    assert "files fetched ahead of the readers" in text


def test_a_node_without_a_mount_fills_its_cache_for_in_process_readers(photos, tmp_path):  # noqa: F811
    store, names, expected = photos
    with NodeJob(store, tmp_path, 1, "--stage", "lazy") as job:
        fs = fsspec.filesystem("fanfs", node=str(job.dirs[0]), skip_instance_cache=True)
        assert {n: fs.cat_file(n) for n in names} == expected[FULL]
        cache = job.stats(0)["cache"]
    kept = states(tmp_path / "local0") == KEPT
    assert kept.any() and cache["held_bytes"] >= int(Store(str(store), check_shards=False).index.blob_stored[kept].sum())
