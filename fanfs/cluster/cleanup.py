"""What a Slurm job left on a node, ended and removed: ``fanfs cleanup --job JOBID``, which slurm/epilog.sh runs as
root on every node of a job once it has ended there (and an administrator, or the job's user, may run by hand).

A job cleans up after itself however Slurm ends it (:mod:`.job`), but not when every process of it is killed at once
(the OOM killer, ``KillWait`` running out): its mounts are then left dead and its directory full.  A plain ``fanfs
mount`` in a batch script leaves the job's processes (its daemon is detached), and ``proctrack/linuxproc`` lets it
live on after the job; and a node's wipe of its local storage cannot remove a directory that holds a mount.  So, for
one job and its user, on this node:

* its mounts: the user's fanfs mounts whose source names the job (``fanfs@JOBID:``, see
  :func:`fanfs.util.mounts.mount_source`: the kernel keeps it, also once the daemon is dead) or that lie in a
  directory of the job, are unmounted, lazily (nothing can hold that up);
* its daemons: the user's processes that hold a fanfs mount's lock (every daemon does) and whose environment has the
  job's ``SLURM_JOB_ID``; they end as their mount goes, and SIGTERM, then SIGKILL, ends those that do not;
* its directories, ``fanfs-JOBID-NODE-*`` of the user's under the node-local directories given and wherever a mount or
  a daemon of the job shows one, are removed once nothing is mounted in them; and so are the control sockets and
  locks its daemons left in the user's runtime directories (their logs stay).

Nothing of another job or user is touched: a thing is the job's only if it names the job and is the user's; a
symbolic link is never followed; a job with a step still running on the node is refused.  A second run finds
nothing to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import stat
import time
from dataclasses import dataclass, field

from ..errors import FanfsError
from ..serve.control import runtime_name
from ..util.mounts import FanfsMount, fanfs_mounts, mounts_within, unmount
from ..util.processes import wait_ended

LOCK = re.compile(r"(.*)/([0-9a-f]{16})\.lock( \(deleted\))?")
"""A fanfs mount's lock file as a process's descriptor names it (``/proc/PID/fd``), removed or not."""
ENDING_SECONDS = 10.0
"""How long the daemons have to end once their mounts have gone, and again once sent SIGTERM, then SIGKILL."""


@dataclass
class Job:
    """One job on this node: its id, its user, and its node (None: any node of this host); once cleaned, what was
    ended or removed and what could not be, a line each."""

    job: str
    uid: int
    node: str | None = None
    done: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.job.isascii() and self.job.isdigit()):
            raise FanfsError(f"a job id is a number, not {self.job!r}")

    @property
    def prefix(self) -> str:
        """The start of the names of the job's directories on this node (on any node, when none is named)."""
        return f"fanfs-{self.job}-{self.node}-" if self.node else f"fanfs-{self.job}-"

    def ours(self, node: bytes | None) -> bool:
        """Whether a process of the job that runs on ``node`` (its ``SLURMD_NODENAME``) is of this node."""
        return not (self.node and node and node != os.fsencode(self.node))

    def running_step(self) -> str | None:
        """A step of the job still running on this node: its ``slurmstepd``'s socket (``NODE_JOBID.STEP`` in the node's
        spool directory) in the kernel's list of bound sockets; None if there is none."""
        node = re.escape(self.node) if self.node else r"[^/]+"
        step = re.compile(rf"{node}_{self.job}\.[0-9]+(\.[0-9]+)?")
        with contextlib.suppress(OSError), open("/proc/net/unix", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(None, 7)
                if len(fields) == 8 and step.fullmatch(os.path.basename(fields[7])):
                    return fields[7]
        return None


@dataclass
class Daemon:
    """A fanfs daemon (or one of its serving processes) of the job: the node it serves, the locks it holds."""

    pid: int
    node: bytes | None
    locks: list[str]


def clean(job: Job, bases: list[str]) -> Job:
    """End and remove what ``job`` left on this node (see the module); ``bases``: the node-local directories its
    directories may be in.  ``job.done`` and ``job.problems`` then say how it went."""
    if (step := job.running_step()) is not None:
        raise FanfsError(f"job {job.job} still runs on this node (its step's socket {step}): 'fanfs cleanup' is for a "
                         "job that has ended (slurm/epilog.sh runs it then)")
    every = _daemons(job)
    daemons = [d for d in every if job.ours(d.node)]
    others = {LOCK.fullmatch(lock)[2] for d in every if d not in daemons for lock in d.locks}  # another node's mounts
    mounts = [m for m in _mounts(job) if runtime_name(m.mountpoint, real=True) not in others]
    dirs = _directories(job, bases, [m.mountpoint for m in mounts] + [lock for d in daemons for lock in d.locks])
    for found in mounts:
        _unmount(job, found.mountpoint)
    _end(job, [d.pid for d in daemons])
    for found in _mounts(job):
        if found in mounts:  # a daemon ended meanwhile by a signal left its mount (dead)
            _unmount(job, found.mountpoint)
    _forget(job, bases, mounts, daemons)
    for path in dirs:
        _remove(job, path)
    return job


def _daemons(job: Job) -> list[Daemon]:
    """The job's fanfs daemons on this host, and their serving processes: the user's processes that hold a fanfs
    mount's lock open and have the job's ``SLURM_JOB_ID`` in their environment."""
    found = []
    for pid in _processes(job.uid):
        if pid != os.getpid() and (locks := _locks(pid)):
            env = _environ(pid)
            if env.get(b"SLURM_JOB_ID") == job.job.encode():
                found.append(Daemon(pid, env.get(b"SLURMD_NODENAME"), locks))
    return found


def _processes(uid: int) -> list[int]:
    """The processes of this pid namespace whose real uid is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, StopIteration, ValueError), open(f"/proc/{name}/status", "rb") as f:
                if int(next(line for line in f if line.startswith(b"Uid:")).split()[1]) == uid:
                    found.append(int(name))
    return found


def _environ(pid: int) -> dict[bytes, bytes]:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
    return {}


def _locks(pid: int) -> list[str]:
    """The fanfs mount locks process ``pid`` holds open, as its descriptors name them."""
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if LOCK.fullmatch(target := os.readlink(f"/proc/{pid}/fd/{fd}")):
                    found.append(target)
    return found


def _job_dir_of(path: str, prefix: str) -> str | None:
    """The directory named ``prefix``... that ``path`` lies in (or is), if any."""
    parts = os.path.abspath(path).split(os.sep)
    return next((os.sep.join(parts[:i + 1]) for i, part in enumerate(parts) if part.startswith(prefix)), None)


def _mounts(job: Job) -> list[FanfsMount]:
    """The job's fanfs mounts on this node: the user's that name the job or lie in a directory of the job's on this
    node; not those in another node's (nodes sharing a host)."""
    found = []
    for mount in fanfs_mounts():
        here = _job_dir_of(mount.mountpoint, job.prefix) is not None
        elsewhere = not here and _job_dir_of(mount.mountpoint, f"fanfs-{job.job}-") is not None
        if mount.owner == job.uid and (mount.job == job.job or here) and not elsewhere:
            found.append(mount)
    return found


def _directories(job: Job, bases: list[str], shown: list[str]) -> list[str]:
    """The user's own directories of the job on this node: under ``bases``, and those the ``shown`` paths (its mount
    points, its daemons' locks) lie in.  Real directories only: never a symbolic link, nor another user's."""
    found = {os.path.join(base, name) for base in bases for name in _listed(base) if name.startswith(job.prefix)}
    found.update(d for path in shown if (d := _job_dir_of(path.removesuffix(" (deleted)"), job.prefix)) is not None)
    mine = []
    for path in sorted(found):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == job.uid:
                mine.append(path)
    return mine


def _listed(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:  # missing, or not a directory: nothing of the job's there
        return []


def _unmount(job: Job, mountpoint: str) -> None:
    """Detach a mount of the job's (as the mount table names it: never looked at, a hung mount would not answer)."""
    if not _mounted(mountpoint):
        return
    done = unmount(mountpoint, lazy=True)
    if not _mounted(mountpoint):
        job.done.append(f"unmounted {mountpoint}")
        return
    reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"{done.args[0]} failed"
    job.problems.append(f"cannot unmount {mountpoint}: {reason}")


def _mounted(mountpoint: str) -> bool:
    return mountpoint in mounts_within(mountpoint)


def _end(job: Job, pids: list[int]) -> None:
    """Let the daemons end (their mounts have gone); SIGTERM, then SIGKILL, those that do not."""
    left = pids
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        waited, deadline = left, time.monotonic() + ENDING_SECONDS
        while (left := [pid for pid in left if not wait_ended(pid, 0)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        how = f" ({signal.Signals(sig).name})" if sig is not None else ""
        job.done += [f"ended daemon pid {pid}{how}" for pid in waited if pid not in left]
        if not left:
            return
    job.problems += [f"daemon pid {pid} did not end even when killed: it waits in the kernel on a file system that "
                     "does not answer (its store's?)" for pid in left]


def _runtime_dirs(job: Job, bases: list[str], daemons: list[Daemon]) -> set[str]:
    """Where the job's daemons may have kept their sockets and locks: beside the locks they held, and the user's
    runtime directories (``fanfs-UID`` and ``fanfs-UID.N`` in the node-local directories, ``/run/user/UID/fanfs``)."""
    found = {LOCK.fullmatch(lock)[1] for d in daemons for lock in d.locks if not lock.endswith(" (deleted)")}
    name = re.compile(rf"fanfs-{job.uid}(\.[1-9][0-9]*)?")
    found.update(os.path.join(base, entry) for base in bases for entry in _listed(base) if name.fullmatch(entry))
    found.add(f"/run/user/{job.uid}/fanfs")
    return found


def _forget(job: Job, bases: list[str], mounts: list[FanfsMount], daemons: list[Daemon]) -> None:
    """Remove the control sockets and locks of the ended mounts and daemons from the user's runtime directories: in a
    directory of the user's own that others cannot write, where no daemon holds the lock (a new mount at the same
    place since)."""
    stems = {runtime_name(m.mountpoint, real=True) for m in mounts}
    stems.update(LOCK.fullmatch(lock)[2] for d in daemons for lock in d.locks)
    for directory in sorted(_runtime_dirs(job, bases, daemons)):
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            for stem in sorted(stems) if st.st_uid == job.uid and not st.st_mode & 0o022 else ():
                if _unlocked(fd, stem + ".lock"):
                    for name in (stem + ".sock", stem + ".lock"):
                        _unlink(job, fd, directory, name)
        finally:
            os.close(fd)


def _unlocked(directory: int, name: str) -> bool:
    """Whether the lock ``name`` in ``directory`` is missing or held by no process (a flock of it succeeds)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _unlink(job: Job, directory: int, path: str, name: str) -> None:
    """Remove the user's socket or file ``name`` from ``directory`` (never what a symbolic link names)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(name, dir_fd=directory)
        if st.st_uid == job.uid and (stat.S_ISSOCK(st.st_mode) or stat.S_ISREG(st.st_mode)):
            os.unlink(name, dir_fd=directory)
            job.done.append(f"removed {os.path.join(path, name)}")


def _remove(job: Job, path: str) -> None:
    """Remove a directory of the job with all it holds, unless something is still mounted in it."""
    if inside := mounts_within(path):
        job.problems.append(f"{path} not removed: {inside[0]} is still mounted in it")
        return
    failures = []

    def failed(func: object, failed_path: str, info: tuple) -> None:
        if not isinstance(info[1], FileNotFoundError):  # gone already is what we wanted
            failures.append(f"cannot remove {failed_path}: {getattr(info[1], 'strerror', None) or info[1]}")

    shutil.rmtree(path, onerror=failed)  # removes a symbolic link inside, never what it names
    if failures:
        job.problems.append(failures[0])
    elif not os.path.lexists(path):
        job.done.append(f"removed {path}")
