"""slurm/train.sbatch under a real Slurm: a controller and three slurmd (n1..n3) on this host.

Every job is submitted exactly as the README says (``sbatch -N 3 slurm/train.sbatch STORE COMMAND...``)
with ``fanfs`` on PATH, and its training command is ``tests/support/slurm_task.py``, run as one task per node.
After every job, whatever its end, nothing of it may be left: no mount, no process, no directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fanfs_command import fanfs
from support.slurm_jobs import NODES, assert_nothing_left, leftovers, reports, submit


pytestmark = pytest.mark.slow  # see docs/userguide.rst, 'Quick start'


@pytest.fixture(scope="module", autouse=True)
def _time_limit_running(time_limited_job) -> None:
    """Submitted before this module's jobs, so that its minute passes while they run (test_time_limit.py)."""


def test_job_reads_every_file_exactly_on_every_node(slurm, slurm_plain, tmp_path):
    src, store = slurm_plain
    started = time.monotonic()
    job = submit(slurm, store, tmp_path / "out", "--source", str(src), "two words", "$FANFS_MNT/x",
                 env={"FANFS_WORKERS": "2"})
    result = slurm.wait(job, timeout=120)
    output = slurm.output(job)
    assert result == ("COMPLETED", 0, 0), output
    assert "error" not in output.lower(), output
    print(f"job wall time (stage + mount + read + unmount, {NODES} nodes): {time.monotonic() - started:.1f} s")
    got = reports(tmp_path / "out")
    assert sorted(r["node"] for r in got.values()) == slurm.nodes
    mounts = {r["mnt"] for r in got.values()}
    assert len(mounts) == NODES, "every node has its own mount point"
    for r in got.values():
        assert r["files"] == 120 and not r["mismatches"], r
        assert r["env_mnt"] == r["mnt"] and f"-{r['node']}" in r["mnt"]
        assert r["extra"] == ["two words", r["mnt"] + "/x"], "arguments arrive as given, $FANFS_MNT replaced"
        assert r["fidelity"] == "full" and r["workers"] == 2
        assert r["run"], "issue 48: a task reads its node's mount in-process by default (fanfs run)"
    assert "read in-process" in output
    assert_nothing_left(slurm, job)


def test_one_node_job_ends_clean_too(slurm, slurm_plain, tmp_path):
    """And FANFS_RUN=0 runs the training command as it is: every read through the mount."""
    src, store = slurm_plain
    job = submit(slurm, store, tmp_path / "out", "--source", str(src), nodes=1, env={"FANFS_RUN": "0"})
    result = slurm.wait(job, timeout=120)
    assert result == ("COMPLETED", 0, 0), slurm.output(job)
    (report,) = reports(tmp_path / "out").values()
    assert report["files"] == 120 and not report["mismatches"], report
    assert not report["run"] and not report["in_process_files"], report
    assert_nothing_left(slurm, job)


def test_a_job_submitted_beside_a_clone_named_fanfs_runs(slurm, slurm_plain, tmp_path):
    """Issue 50: submitted from a home directory that holds a clone of the checkout (git's default name, fanfs), every
    step failed with "cannot import name '__version__'": ``python -m fanfs`` imported that folder.  The steps now run
    this installation's fanfs whatever their directory holds (the installed package, as a user's venv has it: no
    PYTHONPATH naming the checkout)."""
    src, store = slurm_plain
    home = tmp_path / "home"
    (home / "fanfs" / "fanfs").mkdir(parents=True)
    (home / "fanfs" / "README.rst").write_text("a clone of the checkout\n")
    job = submit(slurm, store, tmp_path / "out", "--source", str(src), nodes=2, cwd=home, env={"PYTHONPATH": ""})
    result = slurm.wait(job, timeout=120)
    assert result == ("COMPLETED", 0, 0), slurm.output(job)
    assert "Traceback" not in slurm.output(job)
    got = reports(tmp_path / "out")
    assert len(got) == 2 and all(r["files"] == 120 and not r["mismatches"] for r in got.values()), got
    assert_nothing_left(slurm, job)


def test_a_job_without_fuse_reads_every_file_in_process_on_every_node(slurm, slurm_plain, tmp_path):
    """FANFS_MOUNT=0: the nodes stage and serve each other but mount nothing; each task reads every file
    in-process (fsspec.filesystem("fanfs", job=True)), a third of them from peers (3 nodes, 2 replicas)."""
    src, store = slurm_plain
    job = submit(slurm, store, tmp_path / "out", "--source", str(src), "--in-process", env={"FANFS_MOUNT": "0"})
    result = slurm.wait(job, timeout=120)
    output = slurm.output(job)
    assert result == ("COMPLETED", 0, 0), output
    assert "error" not in output.lower(), output
    got = reports(tmp_path / "out")
    assert sorted(r["node"] for r in got.values()) == slurm.nodes
    for r in got.values():
        assert r["files"] == 120 and not r["mismatches"], r
        assert r["env_mnt"] == r["mnt"] and not r["mounted"] and r["remote_requests"] > 0, r
    assert_nothing_left(slurm, job)


def test_a_lazily_staged_job_within_a_capacity(slurm, slurm_plain, tmp_path):
    """Issue 30: FANFS_STAGE=lazy starts training at once; FANFS_CAPACITY holds each node's cache to a budget smaller
    than its share (3 nodes, 2 replicas): every file exact on every node, the rest read through."""
    src, store = slurm_plain
    share = 2 * sum(p.stat().st_size for p in (store / "shards").iterdir()) // NODES
    job = submit(slurm, store, tmp_path / "out", "--source", str(src),
                 env={"FANFS_STAGE": "lazy", "FANFS_CAPACITY": str(share // 3)})
    result = slurm.wait(job, timeout=120)
    output = slurm.output(job)
    assert result == ("COMPLETED", 0, 0), output
    assert "error" not in output.lower() and "staged" not in output, output  # nothing staged before training
    got = reports(tmp_path / "out")
    assert sorted(r["node"] for r in got.values()) == slurm.nodes
    for r in got.values():
        assert r["files"] == 120 and not r["mismatches"], r
        cache = r["cache"]
        assert cache["capacity"] == share // 3 and 0 < cache["held_bytes"] <= share // 3, r
        assert cache["fills"] > 0 and cache["read_through_bytes"] > 0, r
    assert_nothing_left(slurm, job)


def test_missing_store_fails_at_once(slurm, tmp_path):
    """At once: before any node stages, mounts or trains (no report), not by a time limit; bounded only as a hang."""
    job = submit(slurm, tmp_path / "no-such-store", tmp_path / "out")
    result = slurm.wait(job, timeout=120)
    output = slurm.output(job)
    assert result.state == "FAILED", (result, output)
    errors = [line for line in output.splitlines() if "error" in line]
    assert len(errors) == 1 and "no-such-store: no such store directory" in errors[0], output
    assert not reports(tmp_path / "out")
    assert_nothing_left(slurm, job)


def test_one_node_failing_to_mount_fails_the_job_with_its_reason(slurm, slurm_plain, tmp_path):
    """n2's mount point cannot be made; n1 and n3 had made theirs and must not wait, nor keep them."""
    (tmp_path / "mnt-n2").write_text("in the way")
    job = submit(slurm, slurm_plain[1], tmp_path / "out", env={"FANFS_MNT": str(tmp_path / "mnt-{node}")})
    result = slurm.wait(job, timeout=60)
    output = slurm.output(job)
    assert result.state == "FAILED", output
    errors = [line for line in output.splitlines() if "error" in line]
    assert len(errors) == 1 and "mnt-n2 on node n2" in errors[0], output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt-n2", "out"], "n1's and n3's mount points removed"
    assert not reports(tmp_path / "out")
    assert_nothing_left(slurm, job)


def test_a_mount_point_above_the_local_dir_fails_the_job_at_once(slurm, slurm_plain, tmp_path):
    """FANFS_MNT an ancestor of FANFS_LOCAL: each node's daemon would read its shards through its own
    mount and hang; every node refuses it before mounting, with one line for the job."""
    local = tmp_path / "local"
    local.mkdir()
    job = submit(slurm, slurm_plain[1], tmp_path / "out", env={"FANFS_LOCAL": str(local), "FANFS_MNT": str(tmp_path)})
    result = slurm.wait(job, timeout=60)
    output = slurm.output(job)
    assert result.state == "FAILED", output
    errors = [line for line in output.splitlines() if "error" in line]
    assert len(errors) == 1 and f"is the mount point {tmp_path} or lies under it" in errors[0], output
    assert list(local.iterdir()) == [] and not os.path.ismount(tmp_path)
    assert_nothing_left(slurm, job)


def test_failing_training_fails_the_job_with_its_exit_code(slurm, slurm_plain, tmp_path):
    local = tmp_path / "local"  # the shards somewhere else than $TMPDIR, as on /dev/shm
    local.mkdir()
    job = submit(slurm, slurm_plain[1], tmp_path / "out", "--exit", "7", env={"FANFS_LOCAL": str(local)})
    result = slurm.wait(job, timeout=120)
    assert result == ("FAILED", 7, 0), slurm.output(job)
    assert len(reports(tmp_path / "out")) == NODES
    assert list(local.iterdir()) == []
    assert_nothing_left(slurm, job)


def test_scancel_during_training_leaves_nothing(slurm, slurm_plain, tmp_path):
    out = tmp_path / "out"
    job = submit(slurm, slurm_plain[1], out, "--sleep", "300")
    deadline = time.monotonic() + 120
    while len(reports(out)) < NODES:  # every task is training
        assert time.monotonic() < deadline, slurm.output(job)
        time.sleep(0.2)
    assert leftovers(slurm, job), "the job runs"
    slurm.cancel(job)
    assert slurm.wait(job, timeout=60).state == "CANCELLED"
    assert_nothing_left(slurm, job)


def test_auto_fidelity_is_one_k_for_the_whole_job(slurm, tmp_path):
    from photo_samples import make_photo_set
    make_photo_set(tmp_path / "photos", 24)
    store = tmp_path / "store"
    fanfs("pack", tmp_path / "photos", store, "--progressive-jpeg", "--quiet")
    job = submit(slurm, store, tmp_path / "out", "--images", str(tmp_path / "photos"),
                 env={"FANFS_FIDELITY": "auto:0.95"})
    result = slurm.wait(job, timeout=180)
    assert result == ("COMPLETED", 0, 0), slurm.output(job)
    got = reports(tmp_path / "out")
    assert len(got) == NODES and all(r["images"] and not r["mismatches"] for r in got.values()), got
    chosen = {r["fidelity"] for r in got.values()}
    assert len(chosen) == 1 and chosen != {"full"}, chosen
    assert "fidelity auto:0.95 ->" in slurm.output(job)
    assert_nothing_left(slurm, job)



def test_srun_pmi2_start_up_uses_a_card_that_fits_slurms_pmi1_reader(slurm):
    """Slurm 22.05 reads a PMI-1 line in one read() of 1024 bytes; MPICH's UCX business card can overflow
    it (a sporadic start-up abort under load), so fanfs starts MPICH's MPI on OFI under srun --mpi=pmi2."""
    probe = ("import os; from fanfs.peers.world import World; w = World.detect(); "
             "print(w.rank, w.size, os.environ.get('MPIR_CVAR_CH4_NETMOD'), w.allgather(w.rank)); w.finalize()")
    for _ in range(3):
        done = slurm.run("srun", f"-N{NODES}", f"-n{NODES}", "--mpi=pmi2", sys.executable, "-c", probe, timeout=120)
        lines = sorted(done.stdout.split("\n")[:-1])
        assert lines == [f"{r} {NODES} ofi {list(range(NODES))}" for r in range(NODES)], done.stdout + done.stderr


def test_the_user_s_netmod_and_other_launchers_are_left_alone(monkeypatch):
    from fanfs.peers.world import _short_business_card
    both = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\n"
    for env, library, expected in [({"SLURM_MPI_TYPE": "pmi2"}, both, "ofi"),
                                   ({"SLURM_MPI_TYPE": "pmi2", "MPIR_CVAR_CH4_NETMOD": "ucx"}, both, "ucx"),
                                   ({"SLURM_MPI_TYPE": "pmix"}, both, None), ({}, both, None),
                                   ({"SLURM_MPI_TYPE": "pmi2"}, "MPICH Version: 4\nMPICH Device: ch4:ucx\n", None),
                                   ({"SLURM_MPI_TYPE": "pmi2"}, "Open MPI v5.0.3", None)]:
        monkeypatch.delenv("MPIR_CVAR_CH4_NETMOD", raising=False)
        monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        _short_business_card(library)
        assert os.environ.get("MPIR_CVAR_CH4_NETMOD") == expected, (env, library)


def test_only_whole_references_to_fanfs_mnt_are_replaced():
    from fanfs.cluster.job import expand_mountpoint
    for given, expected in [("$FANFS_MNT", "/m n"), ("${FANFS_MNT}/x", "/m n/x"), ("a=$FANFS_MNT:b", "a=/m n:b"),
                            ("$FANFS_MNT_X", "$FANFS_MNT_X"), ("$FANFS_MNTX", "$FANFS_MNTX"), ("${FANFS_MNT_X}", "${FANFS_MNT_X}"),
                            ('cd "$FANFS_MNT" && echo $FANFS_MNT_LOG', 'cd "/m n" && echo $FANFS_MNT_LOG'),
                            ("$FANFS_MNT$FANFS_MNT", "/m n/m n"), ("\\1 $FANFS_MNT", "\\1 /m n")]:
        assert expand_mountpoint(given, "/m n") == expected, given
    assert expand_mountpoint("$FANFS_MNT", r"/a\1b") == r"/a\1b"


@pytest.mark.root("to act as another user")
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_another_user_can_neither_refuse_a_job_nor_plant_its_directory(slurm, slurm_plain, tmp_path):
    """nobody makes the directories a job would have used (the former fanfs-JOBID-NODE) in a shared
    FANFS_LOCAL, and look-alikes of the new ones holding a mnt/: the job runs, and its tasks find their own."""
    from support.nobody import as_nobody
    src, store = slurm_plain
    local = Path(tempfile.mkdtemp(prefix="fanfs-test-local-", dir="/tmp"))
    os.chmod(local, 0o1777)
    out = tmp_path / "out"
    try:
        job = submit(slurm, store, out, "--source", str(src), "$FANFS_MNT_X", "${FANFS_MNT}/y",
                     env={"FANFS_LOCAL": str(local)}, options=("--hold",))
        planted = [local / f"fanfs-{job}-{node}{suffix}" for node in slurm.nodes for suffix in ("", "-evil")]
        for path in planted:
            as_nobody("mkdir", "-m", "0777", str(path))
            as_nobody("mkdir", "-m", "0777", str(path / "mnt"))
        slurm.run("scontrol", "release", str(job))
        result = slurm.wait(job, timeout=120)
        assert result == ("COMPLETED", 0, 0), slurm.output(job)
        got = reports(out)
        assert len(got) == NODES
        for r in got.values():
            assert r["files"] == 120 and not r["mismatches"], r
            assert str(local) in r["mnt"] and "evil" not in r["mnt"] and r["mnt"].rstrip("/").endswith("/mnt"), r
            assert r["extra"] == ["$FANFS_MNT_X", r["mnt"] + "/y"], "only whole references are replaced"
        assert sorted(local.iterdir()) == sorted(planted) and all(os.listdir(p) == ["mnt"] for p in planted)
        assert_nothing_left(slurm, job)
    finally:
        shutil.rmtree(local)
