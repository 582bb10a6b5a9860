"""One node of a Slurm job: its own directories, its mount for the job's lifetime, and its cleanup.

Everything a job keeps on a node lives in one directory of its own, ``fanfs-JOBID-NODE`` under
``$FANFS_LOCAL`` (default ``$TMPDIR``, else ``/tmp``): the staged shards in ``shards/`` and, unless
``$FANFS_MNT`` names another place, the mount point ``mnt/``.  The node name is in the path, so
several Slurm nodes sharing one host (a test cluster, oversubscribed nodes) never collide, and every
process of the job derives the same paths from its environment alone: ``serve`` (one task per node,
the step that stages and mounts) and ``exec`` (every task of the training step) agree without talking.

A cancelled or timed-out job can start no cleanup step, so the node's serving task removes what the
job put there itself as it ends, however it is told to (job end, ``scancel``, time limit: SIGTERM).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import FanfsError, UsageError
from ..serve.daemon import MountOptions, detach, mounted
from ..util.runtime import RUNTIME_VARIABLE
from .node import mount_node

log = logging.getLogger("fanfs")

MNT_VARIABLE = "FANFS_MNT"
LOCAL_VARIABLE = "FANFS_LOCAL"


class JobEnded(FanfsError):
    """The node's task was told to stop (SIGTERM, SIGHUP, SIGUSR2) before its mount served."""


@dataclass
class NodeDirs:
    """Where one node of a job keeps its shards and its mount, and which of them the job made."""

    node: str
    root: str        # the job's own directory on this node: removed with all it holds at the end
    mountpoint: str
    made: list[str] = field(default_factory=list)  # what create() made (or found to be this job's own)

    @property
    def shards(self) -> str:
        return os.path.join(self.root, "shards")

    @property
    def runtime(self) -> str:
        """The job's fanfs runtime directory on this node (control sockets; see fanfs.util.runtime)."""
        return os.path.join(self.root, "run")

    @classmethod
    def from_environment(cls) -> "NodeDirs":
        job, node = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURMD_NODENAME", "")
        if not job or not node:
            raise UsageError("'fanfs job' runs inside a Slurm job: sbatch slurm/train.sbatch STORE COMMAND...")
        base = os.environ.get(LOCAL_VARIABLE) or os.environ.get("TMPDIR") or "/tmp"
        root = os.path.join(os.path.abspath(base), f"fanfs-{job}-{node}")
        mountpoint = os.environ.get(MNT_VARIABLE, "").replace("{node}", node) or os.path.join(root, "mnt")
        return cls(node, root, os.path.abspath(mountpoint))

    def create(self) -> None:
        """Make the job's directory (its shards, runtime directory and, unless it exists, the mount point)."""
        parent = os.path.dirname(self.root)
        if not os.path.isdir(parent):
            raise FanfsError(f"{parent} does not exist on node {self.node}: set {LOCAL_VARIABLE} to a node-local "
                             "directory (e.g. /tmp or /dev/shm)")
        for path in (self.root, self.shards, self.runtime):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:  # a requeued job (the same id): its own leftovers, if they are this user's
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                    raise FanfsError(f"{path} exists and is not this user's directory: remove it") from None
            self.made.append(path)
        if not os.path.isdir(self.mountpoint):
            try:
                os.mkdir(self.mountpoint, 0o700)
            except OSError as err:
                raise FanfsError(f"cannot create the mount point {self.mountpoint} on node {self.node}: "
                                 f"{err.strerror}") from None
            self.made.append(self.mountpoint)

    def remove(self) -> None:
        """Remove what create() made; never follows into a mount that would not go away."""
        if mounted(self.mountpoint):  # also a dead one, whose daemon was killed
            detach(self.mountpoint)
        still = mounted(self.mountpoint)
        if still:
            log.warning("%s is still mounted: left in place", self.mountpoint)
        elif self.mountpoint in self.made and not self.mountpoint.startswith(self.root + os.sep):
            try:
                os.rmdir(self.mountpoint)
            except OSError as err:
                _cannot_remove(os.rmdir, self.mountpoint, (type(err), err, None))
        if self.root in self.made:
            inside = self.mountpoint.startswith(self.root + os.sep)
            shutil.rmtree(self.shards if still and inside else self.root, onerror=_cannot_remove)


def _cannot_remove(func: object, path: str, info: tuple) -> None:
    if not isinstance(info[1], FileNotFoundError):  # gone already is what we wanted
        log.warning("cannot remove %s: %s", path, getattr(info[1], "strerror", None) or info[1])


def _stop(signum: int, frame: object) -> None:
    raise JobEnded(f"stopped by {signal.Signals(signum).name} before the mount served")


def serve_node(store_root: str, options: MountOptions) -> int:
    """This node's part of the job (one task per node, all at once under srun): stage its shards,
    mount, serve until the job ends, then remove everything the job put on the node."""
    dirs = NodeDirs.from_environment()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):  # a stop before the daemon serves still cleans up
        signal.signal(sig, _stop)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a time limit's warning (--signal=USR1@...) is for training
    os.environ[RUNTIME_VARIABLE] = dirs.runtime
    try:
        return mount_node(store_root, dirs.mountpoint, _for_node(options, dirs), prepare=dirs.create)
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):  # the cleanup itself is not cut short
            signal.signal(sig, signal.SIG_IGN)
        dirs.remove()


def _for_node(options: MountOptions, dirs: NodeDirs) -> MountOptions:
    return replace(options, local_dir=dirs.shards, stage=True, foreground=True, job_node=dirs.node)


def exec_on_node(command: Sequence[str]) -> None:
    """Replace this process by one task of the training command, with this node's mount in ``$FANFS_MNT``.

    ``$FANFS_MNT`` and ``${FANFS_MNT}`` in the arguments are replaced by the path (they are written in
    quotes at submission, when no node is known); the arguments are otherwise passed as given.
    """
    if not command:
        raise UsageError("no command to run")
    dirs = NodeDirs.from_environment()
    if not os.path.ismount(dirs.mountpoint):
        raise FanfsError(f"no fanfs mount at {dirs.mountpoint} on node {dirs.node}: start the job with "
                         "'fanfs job run' (slurm/train.sbatch)")
    args = [a.replace("${" + MNT_VARIABLE + "}", dirs.mountpoint).replace("$" + MNT_VARIABLE, dirs.mountpoint)
            for a in command]
    env = {**os.environ, MNT_VARIABLE: dirs.mountpoint, RUNTIME_VARIABLE: dirs.runtime}  # 'fanfs stats' works there
    try:
        os.execvpe(args[0], args, env)
    except OSError as err:
        raise FanfsError(f"cannot run {args[0]} on node {dirs.node}: {err.strerror}") from None
