"""Issue 39 (defects 1 and 2): a store's files changed under a running mount, as ``cp``, ``rsync --inplace`` or a
full disk change them.  A mount serves what it validated at open, or EIO and one log line: never another file's
bytes, never a shorter file, never a dead mount."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, stats_command
from support.crafting import rewrite
from support.inject import inject

from fanfs.serve import control
from fanfs.store import Store
from fanfs.store.format import INDEX_NAME, SHARD_DIR, SHARD_HEADER

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too

MIB = 1 << 20


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("changed")
    src = base / "src"
    src.mkdir()
    rng = np.random.default_rng(39)
    for name in ("a.bin", "b.bin", "c.bin"):
        (src / name).write_bytes(rng.bytes(20_000))
    fanfs("pack", src, base / "store", "--quiet")
    return src, base / "store"


def _swapped_first(meta, columns):
    """a.bin's entry names b.bin's blobs and b.bin's a.bin's (each blob's checksum still matches its bytes)."""
    offsets, paths = columns["path_offset"], columns["paths"].tobytes()
    entry = {paths[offsets[e]:offsets[e + 1]]: e for e in range(offsets.size - 1)}
    a, b = entry[b"a.bin"], entry[b"b.bin"]
    columns["first"][[a, b]] = columns["first"][[b, a]]


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_an_index_changed_or_cut_in_place_under_a_mount_changes_nothing_it_serves(small_files, tmp_path, mount, workers):
    src, original = small_files
    store = tmp_path / "store"
    shutil.copytree(original, store)
    crafted = tmp_path / "crafted"
    shutil.copytree(original, crafted)
    rewrite(crafted, _swapped_first)  # a valid index of the same size that serves a.bin from b.bin's blobs
    index = store / INDEX_NAME
    with mount(store, "--workers", str(workers)) as mnt:
        assert (mnt / "c.bin").read_bytes() == (src / "c.bin").read_bytes()
        with open(index, "r+b") as f:  # in place: the same file, rewritten (what a mapping of it would see)
            f.write((crafted / INDEX_NAME).read_bytes())
        assert (mnt / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
        os.truncate(index, 100)  # cut in place: a mapping of it would be a SIGBUS
        assert (mnt / "b.bin").read_bytes() == (src / "b.bin").read_bytes()
        assert stats_command(mnt)["errors"] == 0  # the daemon still answers


@pytest.fixture(scope="module")
def large_file(tmp_path_factory):
    base = tmp_path_factory.mktemp("cut")
    src = base / "src"
    src.mkdir()
    (src / "big.raw").write_bytes(np.random.default_rng(1).bytes(6 * MIB + 4321))  # an extent of 7 chunks
    fanfs("pack", src, base / "store", "--quiet")
    return src, base / "store"


def _drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _copy_holding(directory: Path, size: int) -> Path:
    """The one file under ``directory`` large enough to hold the extent (a shard, or the lazy cache's data)."""
    files = [path for path in directory.rglob("*") if path.is_file() and path.stat().st_size >= size]
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("copy", ["store", "staged", pytest.param("lazy", marks=pytest.mark.slow)])
def test_an_extent_whose_copy_is_cut_after_it_was_verified_is_never_served_short(large_file, tmp_path, mount, copy):
    """Cut the copy an extent is spliced from once its chunks were verified: the read is the file's bytes from another
    copy (a staged share and the lazy cache read from the store), or EIO and a log line (no other copy: the store's
    own shard); never a shorter file, and the whole file again once the copy is whole."""
    src, original = large_file
    store = tmp_path / "store"
    shutil.copytree(original, store)
    want = (src / "big.raw").read_bytes()
    options = () if copy == "store" else ("--local-dir", str(tmp_path / "local"), "--stage", {"staged": "full"}.get(copy, copy))
    with mount(store, *options) as mnt:
        path = mnt / "big.raw"
        assert path.read_bytes() == want  # every chunk verified in the copy
        victim = _copy_holding(store / SHARD_DIR if copy == "store" else tmp_path / "local", len(want))
        whole = victim.read_bytes()
        _drop_pages(path)
        os.truncate(victim, len(whole) - 3 * MIB)
        try:
            got = path.read_bytes()
            assert got == want, "a short or wrong file"  # from another copy (the store's shard)
            assert copy != "store", "no other copy: the read had to fail"
        except OSError as err:
            assert err.errno == errno.EIO and copy == "store", err
            lines = [line for line in Path(control.log_path(str(mnt))).read_text().splitlines() if "EIO" in line]
            assert lines and all("big.raw" in line and "short read" in line for line in lines), lines
        assert path.stat().st_size == len(want)
        with open(victim, "r+b") as f:  # whole again (the original bytes)
            f.write(whole)
        _drop_pages(path)
        assert path.read_bytes() == want
        if copy == "lazy":
            return  # a lazy cache fills itself again from the store while its copy is cut: nothing left to come back
        # Issue 49: cut again, noticed, then whole with one byte changed in a chunk the cut never reached: every chunk
        # of a copy that was cut is verified again (a copy cut may come back with other bytes anywhere)
        os.truncate(victim, len(whole) - 3 * MIB)
        _never_the_changed_byte(path, want)  # (the staged share: from the store)
        first = whole.find(want[:MIB])  # the extent's first chunk in the copy
        changed = bytearray(whole)
        changed[first + 100] ^= 0xFF
        with open(victim, "r+b") as f:
            f.write(changed)
        _never_the_changed_byte(path, want)
        # and a copy written in place, never cut (rsync --inplace): its change time and size say it changed
        with open(victim, "r+b") as f:
            f.write(whole)
        _drop_pages(path)
        assert path.read_bytes() == want
        time.sleep(0.05)  # past a tick of the kernel's coarse clock, whose time a write then moves
        with open(victim, "r+b") as f:
            f.seek(first + 200)
            f.write(bytes([whole[first + 200] ^ 0xFF]))
        _never_the_changed_byte(path, want)


@pytest.mark.parametrize("copy", ["store", "staged"])
def test_an_extent_first_read_by_a_fresh_mount_then_changed_in_place_never_serves_the_change(large_file, tmp_path,
                                                                                              mount, copy):
    """A fresh mount's first read of an extent (its shard opened then, off the serving loop) verifies its chunks; the
    copy is then written in place (``rsync --inplace``), never cut: its change time and size say so, and no changed
    byte is served."""
    src, original = large_file
    store = tmp_path / "store"
    shutil.copytree(original, store)
    want = (src / "big.raw").read_bytes()
    options = () if copy == "store" else ("--local-dir", str(tmp_path / "local"), "--stage", "full")
    with mount(store, *options) as mnt:
        path = mnt / "big.raw"
        assert path.read_bytes() == want  # the first read of a fresh mount: the copy path
        victim = _copy_holding(store / SHARD_DIR if copy == "store" else tmp_path / "local", len(want))
        whole = victim.read_bytes()
        first = whole.find(want[:MIB])
        time.sleep(0.05)  # past a tick of the kernel's coarse clock, whose time a write then moves
        with open(victim, "r+b") as f:
            f.seek(first + 2 * MIB + 300)
            f.write(bytes([whole[first + 2 * MIB + 300] ^ 0xFF]))
        _never_the_changed_byte(path, want)


def test_a_chunk_the_copy_path_vouched_for_is_verified_again_once_its_copy_changed(large_file, tmp_path):
    """The store's copy path (a read that cannot be located in one copy: pieces in several, a peer's) checks each chunk
    it reads and vouches for it where it lies, so that a splice of it needs no second read; the copy written in place
    since (``rsync --inplace``) is seen by its change time and size, as for a chunk verified for a splice: a read that
    would splice or ``pread`` it checks it again and never returns the changed byte."""
    src, original = large_file
    shutil.copytree(original, tmp_path / "store")
    want = (src / "big.raw").read_bytes()
    store = Store(str(tmp_path / "store"))
    try:
        entry = store.lookup(b"big.raw")
        assert store.blob(entry, int(store.index.first[entry]), keep=False) == want[:MIB]  # the copy path
        victim = _copy_holding(tmp_path / "store" / SHARD_DIR, len(want))
        at = victim.read_bytes().find(want[:MIB]) + 300
        time.sleep(0.05)  # past a tick of the kernel's coarse clock, whose time a write then moves
        with open(victim, "r+b") as f:
            f.seek(at)
            f.write(bytes([want[300] ^ 0xFF]))
        buffer = bytearray(MIB)
        try:
            assert store.readinto(entry, 0, memoryview(buffer)) == MIB and buffer == want[:MIB], "a changed byte"
        except OSError as err:
            assert err.errno == errno.EIO, err
    finally:
        store.close()


@pytest.mark.mount_only  # the daemon's clock of changes, emulated
def test_a_copy_cut_then_whole_within_a_tick_of_a_coarse_clock_is_verified_again(large_file, tmp_path, mount,
                                                                                   monkeypatch):
    """On a kernel whose change times tick coarsely (RHEL 8 and 9), a copy cut and made whole again with one byte
    changed, within a tick, keeps its change time and size: only having seen it cut tells that it may have changed.
    Every chunk of a copy seen cut is verified again before it is spliced: the changed byte is never served."""
    inject(monkeypatch, "os:fstat=faults.coarse_change_times(fstat)")
    src, original = large_file
    store = tmp_path / "store"
    shutil.copytree(original, store)
    want = (src / "big.raw").read_bytes()
    with mount(store, "--local-dir", str(tmp_path / "local"), "--stage", "full") as mnt:
        path = mnt / "big.raw"
        assert path.read_bytes() == want  # every chunk verified in the staged copy
        victim = _copy_holding(tmp_path / "local", len(want))
        whole = victim.read_bytes()
        os.truncate(victim, len(whole) - 3 * MIB)
        _never_the_changed_byte(path, want)  # seen cut: from the store
        changed = bytearray(whole)
        changed[whole.find(want[:MIB]) + 100] ^= 0xFF  # in the extent's first chunk, which the cut never reached
        with open(victim, "r+b") as f:
            f.write(changed)
        _never_the_changed_byte(path, want)


def _never_the_changed_byte(path: Path, want: bytes) -> None:
    """A read of a copy changed since its chunks were verified: the store's bytes (a chunk kept in memory since it was
    read and checked), or EIO (no good copy); never the copy's changed byte."""
    _drop_pages(path)
    try:
        assert path.read_bytes() == want, "a changed byte was served"
    except OSError as err:
        assert err.errno == errno.EIO, err


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """60 small files over several shards."""
    base = tmp_path_factory.mktemp("sharded")
    src = base / "src"
    src.mkdir()
    rng = np.random.default_rng(50)
    for i in range(60):
        (src / f"{i:02d}.bin").write_bytes(rng.bytes(3000 + 97 * i))
    fanfs("pack", src, base / "store", "--shard-size", "64K", "--quiet")
    assert len(list((base / "store" / SHARD_DIR).iterdir())) >= 3
    return src, base / "store"


@pytest.mark.mount_only  # the daemon's own counters and log
@pytest.mark.parametrize("damage", ["gone", "bad"])
def test_a_staged_copy_gone_or_bad_under_a_mount_is_read_from_the_shared_store(sharded, tmp_path, mount, damage):
    """Issue 50 (major 4): a node's staged shards removed (a wipe of the local disk) or damaged under its live mount:
    every file reads right from the shared store, which was intact (it used to be EIO for every read), and fanfs stats
    counts those bytes as read from the shared store."""
    src, store = sharded
    local = tmp_path / "local"
    with mount(store, "--local-dir", str(local), "--stage") as mnt:
        shards = sorted(p for p in local.iterdir() if p.name.isdigit())
        assert len(shards) >= 3
        for shard in shards:
            if damage == "gone":
                shard.unlink()
            else:
                with open(shard, "r+b") as f:
                    size = f.seek(0, os.SEEK_END)
                    f.seek(size // 2)
                    f.write(bytes(size - size // 2))  # zeros over the blobs of the second half
        for path in sorted(src.iterdir()):
            assert (mnt / path.name).read_bytes() == path.read_bytes(), path.name
        stats = stats_command(mnt)
        assert stats["errors"] == 0 and stats["shared_bytes"] > 0, stats


@pytest.mark.mount_only  # the daemon's own counters and log
def test_a_failing_shard_is_logged_once_not_once_per_file(sharded, tmp_path, mount):
    """Issue 50 (major 4): a cause is logged once, whichever of its shard's files meet it, not once per file (10,000
    files gave 2.1 MB of log): a node's staged shards gone (each file read from the shared store), and a store's own
    shards zeroed in part (each file there an EIO)."""
    src, original = sharded
    local = tmp_path / "local"
    with mount(original, "--local-dir", str(local), "--stage") as mnt:
        shards = sorted(p for p in local.iterdir() if p.name.isdigit())
        for shard in shards:
            shard.unlink()
        for path in sorted(src.iterdir()):
            assert (mnt / path.name).read_bytes() == path.read_bytes()
        used = [line for line in Path(control.log_path(str(mnt))).read_text().splitlines() if "used shared store" in line]
    assert 1 <= len(used) <= len(shards) < len(list(src.iterdir())), used
    store = tmp_path / "store"
    shutil.copytree(original, store)
    with mount(store) as mnt:
        for shard in (store / SHARD_DIR).iterdir():
            with open(shard, "r+b") as f:  # the daemon keeps its descriptors: zeroed in place, as a bad disk does
                size = f.seek(0, os.SEEK_END)
                f.seek(SHARD_HEADER.size)
                f.write(bytes(size - SHARD_HEADER.size))
        failed = 0
        for path in sorted(src.iterdir()):
            for _ in range(2):
                with pytest.raises(OSError) as err:
                    (mnt / path.name).read_bytes()
                assert err.value.errno == errno.EIO
                failed += 1
        eio = [line for line in Path(control.log_path(str(mnt))).read_text().splitlines() if " EIO " in line]
        assert stats_command(mnt)["errors"] >= failed
    assert 1 <= len(eio) <= len(list((store / SHARD_DIR).iterdir())) < len(list(src.iterdir())), eio
