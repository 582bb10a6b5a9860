"""Issue 8.3/8.4: a crafted store (valid checksum, lying content) or a FIFO gets one line, never a hang.

The fuzzer rewrites a real store's index with random edits (a value set to an edge case, a column cut
short or given another type, a header key dropped or retyped) and recomputes the checksum, so only
validation stands between the edit and the reader.  Opening must either refuse with a StoreError, or
succeed with a store whose every file reads in bounded time with the right length or an EIO.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs
from photo_samples import make_photo_set
from support.crafting import plant_blob, rewrite
from support.trees import make_torture_tree

from fanfs.errors import StoreError
from fanfs.store import Store
from fanfs.store.format import FILE, INDEX_NAME, SHARD_DIR, shard_name

EDGES = [0, 1, 2, 63, 64, 255, 256, 4095, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63,
         2**64 - 1]


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("crafted")
    src = make_torture_tree(base / "src")
    os.unlink(src / "a_fifo")
    os.unlink(src / "sparse.img")  # keep every read of every case small
    make_photo_set(src / "photos", 4)
    store = base / "store"
    fanfs("pack", src, store, "--progressive-jpeg", "--shard-size", "64K", "--quiet")
    return store


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def read_everything(store: Path) -> None:
    """Open the store and read every file whole and at a few odd ranges, within 20 s all told."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        try:
            s = Store(str(store))
        except StoreError as err:
            assert "\n" not in str(err)
            return
        for entry in np.flatnonzero(s.index.type == FILE).tolist():
            size = s.size_at(entry)
            for offset, length in ((0, size), (size // 2, 4097), (max(0, size - 1), 1 << 20), (size, 10)):
                try:
                    data = s.read(entry, offset, length)
                except OSError as err:
                    assert err.errno == errno.EIO
                    continue
                assert len(data) == max(0, min(length, size - offset)), (entry, offset, length)
        s.listdir(0)
        s.close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _random_edit(rng: random.Random):
    def edit(meta, columns):
        what = rng.random()
        name = rng.choice(sorted(columns))
        column = columns[name]
        if what < 0.55 and column.size:
            i = rng.randrange(column.size)
            info = np.iinfo(column.dtype)
            value = rng.choice(EDGES + [int(column[i]) + d for d in (-1, 1)] + [rng.randrange(info.max + 1)])
            column[i] = np.array(value).astype(column.dtype) if 0 <= value <= info.max else column.dtype.type(info.max)
        elif what < 0.65:
            columns[name] = column[: max(0, column.size - rng.randint(1, 3))]
        elif what < 0.72:
            columns[name] = column.astype(rng.choice([np.uint8, np.uint16, np.uint32, np.uint64, np.int64]))
        elif what < 0.78:
            del columns[name]
        elif what < 0.9:
            key = rng.choice(sorted(meta))
            del meta[key]
        else:
            key = rng.choice(sorted(meta))
            meta[key] = rng.choice([None, -1, 2**64, "x", [], {}, 1.5, True])
    return edit


@pytest.mark.slow
def test_fuzzed_indexes_are_refused_or_read_safely(real_store, tmp_path):
    rng = random.Random(8)
    refused = served = 0
    for case in range(300):
        victim = tmp_path / f"case{case}"
        shutil.copytree(real_store, victim)
        rewrite(victim, _random_edit(rng))
        try:
            Store(str(victim)).close()
            served += 1
        except StoreError:
            refused += 1
        read_everything(victim)
        shutil.rmtree(victim)
    print(f"300 fuzzed indexes: {refused} refused at open, {served} opened and read safely")
    assert refused > 150


def _file_name(c) -> tuple[int, int]:
    """Where a file's own name (of 3 bytes or more) lies in the paths column, after its parent's path and a '/':
    (entry, start, end).  A change there leaves the path its parent's and a name: only the check of names sees it."""
    offsets, parent = c["path_offset"].astype(np.int64), c["parent"].astype(np.int64)
    for entry in np.flatnonzero(c["type"] == FILE).tolist():
        start = offsets[entry] + (offsets[parent[entry] + 1] - offsets[parent[entry]] + 1 if parent[entry] else 0)
        if offsets[entry + 1] - start >= 3:
            return entry, int(start), int(offsets[entry + 1])
    raise AssertionError("no file name of 3 bytes or more")


def _slash_in_a_name(meta, c):
    _, start, _ = _file_name(c)
    c["paths"][start + 1] = ord("/")


def _dot_dot_name(meta, c):
    """The name becomes '..': the paths after it move up by what it lost."""
    entry, start, end = _file_name(c)
    c["paths"] = np.concatenate([c["paths"][:start], np.frombuffer(b"..", np.uint8), c["paths"][end:]])
    c["path_offset"][entry + 1:] -= end - start - 2


AUDIT = {
    "size one byte more than its chunks": lambda m, c: c["size"].__setitem__(
        int(np.flatnonzero((c["count"] > 1) & (c["type"] == FILE))[0]),
        c["size"][int(np.flatnonzero((c["count"] > 1) & (c["type"] == FILE))[0])] + 1),
    "store_id missing": lambda m, c: m.pop("store_id"),
    "codecs missing": lambda m, c: m.pop("codecs"),
    "totals retyped": lambda m, c: m.__setitem__("totals", "many"),
    "paths column missing": lambda m, c: c.pop("paths"),
    "size column short": lambda m, c: c.__setitem__("size", c["size"][:-1]),
    "hash_entry out of range": lambda m, c: c["hash_entry"].__setitem__(0, 2**32 - 1),
    "blob offset >= 2**63": lambda m, c: c["blob_offset"].__setitem__(0, 2**63),
    "mode column retyped": lambda m, c: c.__setitem__("mode", c["mode"].astype(np.uint64)),
    "a path that is not its parent's": lambda m, c: c["paths"].__setitem__(int(c["path_offset"][2]), ord("/")),
    "a name with a slash": _slash_in_a_name,
    "a name that is '..'": _dot_dot_name,
    "a parent that is a file": lambda m, c: c["parent"].__setitem__(
        int(c["parent"].size - 1), int(np.flatnonzero(c["type"] == FILE)[0])),
}


@pytest.mark.parametrize("damage", sorted(AUDIT))
def test_audit_cases_are_refused_with_one_line(real_store, tmp_path, damage):
    victim = tmp_path / "victim"
    shutil.copytree(real_store, victim)
    rewrite(victim, AUDIT[damage])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for args in (["info", victim], ["verify", victim, "--quiet"], ["mount", victim, mnt]):
        done = fanfs(*args, check=False, timeout=60)
        assert done.returncode == 1, (damage, args, done.stdout, done.stderr)
        assert done.stderr.startswith("fanfs: error:") and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert not os.path.ismount(mnt)


@pytest.mark.parametrize("where", ["index", "shard"])
def test_a_fifo_in_the_store_is_refused_not_waited_on(real_store, tmp_path, where):
    victim = tmp_path / "victim"
    shutil.copytree(real_store, victim)
    target = victim / INDEX_NAME if where == "index" else victim / SHARD_DIR / shard_name(1)
    target.unlink()
    os.mkfifo(target)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    commands = [["verify", victim, "--quiet"], ["mount", victim, mnt]]
    if where == "index":
        commands.append(["info", victim])  # info reads no shard: with a FIFO shard it just works
    for args in commands:
        done = fanfs(*args, check=False, timeout=60)  # a hang would be a TimeoutExpired: the test fails
        assert done.returncode == 1, (args, done.stderr)
        assert "is a FIFO, not a regular file" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not os.path.ismount(mnt)


# --- issue 17.7: a blob's decode is bounded before it starts --------------------------------------

BOMB = 512 << 20  # what the crafted zstd frame declares and decodes to (16 KB stored)
_READ_AND_MEASURE = """
import errno, logging, resource, sys
logging.basicConfig(stream=sys.stderr, format="%(message)s")
from fanfs.errors import StoreError
from fanfs.store import Store
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    store = Store(sys.argv[1])
except StoreError as err:
    print("refused:", err)
else:
    for _ in range(3):
        try:
            store.read_file(sys.argv[2])
            print("read")
        except OSError as err:
            print("EIO" if err.errno == errno.EIO else err)
print("grew", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, "MiB")
"""


@pytest.fixture(scope="module")
def float_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("bomb")
    (base / "src").mkdir()
    np.save(base / "src" / "weights.npy", np.random.default_rng(7).normal(size=4096).astype(np.float32))
    fanfs("pack", base / "src", base / "store", "--float-records", "--quiet")
    return base / "store"


def _zstd_bomb() -> bytes:
    """A zstd frame of BOMB zero bytes that declares its content size, made without holding BOMB bytes."""
    import zstandard
    compressor = zstandard.ZstdCompressor(level=3).compressobj(size=BOMB)
    zeros = bytes(1 << 20)
    return b"".join([*(compressor.compress(zeros) for _ in range(BOMB >> 20)), compressor.flush()])


def _plant_header(store: Path, declared: int | None) -> bytes:
    """Replace the float record's header blob by the bomb, appended to its shard, with every checksum valid;
    ``declared``: the raw size the index gives it (None: just over its stored size, as a float header may be)."""
    bomb = _zstd_bomb()
    s = Store(str(store))
    entry = int(np.flatnonzero(s.index.record == 2)[0])
    path, blob, shard = s.index.path(entry), int(s.index.first[entry]), int(s.index.shard[entry])
    assert s.codecs[int(s.index.codec[entry])].codec_id == "zstd"
    s.close()
    plant_blob(store, blob, shard, bomb, raw=len(bomb) + 1 if declared is None else declared)  # raw > stored: decoded
    return path


@pytest.mark.parametrize("declared", [BOMB, None], ids=["declared-512MiB", "frame-lies-about-its-size"])
def test_a_decompression_bomb_costs_no_memory(float_store, tmp_path, declared):
    """Issue 17.7: a 16 KB frame that decodes to 512 MiB took a daemon to 556 MB before an unlogged EIO.

    Declared as 512 MiB in the index, the store is refused at open (more than a float header can hold);
    declared at 16 KB, the frame's own content size is refused before decoding: EIO, logged once.  Either way the reading process's peak RSS hardly grows."""
    victim = tmp_path / "victim"
    shutil.copytree(float_store, victim)
    path = _plant_header(victim, declared)
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _READ_AND_MEASURE, victim, path], capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    grew = int(lines[-1].split()[1])
    assert grew < 64, (grew, done.stdout, done.stderr)  # MiB of peak RSS; the bomb is 512
    if declared is not None:
        assert lines[0].startswith("refused: index: a float record whose header blob is larger"), lines
        return
    assert lines[:3] == ["EIO"] * 3, lines
    eio = [line for line in done.stderr.splitlines() if line.startswith("EIO")]
    assert len(eio) == 1, done.stderr  # three failed reads, one line
    assert os.fsdecode(path) in eio[0] and "shard 000000" in eio[0] and "blob " in eio[0], eio
    assert "declares 536870912 bytes" in eio[0], eio


def test_a_decompression_bomb_through_a_mount_is_one_logged_eio(float_store, tmp_path, mount):
    """The same frame behind a real mount: the daemon's peak RSS (VmHWM) stays put, its log has one line."""
    victim = tmp_path / "victim"
    shutil.copytree(float_store, victim)
    path = os.fsdecode(_plant_header(victim, None))

    def peak(pid: int) -> int:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) // 1024

    with mount(victim) as mnt:
        from fanfs_command import daemon_pids
        (pid,) = daemon_pids(mnt)
        before = peak(pid)
        for _ in range(3):
            with pytest.raises(OSError) as failed:
                (mnt / path).read_bytes()
            assert failed.value.errno == errno.EIO
        assert peak(pid) - before < 64
        from fanfs.serve.control import log_path
        log = Path(log_path(str(mnt))).read_text()
    eio = [line for line in log.splitlines() if "EIO" in line]
    assert len(eio) == 1 and path in eio[0] and "shard 000000" in eio[0], log


def _crafted_bytes(store: Path, tmp: Path) -> bytes:
    """The bytes of a crafted index for ``store`` (valid checksum, a file whose blobs lie past its shard)."""
    copy = tmp / "crafted"
    shutil.copytree(store, copy)

    def edit(meta, columns):
        files = np.flatnonzero(columns["type"] == FILE)
        first = int(columns["first"][files[0]])
        columns["blob_offset"][first] = 2**40
    rewrite(copy, edit)
    return (copy / INDEX_NAME).read_bytes()


def test_an_index_validated_before_is_trusted_only_while_it_is_the_same_file(real_store, tmp_path, monkeypatch):
    """Issue 19: a node validates an unchanged index once (a record in this user's runtime dir), and a
    crafted index put in its place is validated again however it gets there: written over in place with
    its times restored, renamed over it, or copied elsewhere."""
    import fanfs.store.index as index_module
    store = tmp_path / "store"
    shutil.copytree(real_store, store)
    Store(str(store)).close()  # validated and recorded
    calls = []
    real_validate = index_module.validate
    monkeypatch.setattr(index_module, "validate", lambda ix: calls.append(1) or real_validate(ix))
    Store(str(store)).close()
    assert calls == []  # the same file: trusted
    crafted = _crafted_bytes(real_store, tmp_path)
    path = store / INDEX_NAME
    st = os.stat(path)
    if len(crafted) == st.st_size:  # written over in place, its modification time put back
        with open(path, "r+b") as f:
            f.write(crafted)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(StoreError, match="outside its shard"):
            Store(str(store))
    (tmp_path / "new-index").write_bytes(crafted)
    os.replace(tmp_path / "new-index", path)  # renamed over it
    with pytest.raises(StoreError, match="outside its shard"):
        Store(str(store))
    assert len(calls) >= 1
