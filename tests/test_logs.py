"""Issue 50 (major 4): a daemon's log stays under its stated size (:data:`fanfs.serve.logfile.LOG_LIMIT`) whatever the
reads do: 10,000 files read from a node's wiped copy gave 2.1 MB of log, about 270 MB per epoch at ImageNet's scale."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fanfs_command import fanfs

from fanfs.serve import control
from fanfs.serve.logfile import LOG_LIMIT
from fanfs.store.format import SHARD_DIR, SHARD_HEADER

FULL = "this log reached 1.0 MiB: nothing more is logged"

_FOUR_WRITERS = """
import logging, os, sys
from fanfs.serve.logfile import detach, setup_logging
detach(sys.argv[1])
setup_logging(False, own_file=True)
children = []
for _ in range(3):  # serving processes: they write to the same file
    if (pid := os.fork()) == 0:
        break
    children.append(pid)
for i in range(3000):
    logging.getLogger("fanfs").error("EIO %s %d: %s", "p" * 120, i, "x" * (i % 300))
for child in children if pid else ():
    os.waitpid(child, 0)
os._exit(0)
"""


def test_a_log_written_by_four_processes_stops_at_its_size_with_a_last_line(tmp_path):
    """Four processes (a daemon and its serving processes) logging ~6 MB at once into the daemon's log: it holds at
    most the stated size and ends with the line that says it is full."""
    log = tmp_path / "mount.log"
    done = subprocess.run([sys.executable, "-c", _FOUR_WRITERS, str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert LOG_LIMIT - 4096 < len(text.encode()) <= LOG_LIMIT, len(text.encode())
    lines = text.splitlines()
    assert FULL in lines[-1] and 1 <= sum(FULL in line for line in lines) <= 2, lines[-3:]
    assert all(" ERROR EIO " in line for line in lines[:-4])


@pytest.mark.slow
def test_a_mount_s_log_stays_under_its_size_whatever_the_reads_do(tmp_path, mount):
    """A store of 4,000 shards, each zeroed under a live mount of two serving processes, each file read twice: 4,000
    causes (each logged once, over 1 MB of lines), and the log stops at the stated size with its last line."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4000):
        (src / f"{i:05d}-a-file-with-a-long-name-to-make-long-log-lines-{'x' * 60}.bin").write_bytes(os.urandom(64))
    fanfs("pack", src, tmp_path / "store", "--shard-size", "1", "--quiet")
    with mount(tmp_path / "store", "--workers", "2") as mnt:
        for shard in (tmp_path / "store" / SHARD_DIR).iterdir():
            with open(shard, "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(SHARD_HEADER.size)
                f.write(bytes(size - SHARD_HEADER.size))
        for path in sorted(src.iterdir()) * 2:
            with pytest.raises(OSError) as err:
                (mnt / path.name).read_bytes()
            assert err.value.errno == errno.EIO
        log = Path(control.log_path(str(mnt)))
        assert LOG_LIMIT - 4096 < log.stat().st_size <= LOG_LIMIT
        lines = log.read_text().splitlines()
    assert FULL in lines[-1], lines[-2:]
