"""Issue 8.2: no pack, forced or not, ever deletes anything but a fanfs store or its own leftovers."""

from __future__ import annotations

import json
import os
import socket
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fanfs_command import fanfs

from fanfs.pack.destination import PARTIAL_MARKER
from fanfs.util.processes import process_pool


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def outer(tmp_path):
    outer = tmp_path / "outer"
    (outer / "dataset" / "cls").mkdir(parents=True)
    (outer / "dataset" / "cls" / "a.txt").write_text("precious data\n")
    (outer / "notes.txt").write_text("my notes\n")
    return outer


@pytest.mark.parametrize("store_of", ["parent", "grandparent", "itself"])
def test_force_never_replaces_a_tree_holding_the_source(outer, store_of):
    src = outer / "dataset"
    store = {"parent": outer, "grandparent": outer.parent, "itself": src}[store_of]
    before = tree(outer)
    done = fanfs("pack", src, store, "--force", check=False)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "inside" in done.stderr
    assert tree(outer) == before


def test_force_replaces_only_a_store_or_an_empty_directory(outer, tmp_path):
    src = outer / "dataset"
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep").write_text("precious")
    done = fanfs("pack", src, other, "--force", check=False)
    assert done.returncode == 1 and "not a fanfs store" in done.stderr
    assert (other / "keep").read_text() == "precious"

    store = tmp_path / "store"
    fanfs("pack", src, store, "--quiet")
    done = fanfs("pack", src, store, check=False)
    assert done.returncode == 1 and "--force" in done.stderr
    fanfs("pack", src, store, "--force", "--quiet")  # a store is replaced
    assert (store / "index").exists()
    (store / "added-by-user").write_text("x")
    done = fanfs("pack", src, store, "--force", check=False)  # a store someone put files into is not
    assert done.returncode == 1 and (store / "added-by-user").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    fanfs("pack", src, empty, "--quiet")
    link = tmp_path / "link"
    link.symlink_to(store)
    done = fanfs("pack", src, link, "--force", check=False)
    assert done.returncode == 1 and "symbolic link" in done.stderr and (store / "added-by-user").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "link", "other", "outer", "store"]


def _write_marker(directory: Path, pid: int, host: str | None = None) -> None:
    directory.mkdir()
    from fanfs.pack.destination import _boot_id
    (directory / PARTIAL_MARKER).write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid,
                                                        "boot": _boot_id()}))


def test_only_marked_leftovers_of_dead_packs_are_removed(outer, tmp_path):
    src = outer / "dataset"
    dz = tmp_path / "dz"
    dz.mkdir()
    (dz / "data.partial-notes").mkdir()
    (dz / "data.partial-notes" / "mine.txt").write_text("not fanfs's")
    (dz / "data.partial-123").write_text("a file, not a directory")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_marker(dz / "data.partial-dead", dead.pid)
    _write_marker(dz / "data.old-dead", dead.pid)
    _write_marker(dz / "data.partial-live", os.getpid())
    _write_marker(dz / "data.partial-elsewhere", dead.pid, host="another-node")
    (dz / "data.partial-nomarker").mkdir()
    fanfs("pack", src, dz / "data", "--quiet")
    assert sorted(p.name for p in dz.iterdir()) == [
        "data", "data.partial-123", "data.partial-elsewhere", "data.partial-live", "data.partial-nomarker",
        "data.partial-notes"]
    assert (dz / "data.partial-notes" / "mine.txt").read_text() == "not fanfs's"


def _pack_processes(src: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"fanfs pack {src} "], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _start_and_kill(tmp_path: Path, kill_keeper_first: bool) -> tuple[Path, Path, subprocess.Popen]:
    """Start a pack that takes a while, wait for its first shard, SIGKILL it (and first its keeper, if asked)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i}").write_bytes(os.urandom(2 << 20))
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", "pack", src, store, "--codec", "zstd:19", "-q"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("store.partial-*/shards/*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    workers = _pack_processes(src)
    assert len(workers) >= 2, workers  # the parent and its workers
    if kill_keeper_first:  # as a batch system killing the job's whole process tree would
        keeper = subprocess.run(["pgrep", "-f", f"janitor.py {proc.pid}"], capture_output=True, text=True)
        assert keeper.stdout.split(), "no keeper process"
        for pid in keeper.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
    proc.kill()  # as the OOM killer or a Slurm time limit would
    deadline = time.monotonic() + 10
    while _pack_processes(src) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pack_processes(src), "pack workers outlived their killed parent"
    return src, store, proc


def test_killed_pack_leaves_nothing(tmp_path):
    """Issue 27: SIGKILL (OOM, a time limit, mpiexec killing a job whose rank died): the keeper removes the partial
    store and says so in one line; nothing is left."""
    src, store, proc = _start_and_kill(tmp_path, kill_keeper_first=False)
    err = proc.communicate(timeout=30)[1]  # stderr closes once the keeper, which shares it, is done
    assert err.strip().splitlines()[-1].startswith(f"fanfs: error: the pack (process {proc.pid}) was killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_killed_pack_and_keeper_leave_a_marked_partial_that_the_next_pack_removes(tmp_path):
    src, store, proc = _start_and_kill(tmp_path, kill_keeper_first=True)
    proc.communicate(timeout=30)
    partial = list(tmp_path.glob("store.partial-*"))
    assert len(partial) == 1 and (partial[0] / PARTIAL_MARKER).exists()
    fanfs("pack", src, store, "--codec", "lz4", "--quiet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "store"]


WRITER = """import os, sys
def write_once(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "_adopted" and not os.environ.get("FANFS_TEST_WRITTEN"):
        os.environ["FANFS_TEST_WRITTEN"] = "1"
        with open({target!r}, "ab") as f:  # a writer appends while the pack reads the file
            f.write(b"appended")
sys.settrace(write_once)
"""


def test_a_source_written_while_packed_is_refused_not_stored_torn(tmp_path):
    """Issue 35: a file that grew while it was read was stored half old, half new with exit 0; GNU tar says "file
    changed as we read it".  Now the pack stops with one line naming it and leaves nothing."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "log.bin").write_bytes(os.urandom(3 << 20))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(WRITER.format(target=str(src / "log.bin")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "fanfs", "pack", str(src), str(tmp_path / "store"), "-q", "--jobs", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "log.bin changed while it was packed (size 3,145,728 -> 3,145,736)" in done.stderr
    assert not list(tmp_path.glob("store*"))


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_force_over_a_mounted_store_warns_that_the_mount_serves_the_old_one(tmp_path, mount):
    """Issue 41: 'pack --force' over a store mounted right now said nothing, and the mount went on serving the old tree
    until it was remounted.  Now a line names the mount point and what to do; no mount of the store, no line."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"old")
    store = tmp_path / "store"
    fanfs("pack", src, store, "--quiet")
    (src / "a").write_bytes(b"new")
    with mount(store) as mnt, mount(store) as again:
        done = fanfs("pack", src, store, "--force", "--quiet")
    warned = sorted(line for line in done.stderr.splitlines() if "still serves" in line)
    assert warned == sorted(f"fanfs: warning: {point} still serves the store this pack replaced until it is remounted: "
                            f"'fanfs umount {point}', then mount it again" for point in (mnt, again)), done.stderr
    assert "still serves" not in fanfs("pack", src, store, "--force", "--quiet").stderr


def test_a_pool_stopped_on_an_error_leaves_no_thread_to_race_the_exit():
    """CI saw a traceback (``OSError: Bad file descriptor`` in ``concurrent.futures``' exit hook) after a failed pack's
    one-line error: the pool's manager thread outlived ``terminate`` and closed its wake-up pipe while the
    interpreter's exit wrote to it.  The pool stopped on an error has no thread left to race the exit (ten pools: a
    thread left running is seen in most of them)."""
    for _ in range(10):
        with pytest.raises(RuntimeError, match="a failed pack"), process_pool(2) as pool:
            manager = pool._executor_manager_thread
            raise RuntimeError("a failed pack")
        assert not manager.is_alive()
