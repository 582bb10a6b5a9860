"""``fanfs run -- COMMAND...``: run a command whose Python processes read fanfs mounts' files in their own process.

FUSE hands every file's lookup and read from the reader through the kernel to the daemon and back; a reader that
opens the mount's store itself reads the same bytes without them (on a disk, cold: 1.1-1.5x the native tree, where the
mount gives 0.4-0.5x).  ``fanfs run`` keeps the mount for everything and answers the hot reads in the reader: every
Python process the command starts (DataLoader workers forked or spawned, scripts it runs) opens files of the mounts in
its own process (:mod:`fanfs.inproc`), as the mount presents them at that moment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

from ..errors import FanfsError, UsageError
from ..inproc.hook import MOUNTS_VARIABLE
from ..serve.control import ControlError, request
from ..util.mounts import fanfs_mounts, mounted
from ..util.units import counted, human_size

Command = Callable[[argparse.Namespace], int]
STARTUP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inproc", "startup")
"""The directory put first on PYTHONPATH: its ``sitecustomize`` starts the in-process reads in every Python process."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)

RUN_HELP = """\
Run COMMAND so that its Python processes open the files of fanfs mounts in their own process: no FUSE round
trip per file (a lookup and a read through the kernel to the daemon and back).  The bytes, sizes, errors,
fidelity and precision are the mount's, as it presents them at that moment ('fanfs ctl' switches reach
files opened after them).  Everything else goes through the mount as usual: writes, directories, symbolic
links, os.open, C libraries' own opens (h5py, DALI), non-Python programs.

  fanfs run -- python train.py --data /tmp/imagenet
  fanfs run --mount /tmp/imagenet -- torchrun --nproc-per-node 4 train.py

Needs fanfs installed in the Python that COMMAND runs (the same environment, or 'pip install' it there): a
Python without it reads through the mount, and says so once.  'fanfs stats MOUNTPOINT' counts what was
read in-process; this command says it when COMMAND ends.
"""


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("no command to run: fanfs run [--mount MOUNTPOINT] -- COMMAND...")
    mounts = _chosen(args.mount)
    env = dict(os.environ)
    if mounts:
        env[MOUNTS_VARIABLE] = json.dumps(mounts)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [STARTUP, env.get("PYTHONPATH")]))
        env.pop("FANFS_RUN_SAID", None)
        shown = ", ".join(f"{mount} ({_describe(mount)})" for mount in mounts)
        print(f"fanfs run: Python processes of {command[0]} read {shown} in-process; anything else goes through "
              "the mount", file=sys.stderr, flush=True)
    else:
        print(f"fanfs run: no fanfs mount of yours serves here: {command[0]} reads as without fanfs run",
              file=sys.stderr, flush=True)
    before = {mount: _in_process(mount) for mount in mounts}
    code = _run(command, env)
    for mount in mounts:
        now = _in_process(mount)
        done = {name: now.get(name, 0) - before[mount].get(name, 0) for name in now}
        if done:
            print(f"fanfs run: {mount}: {counted(done['files'], 'file')} ({human_size(done['bytes'])}) read in-process "
                  f"by {counted(done['processes'], 'process', 'processes')}; {counted(done['to_mount'], 'open')} left to the mount",
                  file=sys.stderr, flush=True)
    return code


def _chosen(given: list[str] | None) -> list[str]:
    """The mounts to read in-process: those given (each a fanfs mount of this user's that serves), else every one of
    this user's that serves here."""
    if given:
        chosen = []
        for mount in given:
            path = os.path.realpath(mount)
            if not mounted(path):
                raise FanfsError(f"{mount} is not a mount point: give a fanfs mount (fanfs mount STORE {mount})")
            try:
                request(path, {"cmd": "status"}, timeout=10)
            except ControlError as err:
                raise FanfsError(f"{mount}: {err}") from None
            chosen.append(path)
        return chosen
    found = []
    for mount in (found_mount.mountpoint for found_mount in fanfs_mounts() if found_mount.owner in (None, os.getuid())):
        try:
            request(mount, {"cmd": "status"}, timeout=10)
        except (ControlError, OSError):
            continue  # another user's, or a dead mount: the mount answers its readers
        found.append(mount)
    return found


def _describe(mount: str) -> str:
    from ..records import Presentation
    status = request(mount, {"cmd": "status"}, timeout=10)
    return Presentation({name: status[name] for name in Presentation.NAMES if name in status}).describe()


def _in_process(mount: str) -> dict[str, int]:
    try:
        return dict(request(mount, {"cmd": "stats"}, timeout=10).get("in_process", {}))
    except (ControlError, OSError):
        return {}


def _run(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` and wait for it; the signals that would end this process are passed on to it instead."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as err:
        raise FanfsError(f"cannot run {command[0]}: {err.strerror}") from None
    previous = {sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum)) for sig in FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = command("run", cmd_run, "run a command whose Python processes read fanfs mounts' files in-process")
    p.description = RUN_HELP
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--mount", action="append", metavar="MOUNTPOINT",
                   help="a mount to read in-process (again for more; default: every fanfs mount of yours here)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the command and its arguments")
