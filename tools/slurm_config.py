"""The files of a one-host Slurm (tools/slurm_cluster.py): a MUNGE key, slurm.conf with one fake node per
``slurmd`` on its own port, the task prolog that gives each node its own ``$TMPDIR`` and the node prolog that
records each job's user; and the names of all a cluster makes in its directory.  Stdlib only."""

from __future__ import annotations

import os
import pwd
import random
import shlex
import socket
from pathlib import Path

# Set in the environment of the daemons (hence of slurmstepd) and, by the task prolog, of every job task, so
# that all processes of a cluster can be found in /proc, even after the Python process that owned it died.
OWNER_VAR = "ONE_HOST_SLURM_OWNER"        # pid of the Python process that started the cluster
CONF_VAR = "SLURM_CONF"                   # path of its slurm.conf (also in every job: sbatch's environment)

CONF = "etc/slurm.conf"
JOB_UIDS = "state/job-uids"
"""The real uid of each job's user, a line per job and node, appended by the node prolog (run as the daemons'
user) as the job starts there: the users whose processes may be the cluster's (slurm_processes.kill_cluster)."""

MADE_FILES = (CONF, "etc/task_prolog.sh", "etc/prolog.sh", "slurmctld.pid", "slurmd-n*.pid", "log/slurmctld.log",
              "log/slurmd-n*.log", "log/jobcomp.txt", "log/munged.stdout", "log/slurmctld.stdout",
              "log/slurmd-n*.stdout")
"""What the configuration and the daemons write in a cluster's directory, by name (glob patterns)."""
DAEMON_TREES = ("state", "spool", "munge")
"""The daemons' own directories (state, spool and the munge key and socket): whatever is in them is theirs."""
MADE_DIRS = ("etc", "log", "tmp/n*", "tmp", "jobs")
"""The directories a cluster makes for the others, in the order they can be removed (when empty): the nodes'
``$TMPDIR`` and the tests' job directory hold what jobs write, which is the users', not the cluster's."""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this host right now (a tiny race is acceptable)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_config(base: Path, nodes: list[str], cpus_per_node: int, owner: int, shared: bool,
                 epilog: Path | None = None) -> tuple[Path, Path]:
    """Write the munge key, slurm.conf and the prologs; returns (slurm.conf, munge socket).  ``owner``: the pid
    of the process that runs the cluster, which the task prolog puts in every task's environment.  ``shared``:
    every local user may submit (the daemons run as root, a job as its user): the configuration, the munge
    socket and the nodes' ``$TMPDIR`` (sticky, as /tmp) are open to all; state and logs stay the daemons'.  ``epilog``:
a node epilog (a site's, e.g. fanfs's slurm/epilog.sh) each node runs as the daemons' user when a job ends there."""
    public = 0o755
    for sub, mode in (("etc", public), ("log", 0o700), ("state", 0o700), ("spool", public), ("tmp", public),
                      ("jobs", public), ("munge", public)):
        _directory(base / sub, mode)
    # munged insists on a key owned by its user with mode 0600 or 0400, and on a socket directory
    # everyone may search: with 0700 it refuses to start ("execute permissions for all required").
    key = base / "munge" / "munge.key"
    if not key.exists():
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(os.urandom(1024))
    sock = base / "munge" / "munge.socket"

    # All fake nodes share this host's /tmp.  Give each its own TMPDIR, exported into every task
    # (batch script included) by a TaskProlog: Slurm applies "export NAME=value" lines it prints.
    # The owner's pid marks every task as this cluster's (slurm_processes.of_cluster): a job has the
    # environment of the shell that ran sbatch, which is no mark.  The task prolog runs as the job's user.
    tmp = shlex.quote(str(base / "tmp"))
    task_prolog = _script(base / "etc" / "task_prolog.sh",
                          f'd={tmp}/"$SLURMD_NODENAME"\n'
                          'mkdir -p "$d" && echo "export TMPDIR=$d"\n'
                          f'echo "export {OWNER_VAR}={owner}"\n')
    # The node prolog runs as the daemons' user when a job starts on a node: whose processes it will run.
    prolog = _script(base / "etc" / "prolog.sh",
                     f'echo "$SLURM_JOB_UID" >> {shlex.quote(str(base / JOB_UIDS))}\nexit 0\n')
    for node in nodes:
        _directory(base / "tmp" / node, 0o1777 if shared else 0o700)
        _directory(base / "spool" / node, public)

    user = pwd.getpwuid(os.getuid()).pw_name
    ctld_port, *node_ports = _free_ports(1 + len(nodes))
    node_lines = "\n".join(f"NodeName={n} NodeHostname=localhost Port={p} CPUs={cpus_per_node} RealMemory=1000"
                           for n, p in zip(nodes, node_ports))
    conf = base / CONF
    conf.write_text(f"""\
# Written by tools/slurm_config.py: a throw-away cluster, every node on this host.
ClusterName=testcluster
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
# Job ids of their own: clusters started one after another (or by several users at once) on this host
# must not share them, since what jobs leave is named after them (MPICH names its /dev/shm segments after
# the job and step: a segment leaked by another cluster's job of the same id would be reused, and kept).
FirstJobId={random.randrange(10_000, 60_000_000, 1000)}
# Both daemons run as whoever starts the cluster: root (a job runs as its user), or a user whose jobs all run
# as that user.
SlurmUser={user}
SlurmdUser={user}

# Authentication through our private munged; client commands find the socket here too.
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge

# Per-daemon paths: %n is the node name (one slurmd per fake node on one host).
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# The task prolog gives each node its TMPDIR (Slurm itself does not); the node prolog records the job's user.
TaskProlog={task_prolog}
Prolog={prolog}
{f"Epilog={epilog}" if epilog is not None else "# No node epilog: what a job leaves stays, for the tests to see."}
MailProg=/bin/true

# linuxproc: tasks tracked through their parent chain, no cgroups needed (works in any container); a
# process that leaves its step (setsid, and its parent exits) escapes, so tests see what a job leaves.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# One line per finished job, with its final state and exit code (survives the job record).
JobCompType=jobcomp/filetxt
JobCompLoc={base}/log/jobcomp.txt
# Steps use no MPI plugin unless they ask: srun --mpi=pmi2.
MpiDefault=none
SwitchType=switch/none

SchedulerType=sched/backfill
# Batch jobs start on the next once-a-second scheduler tick (the default delay is up to 3 s).
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Nodes have the CPUs configured here, whatever this host has; a node that registers is usable.
SlurmdParameters=config_overrides
ReturnToService=2

# No slurmdbd (so no sacct): keep finished jobs in "scontrol show job" for a day.
MinJobAge=86400
# Kills: SIGCONT+SIGTERM, then SIGKILL KillWait seconds later (Slurm's default is 30): long enough for a node's
# daemon to unmount and remove its job directory on a loaded host (2 s was not, at load 6), and no wait at all for
# processes that end at SIGTERM.  Time limits are whole minutes and slurmctld checks them every 30 s: --time=1 ends
# the job 60-90 s after its start.
KillWait=10
OverTimeLimit=0
InactiveLimit=0
UnkillableStepTimeout=30
MessageTimeout=10

{node_lines}
PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
""")
    conf.chmod(0o644)       # every client command reads it
    return conf, sock


def _directory(path: Path, mode: int) -> None:
    """``path`` made if missing, with ``mode`` whatever the umask."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)


def _script(path: Path, body: str) -> Path:
    """A shell script any user may run (the task prolog runs as the job's user)."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path
