"""The kernel's mount table, and unmounting: one way for the daemon, a job's nodes, the tests and the benchmarks.

A FUSE mount is unmounted by its user with ``fusermount3 -u`` (setuid: no root needed; ``-z`` detaches it
lazily, while files are still open or its daemon is dead); without fusermount, ``umount`` (``-l``: lazily).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess


_ESCAPED = re.compile(rb"\\([0-7]{3})")  # mountinfo writes space, tab, newline, backslash as \ooo


def mounted(path: str | os.PathLike) -> bool:
    """Whether something is mounted at ``path``, read from /proc/self/mountinfo: also a FUSE mount whose
    daemon was killed, which answers ENOTCONN to the lstat that os.path.ismount relies on."""
    return _device_at(os.fsencode(os.path.realpath(path))) is not None


def mount_device(mountpoint: str) -> str | None:
    """The device (``MAJOR:MINOR``) of the mount on top at ``mountpoint``, from /proc/self/mountinfo; None if
    nothing is mounted there.  The mount point itself is never looked at (only its parent is resolved): a FUSE
    daemon asks this of its own mount while it answers INIT, when a look would wait on itself."""
    parent, name = os.path.split(os.path.abspath(mountpoint))
    return _device_at(os.fsencode(os.path.join(os.path.realpath(parent), name)))


def _device_at(target: bytes) -> str | None:
    device = None
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            if _unescape(fields[4]) == target:
                device = fields[2].decode()  # the last line for a path is the mount on top
    return device


def fanfs_mounts_of(store: str | os.PathLike) -> list[str]:
    """The mount points of fanfs mounts that serve the store at ``store`` (a fanfs mount's source is ``fanfs:`` and the
    store's absolute path, as its daemon was given it), from /proc/self/mountinfo.  Compared as text, with the store's
    absolute and real paths: resolving every mount's path could wait for ever on a stalled network file system."""
    found = []
    want = {b"fanfs:" + os.fsencode(path) for path in (os.path.abspath(store), os.path.realpath(store))}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            if _unescape(fields[fields.index(b"-") + 2]) in want:
                found.append(os.fsdecode(_unescape(fields[4])))
    return found


def fanfs_mounts() -> list[str]:
    """The mount points of every fanfs mount this process sees (any user's: the caller asks each whose it is), from
    /proc/self/mountinfo, never looked at themselves."""
    found = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            if fields[fields.index(b"-") + 1] == b"fuse.fanfs":
                found.append(os.fsdecode(_unescape(fields[4])))
    return found


def _unescape(field: bytes) -> bytes:
    return _ESCAPED.sub(lambda m: bytes([int(m.group(1), 8)]), field)


def unmount(mountpoint: str | os.PathLike, lazy: bool = False) -> subprocess.CompletedProcess:
    """Unmount (``lazy``: detach at once, even if busy or its daemon is dead); the tool's completed process,
    whose failure is the caller's to judge (text output)."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    flag = "-z" if tool else "-l"
    command = [tool or "umount", *(["-u"] if tool else []), *([flag] if lazy else []), os.fspath(mountpoint)]
    return subprocess.run(command, capture_output=True, text=True)
