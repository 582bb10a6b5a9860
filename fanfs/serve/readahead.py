"""How far the kernel reads ahead in a mount's files, which decides the size of its FUSE read requests.

A sequential read reaches the daemon as readahead requests no larger than the mount's readahead window: the
backing device's ``read_ahead_kb`` (``/sys/class/bdi/MAJOR:MINOR/``), 128 KiB by default, whatever the
request size the connection allows (``max_pages``: 256 pages, 1 MiB, negotiated by libfuse 3.14 on Linux >=
4.20).  So a 30 MB file arrived as 240 requests of 128 KiB, each a round trip and a slice of a 1 MiB chunk.
The window can be raised only by writing that sysfs file (root; the INIT reply can only lower it): the
daemon does so when it may; a plain user's mount keeps the kernel's, which ``fanfs stats`` shows (and ``--debug``'s
log says how an administrator can raise it: docs/clusters.rst, a udev rule for every FUSE mount of a node).
"""

from __future__ import annotations

import logging

from ..util.mounts import mount_device

log = logging.getLogger("fanfs")

READAHEAD = 4 << 20
"""The window asked for by default: four requests of the largest size (1 MiB) in flight per file."""
PREFETCH = 512 << 20
"""Not the kernel's: bytes a mount reads ahead of its readers' known order by default (``--prefetch``;
:mod:`fanfs.cache.pagecache`): a few seconds of a node's reading, a small part of its memory."""


def bdi_path(device: str) -> str:
    return f"/sys/class/bdi/{device}/read_ahead_kb"


def current(mountpoint: str) -> int | None:
    """The readahead window of the mount at ``mountpoint`` in bytes (None: not mounted, or not shown)."""
    device = mount_device(mountpoint)
    try:
        with open(bdi_path(device or "none")) as f:
            return int(f.read()) << 10
    except (OSError, ValueError):
        return None


def raise_to(mountpoint: str, wanted: int) -> int | None:
    """Make the mount's readahead window at least ``wanted`` bytes if this process may; returns the window in force."""
    device = mount_device(mountpoint)
    if device is None:
        return None
    now = current(mountpoint)
    if now is None or now >= wanted:
        return now
    path = bdi_path(device)
    try:
        with open(path, "w") as f:
            f.write(f"{wanted >> 10}\n")
    except OSError as err:  # a plain user's mount, on every node of every job: not a line in each log
        log.debug("readahead of %s stays %d KiB (%s): large files are read in requests of that size; an administrator "
                  "can raise it with: echo %d > %s", mountpoint, now >> 10, err.strerror, wanted >> 10, path)
        return now
    return current(mountpoint)
