"""Issue 50 (major 6): a store many users read is staged once per node and shared by every job on it
(``--stage shared``, ``FANFS_STAGE=shared``; fanfs/cache/sharedcopy.py, docs/shared.rst).

Mounts of one store, one after another or started at once, read one copy, staged once (a fuller copy serves a lower
fidelity too); it goes with the last of them, or stays as the site's keep says, and what a job killed outright left is
pruned.  Another user's copy (fanfs-alice's, fanfs-bob's: tests/support/users.py) is read and checked on every read,
never spliced: its owner may change it under a mount without moving its change time; and a copy another user planted,
left incomplete or never lets grow costs a job a private copy of its own, never its bytes nor its start.  The Slurm jobs of two users on one node are in
tests/test_slurm_shared.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import FANFS, fanfs, mounted, stats_command
from support.inject import inject

from fanfs.cache.stage import STAGED_NAME

READER = Path(__file__).resolve().parent / "support" / "run_reader.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def published():
    """A store as a data manager publishes it, open to every user (0755 from /tmp down): 40 small files over several
    shards and one large file stored raw (an extent, 3 chunks); its source; the directory holding both."""
    top = Path(tempfile.mkdtemp(prefix="fanfs-test-shared-", dir="/tmp"))
    top.chmod(0o755)
    src = top / "src"
    src.mkdir()
    rng = np.random.default_rng(50)
    for i in range(40):
        (src / f"{i:02d}.bin").write_bytes(rng.bytes(2000 + 397 * i))
    (src / "big.raw").write_bytes(rng.bytes(2 * MIB + 4321))
    fanfs("pack", src, top / "store", "--shard-size", "256K", "--quiet")
    yield src, top / "store", top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def base(published):
    """The node's directory of shared copies, as an administrator makes it: open to all and sticky."""
    path = Path(tempfile.mkdtemp(prefix="base-", dir=published[2]))
    path.chmod(0o1777)
    yield path
    for directory, _, _ in os.walk(path):
        os.chmod(directory, 0o700)  # a complete copy is read-only
    shutil.rmtree(path)


def shared(local: Path, base: Path) -> tuple[str, ...]:
    return "--local-dir", str(local), "--stage", "shared", "--shared-local", str(base)


def exact(src: Path, mnt: Path) -> list[str]:
    """The files under ``mnt`` that do not read as the source's."""
    return [path.name for path in src.iterdir() if (mnt / path.name).read_bytes() != path.read_bytes()]


def copies_in(base: Path) -> list[Path]:
    return sorted(base.iterdir())


def test_mounts_of_one_store_share_one_copy_that_goes_with_the_last(published, base, tmp_path):
    """Two mounts read one copy, staged by the first (the second copies nothing), exact, spliced (the copy is this
    user's); a reader under ``fanfs run`` reads it in-process (the mount's recipe says where); the copy stays while
    either mount reads it and goes with the last."""
    src, store, _ = published
    with mounted(store, tmp_path / "m1", *shared(tmp_path / "own1", base)) as m1:
        (copy,) = copies_in(base)
        staged = (copy / STAGED_NAME).stat()
        with mounted(store, tmp_path / "m2", *shared(tmp_path / "own2", base)) as m2:
            assert copies_in(base) == [copy] and (copy / STAGED_NAME).stat().st_mtime_ns == staged.st_mtime_ns
            for mnt in (m1, m2):
                assert exact(src, mnt) == []
                assert stats_command(mnt)["shared_copy"] == {"directory": str(copy), "owner": os.getuid(),
                                                             "spliced": True}
            done = subprocess.run([*FANFS, "run", "--mount", str(m2), "--", sys.executable, READER, str(m2), "tree"],
                                  capture_output=True, text=True, timeout=120, check=True)
            read = json.loads(done.stdout.splitlines()[-1])
            assert read.pop("in_process") and len(read) == 41
            assert not (tmp_path / "own1").exists() and not (tmp_path / "own2").exists(), "nothing staged privately"
        assert copies_in(base) == [copy], "m1 reads it still"
        assert exact(src, m1) == []
    assert copies_in(base) == [], "the last mount took it away"


def test_mounts_started_at_once_stage_one_copy(published, base, tmp_path, monkeypatch):
    """Four mounts started at the same moment: one stages the copy, the others wait for it and copy nothing.  Each
    shard's staging pauses a moment, so that the others find it being staged (the Python start-ups of four processes
    on two cores are further apart than a small store's whole staging)."""
    inject(monkeypatch, "fanfs.cache.stage:stage_part=faults.pausing(stage_part, 0.3)")
    src, store, _ = published
    points = [tmp_path / f"m{i}" for i in range(4)]
    for point in points:
        point.mkdir()
    started = [subprocess.Popen([*FANFS, "mount", str(store), str(point), *shared(tmp_path / f"own{i}", base)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i, point in enumerate(points)]
    try:
        outputs = [process.communicate(timeout=120) for process in started]
        assert all(process.returncode == 0 for process in started), outputs
        copied = [line.split("copied ")[1].split(",")[0] for out, _ in outputs for line in out.splitlines()
                  if line.startswith("staged ")]
        assert len(copied) == 4 and copied.count("0 B") == 3, outputs
        assert len(copies_in(base)) == 1
        for point in points:
            assert exact(src, point) == []
    finally:
        for point in points:
            fanfs("umount", point, check=False)
    assert copies_in(base) == []


_HOLD = """
import os, signal, sys
from fanfs.cache.sharedcopy import Claim, acquire
from fanfs.cache.stage import stage
from fanfs.peers.world import World
from fanfs.records import Presentation
from fanfs.store.index import Index
store, base, what = sys.argv[1:]
index = Index(os.path.join(store, "index"))
got = acquire(base, store, index, Presentation())
if what == "complete" and isinstance(got, Claim):
    stage(store, got.directory, 1, World.detect(), index, progress=False)
    got = got.complete(Presentation())
print(type(got).__name__, flush=True)
sys.stdin.read()  # held until the test kills it
"""


@pytest.fixture
def hold():
    """``hold(store, base, what, **popen)``: a process of a job holding the store's copy in ``base``: staged and leased
    ("complete"), or claimed and never staged ("claim"); its first line says which it got.  Killed at the end of the
    test, if the test did not."""
    started = []

    def start(store: Path, base: Path, what: str, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", _HOLD, str(store), str(base), what], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, **kwargs)
        started.append(process)
        process.first = process.stdout.readline().strip()
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_copy_a_killed_job_left_is_used_again_then_pruned(published, base, tmp_path, hold):
    """SIGKILL drops a job's lease with it: its complete copy is left unused, which the next mount leases again (no
    staging) and which goes with that mount; or which ``fanfs shared prune`` removes.  A staging killed outright leaves
    an incomplete copy that the next job of this user resumes."""
    src, store, _ = published
    holder = hold(store, base, "complete")
    assert holder.first == "Lease"
    (copy,) = copies_in(base)
    staged = (copy / STAGED_NAME).stat().st_mtime_ns
    listed = json.loads(fanfs("shared", "list", base, "--json").stdout)
    assert [entry["state"] for entry in listed] == ["in use"]
    holder.kill()
    holder.wait()
    assert [entry["state"] for entry in json.loads(fanfs("shared", "list", base, "--json").stdout)] == ["unused"]
    with mounted(store, tmp_path / "mnt", *shared(tmp_path / "own", base)) as mnt:
        assert copies_in(base) == [copy] and (copy / STAGED_NAME).stat().st_mtime_ns == staged
        assert exact(src, mnt) == []
    assert copies_in(base) == []

    holder = hold(store, base, "complete")
    holder.kill()
    holder.wait()
    assert fanfs("shared", "prune", base).stdout.splitlines() == [f"removed {copy}"]
    assert copies_in(base) == []

    holder = hold(store, base, "claim")  # a staging killed before it copied a byte
    assert holder.first == "Claim"
    holder.kill()
    holder.wait()
    assert [entry["state"] for entry in json.loads(fanfs("shared", "list", base, "--json").stdout)] == ["incomplete"]
    with mounted(store, tmp_path / "mnt", *shared(tmp_path / "own", base)) as mnt:
        assert copies_in(base) == [copy] and (copy / STAGED_NAME).exists(), "resumed in place"
        assert exact(src, mnt) == []
    assert copies_in(base) == []


def test_a_staging_that_does_not_grow_is_not_waited_for(published, base, tmp_path, monkeypatch, hold):
    """A job that claimed the copy and copies nothing (stopped, or a user holding its lock) costs another job
    ``STALL`` seconds at most: that job stages a private copy, says so, and reads exact."""
    src, store, _ = published
    assert hold(store, base, "claim").first == "Claim"
    inject(monkeypatch, "fanfs.cache.sharedcopy:STALL=2")
    with mounted(store, tmp_path / "mnt", *shared(tmp_path / "own", base)) as mnt:
        assert exact(src, mnt) == []
        assert "shared_copy" not in stats_command(mnt)
        assert sorted(path.name for path in (tmp_path / "own").iterdir())[:1] == [STAGED_NAME]


@pytest.mark.slow  # two stores, two mounts and three prunes
def test_the_site_keeps_unused_copies_within_its_size(published, base, tmp_path):
    """``FANFS_SHARED_KEEP``: unused copies stay while all the copies take at most that much, the newest staged kept;
    ``fanfs shared prune --keep`` applies another size."""
    src, store, top = published
    other = tmp_path / "other"
    other.mkdir()
    (other / "one.bin").write_bytes(os.urandom(50_000))
    fanfs("pack", other, top / "other.store", "--quiet")
    try:
        env = {**os.environ, "FANFS_SHARED_KEEP": "1G"}
        for which in (store, top / "other.store"):
            with mounted(which, tmp_path / "mnt", *shared(tmp_path / "own", base), env=env):
                pass
        first, second = sorted(copies_in(base), key=lambda copy: (copy / STAGED_NAME).stat().st_mtime_ns)
        listed = {entry["path"]: entry for entry in json.loads(fanfs("shared", "list", base, "--json").stdout)}
        assert [listed[str(copy)]["state"] for copy in (first, second)] == ["unused", "unused"]
        assert fanfs("shared", "prune", base, "--keep", str(listed[str(second)]["bytes"])).stdout.split() == \
            ["removed", str(first)]
        assert copies_in(base) == [second]
        fanfs("shared", "prune", base, env=env)
        assert copies_in(base) == [second], "within the site's keep"
        fanfs("shared", "prune", base, "--keep", "0")
        assert copies_in(base) == []
    finally:
        shutil.rmtree(top / "other.store")


@pytest.mark.parametrize("owner,mode,why", [(None, None, "--stage shared needs"), (None, 0o777, "is not sticky"),
                                            (65534, 0o1777, "belongs to uid 65534")])
def test_a_bad_directory_of_shared_copies_is_one_line(published, tmp_path, owner, mode, why):
    """None given, or one that others may write without the sticky bit or that another user owns (either could swap
    the copies), is refused before anything is staged, with one line saying what the administrator does."""
    if owner is not None and os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    store = published[1]
    (tmp_path / "mnt").mkdir()
    base = tmp_path / "base"
    args = ["mount", store, tmp_path / "mnt", "--local-dir", tmp_path / "own", "--stage", "shared"]
    if mode is not None:
        base.mkdir()
        base.chmod(mode)
        args += ["--shared-local", base]
    if owner is not None:
        os.chown(base, owner, -1)
    done = fanfs(*args, check=False, env={k: v for k, v in os.environ.items() if k != "FANFS_SHARED_LOCAL"})
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1 and why in done.stderr, done.stderr
    assert not os.path.ismount(tmp_path / "mnt") and not (tmp_path / "own").exists()


def as_user(user, tmp_path: Path) -> dict:
    """What runs a process as ``user`` (a local user of tests/support/users.py): its ids, and an environment with this
    checkout's fanfs and a runtime directory of its own."""
    run = tmp_path / f"run-{user.pw_name}"
    run.mkdir(mode=0o700, exist_ok=True)
    os.chown(run, user.pw_uid, user.pw_gid)
    tmp_path.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ["PYTHONPATH"], "FANFS_RUNTIME_DIR": str(run)}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "env": env, "cwd": "/"}


_ATTACK = """
import mmap, os, sys
shard, offset = sys.argv[1], int(sys.argv[2])
os.chmod(shard, 0o644)  # its owner may
fd = os.open(shard, os.O_RDWR)
pages = mmap.mmap(fd, 0)
pages[offset] = pages[offset]  # the page is dirty from here on: a write to it moves no time of the file's
print("dirty", flush=True)
sys.stdin.readline()
pages[offset + 1] ^= 0xFF
print("changed", flush=True)
sys.stdin.read()
"""


def drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_another_user_s_copy_is_checked_on_every_read_never_spliced(published, base, tmp_path, local_users, hold):
    """fanfs-alice's job staged the copy; this user's mount reads it, checking every read.  Alice then changes a byte
    of the large file's chunk through a mapping whose page she had written before the mount verified it, so the
    copy's change time does not move: a splice would serve her byte (it did, before the copy's owner was asked), the
    check reads the shared store's."""
    src, store, _ = published
    alice = local_users[0]
    holder = hold(store, base, "complete", **as_user(alice, tmp_path))
    attacker = None
    try:
        assert holder.first == "Lease"
        (copy,) = copies_in(base)
        want = (src / "big.raw").read_bytes()
        shard = next(path for path in copy.iterdir() if path.stat().st_size > len(want))
        offset = shard.read_bytes().find(want[:MIB]) + 100
        attacker = subprocess.Popen([sys.executable, "-c", _ATTACK, str(shard), str(offset)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, **as_user(alice, tmp_path))
        assert attacker.stdout.readline().strip() == "dirty"
        with mounted(store, tmp_path / "mnt", *shared(tmp_path / "own", base)) as mnt:
            assert copies_in(base) == [copy], "alice's copy, not one of this job's"
            assert stats_command(mnt)["shared_copy"] == {"directory": str(copy), "owner": alice.pw_uid,
                                                         "spliced": False}
            assert exact(src, mnt) == []
            drop_pages(mnt / "big.raw")
            assert (mnt / "big.raw").read_bytes() == want
            attacker.stdin.write("go\n")
            attacker.stdin.flush()
            assert attacker.stdout.readline().strip() == "changed"
            assert shard.read_bytes()[offset + 1] != want[101]
            drop_pages(mnt / "big.raw")
            assert (mnt / "big.raw").read_bytes() == want, "alice's byte was served"
    finally:
        for process in filter(None, (attacker, holder)):
            process.kill()
            process.wait()


_PLANT = """
import json, os, sys
path, kind, sizes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if kind == "symlink":
    os.symlink("/tmp", path)
else:
    os.mkdir(path, 0o755)
    open(os.path.join(path, ".lock"), "w").close()
    for name, size in sizes.items():  # every shard at its size, all zeros but the header
        with open(os.path.join(path, name), "wb") as f:
            f.truncate(size)
    with open(os.path.join(path, ".staged"), "w") as f:
        json.dump({"store_id": sys.argv[4], "fidelity": 65535, "precision": 65535}, f)
"""


@pytest.mark.parametrize("kind", ["garbage", pytest.param("symlink", marks=pytest.mark.slow)])
def test_a_copy_another_user_planted_costs_no_byte(published, base, tmp_path, local_users, kind):
    """fanfs-bob, who may read the store, makes its copy first: a directory that says it is complete and holds zeros
    (every read of it fails its check and is read from the shared store), or a symbolic link (not a copy: the job
    stages its own).  Every file reads exact; the index is never the copy's.  (This user is root, who removes a copy
    nobody uses once its mount ends, whoever made it.)"""
    from fanfs.store.index import Index
    src, store, _ = published
    index = Index(str(store / "index"))
    store_id = index.meta["store_id"]
    path = base / f"fanfs-{store_id}-ffff-ffff"
    sizes = {path.name: path.stat().st_size for path in (store / "shards").iterdir()}
    subprocess.run([sys.executable, "-c", _PLANT, str(path), kind, json.dumps(sizes), store_id], check=True,
                   **as_user(local_users[1], tmp_path))
    with mounted(store, tmp_path / "mnt", *shared(tmp_path / "own", base)) as mnt:
        assert exact(src, mnt) == []
        copy = stats_command(mnt).get("shared_copy")
        if kind == "garbage":
            assert copy == {"directory": str(path), "owner": local_users[1].pw_uid, "spliced": False}
        else:
            assert copy is None and (tmp_path / "own" / STAGED_NAME).exists(), "a private copy"
    assert os.path.lexists(path) == (kind == "symlink"), "root removes a copy nobody uses, whoever made it; no link"


@pytest.mark.slow  # a store of progressive JPEGs, three mounts
def test_a_fuller_copy_serves_a_lower_fidelity(published, base, tmp_path):
    """A copy staged at full fidelity holds every layer a mount at K reads: a job at K leases it (no copy at K is
    staged) and reads what a mount at K straight on the store reads."""
    from photo_samples import make_photo_set
    make_photo_set(tmp_path / "photos", 12)
    store = published[2] / "photos.store"
    fanfs("pack", tmp_path / "photos", store, "--progressive-jpeg", "--quiet")
    try:
        with mounted(store, tmp_path / "direct", "--fidelity", "2") as direct, \
                mounted(store, tmp_path / "full", *shared(tmp_path / "own1", base)):
            (copy,) = copies_in(base)
            with mounted(store, tmp_path / "k2", *shared(tmp_path / "own2", base), "--fidelity", "2") as k2:
                assert copies_in(base) == [copy]
                assert stats_command(k2)["shared_copy"]["directory"] == str(copy)
                assert [path.name for path in sorted(direct.iterdir()) if path.read_bytes() !=
                        (k2 / path.name).read_bytes()] == []
    finally:
        shutil.rmtree(store)
    assert copies_in(base) == []
