"""Issue 19: several serving processes on one mount (``--workers N``), and every promise of one loop kept.

Two serving processes share a mount's requests, byte-exact; ``fanfs stats`` sums what each served; a stop
signal to the daemon ends every process and the mount; a serving process that dies ends the mount at once
and loudly (its readers get an error, never a hang), and a daemon killed with -9 takes its serving
processes with it.  The switch race, the peers and the Slurm job run with workers too (test_switch_race,
test_cluster, test_slurm).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fanfs_command import daemon_pids, fanfs, force_unmount, mount_stats
from support.inject import inject
from support.processes import stop

from fanfs.serve.control import log_path, request
from fanfs.serve.daemon import umount


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("workers")
    src = base / "src"
    for i in range(300):
        path = src / f"d{i % 6}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1000 + 37 * i) + bytes(i))
    fanfs("pack", src, base / "store", "--shard-size", "256K", "--quiet")
    return src, base / "store", sorted(str(p.relative_to(src)) for p in src.rglob("*.bin"))


def _read(path: Path) -> bytes | str:
    try:
        return path.read_bytes()
    except OSError as err:
        return err.strerror or str(err)


def serving_pids(mnt: Path) -> tuple[int, list[int]]:
    """The daemon's pid and its serving processes' (its children running the same command)."""
    parent = request(mnt, {"cmd": "status"})["pid"]
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return parent, [int(pid) for pid in children]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def wait_gone(mnt: Path | None, pids: Iterable[int], seconds: float = 20) -> None:
    """Wait (at most ``seconds``) until ``mnt`` is no mount and none of ``pids`` is alive; the caller asserts."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and ((mnt is not None and os.path.ismount(mnt)) or any(map(alive, pids))):
        time.sleep(0.05)


@pytest.mark.slow
def test_two_serving_processes_share_the_reads_exactly(tree, mount):
    src, store, files = tree
    with mount(store, "--workers", "2") as mnt:
        parent, workers = serving_pids(mnt)
        assert len(workers) == 2
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(_read, [mnt / f for f in files]))
        assert got == [(src / f).read_bytes() for f in files]
        stats = json.loads(fanfs("stats", mnt, "--json").stdout)
        assert stats["workers"] == 2 and stats["reads"] >= len(files)
        assert len(stats["reads_by_process"]) == 2 and sum(stats["reads_by_process"]) == stats["reads"]
        assert all(n > 0 for n in stats["reads_by_process"]), stats["reads_by_process"]  # both served
        assert stats["bytes_presented"] == sum((src / f).stat().st_size for f in files)
        assert "by 2 serving processes" in fanfs("stats", mnt).stdout
    assert not any(alive(pid) for pid in (parent, *workers))


def test_a_serving_process_that_answers_late_counts_as_it_last_answered_and_stats_catch_up(tree, mount, monkeypatch):
    """Issue 49 (sixth audit, 11): a serving process that gave its counters later than the parent waits for them (here:
    stopped) was left out, so totals went down meanwhile, and its late answer was then taken for the next question's:
    ``fanfs stats`` stayed one answer behind for good.  Now it counts as it last answered, and its late answer is
    passed over.  Reads are made while one process is stopped, so that the other serves them all."""
    src, store, files = tree
    inject(monkeypatch, "fanfs.serve.workers:ASK_SECONDS=0.5")  # the wait for an answer (5 s): short, for the test

    def read_by_one(names: list[str], stopped: int) -> None:
        stop(stopped)  # every thread of it stopped: none may take a request
        try:
            assert [(mnt / name).read_bytes() for name in names] == [(src / name).read_bytes() for name in names]
        finally:
            os.kill(stopped, signal.SIGCONT)

    with mount(store, "--workers", "2") as mnt:
        _, (first, second) = serving_pids(mnt)
        read_by_one(files[:20], first)
        start = mount_stats(mnt)
        assert start["reads"] >= 20 and start["processes_silent"] == 0, start
        stop(second)  # it served the 20 reads, and answers nothing now
        try:
            stopped, said = mount_stats(mnt), fanfs("stats", mnt).stdout
        finally:
            os.kill(second, signal.SIGCONT)  # its answers come late
        assert stopped["reads"] == start["reads"] and stopped["processes_silent"] == 1, stopped  # not fewer
        assert "(1 did not answer in time: theirs as they last gave them)" in said, said
        read_by_one(files[20:30], first)
        now = mount_stats(mnt)
        assert now["reads"] == start["reads"] + 10 and now["processes_silent"] == 0, now  # not one answer behind


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_ends_every_serving_process_and_the_mount(tree, tmp_path, sig):
    _, store, files = tree
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        fanfs("mount", store, mnt, "--workers", "2")
        parent, workers = serving_pids(mnt)
        assert (mnt / files[0]).read_bytes()
        os.kill(parent, sig)
        wait_gone(mnt, (parent, *workers))
        assert not os.path.ismount(mnt)
        assert not any(alive(pid) for pid in (parent, *workers))
    finally:
        force_unmount(mnt)


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_dead_serving_process_ends_the_mount_loudly_never_half_served(tree, tmp_path):
    """kill -9 of one serving process: the requests it held would never be answered, so the daemon ends the
    whole mount at once: readers get an error within seconds (never hang), the log and the daemon say why.
    The mount point stays a dead mount until it is unmounted: a reader opening a file afterwards is told the
    file system's server is gone (ENOTCONN), not that the file does not exist (the empty directory under an
    unmounted point gave ENOENT: issue 29.4); ``fanfs umount`` then clears it and it mounts again."""
    _, store, files = tree
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    reader = None
    pids: list[int] = []
    try:
        fanfs("mount", store, mnt, "--workers", "2")
        parent, workers = serving_pids(mnt)
        pids = [parent, *workers]
        log = Path(log_path(mnt))
        reader = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                                   "for name in sys.argv[2:]:\n"  # each file once (one read is in the kernel's cache,
                                   "    open(os.path.join(sys.argv[1], name), 'rb').read()\n"  # and served from it)
                                   "    time.sleep(0.02)\n", str(mnt), *files],
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        os.kill(workers[0], signal.SIGKILL)
        _, err = reader.communicate(timeout=30)  # an error, not a hang
        assert reader.returncode != 0 and ("Transport endpoint" in err or "Software caused" in err), err
        wait_gone(None, pids)
        assert not any(alive(pid) for pid in pids)
        text = log.read_text()
        assert f"serving process {workers[0]} died of SIGKILL" in text, text
        assert "fanfs umount" in text, text  # what to do, said in the log
        with pytest.raises(OSError) as caught:  # one never read (what was is in the kernel's cache, and right)
            (mnt / files[-1]).read_bytes()
        assert caught.value.errno == errno.ENOTCONN, caught.value
        refused = fanfs("mount", store, mnt, check=False)
        assert refused.returncode != 0 and f"'fanfs umount {mnt}' first" in refused.stderr, refused.stderr
        assert fanfs("umount", mnt).stdout.strip() == f"unmounted {mnt}"
        fanfs("mount", store, mnt, "--workers", "2")
        assert (mnt / files[1]).read_bytes()
        pids += daemon_pids(mnt)
        fanfs("umount", mnt)
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
        force_unmount(mnt)
        _kill_all(pids)


@pytest.mark.slow
def test_a_stopped_serving_process_cannot_hold_the_mount_point(tree, tmp_path):
    """Issue 29.2: SIGSTOP one of 3 serving processes, then ``fanfs umount``: the daemon waited for ever for the
    stopped one, which lived on with it; the mount point was then refused to ``fanfs mount`` ("umount first")
    while ``fanfs umount`` said "not mounted".  Serving processes that have not ended a grace period after the
    mount did are killed (and the log says so): the daemon ends, and the point mounts again; also when the
    daemon unmounted itself on a stop signal."""
    _, store, files = tree
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pids: list[int] = []
    try:
        fanfs("mount", store, mnt, "--workers", "3")
        parent, workers = serving_pids(mnt)
        pids = [parent, *workers]
        log = Path(log_path(mnt))
        assert (mnt / files[0]).read_bytes()
        os.kill(workers[1], signal.SIGSTOP)
        assert fanfs("umount", mnt).stdout.strip() == f"unmounted {mnt}"
        wait_gone(mnt, pids, seconds=30)
        assert not any(alive(pid) for pid in pids)
        text = log.read_text()
        assert f"serving process {workers[1]} had not ended" in text, text
        fanfs("mount", store, mnt, "--workers", "2")
        assert (mnt / files[0]).read_bytes()
        parent, workers = serving_pids(mnt)
        pids += [parent, *workers]
        os.kill(workers[0], signal.SIGSTOP)  # and an unmount that waits less than the grace period kills the daemon
        assert umount(str(mnt), timeout=1)  # (issue 35.5), its serving processes going with it
        wait_gone(mnt, pids, seconds=30)
        assert not any(alive(pid) for pid in pids)
        fanfs("mount", store, mnt, "--workers", "2")  # and a daemon that unmounts itself (SIGTERM, a job's end):
        parent, workers = serving_pids(mnt)  # libfuse has then closed the session's descriptor, and asking
        pids += [parent, *workers]  # whether the mount had ended raised ValueError
        os.kill(workers[1], signal.SIGSTOP)
        os.kill(parent, signal.SIGTERM)
        wait_gone(mnt, pids, seconds=30)
        assert not any(alive(pid) for pid in pids)
        text = log.read_text()
        assert f"serving process {workers[1]} had not ended" in text and "Traceback" not in text, text
    finally:
        force_unmount(mnt)
        _kill_all(pids)


def test_a_daemon_killed_with_minus_9_takes_its_serving_processes_along(tree, tmp_path):
    _, store, _ = tree
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        fanfs("mount", store, mnt, "--workers", "2")
        parent, workers = serving_pids(mnt)
        os.kill(parent, signal.SIGKILL)
        wait_gone(None, workers)
        assert not any(alive(pid) for pid in workers)
    finally:
        force_unmount(mnt)
        for pid in daemon_pids(mnt):
            os.kill(pid, signal.SIGKILL)


def test_a_dead_mount_says_its_daemon_has_ended(tree, tmp_path):
    """Issue 41: after a kill -9 of the daemon, 'fanfs mount' there said only 'already a mount point' (the dead mount's
    root still stats from the kernel's cache) and 'fanfs stats' '(Connection refused)'.  Both say the daemon has ended
    and what to do."""
    _, store, files = tree
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        fanfs("mount", store, mnt)
        parent, workers = serving_pids(mnt)
        os.kill(parent, signal.SIGKILL)
        wait_gone(None, (parent, *workers))
        again = fanfs("mount", store, mnt, check=False)
        assert again.returncode == 1 and again.stderr.splitlines() == [
            f"fanfs: error: {mnt} is already a mount point whose daemon has ended (it answers 'Transport endpoint is "
            f"not connected'): 'fanfs umount {mnt}' first"], again.stderr
        for command in ("stats", "ctl"):
            done = fanfs(command, mnt, *(["--fidelity", "full"] if command == "ctl" else []), check=False)
            assert done.returncode == 1 and done.stderr.splitlines() == [
                f"fanfs: error: {mnt} is a dead mount: its fanfs daemon has ended (killed?); 'fanfs umount {mnt}' "
                "removes it, then mount again"], done.stderr
        assert fanfs("umount", mnt).stdout.strip() == f"unmounted {mnt}"
    finally:
        force_unmount(mnt)
