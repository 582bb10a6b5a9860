"""Issue 8.5: on a shared node, another local user cannot hijack fanfs through its runtime directory.

The default runtime directory (``fanfs-UID`` in the temporary directory) could be created first by
another user, who would then own the daemon's log path and control socket.  Here the other user is
``nobody`` (through ``setpriv``), planting a directory or a symlink where fanfs would create its own.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fanfs_command import fanfs, force_unmount
from support.nobody import RUN_AS_NOBODY, as_nobody

from fanfs.serve import control
from fanfs.util.processes import wait_ended

pytestmark = [pytest.mark.root("to act as another user"),
              pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to act as another user")]


@pytest.fixture
def shared_tmp(monkeypatch):
    """A world-writable sticky temporary directory like /tmp (the other user must reach it), with no
    runtime dir set in the environment: the temporary directory of the commands and of this process (whose
    tempfile module read $TMPDIR once already), so that both find the same runtime directory."""
    tmp = Path(tempfile.mkdtemp(prefix="fanfs-test-shared-", dir="/tmp"))
    os.chmod(tmp, 0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
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


def squat(shared_tmp: Path, name: str, how: str) -> Path:
    """``name`` in the shared temporary directory made first by another user (nobody): a directory (0700, or 0777
    for anyone to fill), a symlink to one of theirs, or a file."""
    path = shared_tmp / name
    if how == "symlink":
        as_nobody("mkdir", "-m", "0777", str(shared_tmp / f"theirs-{name}"))
        as_nobody("ln", "-s", str(shared_tmp / f"theirs-{name}"), str(path))
    elif how == "file":
        as_nobody("touch", str(path))
    else:
        as_nobody("mkdir", "-m", how, str(path))
    return path


def test_no_user_can_make_fanfs_refuse_another_s_mount(shared_tmp, small_store, tmp_path):
    """Issue 50: another user who makes ``fanfs-UID`` (and the names after it) first no longer refuses every mount
    and ``fanfs stats`` of this user's: those names are passed over, nothing of ours goes into them, and every
    command finds the same runtime directory, also once the squatter removes the name before it."""
    uid = os.getuid()
    planted = [squat(shared_tmp, f"fanfs-{uid}", "0700"), squat(shared_tmp, f"fanfs-{uid}.1", "symlink"),
               squat(shared_tmp, f"fanfs-{uid}.2", "file"), squat(shared_tmp, f"fanfs-{uid}.3", "0777")]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        fanfs("mount", small_store, mnt)
        mine = shared_tmp / f"fanfs-{uid}.4"
        assert [p.suffix for p in mine.iterdir() if p.suffix == ".sock"] == [".sock"]
        assert fanfs("stats", mnt, "--json").returncode == 0
        as_nobody("rmdir", str(planted[0]))  # the name before ours is free again: ours is still the one found
        assert "present" not in fanfs("ctl", mnt, "--fidelity", "full").stderr
        assert json.loads(fanfs("stats", mnt, "--json").stdout)["reads"] == 0
        assert (mnt / "a.txt").read_text() == "a\n"
        assert fanfs("umount", mnt).stdout.startswith("unmounted")
    finally:
        force_unmount(mnt)
    assert not os.path.exists(planted[0])  # nothing of ours made in its place
    assert [os.listdir(p) for p in planted[3:]] == [[]] and os.listdir(shared_tmp / f"theirs-fanfs-{uid}.1") == []
    assert fanfs("umount", mnt, check=False).stdout.endswith("ended already); nothing to do\n")  # its mark found


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


@pytest.fixture
def open_runtime_dir(monkeypatch):
    """A runtime directory another user may enter (0755: fanfs refuses only one others can write), short enough for a
    socket's address."""
    path = Path(tempfile.mkdtemp(prefix="fanfs-test-run-", dir="/tmp"))
    os.chmod(path, 0o755)
    monkeypatch.setenv("FANFS_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


_IMPOSTOR = """
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=int(sys.argv[1]))
sock.listen(1)  # its credentials, another user's, are what a client's SO_PEERCRED sees
print("listening", flush=True)
conn, _ = sock.accept()
print(len(conn.recv(4096)), flush=True)
"""


def test_a_control_socket_another_user_serves_is_never_spoken_to(open_runtime_dir, tmp_path):
    """Both ends of the control socket check the other's uid: a client refuses a socket in a mount's place that
    another user listens on (an impostor daemon), and sends it nothing."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(control.socket_path(str(mnt)))
    with sock, subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
                                 "-c", _IMPOSTOR, str(sock.fileno())], pass_fds=[sock.fileno()], stdout=subprocess.PIPE,
                                text=True) as impostor:
        assert impostor.stdout.readline() == "listening\n"
        with pytest.raises(control.ControlError, match=r"served by uid \d+, not by you"):
            control.request(str(mnt), {"cmd": "status"}, timeout=10)
        assert impostor.communicate(timeout=60)[0] == "0\n"  # not a byte of the request


_CLIENT = """
import json, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.settimeout(60)
    sock.connect(sys.argv[1])
    try:
        sock.sendall(b'{"cmd": "status"}\\n')
    except BrokenPipeError:
        pass  # the daemon answered at once, and closed
    print(sock.makefile().readline(), end="")
"""


def test_a_daemon_answers_no_other_user(open_runtime_dir, small_store, mount):
    """The daemon's end: another user who reaches its control socket gets an error, not its status (the socket is the
    user's alone, 0600: opened to every user here, as a umask or a chmod could leave it)."""
    with mount(small_store) as mnt:
        os.chmod(control.socket_path(str(mnt)), 0o666)
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
                               "-c", _CLIENT, control.socket_path(str(mnt))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"error": "not your mount"}, done.stdout


@pytest.fixture
def nobody_s_mount(small_store, fuse_for_users):
    """A mount of nobody's (its daemon nobody's, its runtime directory nobody's own), and how to run fanfs as nobody;
    unmounted however the test ends."""
    mine = Path(tempfile.mkdtemp(prefix="fanfs-test-nobody-", dir="/tmp"))  # not under pytest's: closed to others
    os.chmod(mine, 0o755)
    shutil.copytree(small_store, mine / "store")
    subprocess.run(["chmod", "-R", "a+rX", mine / "store"], check=True)
    (mine / "mnt").mkdir()
    shutil.chown(mine / "mnt", "nobody", "nogroup")
    env = {**os.environ, "FANFS_RUNTIME_DIR": str(mine / "run")}
    (mine / "run").mkdir(mode=0o700)
    shutil.chown(mine / "run", "nobody", "nogroup")

    def as_nobody(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(RUN_AS_NOBODY), *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=120)

    try:
        assert as_nobody("mount", mine / "store", mine / "mnt").returncode == 0
        yield mine / "mnt", as_nobody
    finally:
        as_nobody("umount", mine / "mnt")
        force_unmount(mine / "mnt")
        shutil.rmtree(mine, ignore_errors=True)


def test_root_lists_and_inspects_any_user_s_mount_and_only_inspects_it(nobody_s_mount, small_store, tmp_path):
    """Issue 50: root (an administrator, an epilog) could not query another user's mount, nor a job's (its runtime
    directory is the job's own).  Now ``fanfs stats`` lists every fanfs mount of the node, whose it is, and, for root,
    its daemon and reads; ``fanfs stats MNT`` inspects it (its daemon answers root's status and stats, nothing else:
    a ``ctl`` is refused); root unmounts it, its daemon gone.  And nobody, given root's mount, is told it is not theirs
    (``umount`` used to say "not found in /etc/mtab")."""
    mnt, as_nobody = nobody_s_mount
    assert subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(mnt / "a.txt")],
                          capture_output=True, text=True, check=True).stdout == "a\n"
    listed = {row["mountpoint"]: row for row in json.loads(fanfs("stats", "--json").stdout)}
    row = listed[str(mnt)]
    assert row["user"] == f"nobody (uid {pwd.getpwnam('nobody').pw_uid})" and row["reads"] == 1, row
    assert f"{mnt}  nobody (uid " in fanfs("stats").stdout
    assert json.loads(fanfs("stats", mnt, "--json").stdout)["reads"] == 1  # root, from its own runtime directory
    done = fanfs("ctl", mnt, "--fidelity", "full", check=False)
    assert done.returncode == 1 and "root may only inspect it" in done.stderr, done.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chmod(tmp_path, 0o755)
    fanfs("mount", small_store, mine)
    try:
        for command in ("umount", "stats"):
            done = as_nobody(command, mine)
            assert done.returncode == 1 and f"{mine} is mounted by root (uid 0), not by you" in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
        assert listed.get(str(mine)) is None
        nobody_sees = {row["mountpoint"]: row for row in json.loads(as_nobody("stats", "--json").stdout)}
        assert "reads" not in nobody_sees[str(mine)] and nobody_sees[str(mnt)]["reads"] == 1
    finally:
        fanfs("umount", mine)
    pid = row["pid"]
    assert fanfs("umount", mnt).stdout.startswith("unmounted")
    assert not os.path.ismount(mnt) and wait_ended(pid, 0)  # its daemon waited for (gone, or a zombie)
