"""Issue 2: pack a tree, mount it with real FUSE, read it with real processes."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fanfs_command import daemon_pids, fanfs, force_unmount
from support.trees import SPARSE_SIZE, damaged_copy, make_torture_tree, sha256_file, tree_listing

from fanfs.store.format import SHARD_DIR, shard_name
from fanfs.store import Store
from fanfs.store.sources import LocalShards

pytestmark = pytest.mark.in_process_too  # issue 48: every read test of the mount, in-process too


@pytest.fixture(scope="module")
def torture(tmp_path_factory):
    base = tmp_path_factory.mktemp("torture")
    src = make_torture_tree(base / "src")
    store = base / "store"
    done = fanfs("pack", src, store, "--shard-size", "64K", "--jobs", "2", "--quiet")
    assert "skipped FIFO" in done.stderr and "/a_fifo" in done.stderr  # special files are skipped with a warning
    return src, store


@pytest.mark.slow
def test_pack_verify_against_source(torture):
    src, store = torture
    done = fanfs("verify", store, "--against", src, "--quiet")
    assert done.stdout.startswith("ok:")


def test_verify_against_sees_data_written_into_a_hole(tmp_path):
    """verify --against skips chunks that are holes on both sides; a byte written into the source's hole since
    the pack (data where the store has a hole) is still found, and so is a source grown longer."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse.img", "wb") as f:
        f.write(b"head")
        f.truncate(64 << 20)
    store = tmp_path / "store"
    fanfs("pack", src, store, "--quiet")
    assert fanfs("verify", store, "--against", src, "--quiet").stdout.startswith("ok:")
    with open(src / "sparse.img", "r+b") as f:
        f.seek(40 << 20)
        f.write(b"x")
    done = fanfs("verify", store, "--against", src, "--quiet", check=False)
    assert done.returncode != 0 and "sparse.img: bytes differ from the source in chunk 40" in done.stdout + done.stderr
    with open(src / "sparse.img", "r+b") as f:
        f.seek(40 << 20)
        f.write(b"\0")
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    done = fanfs("verify", store, "--against", src, "--quiet", check=False)
    assert done.returncode != 0 and "sparse.img: the source is longer" in done.stdout + done.stderr


def test_every_file_byte_exact_through_mount(torture, mount):
    src, store = torture
    with mount(store) as mnt:
        expected = {p: v for p, v in tree_listing(src).items()}
        assert tree_listing(mnt) == expected  # same names, types, modes, sizes, mtimes, link targets
        for rel, (kind, *_rest) in expected.items():
            if kind == stat.S_IFREG:
                # a separate process reads each file, as training code would
                assert sha256_file(os.path.join(os.fsencode(mnt), rel)) == sha256_file(os.path.join(os.fsencode(src), rel)), rel
        out = subprocess.run(["cat", str(mnt / "train" / "cat" / "1.txt")], capture_output=True, check=True).stdout
        assert out == (src / "train" / "cat" / "1.txt").read_bytes()


@pytest.mark.slow
def test_sparse_file_read_past_4gib_without_reading_it_all(torture, mount):
    src, store = torture
    with mount(store) as mnt:
        path = mnt / "sparse.img"
        assert path.stat().st_size == SPARSE_SIZE
        with open(path, "rb") as f:
            f.seek((1 << 32) + 100)
            assert f.read(9) == b"past-4GiB"
            f.seek((1 << 32) + 50)
            assert f.read(50) == bytes(50)
            f.seek(SPARSE_SIZE - 3)
            assert f.read(10) == bytes(3)
        stats = fanfs("stats", mnt, "--json").stdout
        assert '"bytes_presented"' in stats


def test_writes_are_refused_with_erofs(torture, mount):
    src, store = torture
    with mount(store) as mnt:
        attempts = [
            lambda: open(mnt / "new_file", "w"),
            lambda: open(mnt / "empty.dat", "a"),
            lambda: open(mnt / "empty.dat", "r+b"),
            lambda: os.mkdir(mnt / "newdir"),
            lambda: os.unlink(mnt / "empty.dat"),
            lambda: os.rmdir(mnt / "empty_dir" / "deeper_empty"),
            lambda: os.rename(mnt / "empty.dat", mnt / "moved"),
            lambda: os.chmod(mnt / "empty.dat", 0o777),
            lambda: os.symlink("x", mnt / "newlink"),
            lambda: os.truncate(mnt / "empty.dat", 10),
            lambda: os.utime(mnt / "empty.dat"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS


@pytest.mark.slow
def test_flipped_byte_gives_eio_on_that_file_only(torture, tmp_path, mount):
    src, store = torture
    bad = tmp_path / "bad"
    shard = damaged_copy(store, bad, b"train/dog/1.bin", at=100)
    with mount(bad) as mnt:
        with pytest.raises(OSError) as info:
            (mnt / "train" / "dog" / "1.bin").read_bytes()
        assert info.value.errno == errno.EIO
        for rel, (kind, *_rest) in tree_listing(src).items():
            if kind == stat.S_IFREG and rel != b"train/dog/1.bin":
                assert sha256_file(os.path.join(os.fsencode(mnt), rel)) == sha256_file(os.path.join(os.fsencode(src), rel))
        assert json.loads(fanfs("stats", mnt, "--json").stdout)["errors"] >= 1
    logs = "".join(p.read_text(errors="replace") for p in Path(os.environ["FANFS_RUNTIME_DIR"]).glob("*.log"))
    assert "train/dog/1.bin" in logs and f"shard {shard_name(shard)}" in logs
    verify = fanfs("verify", bad, "--quiet", check=False)
    assert verify.returncode == 1 and "train/dog/1.bin" in verify.stderr


@pytest.mark.parametrize("damage", ["truncate-index", "flip-index-byte", "missing-shard", "foreign-shard"])
def test_damaged_store_is_refused_at_mount(torture, tmp_path, damage):
    src, store = torture
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    if damage == "truncate-index":
        with open(bad / "index", "r+b") as f:
            f.truncate(os.path.getsize(bad / "index") // 2)
        reason = "index"
    elif damage == "flip-index-byte":  # in its columns, past the JSON: it still parses, only its checksum tells
        with open(bad / "index", "r+b") as f:
            f.seek(-100, os.SEEK_END)
            byte = f.read(1)
            f.seek(-100, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0x01]))
        reason = "index checksum mismatch"
    elif damage == "missing-shard":
        (bad / SHARD_DIR / shard_name(0)).unlink()
        reason = "incomplete store"
    else:
        other = tmp_path / "other"
        (tmp_path / "one").mkdir()
        (tmp_path / "one" / "f").write_text("x")
        fanfs("pack", tmp_path / "one", other, "--quiet")
        size = (bad / SHARD_DIR / shard_name(0)).stat().st_size
        foreign = (other / SHARD_DIR / shard_name(0)).read_bytes()
        (bad / SHARD_DIR / shard_name(0)).write_bytes(foreign.ljust(size, b"\0")[:size])
        reason = "another store"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = fanfs("mount", bad, mnt, check=False)
        assert done.returncode != 0
        assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)


def test_pack_of_unreadable_file_fails_cleanly(torture, tmp_path, mount):
    """A source whose file gives EIO (a fanfs mount with a damaged shard): one line, no store left."""
    src, store = torture
    bad = tmp_path / "bad"
    damaged_copy(store, bad, b"train/cat/1.txt", flip=0xFF)
    with mount(bad) as mnt:
        out = tmp_path / "out"
        done = fanfs("pack", mnt / "train", out, "--quiet", check=False)
    assert done.returncode == 1
    assert "cannot read" in done.stderr and "1.txt" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob("out.*"))


@pytest.mark.slow
def test_interrupted_pack_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i}").write_bytes(os.urandom(4 << 20))
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", "pack", str(src), str(store), "--codec", "zstd:19"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("store.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not store.exists() and not list(tmp_path.glob("store.*"))
    fanfs("pack", src, store, "--codec", "lz4", "--quiet")  # a rerun works
    assert (store / "index").exists()


@pytest.mark.slow
def test_umount_and_signals(torture, tmp_path):
    src, store = torture
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        never = fanfs("umount", mnt, check=False)  # a directory nothing was ever mounted on: a wrong path
        assert never.returncode == 1 and never.stderr.strip().splitlines() == [
            f"fanfs: error: {mnt} is not a fanfs mount, and none of yours was ever mounted there: check the path"]
        done = fanfs("umount", tmp_path / "typo", check=False)
        assert done.returncode == 1 and "typo: no such directory" in done.stderr
        fanfs("mount", store, mnt)
        pids = daemon_pids(mnt)
        assert len(pids) == 1 and os.path.ismount(mnt)
        os.kill(pids[0], signal.SIGTERM)
        deadline = time.monotonic() + 20
        while (os.path.ismount(mnt) or daemon_pids(mnt)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.ismount(mnt) and not daemon_pids(mnt)
        assert "not mounted (ended already)" in fanfs("umount", mnt).stdout  # it was a mount: nothing to do, no error
        fanfs("mount", store, mnt)
        assert (mnt / "empty.dat").exists()
        fanfs("umount", mnt)
        assert not os.path.ismount(mnt) and not daemon_pids(mnt)
    finally:
        force_unmount(mnt)


@pytest.mark.root("for umount(8) of a FUSE mount")
def test_lazy_umount_without_fusermount_detaches_a_busy_mount(torture, tmp_path, mount):
    """With no fusermount on PATH, ``fanfs umount --lazy`` falls back to ``umount -l`` (lazy, like ``-z``)."""
    src, store = torture
    path = tmp_path / "bin"
    path.mkdir()
    (path / "umount").symlink_to(shutil.which("umount"))
    with mount(store) as mnt:
        busy = os.open(mnt / "empty.dat", os.O_RDONLY)
        try:
            done = subprocess.Popen([sys.executable, "-m", "fanfs", "umount", "--lazy", mnt], text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PATH": str(path)})
            deadline = time.monotonic() + 20
            while os.path.ismount(mnt) and done.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not os.path.ismount(mnt), done.communicate()
        finally:
            os.close(busy)
        out, err = done.communicate(timeout=60)
        assert done.returncode == 0 and f"unmounted {mnt}" in out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_foreground_mount_ends_cleanly_on_a_stop_signal(torture, tmp_path, sig):
    """Ctrl-C, kill, a closed terminal: the mount goes and the command exits 0, whatever handlers Python had."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", "mount", torture[1], mnt, "--foreground"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (mnt / "empty.dat").exists()
        proc.send_signal(sig)
        assert proc.wait(20) == 0
        assert not os.path.ismount(mnt)
        assert f"stopped by signal {int(sig)}" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        force_unmount(mnt)


@pytest.mark.slow
def test_bad_options_are_one_line_errors(torture, tmp_path):
    src, store = torture
    for args in (["pack", tmp_path / "nope", tmp_path / "z"], ["mount", store, tmp_path / "no-such-dir"],
                 ["mount", tmp_path / "no-store", tmp_path], ["info", tmp_path]):
        done = fanfs(*args, check=False)
        assert done.returncode == 1, args
        assert done.stderr.startswith("fanfs: error:") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for option, value, said in (("--shard-size", "lots", "not a size"), ("--codec", "zstd:99", "out of range 1..22"),
                                ("--codec", "brotli", "no codec 'brotli' to choose")):
        done = fanfs("pack", src, tmp_path / "w", option, value, check=False)
        assert done.returncode == 2 and said in done.stderr.splitlines()[-1], done.stderr


def test_core_reads_without_fuse(torture):
    src, store = torture
    s = Store(str(store))
    assert s.read_file("train/cat/1.txt") == (src / "train" / "cat" / "1.txt").read_bytes()
    entry = s.lookup(b"sparse.img")
    assert s.read(entry, (1 << 32) + 100, 9) == b"past-4GiB"
    assert [name for name, _, _ in s.listdir(s.lookup(b"train"))] == [b"cat", b"dog"]
    assert s.readlink(s.lookup(b"link_rel")) == b"train/cat/1.txt"
    with pytest.raises(FileNotFoundError):
        s.lookup(b"nope")
    s.close()


def test_a_corrupt_or_missing_copy_falls_to_the_next_source(torture, tmp_path, caplog):
    """The core's chain of sources (a node's copy, then a replica): a flipped byte in the first copy, or its shard
    gone, is read from the next one, exact, with a line that names both; no good copy at all is an error."""
    src, store = torture
    victim = b"train/dog/1.bin"
    shard = damaged_copy(store, tmp_path / "bad", victim, at=100)
    shutil.copytree(store, tmp_path / "gone")
    (tmp_path / "gone" / SHARD_DIR / shard_name(shard)).unlink()
    expected = (src / os.fsdecode(victim)).read_bytes()
    own = Store(str(store))
    for first in ("bad", "gone"):
        chain = [LocalShards(str(tmp_path / first / SHARD_DIR), own.id), LocalShards(str(store / SHARD_DIR), own.id)]
        s = Store(str(store), sources=chain)
        with caplog.at_level(logging.WARNING, logger="fanfs"):
            assert s.read_file(os.fsdecode(victim)) == expected
        assert f"used {store / SHARD_DIR}" in caplog.text and str(tmp_path / first) in caplog.text
        caplog.clear()
        s.close()
    alone = Store(str(store), sources=[LocalShards(str(tmp_path / "bad" / SHARD_DIR), own.id)])
    with pytest.raises(OSError) as info:
        alone.read_file(os.fsdecode(victim))
    assert info.value.errno == errno.EIO
    alone.close()
    own.close()
