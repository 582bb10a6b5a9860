"""Process settings for a long-running server (a mount's daemon, a job node's peer server).

Defaults of the C library are tuned for short interactive programs; a server that holds connections
and moves megabyte buffers all day pays for them:

* the soft limit on open descriptors (often 1,024) is raised to the hard limit, so peers' connections
  and the store's shards never starve each other;
* glibc serves every allocation above 128 KiB with a fresh ``mmap`` and gives it back on free, so each
  1 MiB blob decoded, received or decrypted costs 256 page faults (measured here: a 1 MiB sealed peer
  reply cost its reader 2.5 ms of CPU with the defaults, 0.75 ms with large buffers kept in the heap).
  Keeping buffers up to ``LARGE_BUFFER`` in the heap makes them reusable; the heap then stays at its
  high-water mark, which a server's steady load reaches anyway.
"""

from __future__ import annotations

import ctypes
import os
import resource

LARGE_BUFFER = 64 << 20  # allocations up to this stay in the heap (above it: mmap, as usual)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open descriptors to its hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # beyond the kernel's nr_open: keep what we have
        return soft
    return target


def keep_large_buffers() -> bool:
    """Have glibc keep buffers up to LARGE_BUFFER in the heap; False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER)) and bool(mallopt(_M_TRIM_THRESHOLD, 4 * LARGE_BUFFER))


def default_workers() -> int:
    """Serving processes for a mount (``--workers``): a quarter of the cores this process may run on, 1 to 8
    (the rest is the training job's: its loader's workers decode what the mount serves)."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 4))


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere): a daemon forked
    after its parent validated an index would otherwise keep that pass's freed temporaries (~100 MiB at 1.28 M
    files) for its whole life."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def configure_server() -> None:
    """Both of the above, once, at a server process's start."""
    raise_descriptor_limit()
    keep_large_buffers()
