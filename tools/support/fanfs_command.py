"""The ``fanfs`` command run as a user runs it, and mounts made with it that always go away.

Shared by the tests and the benchmarks (tools/ imports only fanfs and its own modules; tests may
import tools/).  Importing this module makes this checkout's fanfs the one every ``fanfs`` command
started from here runs (``PYTHONPATH``), whatever the virtualenv has installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FANFS = [sys.executable, "-m", "fanfs"]

if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(REPO):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def fanfs(*args: str | os.PathLike, check: bool = True, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m fanfs ARGS`` as a user would; returns the completed process."""
    done = subprocess.run([*FANFS, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"fanfs {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def set_presentation(mountpoint: str | os.PathLike, name: str, text: str) -> None:
    """What ``fanfs ctl MOUNTPOINT --NAME TEXT`` sends the mount, without a process for every switch of a loop."""
    from fanfs.records import setting
    from fanfs.serve.control import presenter
    presenter(os.fspath(mountpoint), name)(setting(name).parse(text))


def mount_stats(mountpoint: str | os.PathLike) -> dict:
    """The counters ``fanfs stats MOUNTPOINT --json`` prints, straight from the mount (settings as codes: 65535
    for full), without a process."""
    from fanfs.serve.control import request
    return request(os.fspath(mountpoint), {"cmd": "stats"})


def stats_command(mountpoint: str | os.PathLike) -> dict:
    """``fanfs stats MOUNTPOINT --json`` run as a user runs it (settings as options write them: "full")."""
    return json.loads(fanfs("stats", mountpoint, "--json").stdout)


def force_unmount(mountpoint: Path) -> None:
    """Last-resort cleanup: a lazy unmount (also of a dead mount), then up to 5 s for it to go."""
    from fanfs.util.mounts import mounted, unmount
    if mounted(mountpoint):
        unmount(mountpoint, lazy=True)
    for _ in range(100):
        if not mounted(mountpoint):
            break
        time.sleep(0.05)


def daemon_pids(mountpoint: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"fanfs mount .* {mountpoint}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@contextlib.contextmanager
def mounted(store: Path, mountpoint: Path, *options: str, env: dict[str, str] | None = None,
            cwd: str | None = None) -> Iterator[Path]:
    """Mount with the real CLI; unmount (and kill a stuck daemon) however the block ends.  ``env`` and ``cwd``:
    the commands' environment and directory (another checkout's fanfs: PYTHONPATH naming it, and a directory
    that holds no other fanfs, as ``python -m`` puts the current directory before PYTHONPATH)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    fanfs("mount", store, mountpoint, *options, env=env, cwd=cwd)
    try:
        yield mountpoint
    finally:
        if os.path.ismount(mountpoint):
            fanfs("umount", mountpoint, check=False, env=env, cwd=cwd)
        force_unmount(mountpoint)
        for pid in daemon_pids(mountpoint):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
