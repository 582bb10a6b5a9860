"""Issue 28: large files through the mount in the largest requests the kernel allows, each chunk decoded once."""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs, stats_command as stats

from fanfs.serve import readahead
from fanfs.store import Store, stream
from fanfs.store.format import SHARD_DIR
from fanfs.store.shared import SharedChunks
from fanfs.store.sources import LocalShards
from fanfs.util.mounts import mount_device

CHUNK = 1 << 20
CHUNKS = 12


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 12 MiB file that compresses (so every chunk is decoded, not just copied) and a small one."""
    base = tmp_path_factory.mktemp("large")
    src = base / "src"
    src.mkdir()
    values = np.random.default_rng(28).integers(-1000, 1000, CHUNKS * CHUNK // 4, dtype=np.int16).astype(np.float32)
    (src / "volume.bin").write_bytes(values.tobytes())
    (src / "small.txt").write_bytes(b"small\n")
    fanfs("pack", src, base / "store", "--extents", "never", "--quiet")  # chunks decoded through the daemon
    return src, base / "store"


def read_in_pieces(path: Path, piece: int = 64 << 10, start_at_end: bool = False) -> bytes:
    """Read a file sequentially in small read() calls, as a loader does (``start_at_end``: its last bytes first, as
    np.load reads a zip's directory, so the kernel's readahead windows then do not start at a chunk's edge)."""
    with open(path, "rb", buffering=0) as f:
        if start_at_end:
            f.seek(-5000, os.SEEK_END)
            f.read()
            f.seek(0)
        return b"".join(iter(lambda: f.read(piece), b""))


needs_root = pytest.mark.root("to raise a mount's readahead")


@needs_root
@pytest.mark.parametrize("start_at_end", [False, True], ids=["from the start", "tail first"])
def test_a_large_file_arrives_in_requests_of_a_chunk_each_decoded_once(big, mount, start_at_end):
    src, store = big
    with mount(store) as mnt:
        assert read_in_pieces(mnt / "volume.bin", start_at_end=start_at_end) == (src / "volume.bin").read_bytes()
        got = stats(mnt)
        assert got["readahead"] == readahead.READAHEAD == readahead.current(str(mnt))
    # the kernel's default readahead (128 KiB) cut it into 96+ requests; now they are (up to) a chunk each
    assert got["reads"] <= CHUNKS + 4, got
    assert got["bytes_presented"] / got["reads"] >= CHUNK * 3 // 4
    # each chunk found, verified and decoded once, however the requests fell (the last one, read first, is long
    # gone from the few kept when the pass reaches it again)
    assert got["cache_misses"] == CHUNKS + start_at_end
    assert got["decode_seconds"] > 0


def test_requests_smaller_than_a_chunk_decode_it_once(big, mount):
    """With the kernel's own readahead (128 KiB requests, what a mount made without root gets), a chunk is read by
    eight requests: found, verified and decoded by the first, sent from the same bytes for the other seven."""
    src, store = big
    with mount(store, "--readahead", "0") as mnt:
        assert read_in_pieces(mnt / "volume.bin", start_at_end=True) == (src / "volume.bin").read_bytes()
        got = stats(mnt)
    assert got["reads"] >= 4 * CHUNKS, got
    assert got["cache_misses"] == CHUNKS + 1  # the last chunk twice: read first, and again at the end of the pass
    assert got["cache_hits"] >= got["reads"] - got["cache_misses"]


@pytest.mark.slow
@pytest.mark.parametrize("readahead", [pytest.param("4M", marks=needs_root), "0"])
def test_one_large_file_is_served_by_every_serving_process_each_chunk_loaded_once(big, mount, readahead):
    """The kernel hands consecutive requests to either process, and a chunk is cut across two (1 MiB requests off
    the chunks' edges) or eight (128 KiB): the process that loads it shares it, the other waits for it.  Without
    that, 2 processes loaded 210 of a file's 144 chunks (1 MiB requests) and all 288 (128 KiB)."""
    src, store = big
    with mount(store, "--workers", "2", "--readahead", readahead) as mnt:
        assert read_in_pieces(mnt / "volume.bin", start_at_end=True) == (src / "volume.bin").read_bytes()
        assert (mnt / "small.txt").read_bytes() == b"small\n"
        got = stats(mnt)
    assert got["workers"] == 2 and all(n > 0 for n in got["reads_by_process"]), got
    assert got["cache_misses"] <= CHUNKS + 1, got  # the last chunk, read first, may be loaded again at the end


def test_the_readahead_is_looked_up_without_asking_the_mount(big, mount):
    """The daemon finds its mount's device in /proc/self/mountinfo while it answers INIT: a look at the mount
    point itself would wait on the daemon (it hung the first version of this)."""
    _, store = big
    with mount(store, "--readahead", "0") as mnt:
        dev = os.stat(mnt).st_dev
        assert mount_device(str(mnt)) == f"{os.major(dev)}:{os.minor(dev)}"
        assert readahead.current(str(mnt)) == 128 << 10  # the kernel's default, left alone
        assert "\nreadahead  128.0 KiB " in fanfs("stats", mnt).stdout
    assert mount_device(str(mnt)) is None


def test_spans_cut_nothing_and_join_to_the_bytes(big):
    """In-process: a read across chunks is one piece per chunk, each the chunk's own decoded bytes (no slice)."""
    src, store = big
    whole = (src / "volume.bin").read_bytes()
    with_store = Store(str(store))
    try:
        entry = with_store.lookup(b"volume.bin")
        spans = with_store.spans(entry, CHUNK - 4096, CHUNK)
        assert [(start, length) for _, start, length in spans] == [(CHUNK - 4096, 4096), (0, CHUNK - 4096)]
        assert all(len(data) == CHUNK for data, _, _ in spans)
        for offset, size in ((0, 10), (CHUNK - 1, 2), (3, 5 * CHUNK), (len(whole) - 7, 100), (len(whole), 10)):
            assert with_store.read(entry, offset, size) == whole[offset:offset + size]
    finally:
        with_store.close()


class SlowShards(LocalShards):
    """The store's own shards, each read counted and slowed (a peer's round trip), so that threads overlap."""

    def __init__(self, directory: str, store_id: bytes) -> None:
        super().__init__(directory, store_id)
        self.reads: list[int] = []

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        self.reads.append(blob)
        time.sleep(0.05)
        return super().read(blob, shard, offset, length)


def test_threads_reading_one_file_at_once_load_each_chunk_once(big):
    """Reads of a file whose blobs are on a peer are answered by threads, several at a time; consecutive requests
    cut across chunks share one between them: it is fetched and decoded once, the other thread waits for it."""
    src, store = big
    whole = (src / "volume.bin").read_bytes()
    opened = Store(str(store))
    slow = SlowShards(str(store / SHARD_DIR), opened.id)
    opened.close()
    reader = Store(str(store), sources=[slow])
    try:
        entry = reader.lookup(b"volume.bin")
        starts = [CHUNK // 2 + i * CHUNK for i in range(CHUNKS - 1)]  # each request: two halves of two chunks
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda start: reader.read(entry, start, CHUNK), starts))
        assert got == [whole[start:start + CHUNK] for start in starts]
        assert sorted(slow.reads) == sorted(set(slow.reads)) and len(slow.reads) == CHUNKS
    finally:
        reader.close()


def test_threads_waiting_on_a_chunk_that_fails_get_eio_not_a_hang(big, monkeypatch):
    """The thread that loads a chunk fails (no good copy): the ones that waited for it try for themselves and fail
    with EIO too, woken by the failure, not by the end of a wait (an hour here: a wait would be the test's hang)."""
    monkeypatch.setattr(stream, "LOADING_WAIT", 3600.0)
    _, store = big
    opened = Store(str(store))
    slow = SlowShards(str(store / SHARD_DIR), opened.id)
    opened.close()
    slow.read = lambda blob, shard, offset, length: (time.sleep(0.05), b"x" * length)[1]  # every copy corrupt
    reader = Store(str(store), sources=[slow])
    try:
        entry = reader.lookup(b"volume.bin")
        outcomes: list[str] = []

        def read(start: int) -> None:
            outcomes.append(_error(lambda: reader.read(entry, start, CHUNK)))

        # daemons: a reader left waiting for the hour does not hold up pytest's exit
        readers = [threading.Thread(target=read, args=(CHUNK // 2 + i,), daemon=True) for i in range(4)]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join(timeout=120)  # bounded: one left waiting fails the test
        assert outcomes == ["EIO"] * 4
    finally:
        reader.close()


def _error(call) -> str:
    try:
        call()
    except OSError as err:
        return errno.errorcode[err.errno]
    return "no error"


def test_shared_chunks_load_once_across_processes_and_survive_a_dead_loader():
    """A chunk claimed by one process is waited for by another, which gets its bytes; a claim whose process died,
    or that it abandoned, is taken over at once (no wait for a loader that will never put)."""
    chunks = SharedChunks(4096, slots=4)
    assert chunks.get_or_claim(7) is None  # this process loads blob 7
    child = os.fork()
    if child == 0:  # another serving process wants it meanwhile, and gets what the first put
        os._exit(0 if chunks.get_or_claim(7) == b"seven" * 100 else 1)
    time.sleep(0.2)
    chunks.put(7, b"seven" * 100)
    assert os.waitpid(child, 0)[1] == 0
    assert chunks.get_or_claim(11) is None and chunks.get_or_claim(11) is None  # 11 % 4 == 7 % 4: the slot is 11's
    chunks.abandon(11)
    assert chunks.get_or_claim(11) is None  # abandoned: claimed afresh
    child = os.fork()
    if child == 0:  # a process claims blob 5 and dies before it puts it
        chunks.get_or_claim(5)
        os._exit(0)
    os.waitpid(child, 0)
    assert chunks.get_or_claim(5, wait=False) is None  # its loader is dead: load it here, with no wait for it
    chunks.put(5, b"five")
    assert chunks.get_or_claim(5) == b"five"


RAISE_BY_HAND = "echo 4096 > /sys/class/bdi/$(mountpoint -d MNT)/read_ahead_kb"
"""What docs/clusters.rst gives an administrator to raise one mount's readahead."""


@needs_root
def test_a_plain_user_s_mount_logs_nothing_of_its_readahead_and_root_raises_it_as_the_docs_say(big, mount):
    """Issue 50: every node of every job logged a ``readahead ... Permission denied`` line (a plain user cannot raise
    it).  Now that is --debug's alone; ``fanfs stats`` shows the window, and the docs' command raises it."""
    _, store = big
    assert RAISE_BY_HAND in (Path(__file__).parents[1] / "docs" / "clusters.rst").read_text()
    with mount(store, "--readahead", "0") as mnt:
        done = subprocess.run([sys.executable, "-c", _RAISE_AS_NOBODY, str(mnt)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and done.stdout == "131072\n", done.stdout + done.stderr
        assert "readahead" not in done.stderr, done.stderr
        assert "an administrator raises it" in fanfs("stats", mnt).stdout
        subprocess.run(["sh", "-c", RAISE_BY_HAND.replace("MNT", shlex.quote(str(mnt)))], check=True)
        assert readahead.current(str(mnt)) == 4 << 20
        assert "an administrator raises it" not in fanfs("stats", mnt).stdout


_RAISE_AS_NOBODY = """
import logging, os, pwd, sys
from fanfs.serve import readahead
logging.basicConfig(level=logging.INFO)
os.setuid(pwd.getpwnam("nobody").pw_uid)
print(readahead.raise_to(sys.argv[1], readahead.READAHEAD))
"""
