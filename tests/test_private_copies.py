"""Issue 35: whatever fanfs writes on a node is no more readable by another user than the store it comes from.

A 0700 store is staged (``fanfs stage`` on 2 ranks of a real mpiexec) into local directories made with a plain
``mkdir`` (0755) and mounted lazily (its cache files, its log and control socket in a runtime directory
another user can reach); then the user ``nobody`` tries to open every file fanfs wrote there: each must be
refused.  Staged copies of a 0755 store may stay readable (as private as the store, not more), and a store
packed from a private source is private itself.
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fanfs_command import fanfs, mounted

from fanfs.cache.stage import STAGED_NAME
from fanfs.store.format import shard_name
from fanfs.util.privacy import file_mode, readable_by_others

MPIEXEC = Path(sys.executable).parent / "mpiexec"
as_another_user = pytest.mark.skipif(not shutil.which("setpriv") or not MPIEXEC.exists(),
                                     reason="needs setpriv to act as another user, and the pip mpich's mpiexec")

_TRY_READ = """
import sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").close()
        print("read", path)
    except PermissionError:
        pass
    except OSError as err:
        print(f"not refused ({err.strerror})", path)
"""


def opened_by_nobody(paths: list[Path]) -> list[str]:
    """The lines ``nobody`` prints for the files it could open (or that failed but not with EACCES)."""
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
                           "-c", _TRY_READ, *map(str, paths)], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.splitlines()


def files_under(*roots: Path) -> list[Path]:
    return sorted(Path(top) / name for root in roots for top, _, names in os.walk(root) for name in names)


@pytest.fixture
def shared(tmp_path):
    """A 0755 directory another user can reach (pytest's own are 0700), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="fanfs-test-private-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _stage(store: Path, shared: Path) -> None:
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "fanfs", "stage", str(store),
                           str(shared / "local{rank}"), "--replicas", "1", "--quiet"],
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode == 0, done.stderr


def _stage_and_mount(store: Path, shared: Path, mnt: Path) -> list[Path]:
    """``fanfs stage`` on 2 ranks and a lazy mount read through; the files they wrote under ``shared``."""
    for rank in range(2):
        (shared / f"local{rank}").mkdir()  # a plain mkdir: 0755
    _stage(store, shared)
    (shared / "cache").mkdir()
    env = {**os.environ, "FANFS_RUNTIME_DIR": str(shared / "run")}
    with mounted(store, mnt, "--local-dir", str(shared / "cache"), "--stage", "lazy", env=env):
        for path in files_under(mnt):
            path.read_bytes()
        written = files_under(shared / "local0", shared / "local1", shared / "cache", shared / "run")
    names = {path.name for path in written}
    assert any(name.isdigit() for name in names) and ".staged" in names, names
    assert len(files_under(shared / "cache")) >= 2, written  # the lazy cache's state and data
    return written


@pytest.mark.slow  # an mpiexec job and a mount
@pytest.mark.root("to act as another user")
@as_another_user
def test_what_fanfs_writes_from_a_private_store_no_other_user_reads(shared, tmp_path):
    src = shared / "src"
    (src / "d").mkdir(parents=True)
    for i in range(20):
        (src / "d" / f"{i}.bin").write_bytes(os.urandom(30_000))
    os.chmod(src, 0o700)  # a private source makes a private store
    store = shared / "store"
    fanfs("pack", src, store, "--shard-size", "64K", "--quiet")
    assert opened_by_nobody(files_under(store)) == []
    written = _stage_and_mount(store, shared, tmp_path / "mnt")
    assert opened_by_nobody(written) == []
    staged = files_under(shared / "local0", shared / "local1", shared / "cache")
    assert all(path.stat().st_mode & 0o077 == 0 for path in staged), [oct(p.stat().st_mode) for p in staged]
    older = next(path for path in staged if path.name.isdigit())
    os.chmod(older, 0o644)  # as an older fanfs staged it: a second staging, which keeps the copy, narrows it
    _stage(store, shared)
    assert older.stat().st_mode & 0o777 == 0o600


def test_a_leftover_staged_tmp_is_made_private_before_it_is_renamed(tmp_path):
    """A copy is written as ``NAME.tmp``, then renamed into place: one that a killed stage left with a wider mode (an
    older fanfs's 0644) is narrowed to the store's before it becomes the copy, and so is the ``.staged`` record's."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(30_000))
    store = tmp_path / "store"
    fanfs("pack", src, store, "--quiet")  # private: pytest's directories are 0700
    local = tmp_path / "local"
    local.mkdir()
    leftovers = [local / f"{shard_name(0)}.tmp", local / f"{STAGED_NAME}.tmp"]
    for path in leftovers:
        path.write_bytes(b"left by a killed stage")
        path.chmod(0o644)
    fanfs("stage", store, local, "--quiet")
    staged = files_under(local)
    assert {path.name for path in staged} == {shard_name(0), STAGED_NAME}
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in staged), [oct(p.stat().st_mode) for p in staged]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the store a group of its own")
def test_a_copy_is_readable_by_the_store_s_group_only_in_that_group(shared):
    """Issue 50: a store only its group may read (0750, files 0640), staged into a directory made with a plain
    ``mkdir`` (0755): the copies took the stager's own group with the store's group bit (0640), open to that
    group's members, whom the store's group shuts out.  A copy keeps the group's read bit only where it gets the store's
    group (a setgid directory of that group), and a shared copy takes that group itself."""
    src = shared / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(30_000))
    store, group = shared / "store", grp.getgrnam("nogroup").gr_gid
    fanfs("pack", src, store, "--quiet")
    for path in (store, store / "shards", *files_under(store)):
        os.chown(path, -1, group)
        os.chmod(path, 0o750 if path.is_dir() else 0o640)
    plain, setgid, base = shared / "plain", shared / "setgid", shared / "base"
    plain.mkdir(mode=0o755)
    setgid.mkdir()
    os.chown(setgid, -1, group)
    os.chmod(setgid, 0o2755)
    base.mkdir()
    os.chmod(base, 0o1777)
    for local in (plain, setgid):
        fanfs("stage", store, local, "--quiet")
    modes = {path.relative_to(shared): (path.stat().st_mode & 0o777, path.stat().st_gid) for path in files_under(plain, setgid)}
    assert modes == {Path(directory, name): (mode, gid) for directory, mode, gid in (("plain", 0o600, 0), ("setgid", 0o640, group))
                     for name in (shard_name(0), STAGED_NAME)}, modes
    with mounted(store, shared / "mnt", "--local-dir", str(shared / "private"), "--stage", "shared", "--shared-local",
                 str(base)):
        (copy,) = base.iterdir()
        assert (copy.stat().st_mode & 0o7777, copy.stat().st_gid) == (0o2550, group)
        assert {path.name: (path.stat().st_mode & 0o777, path.stat().st_gid) for path in copy.iterdir()} == {
            shard_name(0): (0o440, group), STAGED_NAME: (0o440, group), ".lock": (0o640, group)}


@pytest.mark.slow  # an mpiexec job and a mount
@pytest.mark.root("to act as another user")
@as_another_user
def test_staged_copies_of_an_open_store_may_stay_readable(shared, tmp_path):
    """As private as the store, not more: a 0755 store's staged copies keep the umask's 0644."""
    src = shared / "src"
    src.mkdir()
    for i in range(8):
        (src / f"{i}.bin").write_bytes(os.urandom(30_000))
    store = shared / "store"
    fanfs("pack", src, store, "--shard-size", "64K", "--quiet")
    written = _stage_and_mount(store, shared, tmp_path / "mnt")
    shards = [path for path in written if path.name.isdigit()]
    assert {line.split()[0] for line in opened_by_nobody(shards)} == {"read"}
    assert all(path.stat().st_mode & 0o777 == 0o644 for path in shards)


def test_a_store_is_as_private_as_the_directories_above_it(shared):
    """Another user reads a file only through directories they may enter: an open store in a private
    directory (a 0700 home) is private; the group counts only where a directory above is the file's group's."""
    store = shared / "home" / "store"
    store.mkdir(parents=True)
    index = store / "index"
    index.write_bytes(b"")
    os.chmod(index, 0o644)
    os.chmod(store, 0o755)
    for home, expect in ((0o700, 0o600), (0o750, 0o640), (0o711, 0o644), (0o755, 0o644)):
        os.chmod(shared / "home", home)
        assert file_mode(readable_by_others(str(index))) == expect, oct(home)
    if os.geteuid() == 0:  # a directory of another group lets the file's group through only if it is theirs
        os.chown(shared / "home", -1, os.getgid() + 1)
        os.chmod(shared / "home", 0o750)
        assert file_mode(readable_by_others(str(index))) == 0o600
    os.chmod(store, 0o700)
    os.chmod(shared / "home", 0o755)
    assert file_mode(readable_by_others(str(index))) == 0o600


@pytest.mark.root("to act as another user")
@as_another_user
def test_a_store_packed_with_prefixes_is_as_readable_as_its_sources(shared):
    """``PREFIX=SRC`` names SRC: a store packed from open sources under prefixes is as open as one without them (issue
    41: it came out 0700/0600 without a word), and a private source under a prefix still makes a private store, which
    pack says."""
    for name in ("train", "val"):
        (shared / name / "n01").mkdir(parents=True)
        (shared / name / "n01" / "a.bin").write_bytes(os.urandom(3000))
    old = os.umask(0o022)
    try:
        done = fanfs("pack", f"train={shared / 'train'}", f"val={shared / 'val'}", shared / "open", "--quiet")
        assert "private" not in done.stderr
        assert {line.split()[0] for line in opened_by_nobody(files_under(shared / "open"))} == {"read"}
        assert (shared / "open").stat().st_mode & 0o777 == 0o755
        os.chmod(shared / "val", 0o700)
        done = fanfs("pack", f"train={shared / 'train'}", f"val={shared / 'val'}", shared / "closed", "--quiet")
        assert opened_by_nobody(files_under(shared / "closed")) == []
        assert "is as private as its sources" in done.stderr and "files 0600" in done.stderr, done.stderr
    finally:
        os.umask(old)
