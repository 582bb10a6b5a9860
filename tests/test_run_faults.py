"""Issue 48: under ``fanfs run``, faults get the mount's answer: a bad copy, a mount unmounted or whose daemon was
killed, a store cut under the reader, a fidelity switch racing opens, a reader killed mid-read, thousands of files
open at once.  Bytes, or the mount's OSError; nothing written, no traceback of fanfs's, no descriptor left."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fanfs_command import FANFS, fanfs, force_unmount, set_presentation
from support.inject import old_kernel
from test_run import READER, read

from fanfs.serve import control
from fanfs.store import Store
from fanfs.store.format import SHARD_DIR, shard_name

SHELL = Path(__file__).resolve().parent / "support" / "run_shell.py"
PROBE_WAIT = 0.05  # longer than fanfs.inproc.view.PROBE: a killed daemon is known dead by the next open after it


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("runfaults")
    src = base / "src"
    rng = np.random.default_rng(48)
    for i in range(40):
        path = src / f"c{i % 4}" / f"f{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(30_000))
    fanfs("pack", src, base / "store", "--shard-size", "256K", "--quiet")
    return src, base / "store"


class Shell:
    """A run_shell.py reader under fanfs run: ``ask(line)`` sends a command and returns its JSON answer."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def ask(self, line: str) -> object:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, self.process.stderr.read() if self.process.stderr else "the reader ended"
        return json.loads(answer)


@contextlib.contextmanager
def shell(mnt: Path, env: dict[str, str] | None = None) -> Iterator[Shell]:
    process = subprocess.Popen([*FANFS, "run", "--mount", str(mnt), "--", sys.executable, str(SHELL), str(mnt)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        yield Shell(process)
    finally:
        process.kill()
        for pipe in (process.stdin, process.stdout, process.stderr):
            pipe.close()
        process.wait()


def figures(data: bytes) -> list:
    return [len(data), hashlib.sha256(data).hexdigest()]


def _shard_of(store: Path, name: str) -> tuple[Path, int]:
    """The shard file that holds ``name``, and where its first blob lies in it."""
    opened = Store(str(store), check_shards=False)
    try:
        entry = opened.lookup(name.encode())
        return (store / SHARD_DIR / shard_name(int(opened.index.shard[entry])),
                int(opened.index.blob_offset[int(opened.index.first[entry])]))
    finally:
        opened.close()


def test_a_bad_copy_is_the_mount_s_eio_and_its_log_line_never_a_traceback(small, tmp_path, mount):
    src, original = small
    store = tmp_path / "store"
    shutil.copytree(original, store)
    shard, at = _shard_of(store, "c1/f01.bin")
    with open(shard, "r+b") as f:
        f.seek(at + 100)
        f.write(b"\xff" * 64)
    with mount(store) as mnt:
        done = subprocess.run([*FANFS, "run", "--mount", str(mnt), "--", sys.executable, str(READER), str(mnt),
                               "files", "c1/f01.bin", "c0/f00.bin"], capture_output=True, text=True, timeout=120)
        got = json.loads(done.stdout.splitlines()[-1])
        log = Path(control.log_path(str(mnt))).read_text()
    assert got["in_process"] and got["c1/f01.bin"] == errno.EIO
    assert got["c0/f00.bin"] == figures((src / "c0" / "f00.bin").read_bytes())
    assert "Traceback" not in done.stderr and "EIO" not in done.stderr, done.stderr
    assert "c1/f01.bin" in log and "EIO" in log, log


@pytest.mark.parametrize("kernel", ["pidfd", pytest.param("4.18", marks=pytest.mark.slow)])
def test_a_mount_gone_is_the_mount_s_answer(small, tmp_path, monkeypatch, kernel):
    """Unmounted while a reader has read under it: its opens then find the empty directory below, as any open would;
    a daemon killed with -9: "Transport endpoint is not connected", as the mount answers.  On a kernel without
    pidfd_open (before 5.3: RHEL 8), the reader finds the daemon gone by its pid."""
    src, store = small
    env = old_kernel(monkeypatch, "pidfd_open") if kernel == "4.18" else dict(os.environ)
    want = figures((src / "c2" / "f02.bin").read_bytes())
    for how in ("umount", "kill"):
        mnt = tmp_path / how
        mnt.mkdir()
        fanfs("mount", store, mnt)
        try:
            pid = control.request(str(mnt), {"cmd": "status"})["pid"]
            with shell(mnt, env) as reader:
                assert reader.ask("read c2/f02.bin") == want
                if how == "umount":
                    fanfs("umount", mnt)
                    expected = ["FileNotFoundError", errno.ENOENT]
                else:
                    os.kill(pid, signal.SIGKILL)
                    while os.path.exists(f"/proc/{pid}"):
                        time.sleep(0.01)
                    time.sleep(PROBE_WAIT)
                    expected = ["OSError", errno.ENOTCONN]
                assert reader.ask("read c2/f02.bin") == expected, how
        finally:
            force_unmount(mnt)


def test_a_bug_in_the_fast_path_is_an_open_by_the_mount_never_the_reader_s_error(small, mount):
    """Whatever the fast path raises (here: any exception, as a bug of fanfs's would), the reader's open is the
    mount's: the same bytes, no traceback."""
    src, store = small
    want = figures((src / "c1" / "f01.bin").read_bytes())
    with mount(store) as mnt, shell(mnt) as reader:
        assert reader.ask("read c1/f01.bin") == want
        reader.ask("bug")
        assert reader.ask("read c1/f01.bin") == want
        assert reader.ask("read c2/f02.bin") == figures((src / "c2" / "f02.bin").read_bytes())
        reader.process.stdin.close()
        assert reader.process.wait(timeout=60) == 0
        assert "Traceback" not in reader.process.stderr.read()


def test_a_shard_cut_under_a_reader_is_an_eio_and_whole_again_reads_again(small, tmp_path, mount):
    src, original = small
    store = tmp_path / "store"
    shutil.copytree(original, store)
    victim, _ = _shard_of(store, "c3/f03.bin")
    whole = victim.read_bytes()
    with mount(store) as mnt, shell(mnt) as reader:
        want = figures((src / "c3" / "f03.bin").read_bytes())
        assert reader.ask("read c3/f03.bin") == want
        os.truncate(victim, 4096)
        assert reader.ask("read c3/f03.bin") == ["OSError", errno.EIO]
        victim.write_bytes(whole)
        assert reader.ask("read c3/f03.bin") == want


def test_thousands_of_files_open_at_once_take_no_descriptor(small, mount):
    """2,000 files open at once, read and closed: as many descriptors before as after, and none held meanwhile (the
    mount would need one each)."""
    src, store = small
    with mount(store) as mnt, shell(mnt) as reader:
        reader.ask("read c0/f00.bin")
        before = reader.ask("fds")
        count, total = reader.ask("hold 2000 c0/f00.bin")
        assert count == before and total == 2000 * 30_000
        assert reader.ask("release") == before


@pytest.mark.slow
def test_a_switch_racing_opens_gives_every_reader_one_view_s_bytes(tmp_path, mount):
    """Readers open and read progressive records again and again while the fidelity switches under them: every read
    is whole one view's bytes (the view shown when it was opened), never a mix, never a short file."""
    from support.jpeg_samples import build_samples
    src = tmp_path / "src"
    build_samples(src)
    fanfs("pack", src, tmp_path / "store", "--progressive-jpeg", "--quiet")
    opened = Store(str(tmp_path / "store"))
    names = [name for name in ("photo_china.jpg", "photo_flower.jpg", "gray.jpg") if opened.index.lookup(name.encode()) >= 0]
    views = {name: {json.dumps(figures(opened.read_file(name, k))) for k in (1, 2, 3, 65535)} for name in names}
    opened.close()
    with mount(tmp_path / "store") as mnt:
        readers = [subprocess.Popen([*FANFS, "run", "--mount", str(mnt), "--", sys.executable, str(READER), str(mnt),
                                     "repeat", "40", *names], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        try:
            while any(r.poll() is None for r in readers):
                for fidelity in ("1", "3", "full", "2"):
                    set_presentation(mnt, "fidelity", fidelity)
        finally:
            outputs = [r.communicate(timeout=120)[0] for r in readers]
    for output in outputs:
        got = json.loads(output.splitlines()[-1])
        assert got["in_process"] and len(got["reads"]) == 40 * len(names)
        for name, seen in got["reads"]:
            assert json.dumps(seen) in views[name], (name, seen)


def test_fileno_after_a_switch_is_the_view_the_file_was_opened_at(tmp_path, mount):
    """``fileno()`` opens the file's name on the mount: after a switch that name is another view (another size, other
    bytes), so the descriptor handed over is of the view the file was opened at (the mount's inode of that view while
    the kernel still shows it, else a sealed copy of the file's bytes), never the name's new one."""
    from support.jpeg_samples import build_samples
    build_samples(tmp_path / "src")
    fanfs("pack", tmp_path / "src", tmp_path / "store", "--progressive-jpeg", "--quiet")
    with mount(tmp_path / "store", "--fidelity", "1") as mnt, shell(mnt) as reader:
        kept = reader.ask("keep photo_china.jpg")
        set_presentation(mnt, "fidelity", "full")
        assert reader.ask("read photo_china.jpg")[0] > kept[0]  # the name is the full view's now
        assert reader.ask("fileno") == [kept[0], kept]


def test_a_chunk_is_verified_once_for_the_node_not_once_per_reader(tmp_path, mount):
    """An extent's chunks verified by a reader under fanfs run are the mount's verified chunks too (and the other way
    round): read again through the mount, they are spliced with no second verification; and a copy changed since is
    verified again before the mount splices it (the changed chunk an EIO)."""
    big = tmp_path / "bigsrc"
    big.mkdir()
    (big / "big.raw").write_bytes(os.urandom(6 << 20))
    fanfs("pack", big, tmp_path / "bigstore", "--quiet")
    with mount(tmp_path / "bigstore") as mnt:
        got = read(mnt, "files", "big.raw")
        assert got["in_process"] and got["big.raw"] == figures((big / "big.raw").read_bytes())
        assert (mnt / "big.raw").read_bytes() == (big / "big.raw").read_bytes()  # this process: through the mount
        stats = control.request(str(mnt), {"cmd": "stats"})
        assert stats["bytes_spliced"] == 6 << 20 and stats["bytes_verified"] == 0, stats
        shard, at = _shard_of(tmp_path / "bigstore", "big.raw")
        with open(shard, "r+b") as f:  # a byte of its fourth chunk changed since the reader verified it
            f.seek(at + (3 << 20) + 5)
            f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
        # past the mount's pages of it (a FADV_DONTNEED keeps a page the kernel still holds a reference to: a busy
        # machine's CI then served the page read before the change, and the daemon was never asked)
        fd = os.open(mnt / "big.raw", os.O_RDONLY | os.O_DIRECT)
        try:
            assert len(os.pread(fd, 1 << 20, 2 << 20)) == 1 << 20
            with pytest.raises(OSError) as err:
                os.pread(fd, 1 << 20, 3 << 20)
            assert err.value.errno == errno.EIO
        finally:
            os.close(fd)


@pytest.mark.slow
def test_a_reader_killed_mid_read_leaves_the_mount_serving_the_others(small, tmp_path, mount):
    src, store = small
    big = tmp_path / "bigsrc"
    big.mkdir()
    (big / "big.raw").write_bytes(os.urandom(12 << 20))
    fanfs("pack", big, tmp_path / "bigstore", "--quiet")
    code = ("import sys\nwhile True:\n    with open(sys.argv[1] + '/big.raw', 'rb') as f:\n"
            "        while f.read(1 << 20): pass\n")
    with mount(tmp_path / "bigstore") as mnt:
        for _ in range(3):
            run = subprocess.Popen([*FANFS, "run", "--mount", str(mnt), "--", sys.executable, "-c", code, str(mnt)],
                                   stderr=subprocess.DEVNULL)
            try:
                child = _child_of(run.pid)
                time.sleep(0.3)  # reading, somewhere in the file
                os.kill(child, signal.SIGKILL)
                assert run.wait(timeout=60) == 128 + signal.SIGKILL
            finally:
                run.kill()
                run.wait()
        got = read(mnt, "files", "big.raw")
        assert got["in_process"] and got["big.raw"] == figures((big / "big.raw").read_bytes())


def _child_of(pid: int) -> int:
    """The one child process of ``pid`` (the command fanfs run started), once it is there."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        time.sleep(0.01)
    raise AssertionError(f"no child of {pid}")


MEMORY = r"""
import json, os, sys
import numpy  # what a training process imports anyway; then fanfs's modules, before the counting starts
import fanfs.inproc.view

def anonymous():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("RssAnon:"))

before = anonymous()
try:
    open(os.path.join(sys.argv[1], sys.argv[2]), "rb").read()
except OSError:
    pass  # a synthetic store's files are holes: the store is open all the same
with open("/proc/self/maps") as f:
    mapped = any("memfd:fanfs-index" in line for line in f)
print(json.dumps({"grew": anonymous() - before, "mapped": mapped}))
"""


def test_the_index_is_the_mount_s_memory_shared_not_a_copy_per_process(tmp_path, mount):
    """Eight DataLoader workers of eight ranks must not hold 64 copies of a 162 MiB index: a reader maps the mount's
    sealed index (one copy per node) and its own memory grows by a small part of it."""
    from bench_index import synthesise
    names = synthesise(tmp_path / "store", 300_000, 100, 4)
    index_bytes = (tmp_path / "store" / "index").stat().st_size
    with mount(tmp_path / "store") as mnt:
        done = subprocess.run([*FANFS, "run", "--mount", str(mnt), "--", sys.executable, "-c", MEMORY, str(mnt),
                               names[123]], capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(done.stdout.splitlines()[-1])
    assert index_bytes > 20 << 20 and got["mapped"], (index_bytes, got)
    assert got["grew"] < index_bytes // 8, (got, index_bytes)
