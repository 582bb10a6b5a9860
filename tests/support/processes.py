"""What a process holds (its descriptors), what MPI may leave behind (segments in /dev/shm), killing processes at one
blow, and removing a test's tree with what a killed job left mounted in it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def fd_targets(pid: int) -> dict[int, str]:
    """A process's open descriptors and what they name ("socket:[N]", a path, "... (deleted)")."""
    found = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return found


def live_mpi_segments(pids) -> list[str]:
    """MPICH shared-memory segments still named in /dev/shm that these processes hold open."""
    return sorted({target for pid in pids for target in fd_targets(pid).values()
                   if target.startswith("/dev/shm/mpich_shm_") and not target.endswith("(deleted)")})


def mpi_segments() -> set[str]:
    """The MPICH shared-memory segments in /dev/shm now."""
    return {path.name for path in Path("/dev/shm").glob("mpich_shm_*")}


def mpi_segments_left(before: set[str], hosts: int) -> list[str]:
    """MPICH segments in /dev/shm that were not there ``before``, that no process holds any more, and that
    a job on ``hosts`` hosts makes: MPICH names them ``mpich_shm_HASH_N``, one per host N of the job (one
    host under mpiexec here, one per Slurm node).  Another job leaking at the same moment with as many
    hosts would count too."""
    held = {target for pid in filter(str.isdigit, os.listdir("/proc")) for target in fd_targets(int(pid)).values()}
    groups: dict[str, set[str]] = {}
    for name in mpi_segments() - before:
        if f"/dev/shm/{name}" not in held:
            job, _, host = name.rpartition("_")
            groups.setdefault(job, set()).add(host)
    return sorted(f"{job}_{host}" for job, found in groups.items() if found == {str(n) for n in range(hosts)}
                  for host in found)


def kernel_state(pid: int) -> str:
    """Where a process is in the kernel: its state, wait channel and kernel stack (root reads the stack), per
    thread; for the report of a process that did not end when it should have."""
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return f"{pid}: gone"
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            state = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"{base}/wchan").read_text()
            stack = Path(f"{base}/stack").read_text().strip().replace("\n", " <- ")
        except OSError as err:
            state, wchan, stack = "?", "?", str(err)
        lines.append(f"{pid}/{tid} [{state}] {wchan}: {stack}")
    return "\n".join(lines)


def stop(pid: int, seconds: float = 10) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped: kill() returns when the signal is queued,
    and a thread running on the other core may still answer a request meanwhile (a 'stopped' peer served)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                states.add(Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states <= {"T", "t"}:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop:\n{kernel_state(pid)}")


def kill_at_one_blow(listing: Callable[[], list[int]]) -> None:
    """SIGKILL every process ``listing()`` names as the OOM killer may end a job: all of them stopped first (and any
    they start meanwhile), so that none sees another die and cleans up on its way out (on a busy machine one did),
    then killed, until none is left."""
    stopped: set[int] = set()
    while fresh := set(listing()) - stopped:
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):  # ended since it was listed
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    while pids := listing():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_with_mounts(top: Path) -> None:
    """Remove ``top`` whatever a failed test left in it: every mount under it detached first, deepest first (a job
    killed outright leaves its dead mount, and ``rmtree`` cannot remove a mount point), then the tree."""
    with open("/proc/mounts") as f:
        inside = [line.split()[1] for line in f if line.split()[1].startswith(f"{top}/")]
    for mountpoint in sorted(inside, key=len, reverse=True):
        if subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mountpoint], capture_output=True)
    shutil.rmtree(top, ignore_errors=True)
