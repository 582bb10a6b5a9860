"""The kernel's mount table, and unmounting: one way for the daemon, a job's nodes, the tests and the benchmarks.

A FUSE mount is unmounted by its user with ``fusermount3 -u`` (setuid: no root needed; ``-z`` detaches it
lazily, while files are still open or its daemon is dead); without fusermount, ``umount`` (``-l``: lazily).

A fanfs mount's source in the table names its store, and the Slurm job it was made in: ``fanfs:STORE``, or
``fanfs@JOBID:STORE`` in a job.  The kernel keeps it for as long as the mount exists, also once its daemon is dead,
and only the mount's user can make a mount of theirs say so: what ``fanfs cleanup`` (a node's epilog) knows a job's
mounts by.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass


_ESCAPED = re.compile(rb"\\([0-7]{3})")  # mountinfo writes space, tab, newline, backslash as \ooo
_SOURCE = re.compile(rb"fanfs(?:@([0-9]+))?:(.*)", re.DOTALL)
JOB_VARIABLE = "SLURM_JOB_ID"


def mounted(path: str | os.PathLike) -> bool:
    """Whether something is mounted at ``path``, read from /proc/self/mountinfo: also a FUSE mount whose
    daemon was killed, which answers ENOTCONN to the lstat that os.path.ismount relies on."""
    return _mount_at(os.fsencode(os.path.realpath(path))) is not None


def mounts_within(directory: str) -> list[str]:
    """The mount points at ``directory`` or under it (as given: not resolved), from /proc/self/mountinfo."""
    inside = os.fsencode(os.path.abspath(directory))
    return [os.fsdecode(point) for fields in _mountinfo() if (point := _unescape(fields[4])) == inside
            or point.startswith(inside + b"/")]


def mount_device(mountpoint: str) -> str | None:
    """The device (``MAJOR:MINOR``) of the mount on top at ``mountpoint``, from /proc/self/mountinfo; None if
    nothing is mounted there.  The mount point itself is never looked at (only its parent is resolved): a FUSE
    daemon asks this of its own mount while it answers INIT, when a look would wait on itself."""
    parent, name = os.path.split(os.path.abspath(mountpoint))
    found = _mount_at(os.fsencode(os.path.join(os.path.realpath(parent), name)))
    return found[2].decode() if found is not None else None


def mount_owner(path: str | os.PathLike) -> int | None:
    """The uid of the user who made the FUSE mount on top at ``path`` (its ``user_id`` option, set by the kernel);
    None if nothing, or no FUSE file system, is mounted there."""
    found = _mount_at(os.fsencode(os.path.realpath(path)))
    return _owner(found) if found is not None else None


def mount_source(store_root: str) -> str:
    """The source a mount of ``store_root`` names in the mount table (libfuse's ``fsname``, its commas escaped):
    ``fanfs:STORE``, or ``fanfs@JOBID:STORE`` when this process runs in a Slurm job (``$SLURM_JOB_ID``)."""
    job = os.environ.get(JOB_VARIABLE, "")
    tag = f"@{job}" if job.isdigit() and job.isascii() else ""
    return f"fanfs{tag}:" + os.path.abspath(store_root).replace("\\", "\\\\").replace(",", "\\,")


@dataclass(frozen=True)
class FanfsMount:
    """A fanfs mount of this host: where, of which store (as its daemon was given it), whose, and of which Slurm job
    (None: made outside any)."""

    mountpoint: str
    store: str
    owner: int | None
    job: str | None = None


def fanfs_mounts() -> list[FanfsMount]:
    """Every fanfs mount this process sees (its source: :func:`mount_source`), whoever made it, from
    /proc/self/mountinfo.  Nothing is resolved or looked at: a stalled network file system cannot hold this up."""
    found = []
    for fields in _mountinfo():
        source = _SOURCE.fullmatch(_unescape(fields[fields.index(b"-") + 2]))
        if source is not None:
            job = source[1].decode() if source[1] is not None else None
            found.append(FanfsMount(os.fsdecode(_unescape(fields[4])), os.fsdecode(source[2]), _owner(fields), job))
    return found


def fanfs_mounts_of(store: str | os.PathLike) -> list[str]:
    """The mount points of fanfs mounts that serve the store at ``store``, compared as text with the store's absolute
    and real paths: resolving every mount's path could wait for ever on a stalled network file system."""
    want = {os.path.abspath(store), os.path.realpath(store)}
    return [m.mountpoint for m in fanfs_mounts() if m.store in want]


def _mountinfo() -> list[list[bytes]]:
    with open("/proc/self/mountinfo", "rb") as f:
        return [line.rstrip(b"\n").split(b" ") for line in f]


def _mount_at(target: bytes) -> list[bytes] | None:
    """The fields of the mount on top at ``target`` (the last line for a path)."""
    found = None
    for fields in _mountinfo():
        if _unescape(fields[4]) == target:
            found = fields
    return found


def _owner(fields: list[bytes]) -> int | None:
    for option in fields[-1].split(b","):
        if option.startswith(b"user_id="):
            return int(option[8:])
    return None


def _unescape(field: bytes) -> bytes:
    return _ESCAPED.sub(lambda m: bytes([int(m.group(1), 8)]), field)


def unmount(mountpoint: str | os.PathLike, lazy: bool = False) -> subprocess.CompletedProcess:
    """Unmount (``lazy``: detach at once, even if busy or its daemon is dead); the tool's completed process,
    whose failure is the caller's to judge (text output)."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    flag = "-z" if tool else "-l"
    command = [tool or "umount", *(["-u"] if tool else []), *([flag] if lazy else []), os.fspath(mountpoint)]
    return subprocess.run(command, capture_output=True, text=True)
