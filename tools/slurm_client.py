"""The handle on a running one-host Slurm (what tools/slurm_cluster.py's ``slurm_cluster()`` yields): client
commands (sbatch, squeue, scontrol, srun...) against it, run as the caller or, as root, as any local user.  Stdlib
only."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from slurm_config import CONF_VAR

# Job states after which a job never changes again.  ``scontrol show job`` shows COMPLETING (not
# one of these) until every node has cleaned up after the job.
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                          "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})

USER_VARIABLES = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ")
"""The caller's variables a command run as another user keeps: where the interpreter and the checkout are."""


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
            env: dict[str, str] | None = None, user: str | None = None, **kwargs) -> subprocess.CompletedProcess:
        """Run a client command (sinfo, squeue, srun, sbatch, scontrol...) against this cluster;
        output captured as text.  ``env`` entries are added to ``self.env``, or with ``user`` (a local
        user's name; the caller must be root) to ``user_env(user)``, and the command runs as that user."""
        if user is None:
            env, ids = {**self.env, **(env or {})}, {}
        else:
            pw = pwd.getpwnam(user)
            env = {**self.user_env(user), **(env or {})}
            ids = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid)}
        done = subprocess.run([os.fspath(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout,
                              **ids, **kwargs)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                             f"{done.stdout}{done.stderr}")
        return done

    def submit(self, script: str | os.PathLike, *args: str | os.PathLike,
               sbatch_options: Sequence[str] = (), env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None, user: str | None = None) -> int:
        """``sbatch [sbatch_options] script args...``; returns the job id.

        The job inherits sbatch's environment (``--export=ALL``, Slurm's default): ``self.env``
        plus ``env``.  Its stdout+stderr go to ``job_dir/slurm-<id>.out`` unless the options name
        an ``--output``; it runs in ``cwd`` (default ``job_dir``).  With ``user`` (a cluster started
        ``shared``), that user submits it, and the job runs as them: from ``user_env(user)`` plus ``env``,
        in and with its output in ``user_dir(user)`` unless told otherwise.
        """
        home = self.job_dir if user is None else self.user_dir(user)
        options = list(sbatch_options)
        if not any(o == "-o" or o.startswith(("--output", "-o")) for o in options):
            options.append(f"--output={home}/slurm-%j.out")
        done = self.run("sbatch", "--parsable", *options, script, *args, env=env, cwd=cwd or home, user=user)
        return int(done.stdout.strip().split(";")[0])      # "ID" or "ID;CLUSTER"

    def user_env(self, user: str) -> dict[str, str]:
        """What a command of ``user``'s starts with: their HOME, USER and LOGNAME, this cluster's SLURM_CONF,
        and the caller's USER_VARIABLES; none of the caller's other variables, which are the caller's own (a
        FANFS_RUNTIME_DIR, say)."""
        pw = pwd.getpwnam(user)
        kept = {name: self.env[name] for name in USER_VARIABLES if name in self.env}
        return {**kept, "HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name, CONF_VAR: str(self.conf)}

    def user_dir(self, user: str) -> Path:
        """``job_dir/USER``, made that user's own (mode 0700): the default directory of their jobs and outputs."""
        pw = pwd.getpwnam(user)
        path = self.job_dir / pw.pw_name
        path.mkdir(mode=0o700, exist_ok=True)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

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
        SIGKILL KillWait=10 s later; no more steps can start).  With ``signal_name`` (e.g. "TERM"),
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
