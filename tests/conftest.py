"""Shared fixtures: real FUSE mounts, always unmounted; a private runtime directory; the session's real Slurm.

Helpers that are not tests live in ``tests/support/`` (a package) and, when the benchmarks use them
too, in ``tools/`` (``fanfs_command``: the ``fanfs`` command and mounts; ``photo_samples``,
``float_samples``, ``photo_folder``): both are put on ``sys.path`` here.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS.parent / "tools")]

from fanfs_command import fanfs, mounted  # noqa: E402


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


# --- a real Slurm (tests/support/slurm_cluster.py), for the job script's tests -----------------------------

@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """The session's cluster: started once (well under a second), always shut down with every job."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("needs Debian's slurmctld slurmd slurm-client munge (tools/setup --test installs them)")
    from support.slurm_cluster import slurm_cluster
    from support.slurm_jobs import NODES
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
    from support.slurm_jobs import submit
    return submit(slurm, slurm_plain[1], tmp_path_factory.mktemp("limited"), "--sleep", "600", options=("--time=1",))
