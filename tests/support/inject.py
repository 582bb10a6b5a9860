"""Set up a fault for the fanfs processes a test starts (see inject/sitecustomize.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "inject"
KERNELS = {"6.5+": (), "4.18-6.4": ("cachestat",), "no mincore": ("cachestat", "mincore")}
"""Kernels fanfs supports, by the calls they lack (RHEL 8 is 4.18, RHEL 9 5.14: no cachestat), for :func:`old_kernel`."""


def inject(monkeypatch: pytest.MonkeyPatch, *items: str) -> dict[str, str]:
    """Make every fanfs process started from now on (this test's environment) run with ``items``
    (``module:NAME=EXPRESSION``); returns that environment, for a process given one of its own."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{path}" if path else str(HERE))
    monkeypatch.setenv("FANFS_TEST_INJECT", ";".join(items))
    return dict(os.environ)


def kernels(*slow: str) -> list:
    """KERNELS as parameters of a test that mounts: an older one is emulated by a seccomp filter, which a plain user's
    process installs only with ``no_new_privs``, under which fusermount3 cannot mount (so marked ``root``); those named
    in ``slow`` are marked slow too."""
    return [pytest.param(name, marks=[*([pytest.mark.root("to emulate an older kernel under a mount")] if calls else []),
                                      *([pytest.mark.slow] if name in slow else [])]) for name, calls in KERNELS.items()]


def old_kernel(monkeypatch: pytest.MonkeyPatch, *calls: str) -> dict[str, str]:
    """Make every fanfs process started from now on run as on a kernel without ``calls`` (names, e.g. "cachestat"):
    they fail with ENOSYS (inject/enosys.py); returns that environment."""
    path = os.environ.get("PYTHONPATH", "")
    if str(HERE) not in path.split(os.pathsep):
        monkeypatch.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{path}" if path else str(HERE))
    monkeypatch.setenv("FANFS_TEST_ENOSYS", ",".join(calls))
    return dict(os.environ)
