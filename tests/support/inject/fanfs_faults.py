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
