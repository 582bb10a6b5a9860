"""Faults a test injects into the fanfs processes it starts, as wrappers of fanfs's own functions (sitecustomize.py
evaluates a test's expressions with this module as ``faults``), so that no production module holds a hook for them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any


def half_written(pwrite: Callable[[int, Any, int], int], seconds: float, name: str = "cache.data") -> Callable:
    """``os.pwrite``, but a write of more than a byte into a file called ``name`` (the lazy cache's data: a blob's
    copy) writes half of it, waits ``seconds`` (a daemon killed meanwhile leaves a copy cut short), then the whole."""

    def write(fd: int, data: Any, offset: int) -> int:
        if len(data) > 1 and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == name:
            pwrite(fd, data[:len(data) // 2], offset)
            time.sleep(seconds)
        return pwrite(fd, data, offset)
    return write


def pausing(function: Callable, seconds: float) -> Callable:
    """``function``, then a pause of ``seconds`` after each call (a slow kernel's answer to it)."""

    def paused(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            time.sleep(seconds)
    return paused


def coarse_change_times(fstat: Callable[..., os.stat_result], tick: float = 3600.0) -> Callable[..., os.stat_result]:
    """``os.fstat`` as on a kernel whose change times tick coarsely (before Linux 6.13's fine-grained ones, a file's
    change time moves once per timer tick): every change within one ``tick`` of seconds (an hour: any test's) leaves
    the change time as it was, so a file cut and made whole again within it seems unchanged but for its size."""
    step = int(tick * 1e9)

    def stat(*args: Any, **kwargs: Any) -> os.stat_result:
        st = fstat(*args, **kwargs)
        ctime = st.st_ctime_ns - st.st_ctime_ns % step
        fields = list(st[:os.stat_result.n_sequence_fields])
        fields[9] = ctime // 10**9  # the sequence's st_ctime
        extra = {name: getattr(st, name) for name in dir(st) if name.startswith("st_")}
        extra.update(st_ctime=ctime / 1e9, st_ctime_ns=ctime)
        return os.stat_result(fields, extra)
    return stat
