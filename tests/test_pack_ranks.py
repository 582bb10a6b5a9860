"""Issue 27: pack on the job's nodes: ``mpiexec -n N fanfs pack`` as a user types it (real ranks, the launcher's own
clean-up on), the store the same whatever N, and a failure anywhere one line from rank 0 with nothing left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import FANFS, fanfs
from photo_samples import make_photo_set
from support.archives import gnu_tar, make_dataset
from support.processes import mpi_segments, mpi_segments_left

from fanfs.pack.runner import local_runner
from fanfs.pack.shards import PackError
from fanfs.store.format import SHARD_DIR, SHARD_HEADER, read_index

MPIEXEC = Path(sys.executable).parent / "mpiexec"
pytestmark = [pytest.mark.slow,  # mpiexec jobs
              pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")]


def mpi_pack(ranks: int, *args: str | os.PathLike, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([str(MPIEXEC), "-n", str(ranks), *FANFS, "pack", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def contents(store: Path) -> tuple:
    """Everything a store holds but its id and creation time: header, columns, and each shard past its header (a
    shard's checksum covers its header, which names the store)."""
    meta, columns, *_ = read_index(str(store / "index"))
    meta = {k: v for k, v in meta.items() if k not in ("store_id", "created")}
    shards = [p.read_bytes()[SHARD_HEADER.size:] for p in sorted((store / SHARD_DIR).iterdir())]
    return meta, {name: np.array(column).tobytes() for name, column in sorted(columns.items())
                  if name != "shard_checksum"}, shards


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    src = make_dataset(root / "src", photos=4)
    make_photo_set(src / "more", 60)
    return src


@pytest.mark.parametrize("source", ["directory", "tar"])
def test_the_store_is_the_same_whatever_the_ranks(photos, tmp_path, source):
    src = photos if source == "directory" else gnu_tar(photos, tmp_path / "src.tar")
    options = ("--progressive-jpeg", "--float-records", "--shard-size", "512K", "--jobs", "1", "--quiet")
    fanfs("pack", src, tmp_path / "one", *options)
    for ranks in (2, 3):
        proc = mpi_pack(ranks, src, tmp_path / f"ranks{ranks}", *options)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        line = out.split("shards packed by")[1].splitlines()[0]
        counts = [int(n.replace(",", "")) for n in re.findall(r"rank \d+ ([\d,]+\d|\d)", line)]
        assert len(counts) == ranks and all(counts), out  # every rank packed some
        assert contents(tmp_path / f"ranks{ranks}") == contents(tmp_path / "one")
    fanfs("verify", tmp_path / "ranks3", "--against", src, "--quiet")


def _rank_process(rank: int, marker: str) -> int:
    """The pid of the rank ``rank`` of a running ``fanfs pack`` whose command line holds ``marker``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmdline and f"PMI_RANK={rank}".encode() in environ and b"janitor" not in cmdline:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if marker.encode() not in Path(f"/proc/{parent}/cmdline").read_bytes():  # the rank, not a worker
                return int(pid)
    raise AssertionError(f"no rank {rank}")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _slow_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.bin").write_bytes(os.urandom(1 << 20))
    return src


def _wait_for_shards(tmp_path: Path) -> None:
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("store.partial-*/shards/*")) and time.monotonic() < deadline:
        time.sleep(0.05)


def _nothing_left(tmp_path: Path, marker: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (list(tmp_path.glob("store*")) or _pids(marker)):
        time.sleep(0.1)
    assert not list(tmp_path.glob("store*")), list(tmp_path.iterdir())
    assert not _pids(marker), "processes left"


def _pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


def test_a_worker_killed_on_another_rank_fails_the_pack_with_one_line(tmp_path):
    src = _slow_source(tmp_path)
    proc = mpi_pack(2, src, tmp_path / "store", "--codec", "zstd:19", "--shard-size", "1M", "--jobs", "1", "-q")
    _wait_for_shards(tmp_path)
    rank1 = _rank_process(1, str(src))
    os.kill(_children(rank1)[0], signal.SIGKILL)  # as the OOM killer would
    out, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode != 0 and lines and lines[-1].startswith("fanfs: error: rank 1: a worker process failed"), err
    assert "Traceback" not in err and "BAD TERMINATION" not in err  # rank 0 said it; the launcher killed nobody
    _nothing_left(tmp_path, str(src))


def test_a_worker_dead_before_the_next_job_is_a_failed_job_not_a_crash():
    """The race the test above can lose: a worker dies between two waits and the next job meets a broken pool."""
    with local_runner(1) as runner:
        runner.pool.submit(os.kill, os.getpid(), 0).result()  # the worker is up
        for pid in list(runner.pool._processes):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not runner.pool._broken and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.start(None)  # type: ignore[arg-type] - a broken pool refuses any job before it looks at it
        with pytest.raises(PackError, match="a worker process failed: it was killed"):
            runner.finished(1)


def test_a_rank_killed_outright_leaves_nothing(tmp_path):
    """The launcher kills every rank when one dies; rank 0's keeper then removes the store being built, and the
    ranks' keepers MPI's segment in /dev/shm (MPI_Finalize removes it; a rank killed outright left it)."""
    before = mpi_segments()
    src = _slow_source(tmp_path)
    proc = mpi_pack(2, src, tmp_path / "store", "--codec", "zstd:19", "--shard-size", "1M", "--jobs", "1", "-q")
    _wait_for_shards(tmp_path)
    os.kill(_rank_process(1, str(src)), signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    _nothing_left(tmp_path, str(src))
    deadline = time.monotonic() + 10  # the keepers run once their rank is gone
    while mpi_segments_left(before, hosts=1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mpi_segments_left(before, hosts=1) == []


def test_an_unreadable_source_on_rank_0_stops_every_rank(tmp_path):
    proc = mpi_pack(3, tmp_path / "missing", tmp_path / "store")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip().splitlines() == [
        f"fanfs: error: cannot read source {tmp_path / 'missing'}: No such file or directory"], err
    assert not list(tmp_path.iterdir())
