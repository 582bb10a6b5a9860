"""Shared fixtures: run the real ``fanfs`` command and mount real FUSE file systems, always unmounted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def fanfs(*args: str | os.PathLike, check: bool = True, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m fanfs ARGS`` as a user would; returns the completed process."""
    done = subprocess.run([sys.executable, "-m", "fanfs", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"fanfs {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def force_unmount(mountpoint: Path) -> None:
    """Last-resort cleanup: lazy unmount and kill whatever daemon served it."""
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    for _ in range(100):
        if not os.path.ismount(mountpoint):
            break
        time.sleep(0.05)


def daemon_pids(mountpoint: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"fanfs mount .* {mountpoint}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@contextlib.contextmanager
def mounted(store: Path, mountpoint: Path, *options: str):
    """Mount with the real CLI; unmount (and kill a stuck daemon) however the block ends."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    fanfs("mount", store, mountpoint, *options)
    try:
        yield mountpoint
    finally:
        if os.path.ismount(mountpoint):
            fanfs("umount", mountpoint, check=False)
        force_unmount(mountpoint)
        for pid in daemon_pids(mountpoint):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def mount(tmp_path: Path):
    """``with mount(store, *options) as mnt:`` — a fresh mount point under tmp_path."""
    count = 0

    def _mount(store: Path, *options: str):
        nonlocal count
        count += 1
        return mounted(store, tmp_path / f"mnt{count}", *options)

    return _mount


@pytest.fixture(scope="session")
def runtime_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runtime")
    os.environ["FANFS_RUNTIME_DIR"] = str(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_runtime(runtime_dir):
    """Control sockets and logs of test mounts live in a private directory."""
    yield


# --- a real Slurm (tests/slurm_cluster.py), for the job script's tests -----------------------------

@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """The session's cluster: started once (well under a second), always shut down with every job."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("needs Debian's slurmctld slurmd slurm-client munge (tools/setup --test installs them)")
    from slurm_cluster import slurm_cluster
    from slurm_jobs import NODES
    with slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=NODES) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_plain(tmp_path_factory) -> tuple[Path, Path]:
    """A source tree (names with spaces, sizes from 0 to ~200 KB) and its store."""
    root = tmp_path_factory.mktemp("plain")
    src = root / "src"
    for i in range(120):
        path = src / f"dir {i % 4}" / f"file {i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i * 1700) + bytes(i * 300))
    fanfs("pack", src, root / "store", "--shard-size", "256K", "--quiet")
    return src, root / "store"


@pytest.fixture(scope="session")
def time_limited_job(slurm, slurm_plain, tmp_path_factory) -> int:
    """A 3-node job whose training sleeps past ``--time=1``: Slurm checks limits every 30 s, so it ends
    60-90 s after its start.  test_slurm.py asks for it first (it then runs while the other tests do);
    test_time_limit.py, later in the session, looks at how it ended."""
    from slurm_jobs import submit
    return submit(slurm, slurm_plain[1], tmp_path_factory.mktemp("limited"), "--sleep", "600", options=("--time=1",))


# --- what MPI may leave behind (/dev/shm segments) and what a process holds -----------------------

def fd_targets(pid: int) -> dict[int, str]:
    """A process's open descriptors and what they name ("socket:[N]", a path, "... (deleted)")."""
    found = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return found


def live_mpi_segments(pids) -> list[str]:
    """MPICH shared-memory segments still named in /dev/shm that these processes hold open."""
    return sorted({target for pid in pids for target in fd_targets(pid).values()
                   if target.startswith("/dev/shm/mpich_shm_") and not target.endswith("(deleted)")})


def mpi_segments() -> set[str]:
    """The MPICH shared-memory segments in /dev/shm now."""
    return {path.name for path in Path("/dev/shm").glob("mpich_shm_*")}


def mpi_segments_left(before: set[str], hosts: int) -> list[str]:
    """MPICH segments in /dev/shm that were not there ``before``, that no process holds any more, and that
    a job on ``hosts`` hosts makes: MPICH names them ``mpich_shm_HASH_N``, one per host N of the job (one
    host under mpiexec here, one per Slurm node).  Another job leaking at the same moment with as many
    hosts would count too."""
    held = {target for pid in filter(str.isdigit, os.listdir("/proc")) for target in fd_targets(int(pid)).values()}
    groups: dict[str, set[str]] = {}
    for name in mpi_segments() - before:
        if f"/dev/shm/{name}" not in held:
            job, _, host = name.rpartition("_")
            groups.setdefault(job, set()).add(host)
    return sorted(f"{job}_{host}" for job, found in groups.items() if found == {str(n) for n in range(hosts)}
                  for host in found)
