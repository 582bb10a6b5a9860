"""Issue 8.5: on a shared node, another local user cannot hijack fanfs through its runtime directory.

The default runtime directory (``fanfs-UID`` in the temporary directory) could be created first by
another user, who would then own the daemon's log path and control socket.  Here the other user is
``nobody`` (through ``setpriv``), planting a directory or a symlink where fanfs would create its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import fanfs, force_unmount

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to act as another user")


def as_nobody(*command: str) -> None:
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command], check=True)


@pytest.fixture
def shared_tmp(monkeypatch):
    """A world-writable sticky temporary directory like /tmp (the other user must reach it), with no
    runtime dir set in the environment."""
    tmp = Path(tempfile.mkdtemp(prefix="fanfs-test-shared-", dir="/tmp"))
    os.chmod(tmp, 0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.delenv("FANFS_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("attack")
    (base / "src").mkdir()
    (base / "src" / "a.txt").write_text("a\n")
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base / "store"


def refused(store: Path, mnt: Path) -> str:
    mnt.mkdir(exist_ok=True)
    try:
        done = fanfs("mount", store, mnt, check=False)
    finally:
        force_unmount(mnt)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not os.path.ismount(mnt)
    return done.stderr


def test_a_runtime_dir_planted_by_another_user_is_refused(shared_tmp, small_store, tmp_path):
    planted = shared_tmp / f"fanfs-{os.getuid()}"
    as_nobody("mkdir", "-m", "0700", str(planted))
    assert "belongs to uid" in refused(small_store, tmp_path / "mnt")
    assert os.listdir(planted) == []  # nothing of ours was put there
    assert "belongs to uid" in fanfs("stats", tmp_path / "mnt", check=False).stderr


def test_a_symlink_planted_as_runtime_dir_is_refused(shared_tmp, small_store, tmp_path):
    elsewhere = shared_tmp / "theirs"
    as_nobody("mkdir", "-m", "0777", str(elsewhere))
    as_nobody("ln", "-s", str(elsewhere), str(shared_tmp / f"fanfs-{os.getuid()}"))
    assert "symbolic link" in refused(small_store, tmp_path / "mnt")
    assert os.listdir(elsewhere) == []


def test_a_world_writable_runtime_dir_is_refused(shared_tmp, small_store, tmp_path):
    mine = shared_tmp / f"fanfs-{os.getuid()}"
    mine.mkdir()
    os.chmod(mine, 0o777)
    assert "writable by others" in refused(small_store, tmp_path / "mnt")


def test_the_log_is_never_written_through_a_symlink(shared_tmp, small_store, tmp_path, mount):
    from fanfs.serve.control import log_path
    mnt = tmp_path / "mnt1"  # the name the mount fixture gives the first mount point
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    os.makedirs(os.path.dirname(log_path(mnt)), exist_ok=True)
    os.symlink(victim, log_path(mnt))
    with mount(small_store) as mounted:
        assert mounted == mnt and (mnt / "a.txt").read_text() == "a\n"
    assert victim.read_text() == "root's file\n"


def test_xdg_runtime_dir_is_preferred_and_clean_runs_leave_no_log(tmp_path, monkeypatch, small_store, mount):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.delenv("FANFS_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    with mount(small_store) as mnt:
        assert any(p.suffix == ".sock" for p in (xdg / "fanfs").iterdir())
        assert any(p.suffix == ".log" for p in (xdg / "fanfs").iterdir())
        (mnt / "a.txt").read_text()
    assert not [p for p in (xdg / "fanfs").iterdir() if ".log" in p.name]  # a clean run removes its log


@pytest.mark.parametrize("planted_by", ["another user", "myself, writable by all"])
def test_a_local_dir_others_can_write_is_refused_by_stage_and_mount(shared_tmp, small_store, tmp_path, planted_by):
    """Another user who can write the local directory could replace the staged shards."""
    local = shared_tmp / "local"
    if planted_by == "another user":
        as_nobody("mkdir", "-m", "0777", str(local))
    else:
        local.mkdir()
        os.chmod(local, 0o777)
    said = "belongs to uid" if planted_by == "another user" else "writable by others"
    done = fanfs("stage", small_store, local, "--quiet", check=False)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done.stderr
    assert os.listdir(local) == []
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for options in ((), ("--stage",)):
        try:
            done = fanfs("mount", small_store, mnt, "--local-dir", local, *options, check=False)
        finally:
            force_unmount(mnt)
        assert done.returncode == 1 and said in done.stderr, done.stderr
    assert os.listdir(local) == []
