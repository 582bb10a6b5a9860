"""Issue 40: a mount reads ahead of a known order on every kind of mount (into the page cache, within ``--prefetch``),
and a shard-aware sampler chooses an order a disk reads nearly in sequence and tells it to the mount."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import fanfs
from support.inject import KERNELS, kernels, old_kernel
from support.nobody import RUN_AS_NOBODY

from fanfs.cache import order as order_module
from fanfs.errors import FanfsError
from fanfs.serve.control import request
from fanfs.store import Store
from fanfs.train import ShardShuffle, ShardShuffleSampler, shard_aware_order
from fanfs.util.units import human_size

FILES = 120


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """120 files of 20 KB in 30 shards of ~4 files each."""
    base = tmp_path_factory.mktemp("ahead")
    src = base / "src"
    rng = np.random.default_rng(40)
    for i in range(FILES):
        path = src / f"c{i % 6}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(20_000))
    fanfs("pack", src, base / "store", "--shard-size", "80K", "--quiet")
    names = sorted(str(p.relative_to(src)) for p in src.rglob("*.bin"))
    return src, base / "store", names


def _evict(store: Path) -> None:
    """The store's shards out of the page cache: a cold disk."""
    for shard in (store / "shards").iterdir():
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # a fresh copy's pages are dirty, and the kernel drops only clean ones
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _stats(mnt: Path) -> dict:
    return json.loads(fanfs("stats", mnt, "--json").stdout)


def _settled(mnt: Path, past: int = 0) -> dict:
    """The read-ahead's figures once it waits (for the readers, its budget full, or at its order's end: nobody reads)
    with its stream past position ``past``: a state it says in its stats, whatever the machine's pace."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ahead = _stats(mnt)["prefetch"]
        if ahead["waiting"] and ahead["streams"]["ctl"]["position"] > past:
            return ahead
        time.sleep(0.05)
    raise AssertionError(f"the read-ahead never waited past position {past}: {ahead}")


WAYS = {"6.5+": "cachestat", "4.18-6.4": "mincore", "no mincore": "probe"}
"""Which way (fanfs.store.resident) tells root's daemon what is in memory on each of KERNELS."""


@pytest.mark.parametrize("kernel", kernels("no mincore"))
def test_a_mount_on_a_store_reads_an_order_ahead_within_its_budget(many_shards, tmp_path, mount, monkeypatch, kernel):
    """An order ten times the store (ten epochs), a budget of a few files: it reads ahead up to the budget, never past
    it, and on as the readers read; stats say how far ahead it is.  Issue 49: on every kernel fanfs supports (RHEL 8
    and 9 have no cachestat: a read-ahead that took "cannot say" for "in memory" read nothing ahead there)."""
    src, store, names = many_shards
    if KERNELS[kernel]:
        old_kernel(monkeypatch, *KERNELS[kernel])
    order = tmp_path / "order"
    order.write_text("\n\n".join("\n".join(np.random.default_rng(e).permutation(names)) for e in range(10)) + "\n")
    budget = 5 * 20_000 + 1000
    with mount(store, "--prefetch", str(budget)) as mnt:
        _evict(store)
        out = fanfs("ctl", mnt, "--order", order).stdout
        assert f"along {10 * FILES:,} files in 10 epoch(s)" in out and "10.0 times the store's" in out, out
        assert "page cache" in out
        ahead = _settled(mnt)
        assert 0 < ahead["ahead_bytes"] <= budget and ahead["files"] >= 4, ahead
        first_epoch = np.random.default_rng(0).permutation(names)
        for i, name in enumerate(first_epoch[:40]):
            assert (mnt / name).read_bytes() == (src / name).read_bytes()
            if i % 10 == 9:
                assert _stats(mnt)["prefetch"]["ahead_bytes"] <= budget
        ahead = _settled(mnt, past=40)
        assert ahead["ahead_bytes"] <= budget, ahead
        lines = fanfs("stats", mnt).stdout
        assert "files asked of the kernel ahead of the readers" in lines and "; waiting for " in lines, lines
        assert "requests" in lines
        answers = _stats(mnt)["page_cache_answers"]
        assert answers[WAYS[kernel]] > 0 and sum(answers.values()) == answers[WAYS[kernel]], answers
        assert f"by {WAYS[kernel]}" in lines


def test_readers_under_fanfs_run_move_the_read_ahead_on(many_shards, tmp_path, mount):
    """Readers under fanfs run read without a request to the mount: each read is noted in the mount's memory of reads
    all the same, so its read-ahead moves on with them (else it would wait for them at its budget's end, then give its
    files up, one stale period after another)."""
    src, store, names = many_shards
    first = [str(name) for name in np.random.default_rng(0).permutation(names)]
    order = tmp_path / "order"
    order.write_text("\n".join(first) + "\n")
    with mount(store, "--prefetch", str(5 * 20_000 + 1000)) as mnt:
        _evict(store)
        fanfs("ctl", mnt, "--order", order)
        _settled(mnt)
        code = "import sys\nfor name in sys.argv[2:]:\n    open(sys.argv[1] + '/' + name, 'rb').read()\n"
        done = fanfs("run", "--mount", mnt, "--", sys.executable, "-c", code, mnt, *first[:40])
        assert ": 40 files (" in done.stderr, done.stderr
        ahead = _settled(mnt, past=44)  # its budget's 5 files past the 40 read: it saw them read
        assert ahead["given_up"] == 0 and ahead["files"] >= 10, ahead


@pytest.mark.root("to be another user")
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to be another user")
def test_a_plain_user_s_mount_of_another_user_s_store_reads_ahead_on_an_old_kernel(many_shards, monkeypatch,
                                                                                  fuse_for_users):
    """Issue 49: before cachestat (Linux 6.5), mincore is the cheap way to ask, but since Linux 5.0 (and on RHEL 8's
    4.18) it says every page of a file another user owns is in memory.  A plain user's daemon serving a store its data
    manager packed (root's here, readable by all) must not take that for true: it asks another way, and reads ahead."""
    src, store, names = many_shards
    mine = Path(tempfile.mkdtemp(prefix="fanfs-test-nobody-"))  # not under pytest's directory: closed to others
    os.chmod(mine, 0o755)
    shutil.copytree(store, mine / "store")  # root's, published to every user as a data manager would
    subprocess.run(["chmod", "-R", "a+rX", mine / "store"], check=True)
    (mine / "mnt").mkdir()
    shutil.chown(mine / "mnt", "nobody", "nogroup")
    (mine / "order").write_text("\n".join(np.random.default_rng(0).permutation(names)) + "\n")
    env = {k: v for k, v in old_kernel(monkeypatch, "cachestat").items() if k != "FANFS_RUNTIME_DIR"}  # nobody's own

    def as_nobody(*args: object) -> str:
        done = subprocess.run([sys.executable, str(RUN_AS_NOBODY), *map(str, args)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        as_nobody("mount", mine / "store", mine / "mnt", "--prefetch", 5 * 20_000 + 1000)
        _evict(mine / "store")
        as_nobody("ctl", mine / "mnt", "--order", mine / "order")
        deadline, stats = time.monotonic() + 60, {}
        while time.monotonic() < deadline and not (stats := json.loads(as_nobody("stats", mine / "mnt", "--json")))[
                "prefetch"]["files"]:
            time.sleep(0.2)
        answers = stats["page_cache_answers"]
        assert stats["prefetch"]["files"] >= 4 and answers["probe"] > 0 and answers["mincore"] == 0, (stats["prefetch"], answers)
    finally:
        subprocess.run([sys.executable, str(RUN_AS_NOBODY), "umount", str(mine / "mnt")], capture_output=True, env=env)
        if os.path.ismount(mine / "mnt"):
            subprocess.run(["fusermount3", "-uz", str(mine / "mnt")])
        shutil.rmtree(mine, ignore_errors=True)


def test_an_order_of_no_store_file_and_a_budget_of_zero_are_one_line(many_shards, tmp_path, mount):
    """Issue 49: an empty order said "none of the order's 0 paths is a file of the store (e.g. None)"."""
    _, store, _ = many_shards
    with mount(store) as mnt:
        for text, says in (("not/here\nnor/this\n", "none of the order's 2 paths"), ("", "holds no paths"),
                           ("\n\n", "holds no paths")):
            (tmp_path / "order").write_text(text)
            done = fanfs("ctl", mnt, "--order", tmp_path / "order", check=False)
            assert done.returncode == 1 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
            assert "None" not in done.stderr
    (tmp_path / "order").write_text("c0/f000.bin\n")
    with mount(store, "--prefetch", "0") as mnt:
        done = fanfs("ctl", mnt, "--order", tmp_path / "order", check=False)
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and "budget is 0" in done.stderr


def test_a_file_larger_than_the_budget_is_passed_over_and_the_files_after_it_are_read_ahead(tmp_path, mount):
    """Issue 49: a file larger than the whole budget never fits it: it is read when it is read, and the stream goes on
    past it (a read-ahead that waited for room for it would wait for ever, its budget empty: an unguarded promise)."""
    rng = np.random.default_rng(49)
    src = tmp_path / "src"
    src.mkdir()
    names = ["big.bin", *(f"f{i}.bin" for i in range(6))]
    for name in names:
        (src / name).write_bytes(rng.bytes(300_000 if name == "big.bin" else 20_000))
    fanfs("pack", src, tmp_path / "store", "--shard-size", "80K", "--quiet")
    (tmp_path / "order").write_text("\n".join(names) + "\n")
    budget = 5 * 20_000 + 1000
    with mount(tmp_path / "store", "--prefetch", str(budget)) as mnt:
        _evict(tmp_path / "store")
        fanfs("ctl", mnt, "--order", tmp_path / "order")
        ahead = _settled(mnt, past=1)
        assert ahead["too_large"] == 1 and ahead["files"] >= 4 and 0 < ahead["ahead_bytes"] <= budget, ahead
        assert all((mnt / name).read_bytes() == (src / name).read_bytes() for name in names)


def test_a_shard_aware_order_reads_each_window_s_shards_together():
    shards = np.repeat(np.arange(30), 4)
    rng = np.random.default_rng(1)
    for window in (1, 3, 30):
        order = shard_aware_order(shards, window, rng)
        assert np.array_equal(np.sort(order), np.arange(shards.size))  # every file once
        seen = shards[order]
        groups = [set(seen[i:i + 4 * window]) for i in range(0, seen.size, 4 * window)]
        assert all(len(group) == window for group in groups[:-1])  # a window's files are its shards', together
    with pytest.raises(ValueError, match="window"):
        shard_aware_order(shards, 0, rng)
    with pytest.raises(ValueError, match="seed must be a whole number, 0 or more, not -1"):  # issue 49: NumPy's words
        ShardShuffle(shards, window=4, seed=-1)


def test_the_shard_aware_sampler_visits_every_file_once_an_epoch_and_tells_the_mount(many_shards, mount):
    src, store, names = many_shards
    with mount(store) as mnt:
        paths = [str(mnt / name) for name in names]
        sampler = ShardShuffleSampler(paths, window=1, mountpoint=mnt, seed=5)
        index = Store(str(store), check_shards=False).index
        shard_of = np.array([int(index.shard[index.lookup(name.encode())]) for name in names])
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append(list(sampler))
            assert sorted(epochs[-1]) == list(range(FILES))
            runs = np.flatnonzero(np.diff(shard_of[epochs[-1]])).size + 1
            assert runs == np.unique(shard_of).size  # a window of one shard: each shard's files together
        assert epochs[0] != epochs[1]
        stream = _stats(mnt)["prefetch"]["streams"][sampler.stream]
        assert stream["files"] == 2 * FILES  # this epoch and the next, told to the mount
        halves = [list(ShardShuffleSampler(paths, window=2, mountpoint=mnt, seed=5, num_replicas=2, rank=r))
                  for r in (0, 1)]
        assert sorted(halves[0] + halves[1]) == list(range(FILES))  # two ranks: each file once between them
    with pytest.raises(FanfsError, match="mount point"):
        ShardShuffleSampler(paths, mountpoint=None)


def test_the_shard_aware_sampler_s_window_is_what_the_mount_s_read_ahead_budget_holds(many_shards, mount, caplog):
    """Issue 49: the window was 4 shards whatever they held, said to fit the default budget for shards of up to
    128 MiB, where pack's shards are 256 MiB (four: 1 GiB against 512 MiB).  Now it is the most of the dataset's
    shards that the mount's budget holds, largest first; a larger window is taken with a warning."""
    src, store, names = many_shards
    s = Store(str(store), check_shards=False)
    sizes = np.sort(s.index.shard_size.astype(np.int64))[::-1]
    s.close()
    budget = int(sizes[:3].sum()) + 100  # three of the largest shards, not four
    with mount(store, "--prefetch", str(budget)) as mnt:
        paths = [str(mnt / name) for name in names]
        sampler = ShardShuffleSampler(paths, mountpoint=mnt, seed=1)
        assert (sampler.window, sampler.budget) == (3, budget) and not caplog.records
        assert sampler.sampler.window == 3  # the order's
        assert sorted(sampler) == list(range(FILES))
        sampler = ShardShuffleSampler(paths, window=10, mountpoint=mnt)
        assert sampler.window == 10 and sampler.sampler.window == 10
        [warning] = [r.getMessage() for r in caplog.records]
        assert f"a window of 10 shards holds up to {human_size(sizes[:10].sum())} of {mnt}, beyond its read-ahead " \
            f"budget of {human_size(budget)} (3 fit)" in warning
    with mount(store) as mnt:  # the default budget, 512 MiB, holds the whole store
        assert ShardShuffleSampler([str(mnt / name) for name in names], mountpoint=mnt).window == sizes.size
    caplog.clear()
    with mount(store, "--prefetch", "0") as mnt:  # nothing read ahead: a window of one shard, and no word of it
        assert ShardShuffleSampler([str(mnt / name) for name in names], window=1, mountpoint=mnt).budget == 0
        assert ShardShuffleSampler([str(mnt / name) for name in names], mountpoint=mnt).window == 1
        assert not any("window" in r.getMessage() for r in caplog.records)


def _daemon(mnt: Path) -> int:
    return request(str(mnt), {"cmd": "status"})["pid"]


def _memory(pid: int, field: str) -> int:
    """A process's ``VmRSS`` or ``VmHWM`` (its most since the last reset), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(f"{field}:"))


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    """2,000 files of 100 bytes, in memory (just packed): an order of 500 epochs is a million paths."""
    base = tmp_path_factory.mktemp("wide")
    for i in range(2_000):
        path = base / "src" / f"d{i % 20:02d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(i.to_bytes(4, "little") * 25)
    fanfs("pack", base / "src", base / "store", "--quiet")
    names = sorted(str(p.relative_to(base / "src")).encode() for p in (base / "src").rglob("*.bin"))
    return base / "store", names


@pytest.mark.root("to reset the daemon's peak memory (/proc/PID/clear_refs)")
def test_an_order_of_a_million_paths_costs_a_few_mb_and_the_mount_answers_while_it_is_read(wide_store, tmp_path,
                                                                                           mount):
    """Issue 49: an order cost the daemon ~85 bytes a line and was parsed on the control socket's thread (20 M lines:
    160 s, +1,620 MiB, and ``fanfs stats`` timed out meanwhile), and the read-ahead held its lock while it walked
    files in memory already (24 s after 3 M lines of warm files).  Now the order's file is read a piece at a time,
    counted on a thread of its own, and the lock is held for one file's bookkeeping at a time: ``stats`` answers while
    the order is still counted, and while its walk goes on, as does another order."""
    store, names = wide_store
    order = tmp_path / "order"
    rng = np.random.default_rng(49)
    with open(order, "wb") as f:
        for _ in range(500):
            f.write(b"\n".join(np.array(names, dtype=object)[rng.permutation(len(names))]) + b"\n\n")
    (tmp_path / "small").write_text("d00/f00000.bin\n")
    with mount(store) as mnt:
        pid = _daemon(mnt)
        before = _memory(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # its peak from here on
        answers = []
        told = threading.Thread(target=lambda: answers.append(request(str(mnt), {"cmd": "order", "path": str(order)},
                                                                      timeout=600)))
        told.start()
        try:
            while told.is_alive() and "ctl" not in request(str(mnt), {"cmd": "stats"}).get("prefetch", {"streams": {}})[
                    "streams"]:
                time.sleep(0.01)  # the order's first piece is read: it is followed, and counted on
            counting = request(str(mnt), {"cmd": "stats"})["prefetch"]["streams"]["ctl"]
            assert told.is_alive() and counting["files"] is None, counting  # answered while the order is counted
        finally:
            told.join()
        assert answers[0]["files"] == 1_000_000 and answers[0]["epochs"] == 500, answers
        request(str(mnt), {"cmd": "order", "path": str(tmp_path / "small"), "stream": "small"})
        walked = request(str(mnt), {"cmd": "stats"})["prefetch"]
        assert walked["streams"]["small"]["files"] == 1, walked  # another order, taken during the walk:
        assert walked["streams"]["ctl"]["position"] < 1_000_000, walked  # the walk over files in memory goes on
        assert walked["in_memory"] > 0
        assert _memory(pid, "VmHWM") - before < 32 << 20, (before, _memory(pid, "VmHWM"))


@pytest.mark.root("to watch a daemon")
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace to watch a daemon")
def test_the_read_ahead_ends_before_the_store_closes(many_shards, tmp_path, mount):
    """Issue 49: a plain mount's read-ahead was never stopped: its thread outlived ``store.close()`` and went on asking
    the kernel about the shards' descriptors, closed or already reused by files the ending daemon opened.  Waiting for
    its budget, it asks about its next file every 10 ms; the daemon's last steps are slowed (strace delays its
    unlinks by 0.3 s) and strace sees no call of it on a shard's descriptor once the store closed that."""
    _, store, names = many_shards
    (tmp_path / "order").write_text("\n".join(names) + "\n")
    trace, tracer = tmp_path / "strace", None
    try:
        with mount(store, "--prefetch", str(5 * 20_000 + 1000)) as mnt:
            _evict(store)
            fanfs("ctl", mnt, "--order", tmp_path / "order")
            assert _settled(mnt)["waiting"] == "budget"
            pid = _daemon(mnt)
            shards = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")
                      if "/shards/" in os.readlink(f"/proc/{pid}/fd/{fd}")}
            tracer = subprocess.Popen(["strace", "-f", "-p", str(pid), "-o", str(trace),
                                       "-e", "inject=/^unlink(at)?$:delay_enter=300000"], stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while any(Path(f"/proc/{pid}/task/{task}/status").read_text().count(f"TracerPid:\t{tracer.pid}\n") == 0
                      for task in os.listdir(f"/proc/{pid}/task")) and time.monotonic() < deadline:
                time.sleep(0.05)  # every thread of the daemon traced
        tracer.wait(timeout=60)  # it ends with the daemon
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    lines = trace.read_text().splitlines()
    for fd in shards:
        closed = next(i for i, line in enumerate(lines) if re.search(rf"\bclose\({fd}\b", line))
        late = [line for line in lines[closed:]
                if re.search(rf"\b(cachestat|syscall_0x1c3|preadv2|fadvise64)\(({fd}|{fd:#x}),|\bmmap\((.*?, ){{4}}{fd},",
                             line)]
        assert not late, late[:3]


@pytest.mark.parametrize("piece", [32, 100, 4096, order_module.PIECE])
def test_an_order_read_a_piece_at_a_time_holds_what_the_whole_file_holds(many_shards, monkeypatch, piece):
    """Issue 49: an order is read a piece at a time now, by its count and by the read-ahead; wherever a piece ends
    (inside a line, a CR LF, the empty lines between epochs, a line longer than a piece), it holds what the file
    holds, its last line without a newline too."""
    _, store, names = many_shards
    monkeypatch.setattr(order_module, "PIECE", piece)
    index = Store(str(store), check_shards=False).index
    mnt = "/mnt/x"
    lines = [names[0], f"{mnt}/{names[1]}", f"/elsewhere/{names[2]}", "c0", "", "", f"{names[3]}\r", "x" * 5000,
             f"/{names[4]}", f"{names[5]}/", "", names[6]]
    path = store.parent / f"order-{piece}"
    path.write_text("\n".join(lines))
    counted, files = order_module.Order(), []
    for entries, read in order_module.OrderFile(str(path), index, mnt).pieces():
        counted.add(entries, read)
        files += entries[entries >= 0].tolist()
    expected = [index.lookup(names[i].encode()) for i in (0, 1, 3, 5, 6)]
    assert files == expected and (counted.files, counted.left_out, counted.epochs) == (5, 4, 3), counted
    assert counted.example == f"/elsewhere/{names[2]}"
    stream, followed = order_module.Stream(order_module.OrderFile(str(path), index, mnt)), []
    while not stream.ended:
        if (entry := stream.next()) is not None:
            followed.append(entry)
            stream.advance()
    assert followed == expected and stream.position == 5 and stream.source.fd == -1
