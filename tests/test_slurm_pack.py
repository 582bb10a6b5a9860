"""Issue 27: slurm/pack.sbatch under a real Slurm (three slurmd on this host): ``sbatch -N 3 slurm/pack.sbatch SRC
STORE ...`` as its header says, ``srun --mpi=pmi2`` ranks packing shards together; the store is the one a single
node packs, and a failure is one line in the job's log with nothing left anywhere.
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set
from support.archives import gnu_tar, member, tar_bytes
from support.slurm_jobs import leftovers
from test_pack_ranks import contents

pytestmark = pytest.mark.slow  # a real Slurm

SBATCH = Path(__file__).resolve().parent.parent / "slurm" / "pack.sbatch"


def _submit(slurm, *args: str | os.PathLike) -> int:
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # fanfs on PATH, as a user's environment has it
    return slurm.submit(SBATCH, *args, sbatch_options=["-N", "3"], env={"PATH": path})


def test_a_pack_job_on_three_nodes(slurm, tmp_path):
    src = tmp_path / "photos"
    make_photo_set(src / "train", 40)
    archive = gnu_tar(src, tmp_path / "photos.tar")
    options = ("--progressive-jpeg", "--shard-size", "512K", "--jobs", "1")
    job = _submit(slurm, archive, tmp_path / "store", *options)
    result = slurm.wait(job, timeout=300)
    output = slurm.output(job)
    assert result == ("COMPLETED", 0, 0), output
    assert "shards packed by 3 ranks" in output and "error" not in output.lower(), output
    fanfs("pack", archive, tmp_path / "one", *options, "--quiet")
    assert contents(tmp_path / "store") == contents(tmp_path / "one")
    assert not leftovers(slurm, job)


def test_a_failing_pack_job_says_why_once_and_leaves_nothing(slurm, tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.tar").write_bytes(tar_bytes([member("same.txt", name.encode())], tarfile.GNU_FORMAT))
    job = _submit(slurm, tmp_path / "a.tar", tmp_path / "b.tar", tmp_path / "store")
    result = slurm.wait(job, timeout=300)
    output = slurm.output(job)
    assert result.state == "FAILED" and result.exit_code == 1, output
    errors = [line for line in output.splitlines() if line.startswith("fanfs: error:")]
    assert len(errors) == 1 and "name clash: same.txt" in errors[0], output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "b.tar"]
    assert not leftovers(slurm, job)
