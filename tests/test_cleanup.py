"""Issue 50, major 2: ``fanfs cleanup --job JOBID`` (slurm/epilog.sh runs it as root on every node of a job once the
job has ended there) ends and removes what the job left on the node, and nothing else.

A job cleans up after itself unless every process of it is killed at once (the OOM killer): then its mounts are left
dead and its directory full of staged shards.  A plain ``fanfs mount`` in a batch script outlives its job under
``proctrack/linuxproc`` (its daemon is detached).  And root's ``rm -rf`` of a directory holding a live mount fails.
Here the job's things are made as a job makes them (its processes have ``SLURM_JOB_ID``), beside another job's,
another node's, another user's and a mount made outside any job; a real Slurm runs the epilog in
tests/test_epilog.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fanfs_command import FANFS, daemon_pids, fanfs, force_unmount

REPO = Path(__file__).resolve().parent.parent
JOB, OTHER_JOB = "4242", "4343"


def tagged(job: str) -> list[str]:
    """Mount points of fanfs mounts that name ``job`` in the kernel's table."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if f" fanfs@{job}:" in line]


@pytest.fixture
def store(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("cleanup")
    (base / "src").mkdir()
    (base / "src" / "a.txt").write_text("a\n")
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base / "store"


@pytest.fixture
def job_mounts(tmp_path):
    """``mount(store, mountpoint, job=..., node=..., runtime=...)``: a mount made as a job's process makes it (its
    environment has the job's SLURM_JOB_ID); every one unmounted, and its daemon killed, however the test ends."""
    made = []

    def mount(store: Path, mountpoint: Path, job: str | None, node: str = "n1", runtime: Path | None = None) -> Path:
        mountpoint.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env.update({"SLURM_JOB_ID": job, "SLURMD_NODENAME": node} if job else {})
        env.update({"FANFS_RUNTIME_DIR": str(runtime)} if runtime else {})
        made.append(mountpoint)
        fanfs("mount", store, mountpoint, env=env)
        return mountpoint

    yield mount
    for mountpoint in made:
        force_unmount(mountpoint)
        for pid in daemon_pids(mountpoint):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cleanup(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run([*FANFS, "cleanup", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**clean_env, **(env or {})})


def test_a_job_killed_outright_leaves_nothing_of_it_and_nothing_else_is_touched(store, job_mounts, tmp_path):
    base = tmp_path / "local"  # a node's local directory, as $TMPDIR
    job_dir = base / f"fanfs-{JOB}-n1-x8kq2m4p"  # as a job's node makes it: its shards, its runtime, its mount
    (job_dir / "shards").mkdir(parents=True)
    (job_dir / "shards" / "000000").write_bytes(b"staged")
    (job_dir / "run").mkdir(mode=0o700)
    job_dir.chmod(0o700)
    node_mount = job_mounts(store, job_dir / "mnt", JOB, runtime=job_dir / "run")
    plain = job_mounts(store, base / "mine" / "plain", JOB)  # a plain 'fanfs mount' in the batch script: it lives on
    kept = {"other job": job_mounts(store, tmp_path / "other", OTHER_JOB),
            "no job": job_mounts(store, tmp_path / "nojob", None),
            "other node": job_mounts(store, base / f"fanfs-{JOB}-n2-a1b2c3d4" / "mnt", JOB, node="n2")}
    other_dirs = [base / f"fanfs-{OTHER_JOB}-n1-q1w2e3r4", base / f"fanfs-{JOB}-n2-a1b2c3d4",
                  base / f"fanfs-{JOB}0-n1-z"]
    for path in other_dirs:
        path.mkdir(exist_ok=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    (base / f"fanfs-{JOB}-n1-link").symlink_to(victim)  # a link named as the job's: never followed
    (job_dir / "shards" / "link").symlink_to(victim)
    listed = {row["mountpoint"]: row for row in json.loads(fanfs("stats", "--json").stdout)}
    assert listed[str(plain)]["job"] == JOB and listed[str(kept["no job"])]["job"] is None
    assert f"{plain}  root (uid 0)  job {JOB}  " in fanfs("stats").stdout

    node_daemon, plain_daemon = daemon_pids(node_mount)[0], daemon_pids(plain)[0]
    os.kill(node_daemon, signal.SIGKILL)  # every process of the job killed at once: its node's mount left dead
    wiped = subprocess.run(["rm", "-rf", str(base / "mine")], capture_output=True, text=True)
    assert wiped.returncode != 0, "a node's wipe cannot remove a directory holding a live mount"

    done = cleanup("--job", JOB, "--user", "root", "--node", "n1", "--local", base)
    assert done.returncode == 0, done.stderr
    assert f"fanfs cleanup: job {JOB}: unmounted {node_mount}\n" in done.stdout
    assert f"fanfs cleanup: job {JOB}: removed {job_dir}\n" in done.stdout
    assert sorted(tagged(JOB)) == [str(kept["other node"])], "the job's mounts on n1 are gone, and only those"
    assert not os.path.lexists(job_dir)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{plain_daemon}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{plain_daemon}"), "the detached daemon ended with its mount"
    from fanfs.serve.control import socket_path
    assert not os.path.lexists(socket_path(str(plain))) and not os.path.lexists(socket_path(str(node_mount)))
    shutil.rmtree(base / "mine")  # the wipe works now
    for what, mountpoint in kept.items():
        assert (mountpoint / "a.txt").read_text() == "a\n", what
    assert all(path.is_dir() for path in other_dirs) and (victim / "precious").read_text() == "keep"
    assert (base / f"fanfs-{JOB}-n1-link").is_symlink()

    again = cleanup("--job", JOB, "--user", "0", "--node", "n1", "--local", base)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"fanfs cleanup: job {JOB}: nothing left on this node\n"


def test_root_cleans_up_a_user_s_job_and_only_that_user_s(store, local_users, fuse_for_users):
    """The epilog is root: the job's user's mount, daemon and directory go; another user's, though named after the same
    job (anyone can set SLURM_JOB_ID, or make a directory of that name), stay."""
    alice, bob = local_users
    shared = Path(tempfile.mkdtemp(prefix="fanfs-test-cleanup-", dir="/tmp"))  # pytest's is closed to other users
    mounts = []
    try:
        shared.chmod(0o755)
        shutil.copytree(store, shared / "store")
        subprocess.run(["chmod", "-R", "a+rX", shared / "store"], check=True)
        (shared / "local").mkdir(mode=0o1777)
        (shared / "local").chmod(0o1777)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SLURM_JOB_ID": JOB}
        for user in (alice, bob):
            job_dir = shared / "local" / f"fanfs-{JOB}-n1-{user.pw_name}"
            as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "cwd": "/"}
            subprocess.run(["mkdir", "-m", "0700", job_dir, job_dir / "mnt"], check=True, **as_user)
            subprocess.run([*FANFS, "mount", shared / "store", job_dir / "mnt"], env={**env, "FANFS_RUNTIME_DIR": str(
                job_dir)}, check=True, capture_output=True, timeout=120, **as_user)
            mounts.append(job_dir / "mnt")
        done = cleanup("--job", JOB, "--user", alice.pw_name, "--local", shared / "local")
        assert done.returncode == 0, done.stderr
        assert f"removed {mounts[0].parent}" in done.stdout and not os.path.lexists(mounts[0].parent)
        assert tagged(JOB) == [str(mounts[1])], "bob's mount, though it names alice's job, is bob's"
        assert subprocess.run(["cat", mounts[1] / "a.txt"], capture_output=True, text=True, user=bob.pw_uid,
                              group=bob.pw_gid, extra_groups=[]).stdout == "a\n"
    finally:
        for mountpoint in mounts:
            force_unmount(mountpoint)
            for pid in daemon_pids(mountpoint):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_job_still_running_here_is_refused(store, job_mounts, tmp_path):
    """A step of the job on this node (its slurmstepd's socket, NODE_JOBID.STEP) means the job runs: nothing is
    touched, one line says why."""
    base = tmp_path / "local"
    job_dir = base / f"fanfs-{JOB}-n1-abcdefgh"
    job_dir.mkdir(parents=True)
    mnt = job_mounts(store, tmp_path / "mnt", JOB)
    (tmp_path / "spool").mkdir()
    with socket.socket(socket.AF_UNIX) as step:
        step.bind(str(tmp_path / "spool" / f"n1_{JOB}.0"))
        step.listen()
        done = cleanup("--job", JOB, "--user", "root", "--node", "n1", "--local", base)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"fanfs: error: job {JOB} still runs on this node (its step's socket {tmp_path}/spool/"
                           f"n1_{JOB}.0): 'fanfs cleanup' is for a job that has ended (slurm/epilog.sh runs it then)\n")
    assert job_dir.is_dir() and (mnt / "a.txt").read_text() == "a\n"


def test_bad_input_is_one_line():
    for args, env, message in [
            (("--job", "12a", "--user", "root"), {}, "a job id is a number, not '12a'"),
            (("--user", "root"), {}, "which job? --job JOBID (an epilog has it in $SLURM_JOB_ID)"),
            (("--job", "12"), {}, "whose job? --user USER (an epilog has it in $SLURM_JOB_UID)"),
            (("--job", "12", "--user", "no-such-user-here"), {}, "--user no-such-user-here: no such user")]:
        done = cleanup(*args, env=env)
        assert done.returncode in (1, 2) and done.stderr == f"fanfs: error: {message}\n", (args, done.stderr)


def test_the_epilog_runs_cleanup_in_slurm_s_environment(store, job_mounts, tmp_path):
    """slurm/epilog.sh as slurmd runs it: as root, with no PATH and none of the job's variables but its id, its
    user's and the node's name (the fanfs command and the local directories its settings)."""
    base = tmp_path / "local"
    job_dir = base / f"fanfs-{JOB}-n1-abcdefgh"
    job_dir.mkdir(parents=True)
    node_mount = job_mounts(store, job_dir / "mnt", JOB)
    os.kill(daemon_pids(node_mount)[0], signal.SIGKILL)
    fanfs_command = tmp_path / "fanfs"
    fanfs_command.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -c 'from fanfs.cli import entry; "
                             "entry()' \"$@\"\n")
    fanfs_command.chmod(0o755)
    env = {"SLURM_JOB_ID": JOB, "SLURM_JOB_UID": "0", "SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
           "FANFS": str(fanfs_command), "FANFS_LOCAL_DIRS": str(base)}
    done = subprocess.run([REPO / "slurm" / "epilog.sh"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tagged(JOB) == [] and not os.path.lexists(job_dir)


def test_the_prolog_opens_fuse_to_every_user(tmp_path):
    device = tmp_path / "fuse"
    try:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(10, 229))
    except PermissionError:
        pytest.skip("needs root (mknod)")
    done = subprocess.run([REPO / "slurm" / "prolog.sh", device], env={}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert stat.S_IMODE(device.stat().st_mode) == 0o666


def test_a_client_never_makes_a_job_s_runtime_directory_again(tmp_path):
    """A job's node directory is removed as the job ends, its runtime directory in it first; a reader's last word to
    the mount then (``fanfs run``'s report at exit, the task's ``fanfs stats``) made that runtime directory again, and
    the node directory was left behind with it (scancel under load, 1 run in 3).  A client asks and fails; it makes
    nothing."""
    job_dir = tmp_path / "fanfs-1-n1-abcdefgh"
    job_dir.mkdir()
    env = {**os.environ, "FANFS_RUNTIME_DIR": str(job_dir / "run")}
    done = subprocess.run([*FANFS, "stats", job_dir / "mnt"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    code = ("from fanfs.serve.control import ControlError, request\n"
            "try:\n    request(%r, {'cmd': 'in_process', 'files': 1}, timeout=5)\n"
            "except (ControlError, OSError):\n    pass\n") % str(job_dir / "mnt")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert list(job_dir.iterdir()) == []
