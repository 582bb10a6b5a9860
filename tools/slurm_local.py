"""``tools/slurm-local start [-N N] | stop | status``: a one-host Slurm of N fake nodes for trying fanfs's
Slurm jobs (``sbatch -N 2 slurm/train.sbatch ...``) on a laptop-sized box.

The cluster is the tests' own (tools/slurm_cluster.py: munged, slurmctld and one slurmd per node, all on this
host, nothing under /etc, /run or /var).  Started by root it is every local user's, as a real Slurm is (the
daemons run as root, each job as the user who submitted it); started by another user, that user's alone.
``start`` leaves a small supervisor process running that holds it, in a session of its own; ``stop`` sends it
SIGTERM, upon which it cancels every job and stops every daemon, and then removes what ``start`` put in the
cluster's directory.  ``start`` prints, on stdout, the one line to ``eval`` (``export SLURM_CONF=...``);
everything else goes to stderr.  Stdlib only.

The directory is the user's to name, so it is marked: ``start`` makes it, or takes an empty one, and writes a
marker in it naming the directory (its device and inode: a copy is no cluster); ``start`` refuses any other,
and ``stop`` removes nothing where it finds no marker, and, where it does, only what ``start`` and the cluster
made, by name (tools/slurm_config.py): a job's output written there, or a note, stays, and the marker with it.
Processes are the cluster's by their environment: its ``SLURM_CONF`` *and* its supervisor's pid, never
``SLURM_CONF`` alone, which the user's shell exports after the ``eval``; and by their user
(tools/slurm_processes.py): never the processes of one who ran no job there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from slurm_cluster import SOCKET_PATH_MAX, SlurmError, slurm_cluster, step_socket_length
from slurm_config import CONF, CONF_VAR, DAEMON_TREES, MADE_DIRS, MADE_FILES
from slurm_processes import kill_cluster, real_uid

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
MARKER = "made-by-slurm-local"
MARKS = {"made": "'tools/slurm-local start' made this directory ({}): 'tools/slurm-local stop' removes what start "
                 "made in it, and it once nothing else is left\n",
         "lent": "'tools/slurm-local start' found this directory empty ({}): 'tools/slurm-local stop' removes what "
                 "start made in it\n"}
SUPERVISOR_FILES = ("supervisor.pid", "ready", "log/supervisor.log")
"""What ``start`` writes in the directory besides its marker and the cluster's files."""
SHOWN = 3
"""Entries ``stop`` names of what it kept."""

HELP = """\
A one-host Slurm of N fake nodes (n1..nN), to try fanfs's Slurm jobs on one machine: Debian's munged,
slurmctld and one slurmd per node, all on this host (tools/setup --test installs them).

  eval "$(tools/slurm-local start -N 2)"   start it; prints the line to eval: export SLURM_CONF=...
  tools/slurm-local start --epilog FILE    with a node epilog (root: slurm/epilog.sh and the like)
  sbatch -N 2 slurm/train.sbatch STORE python train.py --data '$FANFS_MNT'
  tools/slurm-local status                 its nodes, and the line again
  tools/slurm-local stop                   cancel its jobs, stop its daemons, remove what start made

Started by root, it is every local user's, as a real Slurm is: any user who exports its SLURM_CONF
may submit, and each job runs as the user who submitted it (the daemons run as root). Started by
another user, it is that user's alone, and every job runs as that user.

Its directory holds its configuration, state and logs. start makes it, or takes an empty one (that
no other user may write to, and for a user's cluster not enter either), and marks it. stop removes
only what start made there, by name: anything else (a job's output written there, a note) stays,
and so do the directory and its mark, so that start takes it again. A copy of it is no cluster."""


def default_dir() -> Path:
    """Short (the daemons' Unix sockets live under it) and the user's own."""
    return Path(f"/tmp/fanfs-slurm-{os.getuid()}")


def shared() -> bool:
    """Root's cluster is every user's (each job runs as its user); another user's is theirs alone."""
    return os.geteuid() == 0


class Cluster:
    """The files a one-host Slurm keeps in its directory: the marker ``start`` wrote, the supervisor's pid and,
    once every node is idle, the ready file holding the node count."""

    def __init__(self, base: Path) -> None:
        self.base = base.absolute()
        self.conf = self.base / CONF
        self.marker = self.base / MARKER
        self.pid_file = self.base / "supervisor.pid"
        self.ready = self.base / "ready"
        self.log = self.base / "log" / "supervisor.log"

    def identity(self) -> str:
        info = self.base.lstat()
        return f"device {info.st_dev}, inode {info.st_ino}"

    def mark(self) -> str | None:
        """"made" or "lent", as ``start`` wrote it, if this is a real directory of this user's holding its marker,
        which names this very directory (a copy's names the original)."""
        try:
            info = self.base.lstat()
            text = self.marker.read_text()
            identity = self.identity()
        except (OSError, UnicodeDecodeError):
            return None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        return next((kind for kind, mark in MARKS.items() if text == mark.format(identity)), None)

    def write_mark(self, kind: str) -> None:
        self.marker.write_text(MARKS[kind].format(self.identity()))

    def recorded_pid(self) -> int | None:
        """The supervisor's pid as ``start`` recorded it, running or not; None in a directory not marked."""
        try:
            return int(self.pid_file.read_text()) if self.mark() else None
        except (OSError, ValueError):
            return None

    def supervisor(self) -> int | None:
        """The pid of this directory's supervisor if it still runs, else None."""
        if (pid := self.recorded_pid()) is None or real_uid(pid) != os.getuid():
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        return pid if b"serve" in cmdline and os.fsencode(self.base) in cmdline else None

    def export_line(self) -> str:
        return f"export {CONF_VAR}={self.conf}"


def fail(message: str) -> NoReturn:
    print(f"slurm-local: error: {message}", file=sys.stderr)
    sys.exit(1)


def claim(cluster: Cluster) -> None:
    """Mark the cluster's directory: one ``start`` makes (or made before), or an empty one no other user may
    write to (nor, for a user's own cluster, enter: root's is every user's to read).  Any other is the user's own:
    refused, left as it is."""
    base, mode = cluster.base, 0o755 if shared() else 0o700
    try:
        base.mkdir(mode=mode, parents=True)
    except FileExistsError:
        if cluster.mark():
            return
        info = base.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            fail(f"{base} exists and is not a directory of this user's own: give another --dir")
        if any(base.iterdir()):
            fail(f"{base} is not empty and 'tools/slurm-local start' did not make it: give a new or an empty --dir")
        if info.st_mode & ~mode & 0o077:
            fail(f"{base} is open to other users (mode {stat.S_IMODE(info.st_mode):o}): 'chmod {mode:o}' it or give "
                 "a new --dir")
        cluster.write_mark("lent")
    else:
        base.chmod(mode)                        # whatever the umask
        cluster.write_mark("made")


def release(cluster: Cluster) -> list[str]:
    """Remove what ``start`` and the cluster made in the directory, by name, then the marker and the directory
    ``start`` made if nothing else is left; returns what is (the user's: paths in the directory).  The marker
    goes last, so that a ``stop`` that failed half-way can be run again."""
    base, made = cluster.base, cluster.mark() == "made"
    try:
        for pattern in (*SUPERVISOR_FILES, *MADE_FILES):
            for path in base.glob(pattern):
                if path.is_symlink() or not path.is_dir():
                    path.unlink()
        for name in DAEMON_TREES:
            if (base / name).is_symlink() or (base / name).is_file():
                (base / name).unlink()
            elif (base / name).is_dir():
                shutil.rmtree(base / name)
        for pattern in MADE_DIRS:
            for path in base.glob(pattern):
                if not path.is_symlink() and path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
        if kept := leaves(base):
            return kept
        cluster.marker.unlink()
        if made:
            base.rmdir()
    except OSError as e:
        fail(f"the cluster is stopped but {e.filename} could not be removed ({e.strerror}): remove it, or run "
             "'tools/slurm-local stop' again")
    return []


def leaves(base: Path) -> list[str]:
    """Files, empty directories, symlinks and mount points under ``base`` (not its marker), relative, sorted:
    neither a symlink nor another file system (a job's mount left behind) is entered."""
    found = []
    for root, dirs, files in os.walk(base):
        here = Path(root).relative_to(base)
        found += [str(here / name) for name in files if here / name != Path(MARKER)]
        ends = [name for name in dirs if os.path.islink(os.path.join(root, name))
                or os.path.ismount(os.path.join(root, name)) or not os.listdir(os.path.join(root, name))]
        found += [str(here / name) for name in ends]
        dirs[:] = [name for name in dirs if name not in ends]
    return sorted(found)


def start(cluster: Cluster, nodes: int, epilog: Path | None = None) -> None:
    missing = [name for name in DAEMONS if shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if missing:
        fail(f"{', '.join(missing)} not found: install Debian's slurmctld slurmd slurm-client munge "
             "(tools/setup --test does)")
    if cluster.supervisor() is not None:
        running = cluster.ready.read_text().strip() if cluster.ready.exists() else "?"
        print(f"slurm-local: already running ({running} nodes) in {cluster.base}; 'tools/slurm-local stop' first "
              "for another node count", file=sys.stderr)
        print(cluster.export_line())
        return
    claim(cluster)
    cluster.ready.unlink(missing_ok=True)
    cluster.log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    with open(cluster.log, "ab") as log:
        proc = subprocess.Popen([sys.executable, __file__, "serve", "-N", str(nodes), "--dir", str(cluster.base),
                                 *(["--epilog", str(epilog)] if epilog else [])],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    cluster.pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while not cluster.ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            reason = last_line(cluster.log) or f"not ready after {START_TIMEOUT:.0f} s"
            stop(cluster, quiet=True)
            fail(f"the cluster did not start: {reason}")
        time.sleep(0.1)
    users = "every local user may submit, each job runs as its user" if shared() else "its jobs run as you"
    print(f"slurm-local: {nodes} nodes (n1..n{nodes}) on this host, in {cluster.base} ({users}); "
          "'tools/slurm-local stop' ends every job and daemon", file=sys.stderr)
    print(cluster.export_line())


def last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else ""


def serve(cluster: Cluster, nodes: int, epilog: Path | None = None) -> None:
    """The supervisor: holds the cluster until SIGTERM (slurm_cluster turns it into KeyboardInterrupt and shuts
    everything down on the way out)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with slurm_cluster(cluster.base, nodes=nodes, shared=shared(), epilog=epilog):
            cluster.ready.write_text(f"{nodes}\n")
            while True:
                signal.pause()
    except KeyboardInterrupt:
        pass
    except (SlurmError, OSError, ValueError) as e:
        print(e, file=sys.stderr)
        print(str(e).strip().splitlines()[0], file=sys.stderr)       # the line 'start' reports
        sys.exit(1)


def stop(cluster: Cluster, quiet: bool = False) -> None:
    ran, kept = end(cluster) if os.path.lexists(cluster.base) else (False, [])
    if not quiet:
        shown = ", ".join(kept[:SHOWN]) + (f" and {len(kept) - SHOWN} more" if len(kept) > SHOWN else "")
        print("slurm-local: " + ("stopped" if ran else "was not running") +
              (f"; kept what start did not make in {cluster.base}: {shown}" if kept else ""), file=sys.stderr)


def end(cluster: Cluster) -> tuple[bool, list[str]]:
    """End the supervisor, whatever it left, and what ``start`` put in the directory, a marked one only (anything
    else is the user's); whether the supervisor still ran, and what was kept in the directory."""
    if cluster.mark() is None:
        fail(f"{cluster.base} was not made by 'tools/slurm-local start' (no {MARKER} in it naming it): nothing "
             "stopped, nothing removed")
    pid = cluster.supervisor()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while cluster.supervisor() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if cluster.supervisor() is not None:
            os.kill(pid, signal.SIGKILL)       # its daemons follow it (parent-death signal)
    # Whatever a killed supervisor left: slurmstepd and job tasks carry its pid and the cluster's SLURM_CONF.
    if (owner := cluster.recorded_pid()) is not None:
        kill_cluster(cluster.base, owner)
    return pid is not None, release(cluster)


def status(cluster: Cluster) -> None:
    if cluster.supervisor() is None or not cluster.ready.exists():
        fail(f"not running (in {cluster.base}): 'tools/slurm-local start'")
    done = subprocess.run(["sinfo", "-N", "-o", "%N %T"], env={**os.environ, CONF_VAR: str(cluster.conf)},
                          capture_output=True, text=True, timeout=30)
    print(done.stdout + done.stderr, end="", file=sys.stderr)
    print(cluster.export_line())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/slurm-local", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop", "status", "serve"),
                        help="start, stop or show a one-host Slurm ('serve' is the supervisor start leaves)")
    parser.add_argument("-N", "--nodes", type=int, default=2, help="fake nodes n1..nN (default 2)")
    parser.add_argument("--epilog", type=Path, metavar="FILE",
                        help="a node epilog every node runs when a job ends there, as the daemons' user (root: "
                             "slurm/epilog.sh, with FANFS naming the fanfs command; default none)")
    parser.add_argument("--dir", type=Path, default=default_dir(),
                        help="its directory: configuration, state and logs; a new one, or an empty one (default "
                             "/tmp/fanfs-slurm-$UID)")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 64:
        parser.error("-N takes 1 to 64 nodes")
    cluster = Cluster(args.dir)
    epilog = args.epilog.absolute() if args.epilog else None
    if epilog is not None and not (epilog.is_file() and os.access(epilog, os.X_OK)):
        fail(f"--epilog {args.epilog}: not an executable file")
    if (length := step_socket_length(cluster.base.resolve(), args.nodes)) >= SOCKET_PATH_MAX:
        fail(f"--dir {cluster.base} is too deep for Slurm's step sockets ({length} of at most {SOCKET_PATH_MAX - 1} "
             "bytes: a job would fail to launch): give a shorter --dir")
    {"start": lambda: start(cluster, args.nodes, epilog), "stop": lambda: stop(cluster),
     "status": lambda: status(cluster), "serve": lambda: serve(cluster, args.nodes, epilog)}[args.action]()


if __name__ == "__main__":
    main()
