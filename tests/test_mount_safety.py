"""Issue 8.6: racing mounts, hostile control messages and out-of-range options are refused cleanly."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fanfs_command import daemon_pids, fanfs, force_unmount
from photo_samples import make_photo_set

from fanfs.errors import FanfsError
from fanfs.serve.control import request, socket_path
from fanfs.util.processes import wait_ended


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("safety")
    make_photo_set(base / "src", 4)
    (base / "src" / "notes.txt").write_text("notes\n")
    fanfs("pack", base / "src", base / "records", "--progressive-jpeg", "--quiet")
    fanfs("pack", base / "src", base / "plain", "--quiet")
    return base


@pytest.mark.slow
def test_two_mounts_of_one_point_at_once_never_stack(stores, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        for _ in range(3):
            procs = [subprocess.Popen([sys.executable, "-m", "fanfs", "mount", str(stores / "plain"), str(mnt)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
            results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
            codes = sorted(code for code, _ in results)
            assert codes == [0, 1], results
            refusal = next(err for code, err in results if code)
            assert "mount" in refusal and len(refusal.strip().splitlines()) == 1, refusal
            mounts = [line for line in Path("/proc/self/mounts").read_text().splitlines() if f" {mnt} " in line]
            assert len(mounts) == 1, mounts
            assert len(daemon_pids(mnt)) == 1
            assert (mnt / "notes.txt").read_text() == "notes\n"
            fanfs("umount", mnt)
            assert not os.path.ismount(mnt) and not daemon_pids(mnt)
    finally:
        force_unmount(mnt)


@pytest.mark.slow
@pytest.mark.parametrize("value", [-1, 0, 11, 70000, "3", True, 3.5, None, [2]])
def test_control_messages_are_validated_like_the_command_line(stores, mount, value):
    with mount(stores / "records", "--fidelity", "2") as mnt:
        with pytest.raises(FanfsError) as info:
            request(mnt, {"cmd": "present", "fidelity": value})
        assert "fidelity" in str(info.value)
        assert request(mnt, {"cmd": "status"})["fidelity"] == 2
        assert request(mnt, {"cmd": "present", "fidelity": 3})["fidelity"] == 3


def test_malformed_control_requests_get_an_error_and_the_daemon_lives_on(stores, mount):
    with mount(stores / "records") as mnt:
        for raw in (b"not json\n", b"[1, 2]\n", b'{"cmd": "nosuch"}\n', b'{"cmd": "present", "shape": 1}\n',
                    b"x" * 70000 + b"\n", b"[" * 60000 + b"\n", b'{"cmd": "order", "path": "/dev/zero"}\n'):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(socket_path(mnt))
                sock.sendall(raw)
                answer = json.loads(sock.makefile("rb").readline() or b"{}")
                assert "error" in answer, (raw[:40], answer)
        assert request(mnt, {"cmd": "status"})["pid"] > 0
        assert len(os.listdir(mnt)) == 5


def test_out_of_range_options_name_what_the_store_takes(stores, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = fanfs("mount", stores / "records", mnt, "--fidelity", "99", check=False)
        assert done.returncode == 1 and "fidelity 99 is out of range" in done.stderr and "1.." in done.stderr
        done = fanfs("mount", stores / "plain", mnt, "--fidelity", "3", check=False)
        assert done.returncode == 1 and "no files whose fidelity can be chosen" in done.stderr
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)
    done = fanfs("pack", stores / "src", tmp_path / "s", "--shard-size", "0", check=False)
    assert done.returncode == 2 and "above 0" in done.stderr


def test_stage_creates_only_the_last_component(stores, tmp_path):
    done = fanfs("stage", stores / "plain", tmp_path / "no" / "such" / "local", "--quiet", check=False)
    assert done.returncode == 1 and "does not exist" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no").exists()
    fanfs("stage", stores / "plain", tmp_path / "local", "--quiet")
    assert sorted(os.listdir(tmp_path / "local"))


@pytest.mark.parametrize("layout", ["store under it", "store is it", "store through a symlink", "store through a bind mount",
                                    "a shard linked under it", "local dir under it", "runtime dir under it"])
def test_a_mount_point_holding_what_its_daemon_opens_is_refused(stores, tmp_path, layout):
    """Served through its own mount, the daemon would wait on itself for ever (kill -9 and fusermount3 -u
    were the only way out): refused before mounting, however the path reaches the mount point."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ)
    options: list[str] = []
    store = mnt / "store"
    bound = tmp_path / "bound"
    if layout == "store is it":
        store = mnt
    if layout in ("store under it", "store is it", "store through a symlink", "store through a bind mount"):
        shutil.copytree(stores / "plain", store, dirs_exist_ok=True)
    if layout == "store through a symlink":
        os.symlink(mnt, tmp_path / "link")
        store = tmp_path / "link" / ".." / "mnt" / "store"
    if layout == "store through a bind mount":
        bound.mkdir()
        subprocess.run(["mount", "--bind", str(mnt), str(bound)], check=True)
        store = bound / "store"
    if layout == "a shard linked under it":
        store = tmp_path / "store"
        shutil.copytree(stores / "plain", store)
        (store / "shards" / "000000").rename(mnt / "000000")
        os.symlink(mnt / "000000", store / "shards" / "000000")
    if layout == "local dir under it":
        store, options = stores / "plain", ["--local-dir", str(mnt / "local"), "--stage"]
    if layout == "runtime dir under it":
        store, env["FANFS_RUNTIME_DIR"] = stores / "plain", str(mnt / "run")
    try:
        done = fanfs("mount", store, mnt, *options, check=False, env=env, timeout=60)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert f"is the mount point {mnt} or lies under it" in done.stderr, done.stderr
        assert not os.path.ismount(mnt)
    finally:
        if os.path.ismount(mnt):
            fanfs("umount", mnt, "--lazy", check=False, env=env)
        force_unmount(mnt)
        if layout == "store through a bind mount":  # (os.path.ismount cannot see a bind mount on the same device)
            subprocess.run(["umount", str(bound)], check=True)


def test_a_job_whose_local_dirs_lie_under_their_mount_points_fails_on_every_node_at_once(stores, tmp_path):
    from test_cluster import MPIEXEC, finish, mpiexec
    if not MPIEXEC.exists():
        pytest.skip("needs the pip mpich's mpiexec")
    mounts = [tmp_path / f"mnt{rank}" for rank in range(2)]
    for mnt in mounts:
        mnt.mkdir()
    proc = mpiexec("mount", stores / "plain", tmp_path / "mnt{rank}", "--local-dir", tmp_path / "mnt{rank}" / "local",
                   "--stage", "--foreground", nodes=2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert finish(proc, 60) == 1
        err = proc.stderr.read()
        assert len(err.strip().splitlines()) == 1 and "lies under it" in err, err
        assert not any(os.path.ismount(m) for m in mounts)
    finally:
        for mnt in mounts:
            force_unmount(mnt)


def test_a_mount_s_lock_file_goes_when_its_daemon_ends(stores, tmp_path):
    """Lock files no longer pile up in the runtime directory: a mount that ends, or is refused, removes
    its own (the refusal of a racing second mount is test_two_mounts_of_one_point_at_once_never_stack)."""
    from fanfs.serve.control import log_path
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    lock_file = Path(log_path(mnt)).with_suffix(".lock")  # beside the mount's log and socket
    try:
        fanfs("mount", stores / "plain", mnt)
        assert lock_file.exists()
        fanfs("umount", mnt)
        assert not lock_file.exists()
        assert fanfs("mount", stores / "records", mnt, "--fidelity", "99", check=False).returncode == 1
        assert not lock_file.exists()
        proc = subprocess.Popen([sys.executable, "-m", "fanfs", "mount", str(stores / "plain"), str(mnt), "--foreground"])
        fanfs("wait", mnt, "--timeout", "60")
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        assert not lock_file.exists() and not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)


def test_a_runtime_dir_deeper_than_a_socket_address_works(stores, tmp_path, mount, monkeypatch):
    """A Slurm job's runtime directory lies in $FANFS_LOCAL, at any depth: a control socket's address holds
    at most 107 bytes, so a deeper one is reached through its directory's descriptor."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "run"
    deep.parent.mkdir(parents=True)
    monkeypatch.setenv("FANFS_RUNTIME_DIR", str(deep))
    with mount(stores / "plain") as mnt:
        assert "reads" in fanfs("stats", mnt).stdout
        assert any(p.suffix == ".sock" and len(str(p)) > 107 for p in deep.iterdir())


@pytest.mark.parametrize("depth", ["short", "deeper than a socket address"])
def test_another_shell_finds_a_mount_whose_runtime_directory_is_elsewhere(stores, tmp_path, mount, monkeypatch, depth):
    """Issue 50: a job's mount keeps its control socket in the job's own runtime directory, which another shell of the
    user (ssh to the node while the job runs) does not know: ``fanfs stats`` and ``fanfs umount`` there found no daemon.
    They now find the socket its daemon bound (the kernel lists bound sockets; one bound through its directory's
    descriptor, beside the lock file its daemon holds), served by the mount's user."""
    job = Path(tempfile.mkdtemp(prefix="fanfs-test-run-", dir="/tmp")) if depth == "short" else \
        tmp_path / ("d" * 60) / ("e" * 60) / "run"
    job.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("FANFS_RUNTIME_DIR", str(job))
    try:
        with mount(stores / "plain") as mnt:
            (pid,) = daemon_pids(mnt)
            assert (len(str(socket_path(str(mnt)))) < 100) == (depth == "short")
            shell = {**os.environ, "FANFS_RUNTIME_DIR": str(tmp_path / "shell-run")}
            assert json.loads(fanfs("stats", mnt, "--json", env=shell).stdout)["reads"] == 0
            assert fanfs("umount", mnt, env=shell).stdout.startswith("unmounted")
            assert not os.path.ismount(mnt) and wait_ended(pid, 0)  # the daemon was found, and waited for
        assert not (tmp_path / "shell-run").exists()  # the other shell's clients made nothing there (no socket)
    finally:
        if depth == "short":
            shutil.rmtree(job, ignore_errors=True)


def test_marks_of_ended_mounts_do_not_pile_up(stores, tmp_path, mount, monkeypatch):
    """Issue 50: each mount point ever mounted left an empty ``.ended`` mark in the runtime directory for good.  Now
    the directory keeps the newest marks (enough for 'fanfs umount' of a mount that ended to say so), the others go."""
    from fanfs.serve.listener import ENDED_MARKS
    run = tmp_path / "run"
    monkeypatch.setenv("FANFS_RUNTIME_DIR", str(run))
    run.mkdir(mode=0o700)
    for i in range(3 * ENDED_MARKS):  # marks of mounts long gone
        (run / f"{i:016x}.ended").touch()
        os.utime(run / f"{i:016x}.ended", (1e9 + i, 1e9 + i))
    with mount(stores / "plain") as mnt:
        pass
    marks = [p for p in run.iterdir() if p.suffix == ".ended"]
    assert len(marks) == ENDED_MARKS, len(marks)
    assert "ended already" in fanfs("umount", mnt).stdout  # its own mark kept: the newest
    assert (run / f"{3 * ENDED_MARKS - 1:016x}.ended").exists() and not (run / f"{0:016x}.ended").exists()
