"""Issue 17.10: no request is left unanswered and no reply outlives its session, whatever a handler raises.

Each test runs a real mount (tests/fault_daemon.py: fanfs's own FUSE front, in the foreground) with one
fault injected, and reads it from another process with a timeout: a request never answered is a reader
hanging for ever, which the timeout turns into a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fanfs, force_unmount

DAEMON = Path(__file__).resolve().parent / "fault_daemon.py"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    (base / "src").mkdir()
    for name in ("a", "b", "c"):
        (base / "src" / f"{name}.txt").write_text(f"{name}\n" * 1000)
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base / "store"


class FaultyMount:
    def __init__(self, store: Path, mnt: Path, mode: str) -> None:
        mnt.mkdir()
        self.mnt = mnt
        self.proc = subprocess.Popen([sys.executable, str(DAEMON), str(store), str(mnt), mode],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n", self.proc.stderr.read()

    def read(self, name: str, timeout: float = 20) -> str:
        """What a reader process gets: the text, or the error's name; a hang fails the test."""
        code = (f"import errno, sys\ntry: sys.stdout.write(open({str(self.mnt / name)!r}).read()[:2])\n"
                "except OSError as err: sys.stdout.write(errno.errorcode[err.errno])")
        reader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            return reader.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the reader waits unkillably for its answer: only the daemon's end frees it
            reader.communicate()
            raise AssertionError(f"a reader of {name} hung: its request was never answered") from None

    def end(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=30)
        finally:
            force_unmount(self.mnt)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, out, err


def test_a_base_exception_in_a_handler_is_answered_with_eio(store, tmp_path):
    mount = FaultyMount(store, tmp_path / "mnt", "raise-base")
    try:
        assert mount.read("boom") == "EIO"
        assert mount.read("a.txt") == "a\n"  # the loop lives on
    finally:
        code, _, err = mount.end()
    assert code == signal.SIGTERM and "SystemExit" in err, err  # the loop ended by the stop signal, not a crash


def test_a_failed_reply_in_a_worker_is_answered_and_the_worker_lives_on(store, tmp_path):
    mount = FaultyMount(store, tmp_path / "mnt", "reply-fails")
    try:
        assert mount.read("a.txt") in ("EIO", "a\n")  # EIO, or the kernel's retry of a failed readahead
        got = [mount.read(name) for name in ("b.txt", "c.txt") * 8]  # more reads than workers
        assert got == ["b\n", "c\n"] * 8
    finally:
        code, _, err = mount.end()
    assert code == signal.SIGTERM and "injected" in err, err


def test_workers_finish_before_the_session_is_destroyed(store, tmp_path):
    mount = FaultyMount(store, tmp_path / "mnt", "slow-peer")
    try:
        reader = subprocess.Popen(["cat", str(mount.mnt / "a.txt")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # the read waits in a worker for its slow "peer"
        code, out, err = mount.end()
        reader.wait(timeout=30)
    finally:
        force_unmount(mount.mnt)
    assert code == signal.SIGTERM, err  # no crash on a freed session
    assert out.split() == ["reply", "destroyed"], out
