"""Issue 17.9/17.11: a job leaves nothing behind, and its daemons hold nothing of the launcher's.

MPI is finalised right after the job's start (its last collective call), so no rank holds an MPICH
shared-memory segment while the job serves and none is left in /dev/shm afterwards; the daemon a rank
forks keeps none of the launcher's descriptors; a daemon killed with -9 leaves no dead mount behind.
Jobs run as in tests/test_cluster.py (``mpiexec -disable-auto-cleanup -n 3``, one host).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from fanfs_command import fanfs
from support.processes import fd_targets, live_mpi_segments, mpi_segments, mpi_segments_left
from test_cluster import MPIEXEC, NODES, Job, assert_exact, dataset, finish, mpiexec  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow,  # mpiexec jobs of 3 nodes
              pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the pip mpich's mpiexec (tools/setup --test)")]


def _launcher_pids(job: Job) -> list[int]:
    """mpiexec and its Hydra proxies."""
    out = subprocess.run(["pgrep", "-P", str(job.proc.pid)], capture_output=True, text=True).stdout
    return [job.proc.pid, *map(int, out.split())]


def test_mpi_ends_at_the_start_and_daemons_hold_nothing_of_the_launcher(dataset, tmp_path):
    src, store, files = dataset
    before = mpi_segments()
    with Job(store, tmp_path, 1, "--stage") as job:
        assert_exact(src, job.mounts[0], files[:20])
        pids = job.pids()
        assert len(pids) == 2 * NODES
        assert live_mpi_segments(pids) == [], "MPI still holds its segments while the job serves"
        launcher = {target for pid in _launcher_pids(job) for target in fd_targets(pid).values()
                    if target.startswith(("socket:", "pipe:"))}
        for rank in range(NODES):
            daemon = job.pid(rank)
            inherited = {fd: t for fd, t in fd_targets(daemon).items() if fd > 2 and t in launcher}
            assert not inherited, f"rank {rank}'s daemon holds the launcher's {inherited}"
        fanfs("umount", job.mounts[0], timeout=60)
        assert finish(job.proc, 60) == 0, job.text()
    assert mpi_segments_left(before, hosts=1) == []


def test_an_agreed_failure_ends_mpi_on_every_rank_too(dataset, tmp_path):
    _, store, _ = dataset
    before = mpi_segments()
    for rank in (0, 2):
        (tmp_path / f"mnt{rank}").mkdir()
    (tmp_path / "mnt1").write_text("not a directory")  # rank 1 cannot mount: every rank fails alike
    proc = mpiexec("mount", store, tmp_path / "mnt{rank}", "--local-dir", tmp_path / "local{rank}", "--foreground",
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert finish(proc, 60) == 1
    err = proc.stderr.read()
    assert len(err.strip().splitlines()) == 1 and err.startswith("fanfs: error: rank 1: mount point"), err  # said once, by rank 0
    assert mpi_segments_left(before, hosts=1) == []


def _mounted(path) -> bool:
    """In the mount table: also a dead mount (ENOTCONN), which os.path.ismount may not see."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def test_a_daemon_killed_with_9_leaves_no_dead_mount(dataset, tmp_path):
    """Its rank detaches the dead mount (ENOTCONN to every reader) as soon as it sees the daemon die: the
    node's mount point is an empty directory again, and the others serve on."""
    src, store, files = dataset
    with Job(store, tmp_path, 2, "--stage") as job:
        os.kill(job.pid(2), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _mounted(job.mounts[2]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _mounted(job.mounts[2]) and os.listdir(job.mounts[2]) == []
        assert_exact(src, job.mounts[0], files)  # replicas on the live nodes
        fanfs("umount", job.mounts[0], timeout=60)
        assert finish(job.proc, 60) != 0  # the launcher reports the dead node
    assert not any(_mounted(m) for m in job.mounts)
