"""Issue 8.7: every failure says what happened in one line, and nothing a user does prints a traceback."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fanfs
from trees import damaged_copy


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("errors")
    (base / "src" / "d").mkdir(parents=True)
    for i in range(20):
        (base / "src" / "d" / f"f{i}.txt").write_text(f"file {i}\n" * 5000)
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_full_disk_names_the_file_system_and_the_bytes_needed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"big{i}").write_bytes(os.urandom(1 << 20))
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        done = fanfs("pack", src, small / "store", "--shard-size", "1M", check=False)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert re.search(rf"no space left on {small} \(tmpfs\)", done.stderr), done.stderr
        assert re.search(r"needs about \d+(\.\d)? [KMG]iB more", done.stderr), done.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


STARTED = "import sys; from fanfs.cli import entry; print('started', file=sys.stderr, flush=True); entry()"
"""The ``fanfs`` command, after telling its parent its entry point is loaded: a Ctrl-C before that lands
in CPython's own start-up (its ``site`` import) or in two empty package inits, which no program can guard."""


def start_fanfs(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", STARTED, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr.readline() == "started\n"
    return proc


def test_ctrl_c_at_any_moment_of_a_pack_is_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):
        (src / f"f{i}").write_bytes(os.urandom(1 << 20) + bytes(1 << 20))
    rng = random.Random(7)
    for attempt in range(12):
        store = tmp_path / f"store{attempt}"
        proc = start_fanfs("pack", str(src), str(store), "--codec", "zstd:12")
        time.sleep(rng.uniform(0.0, 1.2))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err and "Exception ignored" not in err, err
        if proc.returncode == 130:
            assert err.strip() == "fanfs: interrupted; nothing was left half-done", err
            assert not store.exists()
        else:
            assert proc.returncode == 0 and store.exists(), err  # it finished before the signal
        assert not list(tmp_path.glob(f"store{attempt}.*"))


def test_ctrl_c_while_starting_is_quiet(store):
    for delay in (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15):
        proc = start_fanfs("verify", str(store / "store"), "--quiet")
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err and proc.returncode in (0, 130), (delay, proc.returncode, err)
        assert err.strip() in ("", "fanfs: interrupted; nothing was left half-done"), err


def test_a_failed_read_is_logged_once(store, tmp_path, mount):
    bad = tmp_path / "bad"
    damaged_copy(store / "store", bad, b"d/f3.txt", at=10)
    from fanfs.serve.control import log_path
    with mount(bad) as mnt:
        for _ in range(3):
            with pytest.raises(OSError):
                (mnt / "d" / "f3.txt").read_bytes()
        log = Path(log_path(mnt)).read_text()
    assert log.count("EIO d/f3.txt") == 1, log


def test_missing_scan_script_and_plan_are_one_clear_line(store, tmp_path):
    for option, what in (("--scan-script", "scan script"), ("--plan", "plan")):
        done = fanfs("pack", store / "src", tmp_path / "x", option, tmp_path / "nosuch", check=False)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
        assert f"cannot read {what} {tmp_path / 'nosuch'}: No such file or directory" in done.stderr, done.stderr
        assert "[Errno" not in done.stderr
    os.mkfifo(tmp_path / "fifo")
    done = fanfs("pack", store / "src", tmp_path / "x", "--scan-script", tmp_path / "fifo", check=False, timeout=30)
    assert done.returncode == 1 and "FIFO" in done.stderr


def test_a_closed_pipe_ends_the_command_quietly(store):
    proc = subprocess.Popen([sys.executable, "-m", "fanfs", "info", "--json", str(store / "store")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head -0` would
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b"", err
