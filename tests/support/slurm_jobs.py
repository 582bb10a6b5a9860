"""Jobs under the tests' real Slurm (tools/slurm_cluster.py; its fixtures are in tests/conftest.py):
submitting slurm/train.sbatch as the README says, and looking for anything a job left behind."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .processes import mpi_segments, mpi_segments_left

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "slurm" / "train.sbatch"
TASK = Path(__file__).resolve().parent / "slurm_task.py"
NODES = 3


def submit(slurm, store: Path, out: Path, *task_args: str, env: dict[str, str] | None = None, nodes: int = NODES,
           options: tuple[str, ...] = (), cwd: Path | None = None) -> int:
    """``sbatch -N 3 slurm/train.sbatch STORE python slurm_task.py OUT '$FANFS_MNT' ...`` with fanfs on PATH, submitted
    from ``cwd`` (default: the cluster's job directory)."""
    out.mkdir(exist_ok=True)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    segments = mpi_segments()
    job = slurm.submit(SBATCH, store, sys.executable, TASK, out, "$FANFS_MNT", *task_args,
                        sbatch_options=["-N", str(nodes), *options], env={"PATH": path, **(env or {})}, cwd=cwd)
    if nodes > 1:  # a job of one node never starts MPI
        SEGMENTS_BEFORE[job] = segments, nodes
    return job


SEGMENTS_BEFORE: dict[int, tuple[set[str], int]] = {}
"""The MPI segments in /dev/shm when each job was submitted, and its nodes: what it left is new ones."""


def reports(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def leftovers(slurm, job: int) -> list[str]:
    """Anything of the job still on a node: its directories, mounts, processes and MPI segments in /dev/shm."""
    found = [str(p) for node in slurm.nodes for p in (slurm.base_dir / "tmp" / node).glob(f"fanfs-{job}-*")]
    found += [f"/dev/shm/{name}" for name in mpi_segments_left(*SEGMENTS_BEFORE[job])] if job in SEGMENTS_BEFORE else []
    with open("/proc/mounts") as f:
        found += [line.strip() for line in f if f"fanfs-{job}-" in line]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}".encode() in env and "slurmstepd" not in cmd:
            found.append(f"pid {pid}: {cmd}")
    return found


def assert_nothing_left(slurm, job: int) -> None:
    deadline = time.monotonic() + 5  # a final state means Slurm saw the job's processes go
    while (left := leftovers(slurm, job)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, (left, {p: sorted(os.listdir(p)) for p in left if os.path.isdir(p)}, slurm.output(job))
