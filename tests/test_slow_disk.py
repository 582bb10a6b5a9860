"""Issue 40: the serving loop never waits on a disk.  A real slow disk: an ext4 on a loop device whose image is served
by a FUSE file system of the test's own that holds reads while the test says so (tests/support/slow_disk.py), so the
page cache, RWF_NOWAIT and cachestat behave as on an SSD.  The store lies on that disk; a read whose bytes are not
in memory waits there, and every other read must go on."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, force_unmount
from support.inject import KERNELS, kernels, old_kernel

from fanfs.serve import control
from fanfs.store import Store
from fanfs.store.format import SHARD_DIR, shard_name
from fanfs.store.reader import KEEP_OPEN

SLOW_DISK = Path(__file__).parent / "support" / "slow_disk.py"
MIB = 1 << 20
WAIT = 60.0  # seconds a test waits for what must happen before it gives up (a bound on a hang, not a pace)

pytestmark = [pytest.mark.root("to build a disk"),
              pytest.mark.skipif(not shutil.which("losetup") or not shutil.which("mkfs.ext4"),
                                 reason="needs losetup and mkfs.ext4 to build a disk")]


def _run(*cmd: str | os.PathLike) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@contextlib.contextmanager
def _slow_disk(base: Path, tree: Path) -> Iterator[tuple[Path, Path, Path]]:
    """``tree`` on a slow disk of its own: (where its ext4 is mounted, the disk's control directory, its image file)."""
    image = base / "disk.ext4"
    with open(image, "wb") as f:
        f.truncate(64 * MIB)
    _run("mkfs.ext4", "-q", "-F", "-d", tree, image)
    served, ctl, disk = base / "served", base / "control", base / "disk"
    for path in (served, ctl, disk):
        path.mkdir()
    server = subprocess.Popen([sys.executable, str(SLOW_DISK), str(image), str(served), str(ctl)],
                              stdout=subprocess.PIPE, text=True)
    loop = None
    try:
        assert server.stdout.readline().strip() == "ready"
        loop = _run("losetup", "-r", "-f", "--show", served / "disk")
        _run("mount", "-o", "ro,noload", loop, disk)
        yield disk, ctl, served / "disk"
    finally:
        (ctl / "slow").unlink(missing_ok=True)
        subprocess.run(["umount", str(disk)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        force_unmount(served)
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    """(sources, the store on the slow disk, the disk's control directory, its image file): a.bin and b.bin in shards
    of their own, and a 6 MiB extent."""
    base = tmp_path_factory.mktemp("slowdisk")
    src = base / "src"
    src.mkdir()
    rng = np.random.default_rng(40)
    for name in ("a.bin", "b.bin"):
        (src / name).write_bytes(rng.bytes(200_000))
    (src / "big.raw").write_bytes(rng.bytes(6 * MIB))
    fanfs("pack", src, base / "store", "--shard-size", "256K", "--quiet")
    with _slow_disk(base, base / "store") as (store, ctl, image):
        yield src, store, ctl, image


@pytest.fixture(scope="module")
def many_shards_disk(tmp_path_factory):
    """(sources, a store of more shards than a store keeps open from its check, on a slow disk of its own, its control
    directory, its image file): a file per shard, one of them an extent."""
    base = tmp_path_factory.mktemp("slowmany")
    src = base / "src"
    src.mkdir()
    rng = np.random.default_rng(49)
    for i in range(KEEP_OPEN + 44):
        (src / f"f{i:03d}.bin").write_bytes(rng.bytes(6000))
    (src / "big.raw").write_bytes(rng.bytes(MIB))  # an extent
    fanfs("pack", src, base / "store", "--shard-size", "4K", "--quiet")
    assert len(list((base / "store" / SHARD_DIR).iterdir())) > KEEP_OPEN
    with _slow_disk(base, base / "store") as (store, ctl, image):
        yield src, store, ctl, image


def _evict(*paths: Path) -> None:
    """Drop these files' pages from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _shard_file(store: Path, name: bytes) -> Path:
    opened = Store(str(store), check_shards=False)
    try:
        return store / SHARD_DIR / shard_name(int(opened.index.shard[opened.lookup(name)]))
    finally:
        opened.close()


def _held(ctl: Path) -> int:
    try:
        return int((ctl / "held").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT:.0f} s"
        time.sleep(0.02)


def _reader(path: Path, offset: int = 0, size: int = 1 << 30) -> tuple[threading.Thread, dict]:
    """A thread that reads ``path`` (its bytes into the dict's "data", or its error into "error")."""
    out: dict = {}

    def read() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            out["data"] = os.pread(fd, size, offset)
        except OSError as err:
            out["error"] = err
        finally:
            os.close(fd)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("calls", [(), pytest.param(("preadv2",), marks=pytest.mark.slow), ("preadv2", "cachestat")],
                         ids=["nowait", "no-nowait", "no-nowait-4.18"])
def test_a_read_in_memory_is_answered_while_another_waits_on_the_disk(disk, mount, monkeypatch, calls):
    """Issue 49 too: where reads without waiting are refused (a file system that refuses ``RWF_NOWAIT``, here the whole
    call), the loop asks whether the bytes are in memory before it reads them, on any kernel."""
    src, store, ctl, image = disk
    if calls:
        old_kernel(monkeypatch, *calls)
    cold, warm = _shard_file(store, b"a.bin"), _shard_file(store, b"b.bin")
    assert cold != warm
    with mount(store) as mnt:
        _evict(cold, warm, image)
        warm.read_bytes()  # b.bin's shard in memory, not a.bin's
        (ctl / "slow").touch()
        try:
            waiting, got_a = _reader(mnt / "a.bin")
            _until(lambda: _held(ctl) > 0, "a read of a.bin's shard reaching the disk")
            answered, got_b = _reader(mnt / "b.bin")
            answered.join(WAIT)
            assert not answered.is_alive(), "b.bin, in memory, waited for a.bin's disk read"
            assert waiting.is_alive() and _held(ctl) > 0  # a.bin still waits on the disk
            assert got_b["data"] == (src / "b.bin").read_bytes()
        finally:
            (ctl / "slow").unlink()
        waiting.join(WAIT)
        assert got_a["data"] == (src / "a.bin").read_bytes()


def _blocked_threads(pid: int) -> int:
    """Threads of ``pid`` waiting in the kernel, uninterruptibly (on a page being read from the disk)."""
    count = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            state = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        count += state == "D"
    return count


@pytest.mark.parametrize("kernel", kernels("no mincore"))
def test_an_evicted_extent_read_by_four_readers_is_answered_by_several_threads(disk, mount, monkeypatch, kernel):
    """Issue 40: a verified extent whose pages were evicted was spliced in the loop, one disk read at a time.  Issue 49:
    on every kernel (before cachestat, the loop took "cannot say" for "in memory")."""
    src, store, ctl, image = disk
    if KERNELS[kernel]:
        old_kernel(monkeypatch, *KERNELS[kernel])
    want = (src / "big.raw").read_bytes()
    with mount(store) as mnt:
        assert (mnt / "big.raw").read_bytes() == want  # every chunk verified
        pid = control.request(str(mnt), {"cmd": "status"}, timeout=10)["pid"]
        _evict(mnt / "big.raw", _shard_file(store, b"big.raw"), image)
        (ctl / "slow").touch()
        try:
            readers = [_reader(mnt / "big.raw", chunk * MIB, MIB) for chunk in (0, 2, 4, 5)]
            _until(lambda: _blocked_threads(pid) >= 2, "two of the daemon's threads waiting on the disk at once")
        finally:
            (ctl / "slow").unlink()
        for (thread, got), chunk in zip(readers, (0, 2, 4, 5)):
            thread.join(WAIT)
            assert got["data"] == want[chunk * MIB:(chunk + 1) * MIB]


def test_a_disk_error_under_a_splice_is_an_eio_a_log_line_and_no_bytes_served(disk, mount):
    """Issue 49: libfuse answers a spliced reply whose copy cannot be read with the read's error itself, and returns 0 as
    for a reply sent: the read was counted as served and never logged.  Now: the reader gets EIO, one log line names
    the file, nothing is counted as spliced, and once the disk reads again the file reads whole."""
    src, store, ctl, image = disk
    want = (src / "big.raw").read_bytes()
    with mount(store) as mnt:
        assert (mnt / "big.raw").read_bytes() == want  # every chunk verified: from now on spliced
        before = control.request(str(mnt), {"cmd": "stats"}, timeout=10)
        _evict(mnt / "big.raw", _shard_file(store, b"big.raw"), image)
        (ctl / "bad").touch()
        try:
            with pytest.raises(OSError) as failed:
                (mnt / "big.raw").read_bytes()
        finally:
            (ctl / "bad").unlink()
        assert failed.value.errno == errno.EIO
        after = control.request(str(mnt), {"cmd": "stats"}, timeout=10)
        assert after["bytes_spliced"] == before["bytes_spliced"] and after["errors"] > before["errors"], after
        log = Path(control.log_path(str(mnt))).read_text()
        assert "big.raw" in log and "EIO" in log, log
        _evict(mnt / "big.raw", _shard_file(store, b"big.raw"), image)
        assert (mnt / "big.raw").read_bytes() == want


def test_the_first_read_of_an_extent_verifies_it_off_the_loop(disk, mount):
    """Issue 49: a first read of an extent reads its chunk once to verify it, a disk read: never in the loop (the
    slow-disk tests read every extent whole first, so a loop that verified inline passed them)."""
    src, store, ctl, image = disk
    warm = _shard_file(store, b"b.bin")
    with mount(store) as mnt:
        _evict(_shard_file(store, b"big.raw"), warm, image)
        warm.read_bytes()  # b.bin's shard in memory; big.raw's chunks neither verified nor in memory
        (ctl / "slow").touch()
        try:
            waiting, got_big = _reader(mnt / "big.raw", 0, MIB)
            _until(lambda: _held(ctl) > 0, "the first read of big.raw reaching the disk")
            answered, got_b = _reader(mnt / "b.bin")
            answered.join(WAIT)
            assert not answered.is_alive(), "b.bin, in memory, waited for big.raw's verification"
            assert got_b["data"] == (src / "b.bin").read_bytes()
        finally:
            (ctl / "slow").unlink()
        waiting.join(WAIT)
        assert got_big["data"] == (src / "big.raw").read_bytes()[:MIB]


@pytest.mark.parametrize("name", ["f000.bin", "big.raw"])
def test_a_shard_not_open_yet_is_opened_off_the_loop(many_shards_disk, mount, name):
    """Issue 49 (sixth audit, 1): a store of more shards than it keeps open from its check (ImageNet's 525 among them)
    opens a shard at its first read, and the loop opened it and read its header itself: on a held disk, a read whose
    bytes were in memory waited behind it (8 s with 300 shards, none with 200); an extent's first read too, to locate it.
    The loop leaves a shard not open yet to a thread."""
    src, store, ctl, image = many_shards_disk
    cold, warm = _shard_file(store, name.encode()), _shard_file(store, b"f001.bin")
    assert cold != warm
    with mount(store) as mnt:
        _evict(cold, warm, image)
        warm.read_bytes()  # f001.bin's shard in memory, its header too; the other's header not
        (ctl / "slow").touch()
        try:
            waiting, got_cold = _reader(mnt / name)
            _until(lambda: _held(ctl) > 0, f"the open of {name}'s shard reaching the disk")
            answered, got_warm = _reader(mnt / "f001.bin")
            answered.join(WAIT)
            assert not answered.is_alive(), f"f001.bin, in memory, waited for the open of {name}'s shard"
            assert got_warm["data"] == (src / "f001.bin").read_bytes()
        finally:
            (ctl / "slow").unlink()
        waiting.join(WAIT)
        assert got_cold["data"] == (src / name).read_bytes()
