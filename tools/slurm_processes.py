"""Finding and killing a one-host Slurm's processes by their environment (tools/slurm_cluster.py): every daemon,
slurmstepd and job task of a cluster carries its ``SLURM_CONF`` and its owner's pid, even those that escaped their
step or outlived the process that started the cluster.  Linux only (/proc).  Stdlib only."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

# Set in the environment of the daemons (hence of slurmstepd) and, by the task prolog, of every job task, so
# that all processes of a cluster can be found in /proc, even after the Python process that owned it died.
OWNER_VAR = "ONE_HOST_SLURM_OWNER"        # pid of the Python process that started the cluster
CONF_VAR = "SLURM_CONF"                   # path of its slurm.conf (also in every job: sbatch's environment)

Match = Callable[[dict[bytes, bytes]], bool]


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
    except OSError:                          # gone, a zombie, or not ours to read
        return {}


def find_processes(match: Match) -> list[int]:
    """PIDs of other processes whose environment satisfies ``match(environ_dict)``."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid() and match(_environ(int(entry.name))):
            pids.append(int(entry.name))
    return pids


def kill_all(match: Match, grace: float = 2.0) -> list[int]:
    """SIGTERM every matching process, then SIGKILL what is left after ``grace`` s; returns PIDs."""
    victims = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = find_processes(match)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        victims += pids
        deadline = time.monotonic() + grace
        while pids and find_processes(match) and time.monotonic() < deadline:
            time.sleep(0.1)
    return sorted(set(victims))


def of_cluster(conf: Path, owner: int) -> Match:
    """A cluster's own processes: its ``SLURM_CONF`` and its owner's pid.  ``SLURM_CONF`` alone is no mark: a
    user's shell exports it (``eval "$(tools/slurm-local start)"``), and so does all that shell starts since."""
    conf_value, owner_value = os.fsencode(conf), str(owner).encode()
    return lambda env: env.get(CONF_VAR.encode()) == conf_value and env.get(OWNER_VAR.encode()) == owner_value


def kill_stale_clusters() -> list[int]:
    """Kill what earlier clusters left behind when their Python owner died (e.g. SIGKILLed test
    runner): every process whose environment names an owner PID that no longer runs."""
    def stale(env: dict[bytes, bytes]) -> bool:
        owner = env.get(OWNER_VAR.encode(), b"")
        return owner.isdigit() and int(owner) != os.getpid() and not Path(f"/proc/{int(owner)}").exists()
    return kill_all(stale)
