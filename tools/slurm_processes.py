"""Finding and killing a one-host Slurm's processes (tools/slurm_cluster.py): every daemon, slurmstepd and job task
of a cluster carries its ``SLURM_CONF`` and its owner's pid in its environment, even one that escaped its step or
outlived the process that started the cluster.

An environment is no proof: any user may start a process with any environment, a setuid program's included.  So a
process is a cluster's only if it also runs in this pid namespace under a real uid the cluster runs things as: its
daemons' (the caller's) or, as the node prolog recorded them, its jobs' users'.  Other users' environments are not
even read.  Linux only (/proc).  Stdlib only."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path

from slurm_config import CONF, CONF_VAR, JOB_UIDS, OWNER_VAR

Match = Callable[[dict[bytes, bytes]], bool]


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
    except OSError:                          # gone, a zombie, or not ours to read
        return {}


def real_uid(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
    except (OSError, StopIteration, ValueError):
        return None


def _pid_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def find_processes(match: Match, uids: Collection[int]) -> list[int]:
    """PIDs of other processes of this pid namespace, of one of ``uids`` (the real uid), whose environment satisfies
    ``match(environ_dict)``."""
    own = _pid_namespace("self")
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        uid = real_uid(entry.name)                    # None: gone meanwhile
        if uid is not None and uid in uids and _pid_namespace(entry.name) == own and match(_environ(int(entry.name))):
            pids.append(int(entry.name))
    return pids


def kill_all(match: Match, uids: Collection[int], grace: float = 2.0) -> list[int]:
    """SIGTERM every matching process, then SIGKILL what is left after ``grace`` s; returns PIDs."""
    victims = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = find_processes(match, uids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        victims += pids
        deadline = time.monotonic() + grace
        while pids and find_processes(match, uids) and time.monotonic() < deadline:
            time.sleep(0.1)
    return sorted(set(victims))


def of_cluster(conf: Path, owner: int) -> Match:
    """A cluster's own processes: its ``SLURM_CONF`` and its owner's pid.  ``SLURM_CONF`` alone is no mark: a
    user's shell exports it (``eval "$(tools/slurm-local start)"``), and so does all that shell starts since."""
    conf_value, owner_value = os.fsencode(conf), str(owner).encode()
    return lambda env: env.get(CONF_VAR.encode()) == conf_value and env.get(OWNER_VAR.encode()) == owner_value


def cluster_uids(base: Path) -> set[int]:
    """The real uids a cluster's processes run as: its daemons' (this process's) and its jobs' users'."""
    try:
        recorded = (base / JOB_UIDS).read_text().split()
    except OSError:
        recorded = []
    return {os.getuid(), *(int(uid) for uid in recorded if uid.isdigit())}


def kill_cluster(base: Path, owner: int) -> list[int]:
    """End what is left of the cluster in ``base`` that ``owner`` ran: stray slurmstepd and job tasks, and the
    daemons of an owner that was killed."""
    return kill_all(of_cluster(base / CONF, owner), cluster_uids(base))


def kill_stale_clusters() -> list[int]:
    """Kill what this user's earlier clusters left behind when their Python owner died (e.g. a SIGKILLed test
    runner): this user's processes whose environment names an owner pid that no longer runs.  Never another
    user's: what their earlier clusters left is theirs, and a mark in an environment is anyone's to forge."""
    def stale(env: dict[bytes, bytes]) -> bool:
        owner = env.get(OWNER_VAR.encode(), b"")
        return owner.isdigit() and int(owner) != os.getpid() and not Path(f"/proc/{int(owner)}").exists()
    return kill_all(stale, {os.getuid()})
