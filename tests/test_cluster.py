"""Issues 5 and 11: blobs spread over node-local dirs, peers serving each other, failures kept local.

Three (or four) "nodes" run on this host as ``mpiexec -disable-auto-cleanup -n N``, each with its own
local dir and mount point (``{rank}`` in the paths).  Every job is killed and every mount point lazily
unmounted however a test ends, and every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, force_unmount
from support.processes import stop

from fanfs.peers.placement import place
from fanfs.records import expand
from fanfs.serve.control import request
from fanfs.store import Store
from fanfs.store.format import INDEX_NAME, shard_name
from fanfs.store.index import Index

MPIEXEC = Path(sys.executable).parent / "mpiexec"
NODES = 3
pytestmark = [pytest.mark.slow,  # mpiexec jobs of 3 nodes
              pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")]


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


def mpiexec(*args: str | os.PathLike, nodes: int = NODES, launcher: list[str] | None = None,
            **kwargs) -> subprocess.Popen:
    """``fanfs ARGS`` on every rank; ``launcher``: another mpiexec command line (the emulated cluster's)."""
    # -disable-auto-cleanup: one rank's death must not make Hydra kill the others (docs/clusters.rst, "Many nodes")
    prefix = launcher or [str(MPIEXEC), "-disable-auto-cleanup", "-n", str(nodes)]
    return subprocess.Popen([*prefix, sys.executable, "-m", "fanfs", *map(str, args)], start_new_session=True, **kwargs)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """Exit code of a job, killing its whole process group if it does not end in time."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise AssertionError(f"the MPI job did not end within {timeout} s") from None


def stage(store: Path | str, base: Path, replicas: int, *options: str, nodes: int = NODES,
          launcher: list[str] | None = None, local: str = "local{rank}") -> str:
    """``fanfs stage`` on every rank (its output); ``launcher`` and ``local`` as for :class:`Job`."""
    with mpiexec("stage", store, base / local, "--replicas", replicas, "--quiet", *options, nodes=nodes,
                 launcher=launcher, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            finish(proc, 10)
    assert proc.returncode == 0, err
    return out


class Job:
    """A mount job: ``mpiexec -n N fanfs mount ... --foreground``, each rank with its own dirs (``mnt`` and
    ``local`` under ``base``, with ``{rank}``); ``launcher`` as for :func:`mpiexec`."""

    def __init__(self, store: Path | str, base: Path, replicas: int, *options: str, nodes: int = NODES,
                 descriptors: int | None = None, launcher: list[str] | None = None, mnt: str = "mnt{rank}",
                 local: str = "local{rank}") -> None:
        """``descriptors``: the job's limit on open files (each process of it may open that many)."""
        self.mounts = [base / mnt.format(rank=rank) for rank in range(nodes)]
        for mountpoint in self.mounts:
            mountpoint.mkdir(exist_ok=True)
        self.log = base / "job.log"
        self.logfile = open(self.log, "w")
        self.proc = mpiexec("mount", store, base / mnt, "--local-dir", base / local, "--replicas", replicas,
                            "--peer-timeout", "1", "--foreground", *options, nodes=nodes, launcher=launcher,
                            stdout=self.logfile, stderr=subprocess.STDOUT,
                            preexec_fn=descriptors and (lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                                   (descriptors, descriptors))))

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
                for mnt in self.mounts:
                    if os.path.ismount(mnt):
                        fanfs("umount", mnt, check=False, timeout=60)
                        break
            finish(self.proc, 60)
        finally:
            for mnt in self.mounts:
                force_unmount(mnt)
            self.logfile.close()

    def pids(self) -> list[int]:
        """The job's fanfs processes, ranks and their daemons (not mpiexec, whose command line holds the same words)."""
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
    assert not bad, f"{len(bad)} files differ through {mnt}, e.g. {bad[:3]}: {[g for f, g in zip(files, got) if f in bad[:3]]}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def holders_of(index: Index, placement, path: str) -> set[int]:
    """The nodes holding any blob of a file."""
    entry = index.lookup(path.encode())
    first, count = int(index.first[entry]), int(index.count[entry])
    return {node for blob in range(first, first + count) for node in placement.holders(blob)}


def test_placement_is_deterministic_balanced_and_distinct():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1_000, 300_000, size=5000)
    a, b = place(sizes, 16, 2), place(sizes.copy(), 16, 2)
    assert np.array_equal(a.bounds, b.bounds)
    assert all(len(set(a.holders(blob))) == 2 for blob in range(0, sizes.size, 7))
    assert a.node_bytes.sum() == 2 * sizes.sum()
    assert a.node_bytes.max() - a.node_bytes.min() <= 4 * sizes.max()  # within a few blobs of each other
    assert place(sizes, 2, 5).replicas == 2  # capped at the node count
    held = sum(int(a.holds(node, 123)) for node in range(16))
    assert held == 2 and sorted(a.remote_holders(123, a.holders(123)[0])) == [a.holders(123)[1]]


def test_a_small_default_packed_store_is_spread_evenly(tmp_path):
    """608 files of ~28 KB (17 MiB) packed with defaults: every node within 10% of the mean."""
    src = tmp_path / "src"
    rng = np.random.default_rng(3)
    for i in range(608):
        (src / f"c{i % 8}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 8}" / f"{i}.bin").write_bytes(rng.bytes(int(rng.integers(20_000, 36_000))))
    fanfs("pack", src, tmp_path / "store", "--quiet")
    for nodes, replicas in ((3, 1), (4, 2), (16, 2)):
        info = json.loads(fanfs("info", tmp_path / "store", "--nodes", nodes, "--replicas", replicas, "--json").stdout)
        node_bytes = np.array(info["placement"]["node_bytes"])
        assert np.abs(node_bytes / node_bytes.mean() - 1).max() < 0.10, (nodes, replicas, node_bytes)
    assert "every node within" in fanfs("info", tmp_path / "store", "--nodes", 16, "--replicas", 2).stdout
    staged = stage(tmp_path / "store", tmp_path, replicas=1)  # the real staging of the same spread
    copied = [sum(p.stat().st_blocks * 512 for p in (tmp_path / f"local{r}").iterdir()) for r in range(NODES)]
    assert max(copied) < 1.1 * min(copied), (copied, staged)


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

    from fanfs.cache.stage import stage as stage_shards
    from fanfs.peers.world import World
    from fanfs.errors import StoreError
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
    placement = place(index.blob_stored, NODES, 2)
    files = np.flatnonzero(index.type == 1)
    blob_of, owner = expand(index.first[files], index.count[files])
    shard_of = dict(zip(blob_of.tolist(), index.shard[files][owner].tolist()))
    for rank in range(NODES):  # every held blob is in the node's sparse copy, byte for byte
        held = [b for lo, hi in placement.ranges_of(rank) for b in range(lo, hi)]
        for blob in held[::3]:
            offset, length = int(index.blob_offset[blob]), int(index.blob_stored[blob])
            local = (tmp_path / f"local{rank}" / shard_name(shard_of[blob])).read_bytes()[offset:offset + length]
            assert local == (store / "shards" / shard_name(shard_of[blob])).read_bytes()[offset:offset + length]
    assert ": copied 0 B," in stage(store, tmp_path, replicas=2)  # a second run copies nothing
    blob = placement.ranges_of(1)[0][0]
    victim = tmp_path / "local1" / shard_name(shard_of[blob])
    data = bytearray(victim.read_bytes())
    data[int(index.blob_offset[blob])] ^= 0xFF
    victim.write_bytes(data)
    gone = tmp_path / "local2" / shard_name(shard_of[placement.ranges_of(2)[0][0]])
    gone.unlink()
    rerun = stage(store, tmp_path, replicas=2)
    rows = {line.split()[0]: line.split() for line in rerun.splitlines()[2:]}
    assert [rows[str(r)][2] for r in range(NODES)] == ["0", "1", "1"]  # only the damaged copies are mended
    assert victim.read_bytes()[int(index.blob_offset[blob])] == data[int(index.blob_offset[blob])] ^ 0xFF
    assert gone.exists()


def test_every_mount_exact_with_remote_reads_and_clean_umount(dataset, tmp_path):
    src, store, files = dataset
    with Job(store, tmp_path, 1, "--stage", "--workers", "2") as job:
        for mnt in job.mounts:
            assert_exact(src, mnt, files)
        pids = job.pids()
        assert len(pids) == 4 * NODES  # each node: the rank the launcher started, its daemon, 2 serving processes
        for rank in range(NODES):
            c = job.stats(rank)["cluster"]
            assert c["local_bytes"] > 0 and c["remote_bytes"] > 0 and c["served_bytes"] > 0, c
            assert c["remote_requests"] > 0 and 0 < c["remote_latency_mean_ms"] <= c["remote_latency_max_ms"]
        before = [cpu_seconds(p) for p in pids]
        time.sleep(2)
        idle = [cpu_seconds(p) - b for p, b in zip(pids, before)]
        assert max(idle) < 0.1, f"idle daemons used {idle} s of CPU in 2 s"
        fanfs("umount", job.mounts[1], timeout=60)  # one node's umount ends the whole job
        assert finish(job.proc, 60) == 0, job.text()
    assert not any(os.path.ismount(m) for m in job.mounts)
    assert not job.pids()
    assert "job ending (rank 1 is done)" in job.text()


def test_replica_serves_missing_and_corrupt_copies(dataset, tmp_path):
    src, store, files = dataset
    stage(store, tmp_path, replicas=2)
    index = Index(str(store / INDEX_NAME))
    placement = place(index.blob_stored, NODES, 2)
    files_ = np.flatnonzero(index.type == 1)
    blob_of, owner = expand(index.first[files_], index.count[files_])
    shard_of = dict(zip(blob_of.tolist(), index.shard[files_][owner].tolist()))
    (tmp_path / "local0" / shard_name(shard_of[placement.ranges_of(0)[0][0]])).unlink()
    corrupt = tmp_path / "local1" / shard_name(shard_of[placement.ranges_of(1)[0][1] - 1])
    data = bytearray(corrupt.read_bytes())
    blob = placement.ranges_of(1)[0][1] - 1
    data[int(index.blob_offset[blob]):int(index.blob_offset[blob]) + 100] = bytes(100)
    corrupt.write_bytes(data)
    with Job(store, tmp_path, 2) as job:
        for mnt in job.mounts:
            assert_exact(src, mnt, files)
        os.kill(job.pid(2), signal.SIGTERM)  # SIGTERM to one node's daemon ends the whole job
        assert finish(job.proc, 60) == 0, job.text()
    log = job.text()
    assert "missing or incomplete" in log and "checksum mismatch" in log and "used peer#" in log
    assert not any(os.path.ismount(m) for m in job.mounts) and not job.pids()


def _kill_mid_read(dataset, tmp_path, replicas: int):
    """kill -9 rank 2's daemon while rank 0 and 1 are being read; returns (job, what they read after)."""
    src, store, files = dataset
    stage(store, tmp_path, replicas=replicas)
    with Job(store, tmp_path, replicas) as job:
        victim = job.pid(2)
        reading = threading.Thread(target=read_all, args=(job.mounts[0], files))
        reading.start()
        time.sleep(0.2)
        os.kill(victim, signal.SIGKILL)
        reading.join(120)
        got = {rank: read_all(job.mounts[rank], files) for rank in (0, 1)}
        assert job.proc.poll() is None, "the launcher ended the job when one node died"
        assert all(os.path.ismount(job.mounts[rank]) for rank in (0, 1))
        assert len(os.listdir(job.mounts[0])) == 4  # never an emptied mount point
        fanfs("umount", job.mounts[0], timeout=60)  # the job still ends cleanly, within seconds
        code = finish(job.proc, 30)
    assert code != 0  # the launcher reports the killed rank
    assert not any(os.path.ismount(m) for m in job.mounts) and not job.pids()
    return got


def test_a_dead_node_with_replicas_takes_nothing_down(dataset, tmp_path):
    src, _, files = dataset
    got = _kill_mid_read(dataset, tmp_path, replicas=2)
    for rank in (0, 1):
        bad = [f for f, data in zip(files, got[rank]) if data != (src / f).read_bytes()]
        assert not bad, (rank, bad[:3])


def test_a_dead_node_without_replicas_costs_nothing_its_blobs_come_from_the_shared_store(dataset, tmp_path):
    """Issue 50: a blob no live node holds is read from the shared store, as a replica's would be (it was an EIO for
    every file of the dead node's, though the store was intact)."""
    src, store, files = dataset
    got = _kill_mid_read(dataset, tmp_path, replicas=1)
    index = Index(str(store / INDEX_NAME))
    lost = {f for f in files if holders_of(index, place(index.blob_stored, NODES, 1), f) & {2}}
    assert lost and len(lost) < len(files)
    for rank in (0, 1):
        bad = [f for f, data in zip(files, got[rank]) if data != (src / f).read_bytes()]
        assert not bad, (rank, bad[:3])


def test_local_reads_go_on_while_a_peer_is_stopped(dataset, tmp_path):
    src, store, files = dataset
    stage(store, tmp_path, replicas=2)
    index = Index(str(store / INDEX_NAME))
    placement = place(index.blob_stored, NODES, 2)
    local = [f for f in files if holders_of(index, placement, f) <= {0, 1} and 0 in holders_of(index, placement, f)
             and placement.holds_range(0, int(index.first[index.lookup(f.encode())]),
                                       int(index.count[index.lookup(f.encode())]))]
    remote = [f for f in files if f not in local and holders_of(index, placement, f) & {2}]
    with Job(store, tmp_path, 2) as job:
        stopped = job.pid(2)
        stop(stopped)
        try:
            done = {}
            waiting = threading.Thread(target=lambda: done.setdefault("remote", read_all(job.mounts[0], remote)))
            waiting.start()
            time.sleep(0.1)
            assert waiting.is_alive()  # stuck on the stopped peer (for the 1 s peer timeout, per holder)
            local_got = read_all(job.mounts[0], local)
            still_waiting = waiting.is_alive()
            waiting.join(120)
            assert local_got == [(src / f).read_bytes() for f in local]
            assert done["remote"] == [(src / f).read_bytes() for f in remote]  # failed over to a replica
            assert still_waiting or len(remote) < 8, "local reads were not served while the remote ones waited"
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert job.stats(0)["cluster"]["remote_timeouts"] >= 1
    assert "did not answer within 1 s" in job.text()


def test_remote_reads_carry_only_the_layers_the_fidelity_needs(tmp_path):
    from support.jpeg_samples import build_samples
    photos = sorted(p.name for p in build_samples(tmp_path / "src").values() if p.suffix == ".jpg")
    store = tmp_path / "store"
    fanfs("pack", tmp_path / "src", store, "--progressive-jpeg", "--shard-size", "64K", "--quiet")
    local = Store(str(store))
    placement = place(local.index.blob_stored, NODES, 1)
    entries = [local.lookup(p.encode()) for p in photos]
    with Job(store, tmp_path, 1, "--stage", "--fidelity", "2") as job:
        for rank, mnt in enumerate(job.mounts):
            assert [(mnt / p).read_bytes() for p in photos] == [local.read_file(p, 2) for p in photos]
            stats = job.stats(rank)
            assert len(stats["stored_by_layer"]) <= 2 and stats["cluster"]["remote_bytes"] > 0, stats
            remote = [e for e in entries
                      if not placement.holds_range(rank, int(local.index.first[e]), min(2, int(local.index.layers[e])))]
            # a remote photo's two layers come in one round trip (but at the edge of two nodes' ranges)
            assert len(remote) <= stats["cluster"]["remote_requests"] <= len(remote) + 1, stats
    local.close()


def test_auto_fidelity_is_resolved_once_for_the_job(tmp_path):
    from support.jpeg_samples import build_samples

    from fanfs.tune.fidelity import auto_fidelity
    build_samples(tmp_path / "src")
    store = tmp_path / "store"
    fanfs("pack", tmp_path / "src", store, "--progressive-jpeg", "--quiet")
    with Job(store, tmp_path, 1, "--stage", "--fidelity", "auto:0.9") as job:
        chosen = {job.stats(rank)["fidelity"] for rank in range(NODES)}
    local = Store(str(store))
    assert chosen == {str(auto_fidelity(local, 0.9, jobs=1)[0])}  # every node got rank 0's measurement
    local.close()
    assert job.log.read_text().count("fidelity auto:0.9 ->") == 1


ATTACKER = """
import os, socket, sys, time
store_id = bytes.fromhex(sys.argv[1])
heard = 0
for address in sys.argv[2:]:
    host, port = address.rsplit(":", 1)
    target = (host, int(port))
    for rank in range(4):  # the old protocol's hello and BYE, then the new hello with a guessed proof and a BYE
        for attempt in (b"FANFSPR1" + os.urandom(32) + store_id + rank.to_bytes(4, "little") + bytes([2]) + bytes(8),
                        b"FANFSPR3" + store_id + rank.to_bytes(4, "little") + bytes(4) + os.urandom(32 + 32 + 25)):
            try:
                with socket.create_connection(target, timeout=2) as sock:
                    sock.sendall(attempt)
                    sock.settimeout(2)
                    while data := sock.recv(4096):
                        heard += len(data)
            except OSError:
                pass
flood = []
for address in sys.argv[2:]:
    host, port = address.rsplit(":", 1)
    failures = 0
    while len(flood) < 1500 * (sys.argv.index(address) - 1) and failures < 20:
        try:
            flood.append(socket.create_connection((host, int(port)), timeout=0.5))
            failures = 0
        except OSError:
            failures += 1
print(heard, len(flood), flush=True)
sys.stdin.read()  # hold the flood until told to stop
"""


@pytest.mark.root("to act as another user (setpriv)")
def test_another_local_user_can_neither_read_a_blob_end_a_job_nor_stop_a_node(dataset, tmp_path):
    """Issue 17: as ``nobody``, against every node of a running job whose processes may open 256 files (as in
    the audit): the old protocol's BYE, hellos with guessed proofs for every rank, then thousands of held
    connections.  Nothing of a blob comes back (only handshake challenges), no mount ends, and every node
    keeps serving its peers and readers throughout."""
    src, store, files = dataset
    stage(store, tmp_path, replicas=1)
    with Job(store, tmp_path, 1, descriptors=256) as job:
        addresses = [":".join(map(str, job.stats(rank)["cluster"]["peer_address"])) for rank in range(NODES)]
        store_id = json.loads(fanfs("info", store, "--json").stdout)["store_id"]
        attacker = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                     sys.executable, "-c", ATTACKER, store_id, *addresses],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            heard, held = map(int, attacker.stdout.readline().split())
            assert heard <= 4 * NODES * 64  # at most one 64-byte challenge per guessed hello: no blob byte
            assert held > NODES * 200  # far more than a node keeps: it closes the oldest as new ones come
            assert_exact(src, job.mounts[1], files)  # remote reads between the nodes, during the flood
        finally:
            attacker.communicate("", timeout=60)
        assert_exact(src, job.mounts[2], files)
        assert job.proc.poll() is None and all(os.path.ismount(m) for m in job.mounts)
        assert sum(job.stats(rank)["cluster"]["refused"] for rank in range(NODES)) >= 4 * NODES
