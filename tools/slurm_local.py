"""``tools/slurm-local start [-N N] | stop | status``: a one-host Slurm of N fake nodes for trying fanfs's
Slurm jobs (``sbatch -N 2 slurm/train.sbatch ...``) on a laptop-sized box.

The cluster is the tests' own (tools/slurm_cluster.py: munged, slurmctld and one slurmd per node, all on this
host as the calling user, nothing under /etc, /run or /var).  ``start`` leaves a small supervisor process
running that holds it, in a session of its own; ``stop`` sends it SIGTERM, upon which it cancels every job
and stops every daemon, and then removes the cluster's directory.  ``start`` prints, on stdout, the one line
to ``eval`` (``export SLURM_CONF=...``); everything else goes to stderr.  Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm_cluster import SOCKET_PATH_MAX, SlurmError, slurm_cluster, step_socket_length
from slurm_processes import CONF_VAR, kill_all

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


def default_dir() -> Path:
    """Short (the daemons' Unix sockets live under it) and the user's own."""
    return Path(f"/tmp/fanfs-slurm-{os.getuid()}")


class Cluster:
    """The files a running one-host Slurm keeps in its directory: the supervisor's pid and, once every node
    is idle, the ready marker holding the node count."""

    def __init__(self, base: Path) -> None:
        self.base = base.absolute()
        self.conf = self.base / "etc" / "slurm.conf"
        self.pid_file = self.base / "supervisor.pid"
        self.ready = self.base / "ready"
        self.log = self.base / "log" / "supervisor.log"

    def supervisor(self) -> int | None:
        """The pid of this directory's supervisor if it still runs, else None."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if b"serve" in cmdline and os.fsencode(self.base) in cmdline else None

    def export_line(self) -> str:
        return f"export {CONF_VAR}={self.conf}"


def fail(message: str) -> None:
    print(f"slurm-local: error: {message}", file=sys.stderr)
    sys.exit(1)


def make_private_dir(base: Path) -> None:
    """The directory, made 0700 by this user; one that exists must be this user's own real directory."""
    try:
        base.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        info = base.lstat()
        if base.is_symlink() or not base.is_dir() or info.st_uid != os.getuid():
            fail(f"{base} exists and is not a directory of this user's own: remove it or give --dir")
        base.chmod(0o700)


def start(cluster: Cluster, nodes: int) -> None:
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
    make_private_dir(cluster.base)
    cluster.ready.unlink(missing_ok=True)
    cluster.log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    with open(cluster.log, "ab") as log:
        proc = subprocess.Popen([sys.executable, __file__, "serve", "-N", str(nodes), "--dir", str(cluster.base)],
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
    print(f"slurm-local: {nodes} nodes (n1..n{nodes}) on this host, in {cluster.base}; "
          "'tools/slurm-local stop' ends every job and daemon", file=sys.stderr)
    print(cluster.export_line())


def last_line(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else ""


def serve(cluster: Cluster, nodes: int) -> None:
    """The supervisor: holds the cluster until SIGTERM (slurm_cluster turns it into KeyboardInterrupt and shuts
    everything down on the way out)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with slurm_cluster(cluster.base, nodes=nodes):
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
    pid = cluster.supervisor()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while cluster.supervisor() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if cluster.supervisor() is not None:
            os.kill(pid, signal.SIGKILL)       # its daemons follow it (parent-death signal)
    # Whatever a killed supervisor left: job tasks and slurmstepd carry the cluster's SLURM_CONF.
    conf = os.fsencode(cluster.conf)
    kill_all(lambda env: env.get(CONF_VAR.encode()) == conf)
    if cluster.base.is_dir() and not cluster.base.is_symlink() and cluster.base.lstat().st_uid == os.getuid():
        shutil.rmtree(cluster.base, ignore_errors=True)
    if not quiet:
        print("slurm-local: stopped" if pid is not None else "slurm-local: was not running", file=sys.stderr)


def status(cluster: Cluster) -> None:
    if cluster.supervisor() is None or not cluster.ready.exists():
        fail(f"not running (in {cluster.base}): 'tools/slurm-local start'")
    done = subprocess.run(["sinfo", "-N", "-o", "%N %T"], env={**os.environ, CONF_VAR: str(cluster.conf)},
                          capture_output=True, text=True, timeout=30)
    print(done.stdout + done.stderr, end="", file=sys.stderr)
    print(cluster.export_line())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/slurm-local", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop", "status", "serve"),
                        help="start, stop or show a one-host Slurm ('serve' is the supervisor start leaves)")
    parser.add_argument("-N", "--nodes", type=int, default=2, help="fake nodes n1..nN (default 2)")
    parser.add_argument("--dir", type=Path, default=default_dir(),
                        help="its private directory: config, state, logs (default /tmp/fanfs-slurm-$UID)")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 64:
        parser.error("-N takes 1 to 64 nodes")
    cluster = Cluster(args.dir)
    if (length := step_socket_length(cluster.base.resolve(), args.nodes)) >= SOCKET_PATH_MAX:
        fail(f"--dir {cluster.base} is too deep for Slurm's step sockets ({length} of at most {SOCKET_PATH_MAX - 1} "
             "bytes: a job would fail to launch): give a shorter --dir")
    {"start": lambda: start(cluster, args.nodes), "stop": lambda: stop(cluster), "status": lambda: status(cluster),
     "serve": lambda: serve(cluster, args.nodes)}[args.action]()


if __name__ == "__main__":
    main()
