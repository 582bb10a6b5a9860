"""Set up a fault for the fanfs processes a test starts (see inject/sitecustomize.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "inject"


def inject(monkeypatch: pytest.MonkeyPatch, *items: str) -> dict[str, str]:
    """Make every fanfs process started from now on (this test's environment) run with ``items``
    (``module:NAME=EXPRESSION``); returns that environment, for a process given one of its own."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{path}" if path else str(HERE))
    monkeypatch.setenv("FANFS_TEST_INJECT", ";".join(items))
    return dict(os.environ)
