"""What a process holds (its descriptors) and what MPI may leave behind (segments in /dev/shm)."""

from __future__ import annotations

import os
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


def mpi_segments_since(started: float) -> list[str]:
    """MPICH segments in /dev/shm made since ``started`` (time.time()) that no process holds any more:
    what a job left behind.  (Another user's job leaking at the same moment would count too.)"""
    held = {target for pid in filter(str.isdigit, os.listdir("/proc")) for target in fd_targets(int(pid)).values()}
    left = []
    for path in Path("/dev/shm").glob("mpich_shm_*"):
        try:
            st = path.stat()
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) >= started - 1 and str(path) not in held:
            left.append(path.name)
    return left
