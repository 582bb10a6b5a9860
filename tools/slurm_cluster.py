"""A real, throw-away Slurm cluster on this one host, for the tests and ``tools/slurm-local`` (a user's own).

``slurm_cluster(base_dir, nodes=3)`` starts Debian's own daemons (bookworm: Slurm 22.05, MUNGE 0.5.15):

* one ``munged`` on a private socket with its own key (nothing under /etc, /run or /var is used),
* one ``slurmctld``,
* one ``slurmd -N nX`` per fake node ``n1..nN``: every node is ``localhost``, each on its own port,

all in the foreground (``-D`` / ``-F``) as children of this process, configured by files written
under ``base_dir``, which also holds every log, pid file, spool and state directory.  It yields a
:class:`SlurmCluster` (tools/slurm_client.py) once ``sinfo`` reports every node idle (about 0.3 s), and
tears the whole thing down when the ``with`` block ends, however it ends (about 0.2 s with no job running):

1. running jobs are cancelled and waited for (slurmd does *not* kill running steps when it stops),
2. ``scontrol shutdown`` stops slurmctld and every slurmd; munged is stopped last,
3. SIGTERM/SIGKILL for anything still there, children reaped,
4. a sweep kills every process still carrying this cluster's ``SLURM_CONF`` and its owner's pid in its
   environment and run by the daemons' user or a job's (tools/slurm_processes.py): stray ``slurmstepd`` and
   job tasks that escaped their step (proctrack/linuxproc lets them: a test can therefore see anything a job
   leaves running); not the processes of a user's shell that merely exports ``SLURM_CONF``.

If the test runner itself dies, the daemons die with it (parent-death signal), and the next
``slurm_cluster()`` of the same user kills whatever that user's earlier, dead owner left behind.  SIGTERM to
this process (``timeout``, CI cancel) is turned into KeyboardInterrupt while a cluster runs, so the
``finally`` still runs.

Stdlib only.  Needs the Debian packages ``slurmctld slurmd slurm-client munge`` (``tools/setup --test``).
All daemons run as the calling user (SlurmUser = SlurmdUser = that user).  As root, ``shared=True`` makes it
a cluster of every local user, as a real Slurm is: anyone may submit (``SlurmCluster.submit(user=...)``, or
``sbatch`` with its ``SLURM_CONF``) and each job runs as the user who submitted it; otherwise only the caller
may, and every job runs as the caller.  Linux only (/proc, prctl).  Every node has its own ``$TMPDIR`` (a task
prolog; sticky and open to all in a shared cluster, as /tmp is), as separate hosts would; otherwise the nodes
share everything but their name (``$SLURMD_NODENAME``).  Time limits are whole minutes, checked every 30 s.

Usage::

    with slurm_cluster(tmp_path / "slurm") as cluster:
        job = cluster.submit("job.sbatch", "arg", sbatch_options=["-N", "3", "--time=5"])
        result = cluster.wait(job, timeout=60)     # JobResult(state='COMPLETED', exit_code=0, signal=0)
        print(cluster.output(job))
        cluster.run("srun", "-N", "3", "hostname")  # any client command; or subprocess with env=cluster.env
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from slurm_client import FINAL_STATES, JobResult, SlurmCluster, SlurmError
from slurm_config import CONF_VAR, OWNER_VAR, write_config
from slurm_processes import kill_cluster, kill_stale_clusters

__all__ = ["slurm_cluster", "SlurmCluster", "JobResult", "SlurmError", "FINAL_STATES", "kill_stale_clusters"]

# Variables that must not leak from the caller into the test cluster's commands: if the test-suite
# itself runs inside a real Slurm job, SLURM_JOB_ID & co. would make srun/sbatch act inside *that*
# job; SBATCH_*/SRUN_*/SALLOC_* set option defaults; PMI_*/PMIX_* confuse MPI start-up.
_LEAKY_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCONTROL_",
                   "SACCT_", "PMI_", "PMIX_", "MPIR_", "HYDRA_")

_STOP_GRACE = 10.0                        # seconds for jobs/daemons to go before signals are used
_PR_SET_PDEATHSIG = 1


# -- processes ------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGTERM the daemon when the thread that started it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _stop_process(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s; reaps the process."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SlurmError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


@contextlib.contextmanager
def _sigterm_as_keyboard_interrupt() -> Iterator[None]:
    """While the cluster runs, SIGTERM (timeout(1), CI cancelling) raises KeyboardInterrupt instead
    of killing Python on the spot, so that the cluster is still shut down.  Only from the main
    thread, and only if nobody else handles SIGTERM.  A process forked meanwhile (a test's worker
    pool) still dies of SIGTERM: a KeyboardInterrupt there once left a pool worker that
    ``Pool.terminate()`` waited for forever."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:  # a child forked by a test (a worker pool): die as SIGTERM means
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


SOCKET_PATH_MAX = 108
"""A Unix socket's path, NUL included (``sun_path``).  munged's socket and slurmstepd's, one per step in the node's
spool directory (``spool/nX/nX_JOB.STEP``), live under the base directory: one path too long fails every job's launch
("launch failed requeued held": it failed so in the full suite, under pytest's deeper temporary directories)."""


def step_socket_length(base: Path, nodes: int) -> int:
    """Bytes of the longest step socket path of a cluster of ``nodes`` under ``base`` (job ids up to 10 digits)."""
    return len(os.fsencode(base / "spool" / f"n{nodes}" / f"n{nodes}_{'9' * 10}.{2 ** 32 - 5}"))


def _check_shareable(base: Path) -> None:
    """A shared cluster's daemons run as root and its configuration is read by every user: refused otherwise."""
    if os.geteuid() != 0:
        raise ValueError("a shared cluster runs each job as the user who submits it: only root can start one")
    for directory in (*reversed(base.parents), base):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise ValueError(f"{directory} is closed to other users (mode {stat.S_IMODE(mode):o}): they could not "
                             "read the cluster's slurm.conf; give a directory every user may reach")


@contextlib.contextmanager
def slurm_cluster(base_dir: Path, nodes: int = 3, *, cpus_per_node: int = 4, start_timeout: float = 30,
                  shared: bool = False, epilog: Path | None = None) -> Iterator[SlurmCluster]:
    """Start munged + slurmctld + one slurmd per node under ``base_dir``; yield a SlurmCluster.

    ``cpus_per_node``: CPUs each fake node claims (jobs, and steps without --overlap, need free ones).
    ``shared``: every local user may submit, each job runs as its user (root only; ``base_dir`` must be a
    directory every user may reach).  ``epilog``: the node epilog each node runs when a job ends there (none by
    default: the tests see what a job leaves).  Everything is stopped and reaped on exit, even if start-up fails
    half-way.
    """
    base = Path(base_dir).resolve()
    if (length := step_socket_length(base, nodes)) >= SOCKET_PATH_MAX:
        raise ValueError(f"base_dir too long for the daemons' Unix sockets ({length} of at most {SOCKET_PATH_MAX - 1} "
                         f"bytes): {base}")
    base.mkdir(parents=True, exist_ok=True)
    if shared:
        _check_shareable(base)
    kill_stale_clusters()
    names = [f"n{i}" for i in range(1, nodes + 1)]
    owner = os.getpid()
    conf, sock = write_config(base, names, cpus_per_node, owner, shared, epilog)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    env.update({CONF_VAR: str(conf), OWNER_VAR: str(owner)})
    cluster = SlurmCluster(base, names, conf, env, base / "jobs")

    def start(name: str, cmd: list[str]) -> None:
        # Own session: a Ctrl-C aimed at the test runner does not reach the daemons before we stop
        # them in order.  The daemons write their own logs; this file only gets early messages.
        with open(base / "log" / f"{name}.stdout", "ab") as out:
            cluster._procs[name] = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent)

    def check_alive(name: str) -> None:
        if cluster._procs[name].poll() is not None:
            log = base / "log" / f"{name}.log"
            text = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            text += (base / "log" / f"{name}.stdout").read_text(errors="replace")[-2000:]
            raise SlurmError(f"{name} exited ({cluster._procs[name].returncode}) during start-up:\n{text}")

    def ctld_up() -> bool:
        check_alive("slurmctld")
        return "UP" in cluster.run("scontrol", "ping", check=False, timeout=15).stdout

    def all_idle() -> bool:
        for node in names:
            check_alive(f"slurmd-{node}")
        states = cluster.node_states()
        return len(states) == len(names) and all(s == "idle" for s in states.values())

    with _sigterm_as_keyboard_interrupt():
        try:
            # --force: tolerate loose permissions above base_dir (munged checks the whole path).
            start("munged", ["munged", "-F", "--force", f"--socket={sock}",
                             f"--key-file={base}/munge/munge.key", f"--pid-file={base}/munge/munged.pid",
                             f"--seed-file={base}/munge/munged.seed"])      # -F: logs to stderr
            _wait_for(lambda: check_alive("munged") or sock.is_socket(), start_timeout, "munged's socket")
            start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])   # -i: ignore old state
            _wait_for(ctld_up, start_timeout, "slurmctld to answer", poll=0.1)
            for node in names:
                start(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(conf)])
            _wait_for(all_idle, start_timeout, "every node to be idle", poll=0.1)
            yield cluster
        finally:
            _shutdown(cluster)


def _shutdown(cluster: SlurmCluster) -> None:
    """Stop everything, politely first.  Never raises; leaves no process of the cluster behind."""
    procs = cluster._procs
    ctld = procs.get("slurmctld")
    if ctld is not None and ctld.poll() is None:
        with contextlib.suppress(Exception):
            # 1. Cancel all jobs and let them finish completing: slurmd leaves running steps alone
            #    when it stops (slurmstepd is built to outlive a slurmd restart).
            jobs = cluster.run("squeue", "-h", "-o", "%i", check=False, timeout=15).stdout.split()
            if jobs:
                cluster.run("scancel", *jobs, check=False, timeout=15)
                deadline = time.monotonic() + _STOP_GRACE
                while time.monotonic() < deadline and cluster.run(
                        "squeue", "-h", "-o", "%i", check=False, timeout=15).stdout.strip():
                    time.sleep(0.2)
        with contextlib.suppress(Exception):
            # 2. slurmctld tells every slurmd to exit, then exits itself.
            cluster.run("scontrol", "shutdown", check=False, timeout=15)
        deadline = time.monotonic() + _STOP_GRACE
        for name, proc in procs.items():
            if name != "munged":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
    # 3. Whatever did not stop, or a start-up that failed half-way: signals.  munged last, so that
    #    the Slurm daemons can still authenticate while they go.
    for name, proc in sorted(procs.items(), key=lambda item: item[0] == "munged"):
        with contextlib.suppress(Exception):
            _stop_process(proc)
    # 4. Stray slurmstepd and job tasks (not our children: init reaps them).
    with contextlib.suppress(Exception):
        kill_cluster(cluster.base_dir, os.getpid())
