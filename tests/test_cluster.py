"""Issue 5: shards spread over node-local dirs, peers serving each other over MPI (real mpiexec, real mounts).

Three "nodes" run on this host as ``mpiexec -n 3``, each with its own local dir and mount point
(``{rank}`` in the paths).  Every job is killed and every mount point lazily unmounted however a
test ends, and every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import fanfs, force_unmount

from fanfs.serve.control import request
from fanfs.store.format import INDEX_NAME, shard_name
from fanfs.store.index import Index
from fanfs.cluster.placement import place
from fanfs.store import Store

MPIEXEC = Path(sys.executable).parent / "mpiexec"
NODES = 3
pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """About 240 files of 0.1-200 KB in ~30 shards of 256 KB of source each."""
    base = tmp_path_factory.mktemp("cluster")
    src = base / "src"
    rng = random.Random(5)
    for d in range(4):
        (src / f"class{d}").mkdir(parents=True)
        for i in range(60):
            size = rng.randint(100, 200_000)
            (src / f"class{d}" / f"{i}.bin").write_bytes(rng.randbytes(size // 3) + bytes(size - size // 3))
    store = base / "store"
    fanfs("pack", src, store, "--shard-size", "256K", "--quiet")
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*.bin"))
    return src, store, files


def mpiexec(*args: str | os.PathLike, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([str(MPIEXEC), "-n", str(NODES), sys.executable, "-m", "fanfs", *map(str, args)],
                            start_new_session=True, **kwargs)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """Exit code of a job, killing its whole process group if it does not end in time."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise AssertionError(f"the MPI job did not end within {timeout} s") from None


def stage(store: Path, base: Path, replicas: int) -> str:
    with mpiexec("stage", store, base / "local{rank}", "--replicas", replicas, "--quiet",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            finish(proc, 10)
    assert proc.returncode == 0, err
    return out


class Job:
    """A mount job: ``mpiexec -n 3 fanfs mount ... --foreground``, each rank with its own dirs."""

    def __init__(self, store: Path, base: Path, replicas: int, *options: str) -> None:
        self.mounts = [base / f"mnt{rank}" for rank in range(NODES)]
        for mnt in self.mounts:
            mnt.mkdir(exist_ok=True)
        self.log = base / "job.log"
        self.logfile = open(self.log, "w")
        self.proc = mpiexec("mount", store, base / "mnt{rank}", "--local-dir", base / "local{rank}",
                            "--replicas", replicas, "--peer-timeout", "1", "--foreground", *options,
                            stdout=self.logfile, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Job":
        try:
            for mnt in self.mounts:
                fanfs("wait", mnt, "--timeout", "60", timeout=90)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                fanfs("umount", self.mounts[0], check=False, timeout=60)
            finish(self.proc, 60)
        finally:
            for mnt in self.mounts:
                force_unmount(mnt)
            self.logfile.close()

    def pids(self) -> list[int]:
        """The ranks' daemons (not mpiexec, whose command line holds the same words)."""
        out = subprocess.run(["pgrep", "-f", f"fanfs mount .*{self.mounts[0].parent}"], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split() if _command(int(p)) == os.fsencode(sys.executable)]

    def pid(self, rank: int) -> int:
        return request(self.mounts[rank], {"cmd": "status"})["pid"]

    def stats(self, rank: int) -> dict:
        return json.loads(fanfs("stats", self.mounts[rank], "--json").stdout)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:  # gone meanwhile
        return b""


def _read(path: str) -> bytes | int:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        return err.errno


def read_all(mnt: Path, files: list[str]) -> list[bytes | int]:
    """Every file through a mount, by four reader processes at once (as a DataLoader would)."""
    with ProcessPoolExecutor(4) as pool:
        return list(pool.map(_read, [str(mnt / f) for f in files], chunksize=8))


def assert_exact(src: Path, mnt: Path, files: list[str]) -> None:
    got = read_all(mnt, files)
    bad = [f for f, data in zip(files, got) if data != (src / f).read_bytes()]
    assert not bad, f"{len(bad)} files differ through {mnt}, e.g. {bad[:3]}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_placement_is_deterministic_balanced_and_distinct():
    rng = np.random.default_rng(1)
    sizes = rng.integers(100 << 20, 300 << 20, size=500)
    a, b = place(sizes, 16, 2), place(sizes.copy(), 16, 2)
    assert np.array_equal(a.holders, b.holders)
    assert all(len(set(row)) == 2 for row in a.holders.tolist())
    assert a.node_bytes.sum() == 2 * sizes.sum()
    assert a.node_bytes.max() - a.node_bytes.min() <= sizes.max()  # within one shard of each other
    assert place(sizes, 2, 5).replicas == 2  # capped at the node count
    assert sorted(a.remote_holders(7, a.holders[7][0])) == [a.holders[7][1]]


def test_info_shows_per_node_bytes(dataset):
    _, store, _ = dataset
    out = fanfs("info", store, "--nodes", "3", "--replicas", "2").stdout
    assert "placement  3 nodes, 2 replicas per shard" in out
    info = json.loads(fanfs("info", store, "--nodes", "3", "--replicas", "2", "--json").stdout)
    shard_bytes = info["shard_bytes"]["total"]
    assert sum(info["placement"]["node_bytes"]) == 2 * shard_bytes


def test_index_from_broadcast_bytes_equals_the_file(dataset):
    _, store, _ = dataset
    path = store / INDEX_NAME
    index = Index(str(path), data=path.read_bytes())
    assert index.meta == Index(str(path)).meta
    s = Store(str(store), index=index)
    assert s.read_file("class0/0.bin") == (dataset[0] / "class0" / "0.bin").read_bytes()
    s.close()


def test_single_node_stage_refuses_a_too_small_disk(dataset, tmp_path, monkeypatch):
    import shutil

    from fanfs.cluster.world import World
    from fanfs.errors import StoreError
    from fanfs.cluster.stage import stage as stage_shards
    _, store, _ = dataset
    index = Index(str(store / INDEX_NAME))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1000))
    with pytest.raises(StoreError, match="free but this node needs"):
        stage_shards(str(store), str(tmp_path / "local"), 1, World(), index, progress=False)
    assert not list((tmp_path / "local").iterdir())  # nothing was copied


def test_stage_places_verifies_and_resumes(dataset, tmp_path):
    _, store, _ = dataset
    out = stage(store, tmp_path, replicas=2)
    assert "staged 3 node(s), 2 replica(s)" in out and "already there 0 B" in out
    index = Index(str(store / INDEX_NAME))
    placement = place(index.shard_size, NODES, 2)
    for rank in range(NODES):
        held = sorted(p.name for p in (tmp_path / f"local{rank}").iterdir())
        assert held == [shard_name(s) for s in placement.shards_of(rank)]
    assert ": copied 0 B," in stage(store, tmp_path, replicas=2)  # a second run copies nothing
    victim = tmp_path / "local1" / shard_name(int(placement.shards_of(1)[0]))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(data)
    (tmp_path / "local2" / shard_name(int(placement.shards_of(2)[0]))).unlink()
    rerun = stage(store, tmp_path, replicas=2)
    rows = {line.split()[0]: line.split() for line in rerun.splitlines()[2:]}
    assert [rows[str(r)][2] for r in range(NODES)] == ["0", "1", "1"]  # only the damaged shards are copied again
    assert victim.read_bytes() == (store / "shards" / victim.name).read_bytes()


def test_every_mount_exact_with_remote_reads_and_clean_umount(dataset, tmp_path):
    src, store, files = dataset
    with Job(store, tmp_path, 1, "--stage") as job:
        for mnt in job.mounts:
            assert_exact(src, mnt, files)
        pids = job.pids()
        assert len(pids) == NODES
        for rank in range(NODES):
            c = job.stats(rank)["cluster"]
            assert c["local_bytes"] > 0 and c["remote_bytes"] > 0 and c["served_bytes"] > 0, c
            assert c["remote_requests"] > 0 and 0 < c["remote_latency_mean_ms"] <= c["remote_latency_max_ms"]
        before = [cpu_seconds(p) for p in pids]
        time.sleep(2)
        idle = [cpu_seconds(p) - b for p, b in zip(pids, before)]
        assert max(idle) < 0.3, f"idle daemons used {idle} s of CPU in 2 s"
        fanfs("umount", job.mounts[1], timeout=60)  # one node's umount ends the whole job
        assert finish(job.proc, 60) == 0, job.text()
    assert not any(os.path.ismount(m) for m in job.mounts)
    assert not job.pids()
    assert "job ending (rank 1 is done)" in job.text()


def test_replica_serves_missing_and_corrupt_shards(dataset, tmp_path):
    src, store, files = dataset
    stage(store, tmp_path, replicas=2)
    placement = place(Index(str(store / INDEX_NAME)).shard_size, NODES, 2)
    (tmp_path / "local0" / shard_name(int(placement.shards_of(0)[0]))).unlink()
    corrupt = tmp_path / "local1" / shard_name(int(placement.shards_of(1)[-1]))
    data = bytearray(corrupt.read_bytes())
    data[100:5000] = bytes(4900)
    corrupt.write_bytes(data)
    with Job(store, tmp_path, 2) as job:
        for mnt in job.mounts:
            assert_exact(src, mnt, files)
        os.kill(job.pid(2), signal.SIGTERM)  # SIGTERM to one node's daemon ends the whole job
        assert finish(job.proc, 60) == 0, job.text()
    log = job.text()
    assert "missing or incomplete" in log and "checksum mismatch" in log and "used peer#" in log
    assert not any(os.path.ismount(m) for m in job.mounts) and not job.pids()


def test_single_replica_fault_is_eio_not_a_hang(dataset, tmp_path):
    src, store, files = dataset
    stage(store, tmp_path, replicas=1)
    index = Index(str(store / INDEX_NAME))
    lost = int(place(index.shard_size, NODES, 1).shards_of(1)[0])
    (tmp_path / "local1" / shard_name(lost)).unlink()
    affected = {f for f in files if int(index.shard[index.lookup(f.encode())]) == lost}
    assert affected
    with Job(store, tmp_path, 1) as job:
        for mnt in (job.mounts[0], job.mounts[1]):
            started = time.monotonic()
            got = read_all(mnt, files)
            assert time.monotonic() - started < 30
            for f, data in zip(files, got):
                assert data == (errno.EIO if f in affected else (src / f).read_bytes()), f
    assert "no good copy" in job.text()


def test_silent_holder_is_skipped_after_the_timeout(dataset, tmp_path):
    src, store, files = dataset
    stage(store, tmp_path, replicas=2)
    with Job(store, tmp_path, 2) as job:
        stopped = job.pid(2)
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert_exact(src, job.mounts[0], files)
            assert time.monotonic() - started < 30
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert job.stats(0)["cluster"]["remote_timeouts"] >= 1
    assert "did not answer within 1 s" in job.text()


def test_peer_refuses_what_it_must_not_serve(dataset, tmp_path):
    _, store, _ = dataset
    script = Path(__file__).with_name("mpi_peer_refusals.py")
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script), store, tmp_path / "local{rank}"],
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("served ok") == 1 and done.stdout.count("refused ok") == 5, done.stdout
    assert done.stderr.count("peer: refused request from rank 0") == 5, done.stderr
    assert "peer: refused a malformed request from rank 0" in done.stderr


def test_remote_reads_carry_only_the_layers_the_fidelity_needs(tmp_path):
    from jpeg_samples import build_samples
    photos = sorted(p.name for p in build_samples(tmp_path / "src").values() if p.suffix == ".jpg")
    store = tmp_path / "store"
    fanfs("pack", tmp_path / "src", store, "--progressive-jpeg", "--shard-size", "64K", "--quiet")
    local = Store(str(store))
    with Job(store, tmp_path, 1, "--stage", "--fidelity", "2") as job:
        for rank, mnt in enumerate(job.mounts):
            assert [(mnt / p).read_bytes() for p in photos] == [local.read_file(p, 2) for p in photos]
            stats = job.stats(rank)
            assert len(stats["stored_by_layer"]) <= 2 and stats["cluster"]["remote_bytes"] > 0, stats
    local.close()


def test_auto_fidelity_is_resolved_once_for_the_job(tmp_path):
    from jpeg_samples import build_samples

    from fanfs.tune.fidelity import auto_fidelity
    build_samples(tmp_path / "src")
    store = tmp_path / "store"
    fanfs("pack", tmp_path / "src", store, "--progressive-jpeg", "--quiet")
    with Job(store, tmp_path, 1, "--stage", "--fidelity", "auto:0.9") as job:
        chosen = {job.stats(rank)["fidelity"] for rank in range(NODES)}
    local = Store(str(store))
    assert chosen == {auto_fidelity(local, 0.9, jobs=1)[0]}  # every node got rank 0's measurement
    local.close()
    assert job.log.read_text().count("fidelity auto:0.9 ->") == 1
