"""Issue 35.5: a stalled shared store never blocks a read longer than ``--store-timeout``.

The store lives on a real network file system that can be frozen: ``sshfs`` to an SFTP server (the very
``sftp-server`` sshd runs, on a pipe, with no network), which SIGSTOP stops answering, as in the issue (uncached reads
blocked > 120 s each); sshfs has then taken a read's request, so its reader waits in the kernel uninterruptibly.
A plain mount, a lazily staged one, and one staged at fidelity 1 read at full (the layers above from the store) are
read from other processes while it is frozen: an uncached read fails with EIO (a hang would be caught by the reader's
timeout), logged in one line naming the file and the store; ``fanfs umount`` succeeds, frozen; and once it answers
again, the same mount reads it again.  A daemon told to wait for ever (``--store-timeout 0``), stuck, is killed by
``fanfs umount`` after its grace: on ``squashfuse_ll`` stopped with SIGSTOP (a FUSE server that has taken no request:
the wait can be killed).  The frozen process is resumed before anything is unmounted, whatever happens.  The deadline
itself is tested on a pipe nobody writes to.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fanfs_command import FANFS, daemon_pids, fanfs, force_unmount, mounted
from photo_samples import make_photo_set

from support.processes import kernel_state, stop

from fanfs.serve.control import log_path
from fanfs.store import Store
from fanfs.store.format import shard_name
from fanfs.store.trust import sealed_memory
from fanfs.util import deadline
from fanfs.util.deadline import Deadline, Stalled
from fanfs.util import mounts

SFTP_SERVER = "/usr/lib/openssh/sftp-server"
TIMEOUT = "1"  # seconds a read may wait on the frozen store
FILES = 6
SHARDS = 200


class FreezableStore:
    """A store on a FUSE file system whose server process can be stopped (frozen) and continued: ``sshfs`` (to an
    sftp-server on a pipe) or ``squashfuse_ll`` (of a squashfs image)."""

    def __init__(self, base: Path, kind: str) -> None:
        """``kind``: sshfs, squashfuse, or "sshfs, many shards" (SHARDS small ones: opening or staging the store takes
        long enough to be frozen midway)."""
        many = kind == "sshfs, many shards"
        kind = "sshfs" if many else kind
        needs = {"sshfs": ("sshfs", SFTP_SERVER), "squashfuse": ("squashfuse_ll", "mksquashfs")}[kind]
        if not all(shutil.which(tool) for tool in needs):
            pytest.skip(f"needs {' and '.join(needs)} (tools/setup --test installs them)")
        src = base / "src"
        src.mkdir()
        # a file per shard: no file's bytes in the kernel's pages of another's
        rng = random.Random(35)
        self.data = {f"f{i}.bin": rng.randbytes(8000 if many else 300_000) for i in range(SHARDS if many else FILES)}
        for name, data in self.data.items():
            (src / name).write_bytes(data)
        if many:
            fanfs("pack", src, base / "store", "--shard-size", "8K", "--quiet")
        else:
            make_photo_set(src / "photos", 2)  # progressive records: a mount staged at K reads the layers above here
            fanfs("pack", src, base / "store", "--shard-size", "256K", "--progressive-jpeg", "--quiet")
            store = Store(str(base / "store"))
            self.data.update({f"photos/{p.name}": store.read_file(f"photos/{p.name}")
                              for p in (src / "photos").iterdir()})
            store.close()
        self.base, self.kind, self.fuse, self.server = base, kind, None, 0
        self.path = base / "frozen"
        self.path.mkdir()

    def start(self) -> None:
        base = self.base
        if self.kind == "sshfs":
            server = base / "sftp"  # sshfs runs it as its ssh command: the server on a pipe (its pid said)
            server.write_text(f"#!/bin/sh\necho $$ > {base / 'sftp.pid'}\nexec {SFTP_SERVER}\n")
            server.chmod(0o700)
            command = ["sshfs", "-f", "-o", f"ssh_command={server}", f"localhost:{base / 'store'}", self.path]
        else:
            subprocess.run(["mksquashfs", base / "store", base / "store.sqfs", "-quiet", "-noappend", "-no-progress"],
                           check=True, capture_output=True)
            command = ["squashfuse_ll", "-f", base / "store.sqfs", self.path]
        self.fuse = subprocess.Popen(command)
        while not mounts.mounted(self.path):
            assert self.fuse.poll() is None, f"{command[0]} did not start"
            time.sleep(0.02)
        self.server = int((base / "sftp.pid").read_text()) if self.kind == "sshfs" else self.fuse.pid

    def freeze(self) -> None:
        stop(self.server)

    def thaw(self) -> None:
        os.kill(self.server, signal.SIGCONT)

    def read(self, path: Path) -> bytes | str:
        """What a reader process gets: the bytes, or "EIO"; a reader that hangs fails the test (thawed first: its read
        waits in the kernel until the mount answers it, which waits on this store)."""
        reader = subprocess.Popen(["cat", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = reader.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.thaw()
            reader.kill()
            reader.communicate()
            raise AssertionError(f"a read of {path} hung on the frozen store") from None
        if reader.returncode:
            assert b"Input/output error" in err, err
            return "EIO"
        return out

    def close(self) -> None:
        if self.server:
            self.thaw()
        subprocess.run(["fusermount3", "-u", self.path], capture_output=True)
        force_unmount(self.path)
        if self.fuse is not None:
            self.fuse.terminate()
            self.fuse.wait()
        if self.server != getattr(self.fuse, "pid", 0):  # sshfs's server (not its child: it ends with its pipe)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.server, signal.SIGTERM)


@pytest.fixture
def frozen(tmp_path, request):
    store = FreezableStore(tmp_path, getattr(request, "param", "sshfs"))
    try:
        store.start()
        yield store
    finally:
        store.close()


def umount_frozen(mnt: Path, held: bool = False) -> list[int]:
    """``fanfs umount`` while the store is frozen, a read given up on: it succeeds and the mount is gone; the daemon
    has ended (but for a thread of that read that may wait in the kernel on sshfs until it answers: ``held``, it does,
    and umount says so); its pids."""
    pids = daemon_pids(mnt)
    assert pids
    done = fanfs("umount", mnt, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "killed" not in done.stderr  # the daemon ended by itself, stalled store or not
    assert not held or "threads of it wait in the kernel" in done.stderr, done.stderr
    assert not mounts.mounted(mnt)
    return pids


def gone(pids: list[int]) -> None:
    """Wait until the processes are gone (their threads leave the kernel once the store answers, or in a moment once
    killed; a process that stays is the pytest timeout's)."""
    assert pids
    while [pid for pid in pids if os.path.exists(f"/proc/{pid}")]:
        time.sleep(0.02)


def read_again(frozen: FreezableStore, path: Path) -> bytes | str:
    """A read once the store is thawed (the reads given up on, still in the kernel, may not have returned yet)."""
    while (got := frozen.read(path)) == "EIO":
        time.sleep(0.1)
    return got


def eio_lines(mnt: Path) -> list[str]:
    return [line for line in Path(log_path(mnt)).read_text().splitlines() if " EIO " in line]


@contextlib.contextmanager
def held_in_memory(path: Path) -> Iterator[None]:
    """The file's pages kept in the page cache while the block runs: mapped and locked by the test, so that no memory
    pressure (a loaded machine) evicts them meanwhile, and what the kernel caches is a state, not a chance."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    try:
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        assert _libc.mlock(ctypes.c_void_p(address), size) == 0, os.strerror(ctypes.get_errno())
        yield
    finally:
        if address not in (None, ctypes.c_void_p(-1).value):
            _libc.munmap(ctypes.c_void_p(address), size)  # (unlocked with it)
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mlock.argtypes = _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@pytest.mark.slow
@pytest.mark.parametrize("mount", ["plain", "lazy", "2 serving processes"])
def test_a_frozen_store_answers_eio_in_time_unmounts_and_recovers(frozen, tmp_path, mount):
    options = {"plain": ("--workers", "1"), "lazy": ("--local-dir", tmp_path / "local", "--stage", "lazy", "--workers",
                                                     "1"), "2 serving processes": ("--workers", "2")}[mount]
    with mounted(frozen.path, tmp_path / "mnt", "--store-timeout", TIMEOUT, *options) as mnt:
        try:
            assert frozen.read(mnt / "f0.bin") == frozen.data["f0.bin"]
            with held_in_memory(mnt / "f0.bin"):  # cached: in the kernel's pages (plain), kept (lazy)
                frozen.freeze()
                assert frozen.read(mnt / "f4.bin") == "EIO"  # waited on for --store-timeout
                assert frozen.read(mnt / "f5.bin") == "EIO"  # at once: known to be stalled
                assert frozen.read(mnt / "f0.bin") == frozen.data["f0.bin"]  # what is cached or kept is served still
            lines = [line for line in eio_lines(mnt) if "f4.bin" in line]  # one per serving process that was asked
            assert 1 <= len(lines) <= (2 if mount == "2 serving processes" else 1), lines
            assert f"{frozen.path}/shards/" in lines[0] and "no answer within 1 s" in lines[0], lines
            frozen.thaw()
            for name in ("f5.bin", "f4.bin", "f3.bin"):  # the same mount reads the store again
                assert read_again(frozen, mnt / name) == frozen.data[name]
            frozen.freeze()
            assert frozen.read(mnt / "f2.bin") == "EIO"
            pids = umount_frozen(mnt)
        finally:
            frozen.thaw()  # before the mount's cleanup unmounts it
    gone(pids)


@pytest.mark.slow
def test_a_mount_staged_at_k_reads_the_layers_above_from_a_frozen_store_in_time(frozen, tmp_path):
    photo, other = sorted(name for name in frozen.data if name.startswith("photos/"))
    with mounted(frozen.path, tmp_path / "mnt", "--local-dir", tmp_path / "local", "--stage", "--fidelity", "1",
                 "--store-timeout", TIMEOUT, "--workers", "1") as mnt:
        try:
            frozen.freeze()
            fanfs("ctl", mnt, "--fidelity", "full")  # layers no node staged: from the store
            assert frozen.read(mnt / photo) == "EIO"
            frozen.thaw()
            assert read_again(frozen, mnt / photo) == frozen.data[photo]
            frozen.freeze()
            assert frozen.read(mnt / other) == "EIO"
            pids = umount_frozen(mnt)
        finally:
            frozen.thaw()
    gone(pids)


@pytest.mark.slow
def test_a_staged_copy_gone_reads_the_frozen_store_on_a_thread_in_time(frozen, tmp_path):
    """Issue 50: a node's staged copy removed under its mount falls back to the shared store; that store frozen, the
    read fails in time (--store-timeout), waited on by a thread: the serving loop still answers the staged files at
    once; thawed, the same mount reads the file from the store."""
    with mounted(frozen.path, tmp_path / "mnt", "--local-dir", tmp_path / "local", "--stage", "--store-timeout",
                 TIMEOUT, "--workers", "1") as mnt:
        try:
            store = Store(str(frozen.base / "store"))
            for name in ("f4.bin", "f5.bin"):  # a shard each
                (tmp_path / "local" / shard_name(int(store.index.shard[store.lookup(os.fsencode(name))]))).unlink()
            store.close()
            frozen.freeze()
            waiting = subprocess.Popen(["cat", mnt / "f4.bin"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for name in ("f1.bin", "f2.bin", "f3.bin"):  # staged: answered while f4's read waits on the store
                assert frozen.read(mnt / name) == frozen.data[name]
            assert waiting.wait(60) == 1 and b"Input/output error" in waiting.stderr.read()
            assert frozen.read(mnt / "f5.bin") == "EIO"
            frozen.thaw()
            for name in ("f4.bin", "f5.bin"):  # once the reads given up on have returned (no copy at all: EIO for ever)
                until = time.monotonic() + 60
                while (got := frozen.read(mnt / name)) == "EIO" and time.monotonic() < until:
                    time.sleep(0.1)
                assert got == frozen.data[name]
        finally:
            frozen.thaw()


def ended(frozen: FreezableStore, *args: str | os.PathLike, freeze: Callable[[int], bool] = lambda pid: True
          ) -> subprocess.CompletedProcess:
    """``fanfs ARGS`` run while the store is frozen: frozen once ``freeze(pid)`` says so (the process started, polled),
    then the command must end by itself; one that hangs fails the test (thawed first: it then ends)."""
    command = subprocess.Popen([*FANFS, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not freeze(command.pid):
            assert command.poll() is None, f"fanfs {args[0]} ended before the store was frozen: {command.communicate()}"
            time.sleep(0.001)
        frozen.freeze()
        out, err = command.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        frozen.thaw()
        command.kill()
        command.communicate()
        raise AssertionError(f"fanfs {args[0]} hung on the frozen store") from None
    return subprocess.CompletedProcess(command.args, command.returncode, out, err)


def fanfs_processes(base: Path) -> list[int]:
    """fanfs processes whose command line names a path under ``base``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "-m fanfs " in line and str(base) in line:
                found.append(int(pid))
    return found


def holds_a_shard(pid: int, frozen: FreezableStore) -> bool:
    """Whether process ``pid`` or a child of it holds a shard of the frozen store open: it checks the shards."""
    shards = f"{frozen.path}/shards/"
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for process in [pid, *map(int, children.read_text().split() if children.exists() else [])]:
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{process}/fd/{fd}").startswith(shards) for fd in os.listdir(f"/proc/{process}/fd")):
                return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("frozen", ["sshfs, many shards"], indirect=True)
@pytest.mark.parametrize("case", ["mount, frozen first", "mount, frozen while it checks the shards",
                                  "stage, frozen first", "stage, frozen while it copies",
                                  "mount --stage, frozen while it copies"])
def test_mount_and_stage_of_a_frozen_store_fail_in_time_with_one_line(frozen, tmp_path, case):
    """Issue 39.5: reading the index, checking the shards at a mount and stage's copies waited in the kernel for a
    frozen store until it answered, SIGKILL or not.  Each is now waited on for ``--store-timeout``: then one line,
    exit 1, no mount and no local directory made, and the command ends, though a thread of it waits on sshfs (its
    process, left behind, ends once the store answers)."""
    mnt, local = tmp_path / "mnt", tmp_path / "local"
    mnt.mkdir()
    command, _, when = case.partition(", frozen ")
    args = {"mount": ("mount", frozen.path, mnt), "stage": ("stage", frozen.path, local, "--quiet"),
            "mount --stage": ("mount", frozen.path, mnt, "--local-dir", local, "--stage")}[command]
    freeze = {"first": lambda pid: True, "while it checks the shards": lambda pid: holds_a_shard(pid, frozen),
              "while it copies": lambda pid: local.exists() and any(name.isdigit() for name in os.listdir(local))}[when]
    try:
        done = ended(frozen, *args, "--store-timeout", TIMEOUT, freeze=freeze)
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert lines[0].startswith("fanfs: error: ") and "no answer within 1 s (--store-timeout)" in lines[0], lines
        assert not mounts.mounted(mnt)
        assert not local.exists() or when == "while it copies"  # copies whole and checked stay: a rerun resumes
        assert not [name for name in (os.listdir(local) if local.exists() else []) if not name.isdigit()]  # no .tmp
        left = fanfs_processes(tmp_path)
    finally:
        frozen.thaw()
        if mounts.mounted(mnt):  # the code before issue 39 mounted it once thawed
            fanfs("umount", mnt, check=False)
    while [pid for pid in left if os.path.exists(f"/proc/{pid}")]:  # once it answers; one that stays is pytest-timeout's
        time.sleep(0.02)


HOLD_SSHFS = """
import os, sys, threading
fds = [os.open(path, os.O_RDONLY) for path in sys.argv[1:]]
sys.stdin.readline()
readers = [threading.Thread(target=os.pread, args=(fd, 4096, 0)) for fd in fds]
for reader in readers:
    reader.start()
for reader in readers:
    reader.join()
"""
"""Opens files on sshfs, then, told to, reads each in a thread of its own: a process that never forks, since a child
closing the descriptors it inherited (``subprocess``'s ``close_fds``) would wait on the frozen server too."""


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_umount_ends_the_daemon_while_every_thread_of_sshfs_waits_on_the_frozen_server(frozen, tmp_path, workers):
    """Issue 39.6: other readers of the frozen store hold every thread of sshfs (10), so a close of a file on it waits
    too (sshfs answers a flush from a thread).  A daemon closing its shards at its end waited so, and ``fanfs umount``
    killed it after 20 s; with ``--workers 2`` a serving process's exit also closed them, waiting interruptibly, and
    was taken for a process still running.  Now the daemon ends by itself, its threads in the kernel left there."""
    others = []
    for i in range(16):  # one sshfs thread each, once read (opened while it answers)
        others.append(frozen.base / "store" / f"other{i}")
        others[-1].write_bytes(os.urandom(65536))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SSHFS, *(frozen.path / path.name for path in others)],
                              stdin=subprocess.PIPE, text=True)
    try:
        with mounted(frozen.path, tmp_path / "mnt", "--store-timeout", TIMEOUT, "--workers", workers) as mnt:
            try:
                assert frozen.read(mnt / "f0.bin") == frozen.data["f0.bin"]
                frozen.freeze()
                assert frozen.read(mnt / "f4.bin") == "EIO"
                holder.stdin.write("read\n")
                holder.stdin.flush()
                while _waiting_in_the_kernel(holder.pid) < len(others):  # sent to sshfs, or queued: no thread free
                    assert holder.poll() is None
                    time.sleep(0.05)
                pids = umount_frozen(mnt, held=True)
            finally:
                frozen.thaw()
        gone(pids)
    finally:
        frozen.thaw()
        holder.stdin.close()
        holder.wait(timeout=120)


def _waiting_in_the_kernel(pid: int) -> int:
    """Threads of process ``pid`` but its first that sleep in the kernel, not on a lock (a futex): in a read."""
    waiting = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if task.name != str(pid) and state in ("S", "D") and not (task / "wchan").read_text().startswith("futex"):
                waiting += 1
    return waiting


@pytest.mark.slow
@pytest.mark.parametrize("frozen", ["squashfuse"], indirect=True)
def test_umount_kills_a_daemon_stuck_on_its_store(frozen, tmp_path):
    """``--store-timeout 0`` (wait for ever): the FUSE loop itself waits in the frozen store's ``pread``, for a read
    the kernel asked ahead (no file is open).  ``fanfs umount`` still succeeds: its grace over, it kills the daemon,
    and nothing is left."""
    with mounted(frozen.path, tmp_path / "mnt", "--store-timeout", "0", "--workers", "1") as mnt:
        try:
            assert frozen.read(mnt / "f0.bin") == frozen.data["f0.bin"]  # its close: FLUSH answered ENOSYS, never again
            frozen.freeze()  # asked (else the close below could wait for good on the loop that waits on the store)
            fd = os.open(mnt / "f4.bin", os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            os.close(fd)
            pids = daemon_pids(mnt)
            while not any("request_wait_answer" in kernel_state(pid) for pid in pids):  # its loop waits on the store
                time.sleep(0.05)
            done = fanfs("umount", mnt, check=False, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "was killed" in done.stderr
            assert not mounts.mounted(mnt)
            gone(pids)
        finally:
            frozen.thaw()


_EXITS_LARGE = """
import os, sys, threading
memory = bytearray(256 << 20)
memory[::4096] = b"\\x01" * (len(memory) // 4096)  # every page touched
stop = threading.Event()
for _ in range(8):
    threading.Thread(target=stop.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
os._exit(0)
"""


def test_a_daemon_tearing_down_its_memory_as_it_exits_is_not_said_to_wait_in_the_kernel():
    """Issue 49 (sixth audit, defect 13) and 50: twice ``fanfs umount`` of a healthy local mount warned that its
    daemon's threads "wait in the kernel on a file system that does not answer".  A process that exits has its first
    thread a zombie while its last one, in its exit, tears down its memory (256 MiB here: the moment is likely): asked
    once in that moment, ``exited(pid, held=True)`` said yes.  Asked all along the exit, umount's question never
    does; a thread really held stays there (``test_umount_ends_the_daemon_while_every_thread_of_sshfs_waits...``)."""
    from fanfs.util.processes import held_in_kernel, thread_states
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _EXITS_LARGE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout.readline() == "ready\n"
            child.stdin.write("\n")
            child.stdin.flush()
            said = []
            while {state for state, _ in thread_states(child.pid).values()} - {b"Z"}:  # until its last thread is gone
                said.append(held_in_kernel(child.pid))
            assert not any(said), f"said held {sum(said)} times of {len(said)}"
        finally:
            child.kill()
            child.wait()


def test_reads_fail_at_once_while_stalled_but_a_probe_each_timeout_and_none_past_the_cap(monkeypatch):
    """The deadline itself, on real blocking reads: a pipe nobody writes to, as a stalled server's file."""
    monkeypatch.setattr(deadline, "STUCK", 2)
    reads = Deadline("a pipe", 0.2)
    stalled, writer = os.pipe()
    try:
        with pytest.raises(Stalled, match="no answer within 0.2 s"):
            reads.run("p", os.read, stalled, 1)
        with pytest.raises(Stalled, match=r"not read: its file system is stalled \(1 reads"):
            reads.run("p", os.read, stalled, 1)  # at once: within a timeout of the last one given up on
        time.sleep(0.2)
        with pytest.raises(Stalled, match=r"stalled \(1 reads"):  # at once, but asked: a probe, a
            reads.run("p", os.read, stalled, 1)  # timeout later, not waited for
        time.sleep(0.2)
        for _ in range(2):  # the cap: no more probes (the second would say 3)
            with pytest.raises(Stalled, match=r"stalled \(2 reads"):
                reads.run("p", os.read, stalled, 1)
            time.sleep(0.2)
        os.write(writer, b"abc")  # it answers: the stuck reads return, and reads go to it again
        while (got := _read_or_none(reads, stalled)) is None:
            time.sleep(0.01)
        assert len(got) == 1

        ending, outcome = Deadline("a pipe", 600), []
        waiting = threading.Thread(target=lambda: outcome.append(_read_or_none(ending, stalled)))
        waiting.start()
        while not ending._waiting:  # admitted, and waiting on the pipe
            time.sleep(0.01)
        ending.stop()  # the mount ends: the read gives up now, not in 600 s
        waiting.join()
        assert outcome == [None]
        with pytest.raises(Stalled, match="the mount is ending"):
            ending.run("p", os.read, stalled, 1)
    finally:
        os.write(writer, b"x" * 8)  # no thread left waiting
        os.close(writer)
        os.close(stalled)


def test_a_deadline_holds_no_argument_of_a_call_answered(tmp_path):
    """A call answered leaves nothing of its caller's with the deadline's thread: an index on a network file system is
    read into memory it then seals, through the deadline, and the thread's last call kept a part of that memory
    exported (a memoryview), so the mapping could not be closed and every mount of a store on sshfs failed with a
    traceback (BufferError).  Here: a mapping read into through a deadline, then closed."""
    path = tmp_path / "index"
    path.write_bytes(os.urandom(10_000))
    reads = Deadline("a file", 30)
    fd = os.open(path, os.O_RDONLY)
    try:
        memory = sealed_memory(10_000, lambda view: reads.run("index", os.preadv, fd, [view[:10_000]], 0))
    finally:
        os.close(fd)
        reads.retire()
    assert bytes(memory) == path.read_bytes()


class _AnsweredAt(threading.Event):
    """A call's "answered" event on a clock of the test's: a wait of ``timeout`` seconds sees the answer only if it comes
    within them (at ``at`` seconds after the call was asked: its pipe's byte is then written, and waited for); a
    shorter wait sees none, at once, as after ``timeout`` seconds of nothing."""

    def __init__(self, writer: int, at: float) -> None:
        super().__init__()
        self.writer, self.at = writer, at

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None or timeout >= self.at:
            os.write(self.writer, b"a")
            return super().wait()
        return super().wait(0)


def test_a_read_past_the_timeout_fails_before_its_answer_comes(monkeypatch):
    """The EIO comes from the deadline, not from an answer that came late: a pipe answered two timeouts after the read
    was asked, on the test's clock (a read that waited twice ``--store-timeout``, or more, would get its byte; one that
    waits its timeout gets Stalled whatever the machine's pace)."""
    reads = Deadline("a pipe", 0.3)
    stalled, writer = os.pipe()

    calls = []

    class Clocked(deadline._Call):
        def __init__(self, function: Callable, args: tuple) -> None:
            super().__init__(function, args)
            self.done = _AnsweredAt(writer, 2 * reads.seconds)
            calls.append(self)

    monkeypatch.setattr(deadline, "_Call", Clocked)
    try:
        with pytest.raises(Stalled, match=r"no answer within 0.3 s \(--store-timeout\)"):
            reads.run("p", os.read, stalled, 1)
    finally:
        os.write(writer, b"a")  # the read given up on returns with the byte: no thread left waiting in it
        assert threading.Event.wait(calls[0].done, 60)  # (on the real clock)
        os.close(writer)
        os.close(stalled)


def _read_or_none(reads: Deadline, fd: int) -> bytes | None:
    try:
        return reads.run("p", os.read, fd, 1)
    except Stalled:
        return None
