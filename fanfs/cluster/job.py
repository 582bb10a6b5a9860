"""One node of a Slurm job: its own directories, its mount for the job's lifetime, and its cleanup.

Everything a job keeps on a node lives in one directory of its own under ``$FANFS_LOCAL`` (default
``$TMPDIR``, else ``/tmp``), ``fanfs-JOBID-NODE-`` plus random letters, made 0700 by the node's serving
task: the staged shards in ``shards/``, the runtime directory ``run/`` and, unless ``$FANFS_MNT`` names
another place, the mount point ``mnt/`` (with ``FANFS_MOUNT=0``, where FUSE is not allowed, nothing is
mounted there: it is the node directory where the node publishes its view for the tasks' in-process
readers, :mod:`.nodeview`).  The node name is in the path, so several Slurm nodes sharing
one host (a test cluster, oversubscribed nodes) never collide; the random part means another user can
neither make it first (refusing the job) nor guess it.  ``exec`` (every task of the training step)
finds it as the newest directory of that name owned by this user and writable by nobody else, which
another user cannot make, whose mount serves.

A cancelled or timed-out job can start no cleanup step, so the node's serving task removes what the
job put there itself as it ends, however it is told to (job end, ``scancel``, time limit: SIGTERM).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import FanfsError, UsageError
from ..records import Auto
from ..serve.daemon import MountOptions
from ..util.mounts import mounted, unmount
from ..util.runtime import RUNTIME_VARIABLE, UnsafeDirError, private_dir
from .node import mount_node
from .nodeview import serving
from .serving import NodeOptions

log = logging.getLogger("fanfs")

MNT_VARIABLE = "FANFS_MNT"
LOCAL_VARIABLE = "FANFS_LOCAL"


class JobEnded(FanfsError):
    """The node's task was told to stop (SIGTERM, SIGHUP, SIGUSR2) before its mount served."""


@dataclass
class NodeDirs:
    """Where one node of a job keeps its shards and its mount, and which of them the job made."""

    node: str
    prefix: str  # BASE/fanfs-JOBID-NODE-: the job's directory on this node is this plus random letters
    given_mountpoint: str | None  # $FANFS_MNT for this node, if set
    root: str = ""  # the job's own directory on this node (make_root, find): removed with all it holds
    made: list[str] = field(default_factory=list)  # what make_root() and create() made
    failure: FanfsError | None = None  # why make_root() could not: create() raises it, for the job to agree on

    @property
    def mountpoint(self) -> str:
        return self.given_mountpoint or os.path.join(self.root or self.prefix + "unmade", "mnt")

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
        given = os.environ.get(MNT_VARIABLE, "").replace("{node}", node)
        return cls(node, os.path.join(os.path.abspath(base), f"fanfs-{job}-{node}-"),
                   os.path.abspath(given) if given else None)

    def make_root(self) -> None:
        """Make the job's directory on this node, 0700 under a name nobody can guess: another user can
        neither create it first (and so refuse the job) nor plant anything in it."""
        parent = os.path.dirname(self.prefix)
        try:
            self.root = tempfile.mkdtemp(prefix=os.path.basename(self.prefix), dir=parent)
        except OSError as err:
            self.failure = FanfsError(f"cannot create the job's directory in {parent} on node {self.node}: "
                                      f"{err.strerror}: set {LOCAL_VARIABLE} to a node-local directory "
                                      "(e.g. /tmp or /dev/shm)")
            return
        self.made.append(self.root)

    @classmethod
    def find(cls) -> "NodeDirs":
        """The directory ``make_root`` made for this job on this node (for ``fanfs job exec``): among this
        user's private directories named after the job and the node, the newest whose mount (or node
        serving without one) serves."""
        dirs = cls.from_environment()
        parent, stem = os.path.split(dirs.prefix)
        found = []
        for name in os.listdir(parent) if os.path.isdir(parent) else ():
            path = os.path.join(parent, name)
            try:
                if name.startswith(stem):
                    found.append((os.lstat(private_dir(path, "job directory", "", create=False)).st_ctime, path))
            except (UnsafeDirError, OSError):  # another user's, or gone: never this job's
                continue
        for _, root in sorted(found, reverse=True):
            dirs.root = root
            if mounted(dirs.mountpoint) or serving(dirs.mountpoint):
                return dirs
        raise FanfsError(f"no fanfs node of job {os.environ['SLURM_JOB_ID']} serves on node {dirs.node} "
                         f"(looked for {dirs.prefix}*): start the job with 'fanfs job run' (slurm/train.sbatch)")

    def create(self) -> None:
        """Make the job's shards and runtime directories and, unless it exists, the mount point."""
        if self.failure is not None:
            raise self.failure
        for path in (self.shards, self.runtime):
            os.mkdir(path, 0o700)  # inside the job's private directory: nobody else can have made them
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
            unmount(self.mountpoint, lazy=True)
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


def serve_node(store_root: str, mount: MountOptions, *, replicas: int, auto: dict[str, Auto],
               mount_fuse: bool = True, stage: str = "full", capacity: int | None = None,
               shared: str | None = None) -> int:
    """This node's part of the job (one task per node, all at once under srun): stage its shards (``stage``
    "lazy": as it reads, within ``capacity``; "shared": lease the node's shared copy in ``shared``, ``{node}`` for the
    node's name), mount (unless not ``mount_fuse``: then the mount point is the node directory of in-process readers),
    serve until the job ends, then remove everything the job put on the node (a shared copy: if no other job reads it,
    :mod:`fanfs.cache.sharedcopy`)."""
    dirs = NodeDirs.from_environment()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):  # a stop before the daemon serves still cleans up
        signal.signal(sig, _stop)
    dirs.make_root()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a time limit's warning (--signal=USR1@...) is for training
    os.environ[RUNTIME_VARIABLE] = dirs.runtime
    try:
        options = NodeOptions(replace(mount, foreground=True), dirs.shards, replicas=replicas, stage=stage,
                              capacity=capacity, auto=auto, job_node=dirs.node, serve_only=not mount_fuse,
                              shared=shared and shared.replace("{node}", dirs.node))
        return mount_node(store_root, dirs.mountpoint, options, prepare=dirs.create)
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2):  # the cleanup itself is not cut short
            signal.signal(sig, signal.SIG_IGN)
        dirs.remove()


_MNT_REFERENCE = re.compile(r"\$(?:\{" + MNT_VARIABLE + r"\}|" + MNT_VARIABLE + r"(?![A-Za-z0-9_]))")


def expand_mountpoint(argument: str, mountpoint: str) -> str:
    """``argument`` with every whole reference to ``$FANFS_MNT`` (``$FANFS_MNT``, ``${FANFS_MNT}``) replaced by
    the mount point, and nothing else: ``$FANFS_MNT_X`` or ``$FANFS_MNTX`` are other variables."""
    return _MNT_REFERENCE.sub(lambda m: mountpoint, argument)


def exec_on_node(command: Sequence[str]) -> None:
    """Replace this process by one task of the training command, with this node's mount in ``$FANFS_MNT``.

    Whole references ``$FANFS_MNT`` and ``${FANFS_MNT}`` in the arguments are replaced by the path (they are
    written in quotes at submission, when no node is known), wherever they stand, also inside an ``sh -c``
    script; the arguments are otherwise passed as given, and the command's environment has ``$FANFS_MNT``.
    """
    if not command:
        raise UsageError("no command to run")
    dirs = NodeDirs.find()
    args = [expand_mountpoint(a, dirs.mountpoint) for a in command]
    env = {**os.environ, MNT_VARIABLE: dirs.mountpoint, RUNTIME_VARIABLE: dirs.runtime}  # 'fanfs stats' works there
    try:
        os.execvpe(args[0], args, env)
    except OSError as err:
        raise FanfsError(f"cannot run {args[0]} on node {dirs.node}: {err.strerror}") from None
