"""A real, throw-away Slurm cluster on this one host, for the tests and ``tools/slurm-local`` (a user's own).

``slurm_cluster(base_dir, nodes=3)`` starts Debian's own daemons (bookworm: Slurm 22.05, MUNGE 0.5.15):

* one ``munged`` on a private socket with its own key (nothing under /etc, /run or /var is used),
* one ``slurmctld``,
* one ``slurmd -N nX`` per fake node ``n1..nN``: every node is ``localhost``, each on its own port,

all in the foreground (``-D`` / ``-F``) as children of this process, configured by files written
under ``base_dir``, which also holds every log, pid file, spool and state directory.  It yields a
:class:`SlurmCluster` once ``sinfo`` reports every node idle (about 0.3 s), and tears the whole
thing down when the ``with`` block ends, however it ends (about 0.2 s with no job running):

1. running jobs are cancelled and waited for (slurmd does *not* kill running steps when it stops),
2. ``scontrol shutdown`` stops slurmctld and every slurmd; munged is stopped last,
3. SIGTERM/SIGKILL for anything still there, children reaped,
4. a sweep kills every process still carrying this cluster's ``SLURM_CONF`` and its owner's pid in its
   environment: stray ``slurmstepd`` and job tasks that escaped their step (proctrack/linuxproc lets them: a
   test can therefore see anything a job leaves running); not the processes of a user's shell that merely
   exports ``SLURM_CONF``.

If the test runner itself dies, the daemons die with it (parent-death signal), and the next
``slurm_cluster()`` kills whatever an earlier, dead owner left behind.  SIGTERM to this process
(``timeout``, CI cancel) is turned into KeyboardInterrupt while a cluster runs, so the ``finally``
still runs.

Stdlib only.  Needs the Debian packages ``slurmctld slurmd slurm-client munge`` (``tools/setup --test``).
All daemons run as the calling user (SlurmUser = SlurmdUser = that user): as root, or as any other
user, whose jobs then run as that user too.  Linux only (/proc, prctl).  Every node has its own
``$TMPDIR`` (a task prolog), as separate hosts would; otherwise the nodes share everything but their
name (``$SLURMD_NODENAME``).  Time limits are whole minutes, checked every 30 s.

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
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from slurm_config import write_config
from slurm_processes import CONF_VAR, OWNER_VAR, kill_all, kill_stale_clusters, of_cluster

__all__ = ["slurm_cluster", "SlurmCluster", "JobResult", "SlurmError", "FINAL_STATES", "kill_stale_clusters"]

# Job states after which a job never changes again.  ``scontrol show job`` shows COMPLETING (not
# one of these) until every node has cleaned up after the job.
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                          "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})

# Variables that must not leak from the caller into the test cluster's commands: if the test-suite
# itself runs inside a real Slurm job, SLURM_JOB_ID & co. would make srun/sbatch act inside *that*
# job; SBATCH_*/SRUN_*/SALLOC_* set option defaults; PMI_*/PMIX_* confuse MPI start-up.
_LEAKY_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCONTROL_",
                   "SACCT_", "PMI_", "PMIX_", "MPIR_", "HYDRA_")

_STOP_GRACE = 10.0                        # seconds for jobs/daemons to go before signals are used
_PR_SET_PDEATHSIG = 1


class JobResult(NamedTuple):
    """How a job ended: ``state`` (COMPLETED, FAILED, CANCELLED, TIMEOUT...) and Slurm's
    ``ExitCode=N:S``, i.e. the batch script's exit status and the signal that killed it, if any."""
    state: str
    exit_code: int
    signal: int


class SlurmError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    """Handle on a running cluster (what ``slurm_cluster()`` yields)."""

    base_dir: Path
    nodes: list[str]                      # ["n1", "n2", "n3"]
    conf: Path                            # base_dir/etc/slurm.conf
    env: dict[str, str]                   # environment for Slurm client commands (SLURM_CONF=...)
    job_dir: Path                         # default working directory and output directory of jobs
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    # -- client commands -------------------------------------------------------------------------

    def run(self, *cmd: str | os.PathLike, check: bool = True, timeout: float = 60,
            env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
        """Run a client command (sinfo, squeue, srun, sbatch, scontrol...) against this cluster;
        output captured as text.  ``env`` entries are added to ``self.env``."""
        done = subprocess.run([os.fspath(c) for c in cmd], env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                             f"{done.stdout}{done.stderr}")
        return done

    def submit(self, script: str | os.PathLike, *args: str | os.PathLike,
               sbatch_options: Sequence[str] = (), env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None) -> int:
        """``sbatch [sbatch_options] script args...``; returns the job id.

        The job inherits sbatch's environment (``--export=ALL``, Slurm's default): ``self.env``
        plus ``env``.  Its stdout+stderr go to ``job_dir/slurm-<id>.out`` unless the options name
        an ``--output``; it runs in ``cwd`` (default ``job_dir``).
        """
        options = list(sbatch_options)
        if not any(o == "-o" or o.startswith(("--output", "-o")) for o in options):
            options.append(f"--output={self.job_dir}/slurm-%j.out")
        done = self.run("sbatch", "--parsable", *options, script, *args, env=env,
                        cwd=cwd or self.job_dir)
        return int(done.stdout.strip().split(";")[0])      # "ID" or "ID;CLUSTER"

    def job_info(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict; empty if Slurm does not know the job (any more)."""
        done = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if done.returncode != 0:
            return {}
        # One line of "Key=Value" pairs; only a few values (Command, WorkDir...) could hold spaces.
        return dict(re.findall(r"(?:^|\s)([\w/:]+)=(\S*)", done.stdout.strip()))

    def state(self, job_id: int) -> JobResult:
        """The job's current state; the exit code is meaningful once the state is final."""
        info = self.job_info(job_id)
        if not info:
            return self._jobcomp_result(job_id)
        return JobResult(info.get("JobState", "UNKNOWN"), *_exit_code(info.get("ExitCode")))

    def _jobcomp_result(self, job_id: int) -> JobResult:
        """The jobcomp/filetxt record of a finished job (one line per job, written at its end)."""
        comp = self.base_dir / "log" / "jobcomp.txt"
        if comp.exists():
            for line in reversed(comp.read_text(errors="replace").splitlines()):
                if line.startswith(f"JobId={job_id} "):
                    fields = dict(re.findall(r"(\w+)=(\S*)", line))
                    return JobResult(fields.get("JobState", "UNKNOWN"), *_exit_code(fields.get("ExitCode")))
        return JobResult("UNKNOWN", -1, 0)

    def wait(self, job_id: int, timeout: float = 120, poll: float = 0.2) -> JobResult:
        """Wait until the job is in a final state (after COMPLETING: its processes are gone);
        returns its JobResult.  Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.state(job_id)
            if result.state in FINAL_STATES:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {result.state} after {timeout}s")
            time.sleep(poll)

    def wait_running(self, job_id: int, timeout: float = 30) -> None:
        """Wait until the job has started (batch jobs start on a once-a-second scheduler tick)."""
        deadline = time.monotonic() + timeout
        while (state := self.state(job_id).state) == "PENDING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still PENDING after {timeout}s")
            time.sleep(0.1)
        if state in FINAL_STATES | {"UNKNOWN"}:
            raise SlurmError(f"job {job_id} is {state}, not running")

    def cancel(self, job_id: int, signal_name: str | None = None, batch_only: bool = False) -> None:
        """``scancel ID``: cancel the job (its steps and batch shell get SIGCONT+SIGTERM, then
        SIGKILL KillWait=2 s later; no more steps can start).  With ``signal_name`` (e.g. "TERM"),
        only send that signal and do not cancel: to every step, or with ``batch_only`` to the batch
        shell alone (``scancel -b -s SIG``), which can then still run cleanup steps."""
        args = []
        if signal_name:
            args.append(f"--signal={signal_name}")
            if batch_only:
                args.append("--batch")
        self.run("scancel", *args, str(job_id))

    def output(self, job_id: int) -> str:
        """The job's output file, as far as it has been written ("" if there is none)."""
        path = self.job_dir / f"slurm-{job_id}.out"
        if not path.exists():
            path = Path(self.job_info(job_id).get("StdOut", path))
        return path.read_text(errors="replace") if path.exists() else ""

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as sinfo reports it (idle, alloc, mix, down*, unk*...)."""
        done = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15)
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())

    def log(self, name: str) -> str:
        """A daemon's log: "slurmctld", "munged" or a node name ("n1")."""
        name = f"slurmd-{name}" if name in self.nodes else name
        path = self.base_dir / "log" / f"{name}.log"
        if not path.exists():          # munged -F logs to stderr, i.e. to munged.stdout
            path = path.with_suffix(".stdout")
        return path.read_text(errors="replace") if path.exists() else ""


def _exit_code(text: str | None) -> tuple[int, int]:
    code, _, sig = (text or "0:0").partition(":")
    return int(code or 0), int(sig or 0)


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


@contextlib.contextmanager
def slurm_cluster(base_dir: Path, nodes: int = 3, *, cpus_per_node: int = 4,
                  start_timeout: float = 30) -> Iterator[SlurmCluster]:
    """Start munged + slurmctld + one slurmd per node under ``base_dir``; yield a SlurmCluster.

    ``cpus_per_node``: CPUs each fake node claims (jobs, and steps without --overlap, need free ones).
    Everything is stopped and reaped on exit, even if start-up fails half-way.
    """
    kill_stale_clusters()
    base = Path(base_dir).resolve()
    if (length := step_socket_length(base, nodes)) >= SOCKET_PATH_MAX:
        raise ValueError(f"base_dir too long for the daemons' Unix sockets ({length} of at most {SOCKET_PATH_MAX - 1} "
                         f"bytes): {base}")
    base.mkdir(parents=True, exist_ok=True)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    owner = os.getpid()
    conf, sock = write_config(base, names, cpus_per_node, owner)
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
        kill_all(of_cluster(cluster.conf, os.getpid()))
