"""The main job on the built-in sample, exactly as README's first command runs it."""

from __future__ import annotations

import os

import pytest
from fanfs_command import fanfs


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    done = fanfs("demo", "--workdir", tmp_path / "demo", timeout=600)
    assert "all exact" in done.stdout and ", 0 mismatches" in done.stdout
    assert "$ fanfs pack" in done.stdout and "$ fanfs umount" in done.stdout
    assert not os.path.ismount(tmp_path / "demo" / "mnt")


def test_help_explains_every_command():
    top = fanfs("--help").stdout
    for command in ("pack", "mount", "umount", "verify", "info", "fidelity", "ctl", "stats", "demo"):
        assert command in top
        assert fanfs(command, "--help").stdout.startswith("usage: fanfs " + command)
