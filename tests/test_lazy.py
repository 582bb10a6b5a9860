"""Issue 30: a cache, not only a copy (``--stage lazy``, ``--capacity``, ``ctl --order``), on one node.

The cache itself is tested in-process against processes racing for the same blobs and one killed while it fetches;
the rest through real mounts: served at once and byte-exact at every fidelity, a second mount resumes from what
the first fetched, a quarter of the share as the capacity never takes more disk, a daemon killed with a copy half
written, a full local disk, and an order followed ahead of the reads.  The multi-node promises (peers fetching what
they were asked for, readers on every node racing) are in ``test_lazy_cluster.py``.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.inject import inject
from fanfs_command import fanfs, force_unmount, stats_command as stats

from fanfs.errors import FanfsError
from fanfs.records import FULL, blob_ranks
from fanfs.store import Store
from fanfs.cache.localcache import (ABSENT, DATA_NAME, FILLING, HEADER_SIZE, HOLE, KEPT, STATE_NAME, DiskCache, footprints,
                                    state_file_bytes)

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """40 real photos as progressive records, a 1.5 MB plain file (chunks) and a sparse one (holes)."""
    from photo_samples import make_photo_set
    base = tmp_path_factory.mktemp("lazy")
    make_photo_set(base / "src" / "photos", 40)
    rng = random.Random(3)
    (base / "src" / "big.bin").write_bytes(rng.randbytes(1_500_000))
    with open(base / "src" / "sparse.bin", "wb") as f:  # a hole in the middle: kept chunked, whatever speeds pack measures
        f.write(rng.randbytes(5000))
        f.seek(2_505_000)
        f.write(rng.randbytes(5000))
    fanfs("pack", base / "src", base / "store", "--progressive-jpeg", "--shard-size", "512K", "--quiet")
    names = sorted(str(p.relative_to(base / "src")) for p in (base / "src").rglob("*") if p.is_file())
    store = Store(str(base / "store"))
    expected = {k: {n: store.read_file(n, k) for n in names} for k in (1, 2, 5, FULL)}
    store.close()
    return base / "store", names, expected


def states(local: Path) -> np.ndarray:
    return np.frombuffer((local / STATE_NAME).read_bytes()[64:], np.uint8)


def disk_bytes(local: Path) -> int:
    """What the local directory really takes (sparse files: their blocks)."""
    return sum(p.stat().st_blocks * 512 for p in local.iterdir())


def read_all(mnt: Path, names: list[str]) -> dict[str, bytes]:
    return {n: read(mnt / n) for n in names}


def read(path: Path) -> bytes:
    """A file's bytes, its pages then dropped from the kernel's cache: the next read asks the daemon again."""
    with open(path, "rb") as f:
        data = f.read()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data


# --- the cache in-process -----------------------------------------------------------------------------------

def _fill_all(local: str, store: str, order_seed: int, log: str) -> None:
    """A process of a node: fill every blob, in an order of its own, each fetch noted in ``log``."""
    shards = Store(store, check_shards=False)
    index = shards.index
    cache = DiskCache(local, index, bytes.fromhex(index.meta["store_id"]))
    files = np.flatnonzero(index.type == 1)
    shard_of = np.repeat(index.shard[files], index.count[files])  # blobs are numbered file by file
    blobs = np.flatnonzero(index.blob_stored).tolist()
    random.Random(order_seed).shuffle(blobs)

    def fetch(blob: int) -> bytes:
        with open(log, "a") as f:
            f.write(f"{blob}\n")
        time.sleep(0.002)
        return shards.sources[0].read(blob, int(shard_of[blob]), int(index.blob_offset[blob]),
                                      int(index.blob_stored[blob]))

    for blob in blobs:
        data, _, why = cache.fill(blob, lambda: fetch(blob))
        assert not why and len(data) == index.blob_stored[blob]


def new_cache(store: Path, tmp_path: Path) -> tuple[Any, Path, DiskCache]:
    """The store's index, a fresh local directory and the cache its node's daemon opens there."""
    index = Store(str(store), check_shards=False).index
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    return index, local, DiskCache(str(local), index, bytes.fromhex(index.meta["store_id"]), owner=True)


def test_processes_racing_for_the_same_blobs_fetch_each_once(photos, tmp_path):
    index, local, owner = new_cache(photos[0], tmp_path)
    store = photos[0]
    owner.recover(np.ones(index.blob_stored.size, bool))
    log = tmp_path / "fetched"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_fill_all, args=(str(local), str(store), seed, str(log))) for seed in range(5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 5
    fetched = [int(line) for line in log.read_text().split()]
    assert len(fetched) == len(set(fetched)) == int((index.blob_stored > 0).sum())  # each blob once, by one process
    final = states(local)
    assert (final[index.blob_stored > 0] == KEPT).all() and (final[index.blob_stored == 0] == HOLE).all()
    data = (local / "cache.data").read_bytes()
    for blob in np.flatnonzero(index.blob_stored).tolist()[::7]:
        slot = int(owner.slot[blob])
        assert owner.read(blob, int(index.blob_stored[blob])) == data[slot:slot + int(index.blob_stored[blob])]
    assert disk_bytes(local) <= int(owner.footprint.sum()) + state_file_bytes(index.blob_stored.size)
    owner.close()


def _fill_slowly(local: str, store: str, blob: int) -> None:
    index = Store(store, check_shards=False).index
    cache = DiskCache(local, index, bytes.fromhex(index.meta["store_id"]))
    cache.fill(blob, lambda: time.sleep(600) or b"")  # killed while it fetches


def test_a_process_killed_mid_fetch_holds_nothing_up_and_leaves_nothing_trusted(photos, tmp_path):
    index, local, owner = new_cache(photos[0], tmp_path)
    store = photos[0]
    blob = int(np.flatnonzero(index.blob_stored > 100)[0])
    child = mp.get_context("fork").Process(target=_fill_slowly, args=(str(local), str(store), blob))
    child.start()
    try:
        deadline = time.monotonic() + 30
        while owner.state(blob) != FILLING:
            assert time.monotonic() < deadline and child.is_alive()
            time.sleep(0.01)
    finally:  # killed however this ends (a child left would hold pytest's exit for its 600 s)
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert owner.state(blob) == FILLING  # what it was doing is marked, and no reader trusts it
    assert owner.read(blob, int(index.blob_stored[blob])) is None
    shards = Store(str(store), check_shards=False)
    entry = int(np.searchsorted(index.first, blob, side="right") - 1)
    good = shards.sources[0].read(blob, int(index.shard[entry]), int(index.blob_offset[blob]), int(index.blob_stored[blob]))
    filled: list = []
    filler = threading.Thread(target=lambda: filled.append(owner.fill(blob, lambda: good)))
    filler.start()
    filler.join(timeout=60)  # its lock went with it: nothing waits for the dead process
    assert not filler.is_alive() and filled[0][:2] == (good, True) and owner.state(blob) == KEPT
    owner._states[blob] = FILLING  # as a crash of the whole node leaves it
    owner.close()
    again = DiskCache(str(local), index, bytes.fromhex(index.meta["store_id"]), owner=True)
    assert again.recover(np.ones(index.blob_stored.size, bool)) == 1 and again.state(blob) == ABSENT
    again.close()


def test_a_second_daemon_on_the_same_local_directory_is_refused(photos, tmp_path):
    index, local, first = new_cache(photos[0], tmp_path)
    store_id = bytes.fromhex(index.meta["store_id"])
    with pytest.raises(FanfsError, match="another fanfs mount"):
        DiskCache(str(local), index, store_id, owner=True)
    first.close()
    DiskCache(str(local), index, store_id, owner=True).close()


def test_the_caches_files_are_private_whatever_the_umask(photos, tmp_path):
    """A lazy cache holds a private store's bytes: its files are 0600 even under umask 0."""
    old = os.umask(0)
    try:
        index, local, owner = new_cache(photos[0], tmp_path)
        owner.close()
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in local.iterdir()}
    assert modes and set(modes.values()) == {"0o600"}, modes


# --- through a mount --------------------------------------------------------------------------------------

@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
def test_lazy_mount_serves_at_once_every_fidelity_byte_exact_and_a_second_mount_resumes(photos, tmp_path, mount):
    store, names, expected = photos
    local = tmp_path / "local"
    with mount(store, "--local-dir", local, "--stage", "lazy", "--fidelity", "2") as mnt:
        assert disk_bytes(local) <= 8192  # nothing copied before serving
        assert read_all(mnt, names) == expected[2]
        first = stats(mnt)["cache"]
        for k in (1, 5, "full"):
            fanfs("ctl", mnt, "--fidelity", str(k))
            assert read_all(mnt, names) == expected[FULL if k == "full" else k]
        cache = stats(mnt)["cache"]
    index = Store(str(store), check_shards=False).index
    assert first["fills"] < cache["fills"] == int((index.blob_stored > 0).sum())  # each blob fetched once
    assert cache["read_through_bytes"] == 0 and cache["unkept"] == 0
    assert (states(local)[index.blob_stored > 0] == KEPT).all()
    with mount(store, "--local-dir", local, "--stage", "lazy") as mnt:  # a second mount: all there already
        assert read_all(mnt, names) == expected[FULL]
        again = stats(mnt)["cache"]
    assert again["fills"] == 0 and again["hit_bytes"] == int(index.blob_stored.sum())


@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
def test_a_quarter_of_the_share_as_capacity(photos, tmp_path, mount):
    store, names, expected = photos
    index = Store(str(store), check_shards=False).index
    capacity = int(index.blob_stored.sum()) // 4
    local = tmp_path / "local"
    with mount(store, "--local-dir", local, "--stage", "lazy", "--capacity", str(capacity)) as mnt:
        seen = []
        for _ in range(2):
            for n in names:
                assert read(mnt / n) == expected[FULL][n]
                seen.append(disk_bytes(local))
        cache = stats(mnt)["cache"]
        text = fanfs("stats", mnt).stdout
    assert max(seen) <= capacity  # never more than the budget on disk
    assert cache["capacity"] == capacity and cache["held_bytes"] <= capacity - state_file_bytes(index.blob_stored.size)
    assert cache["hit_bytes"] > 0 and cache["read_through_bytes"] > 0  # hits the second time, the rest read through
    kept = states(local) == KEPT
    assert kept.any() and int(index.blob_stored[kept].sum()) == cache["fill_bytes"]
    assert "read through" in text and "capacity" in text
    ranks = blob_ranks(index)  # a record's first layers are what it keeps first
    assert ranks[kept].max() <= ranks[~kept & (index.blob_stored > 0)].min()


def _waiting_for_a_lock(path: Path) -> bool:
    """Whether some process waits for a lock on the file ``path`` (a blocked request, ``->`` in /proc/locks)."""
    inode = os.stat(path).st_ino
    return any(line.split()[1] == "->" and line.split()[6].rsplit(":", 1)[1] == str(inode)
               for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.mount_only  # the daemon's own counters
def test_a_bad_copy_in_the_cache_is_dropped_by_a_thread_not_the_loop(photos, tmp_path, mount):
    """Issue 49: a kept copy that failed its checksum was dropped by the serving loop itself, which waits for the drop's
    lock while a reader in another process holds it (and for the disk that frees its blocks): every read of the mount
    waited meanwhile.  Here the test holds that lock: the bad copy's read is answered from the shared store and another
    file's read in the loop, while the drop waits; once the lock is free the copy is dropped and fetched again."""
    store, names, expected = photos
    local = tmp_path / "local"
    bad, other = [name for name in names if name.startswith("photos/")][:2]
    index = Store(str(store), check_shards=False).index
    blob = int(index.first[index.lookup(bad.encode())])
    slot = int(np.concatenate([[0], np.cumsum(footprints(index.blob_stored))])[blob])
    with mount(store, "--local-dir", local, "--stage", "lazy") as mnt:
        assert read_all(mnt, names) == expected[FULL]  # every blob kept
        with open(local / DATA_NAME, "r+b") as data:  # a flipped byte in the kept copy of bad's first blob
            byte = os.pread(data.fileno(), 1, slot)
            os.pwrite(data.fileno(), bytes([byte[0] ^ 0xFF]), slot)
        lock = os.open(local / STATE_NAME, os.O_RDONLY)
        try:  # a reader of that blob in another process, as it reads (an open file description lock, as the cache's)
            fcntl.fcntl(lock, fcntl.F_OFD_SETLK, struct.pack("hhxxxxqqixxxx", fcntl.F_RDLCK, os.SEEK_SET,
                                                            HEADER_SIZE + blob, 1, 0))
            got: dict[str, bytes] = {}
            reading = threading.Thread(target=lambda: got.update(bad=read(mnt / bad)), daemon=True)
            reading.start()
            deadline = time.monotonic() + 60
            while not _waiting_for_a_lock(local / STATE_NAME):  # the drop waits for the test's lock
                assert time.monotonic() < deadline, "the bad copy was never dropped"
                time.sleep(0.02)
            answered = threading.Thread(target=lambda: got.update(other=read(mnt / other)), daemon=True)
            answered.start()
            answered.join(60)
            assert not answered.is_alive(), "a read waited for the drop of another file's bad copy"
            reading.join(60)
            assert got == {"bad": expected[FULL][bad], "other": expected[FULL][other]}
        finally:
            os.close(lock)
        deadline = time.monotonic() + 60
        while stats(mnt)["cache"]["dropped"] != 1:
            assert time.monotonic() < deadline, "the bad copy was not dropped once its lock was free"
            time.sleep(0.05)
        assert read(mnt / bad) == expected[FULL][bad]  # fetched again, and kept
        assert states(local)[blob] == KEPT


@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
def test_a_daemon_killed_mid_fetch_and_a_second_mount(photos, tmp_path, mount, monkeypatch):
    store, names, expected = photos
    local, mnt = tmp_path / "local", tmp_path / "mnt"
    mnt.mkdir()
    with monkeypatch.context() as patch:
        env = inject(patch, "fanfs.cache.localcache:os.pwrite=faults.half_written(os.pwrite, 60)")  # a fill waits with half its copy written
    fanfs("mount", store, mnt, "--local-dir", local, "--stage", "lazy", env=env)
    try:
        from fanfs.serve.control import request
        pid = request(str(mnt), {"cmd": "status"})["pid"]
        reader = subprocess.Popen(["cat", str(mnt / names[0])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (states(local) == FILLING).any():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)  # with half a copy written
        reader.wait(timeout=30)
    finally:
        force_unmount(mnt)
    cut = np.flatnonzero(states(local) == FILLING)
    assert cut.size == 1
    with mount(store, "--local-dir", local, "--stage", "lazy") as again:
        assert read_all(again, names) == expected[FULL]
        cache = stats(again)["cache"]
    index = Store(str(store), check_shards=False).index
    assert cache["fills"] == int((index.blob_stored > 0).sum())  # the cut copy was fetched again, not trusted
    assert states(local)[cut[0]] == KEPT


@pytest.mark.slow
@pytest.mark.root("to mount a small tmpfs")
def test_a_full_disk_during_a_lazy_fetch_reads_through_and_says_why(photos, tmp_path, mount):
    from fanfs.serve.control import log_path
    store, names, expected = photos
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        local = small / "local"
        started = fanfs("mount", store, mnt, "--local-dir", local, "--stage", "lazy", "--workers", "1")
        assert read_all(mnt, names) == expected[FULL]
        cache = stats(mnt)["cache"]
        text = fanfs("stats", mnt).stdout
        log = Path(log_path(str(mnt))).read_text()
        fanfs("umount", mnt)
        assert cache["unkept"] > 0 and cache["fills"] > 0 and disk_bytes(local) <= 1 << 20
        assert "free, but this node's cache may grow by" in started.stderr  # said at the start
        assert "(the local directory is full); it is read through from shared store" in log  # and at the first one
        assert "could not be kept (the local directory was full" in text
    finally:
        force_unmount(mnt)
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
@pytest.mark.root("to mount a small tmpfs")
def test_a_lazy_cache_on_a_full_disk_gives_one_account_of_its_blobs(photos, tmp_path, mount):
    """Issue 41: on a full disk, stats said '2,000 fetched and kept (876.8 MiB)' beside '300.0 MiB on disk now' and
    '1,233 blobs could not be kept': the fetched ones counted those not kept.  Now one account: fetched = kept + not
    kept, bytes too; kept now = what those kept, the blobs the cache had at the mount's start included (a second
    mount starts with them)."""
    from fanfs.util.units import human_size
    store, names, expected = photos
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)], check=True)
    try:
        local = small / "local"
        with mount(store, "--local-dir", local, "--stage", "lazy", "--workers", "1") as mnt:
            assert read_all(mnt, names) == expected[FULL]
            first, text = stats(mnt)["cache"], fanfs("stats", mnt).stdout
        with mount(store, "--local-dir", local, "--stage", "lazy", "--workers", "1") as mnt:
            second = stats(mnt)["cache"]
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    kept = first["fills"] - first["unkept"]
    assert first["unkept"] > 0 and kept > 0 and first["kept_at_start"] == 0, first
    assert kept == first["kept_blobs"] and first["fill_bytes"] - first["unkept_bytes"] == first["kept_stored_bytes"]
    lines = {line[:10].strip(): line[11:] for line in text.splitlines()}
    assert lines["fetched"] == (
        f"{first['fills']:,} blobs ({human_size(first['fill_bytes'])}) by reads since the mount: {kept:,} kept "
        f"({human_size(first['kept_stored_bytes'])}), {first['unkept']:,} ({human_size(first['unkept_bytes'])}) could "
        "not be kept (the local directory was full: see the log)"), text
    assert lines["kept now"] == f"{kept:,} blobs ({human_size(first['kept_stored_bytes'])}), 0 of them kept when the " \
                                "mount started", text
    assert "fetched and kept" not in text
    assert second["kept_at_start"] == second["kept_blobs"] == kept and second["fills"] == 0, second


@pytest.fixture
def one_file_store(tmp_path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"a")
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--quiet")
    return tmp_path / "store"


def test_an_order_with_a_64_kib_line_is_taken(one_file_store, tmp_path, mount):
    """Issue 35: a 64 KiB line (no file of the store) came back whole as the answer's example, over the control
    socket's 64 KiB limit: 'control message longer than 65536 bytes'.  The example is cut; the order is taken."""
    order = tmp_path / "order"
    order.write_text("a\n" + "x" * 65536 + "\na\n")
    with mount(one_file_store, "--local-dir", tmp_path / "local", "--stage", "lazy") as mnt:
        done = fanfs("ctl", mnt, "--order", order, check=False)
    assert done.returncode == 0, done.stderr
    assert "along 2 files in 1 epoch(s)" in done.stdout and "1 paths left out" in done.stdout, done.stdout
    assert "(65,536 characters)" in done.stdout and len(done.stdout) < 1000


def test_an_order_told_to_a_mount_that_reads_nothing_ahead_says_why(one_file_store, tmp_path, mount):
    """Issue 35: 'unknown command 'order'' told a user nothing; a mount whose read-ahead budget is 0 says why it takes
    no order (issue 40: every other mount reads an order ahead)."""
    (tmp_path / "order").write_text("a\n")
    with mount(one_file_store, "--prefetch", "0") as mnt:
        done = fanfs("ctl", mnt, "--order", tmp_path / "order", check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "--prefetch budget is 0" in done.stderr and "unknown" not in done.stderr


@pytest.mark.mount_only  # the daemon's own counters
@pytest.mark.slow
def test_an_order_is_fetched_ahead(photos, tmp_path, mount):
    store, names, expected = photos
    index = Store(str(store), check_shards=False).index
    capacity = int(index.blob_stored.sum()) // 2
    order = tmp_path / "order"
    shuffled = random.Random(1).sample(names, len(names))
    order.write_text("\n".join(shuffled) + "\n\n" + "\n".join(["not/in/the/store", *shuffled]) + "\n")
    local = tmp_path / "local"
    with mount(store, "--local-dir", local, "--stage", "lazy", "--capacity", str(capacity)) as mnt:
        assert "prefetch" not in stats(mnt)  # no order, nothing changes
        out = fanfs("ctl", mnt, "--order", order).stdout
        assert f"along {2 * len(names)} files in 2 epoch(s)" in out and "1 paths left out" in out
        deadline = time.monotonic() + 60
        while not (ahead := stats(mnt)["prefetch"])["waiting"] and time.monotonic() < deadline:
            time.sleep(0.1)  # nobody reads: it stops at its window (it says so), holding what it fetched
        held = stats(mnt)["cache"]
        assert ahead["files"] > 0 and ahead["dropped"] == 0 and held["ahead_bytes"] <= held["window"]
        for n in shuffled:
            assert read(mnt / n) == expected[FULL][n]
            assert disk_bytes(local) <= capacity
        after = stats(mnt)
    assert after["prefetch"]["from_shared"] + after["prefetch"]["kept_fills"] > 0
    assert after["cache"]["hit_blobs"] > 0


def test_lazy_options_misused_are_one_line(photos, tmp_path):
    store, _, _ = photos
    (tmp_path / "mnt").mkdir()
    for args, says in ((["--local-dir", tmp_path / "l", "--capacity", "1G"], "add --stage lazy"),
                       (["--stage", "lazy"], "need --local-dir"),
                       (["--local-dir", tmp_path / "l", "--stage", "lazy", "--capacity", "0"], "above 0")):
        done = fanfs("mount", store, tmp_path / "mnt", *args, check=False)
        assert done.returncode != 0 and says in done.stderr, done.stderr
    force_unmount(tmp_path / "mnt")


@pytest.mark.slow
def test_capacity_figures_agree_and_never_exceed_the_capacity(photos, tmp_path, mount):
    """Issue 35: the mount's log, ``info --capacity`` and ``stats`` gave three figures for one node (85.9, 74.3 and
    30.1 MiB against a 30.0 MiB capacity): one definition (cache slots, :meth:`CachePlan.kept_bytes`, which the log
    line uses too), the same figures in info and stats, none above the capacity, whatever the cache holds while an
    order is fetched ahead and the files are read."""
    from fanfs.util.units import human_size
    store, names, expected = photos
    total = int(Store(str(store), check_shards=False).index.blob_stored.sum())
    capacity = total // 3
    info = json.loads(fanfs("info", store, "--capacity", str(capacity), "--json").stdout)["capacity"]
    (share,), (keeps,) = info["node_share_bytes"], info["node_kept_bytes"]
    assert 0 < keeps <= capacity < share
    order = tmp_path / "order"
    order.write_text("\n".join(random.Random(2).sample(names, len(names))) + "\n")
    with mount(store, "--local-dir", tmp_path / "local", "--stage", "lazy", "--capacity", str(capacity)) as mnt:
        fanfs("ctl", mnt, "--order", order)
        seen = []
        for n in names:
            assert read(mnt / n) == expected[FULL][n]
            seen.append(stats(mnt)["cache"])
        text = fanfs("stats", mnt).stdout
    assert f"keeps up to {human_size(keeps)} of its {human_size(share)} share" in text
    assert all(c["keeps_bytes"] == keeps and c["share_bytes"] == share and c["capacity"] == capacity for c in seen)
    assert max(c["held_bytes"] for c in seen) <= capacity
    assert max(c["kept_bytes"] for c in seen) <= keeps
    assert f"{human_size(share):>9} {human_size(keeps):>12}" in fanfs("info", store, "--capacity", str(capacity)).stdout


def test_info_capacity(photos):
    store, _, _ = photos
    index = Store(str(store), check_shards=False).index
    total = int(index.blob_stored.sum())
    info = json.loads(fanfs("info", store, "--nodes", "3", "--replicas", "2", "--capacity", str(total // 4),
                            "--json").stdout)["capacity"]
    assert len(info["node_kept_bytes"]) == 3 and max(info["node_kept_bytes"]) <= total // 4
    assert 0 < info["read_kept_bytes"] < info["read_bytes"] == total
    text = fanfs("info", store, "--nodes", "3", "--replicas", "2", "--capacity", str(total // 4)).stdout
    assert "read through from the shared store" in text and "keeps" in text
