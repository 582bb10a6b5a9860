"""The files of a one-host Slurm (tools/slurm_cluster.py): a MUNGE key, slurm.conf with one fake node per
``slurmd`` on its own port, and the task prolog that gives each node its own ``$TMPDIR``.  Stdlib only."""

from __future__ import annotations

import os
import pwd
import random
import socket
from pathlib import Path

from slurm_processes import OWNER_VAR


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


def write_config(base: Path, nodes: list[str], cpus_per_node: int, owner: int) -> tuple[Path, Path]:
    """Write the munge key, slurm.conf and a task prolog; returns (slurm.conf, munge socket).  ``owner``: the pid
    of the process that runs the cluster, which the prolog puts in every task's environment."""
    for sub in ("etc", "log", "state", "spool", "tmp", "jobs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    # munged insists on a key owned by its user with mode 0600 or 0400, and on a socket directory
    # everyone may search: with 0700 it refuses to start ("execute permissions for all required").
    munge_dir = base / "munge"
    munge_dir.mkdir(exist_ok=True)
    munge_dir.chmod(0o755)
    key = munge_dir / "munge.key"
    if not key.exists():
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(os.urandom(1024))
    sock = munge_dir / "munge.socket"

    # All fake nodes share this host's /tmp.  Give each its own TMPDIR, exported into every task
    # (batch script included) by a TaskProlog: Slurm applies "export NAME=value" lines it prints.
    # The owner's pid marks every task as this cluster's (slurm_processes.of_cluster): a job has the
    # environment of the shell that ran sbatch, which is no mark.
    prolog = base / "etc" / "task_prolog.sh"
    prolog.write_text("#!/bin/sh\n"
                      f'd="{base}/tmp/$SLURMD_NODENAME"\n'
                      'mkdir -p "$d" && echo "export TMPDIR=$d"\n'
                      f'echo "export {OWNER_VAR}={owner}"\n')
    prolog.chmod(0o755)
    for node in nodes:
        (base / "tmp" / node).mkdir(exist_ok=True)
        (base / "spool" / node).mkdir(exist_ok=True)

    user = pwd.getpwuid(os.getuid()).pw_name
    ctld_port, *node_ports = _free_ports(1 + len(nodes))
    node_lines = "\n".join(f"NodeName={n} NodeHostname=localhost Port={p} CPUs={cpus_per_node} RealMemory=1000"
                           for n, p in zip(nodes, node_ports))
    conf = base / "etc" / "slurm.conf"
    conf.write_text(f"""\
# Written by tools/slurm_config.py: a throw-away cluster, every node on this host.
ClusterName=testcluster
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
# Job ids of their own: clusters started one after another (or by several users at once) on this host
# must not share them, since what jobs leave is named after them (MPICH names its /dev/shm segments after
# the job and step: a segment leaked by another cluster's job of the same id would be reused, and kept).
FirstJobId={random.randrange(10_000, 60_000_000, 1000)}
# Both daemons run as whoever starts the cluster (root, or a user whose jobs then all run as that user).
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
# The task prolog gives each node its TMPDIR (Slurm itself does not).
TaskProlog={prolog}
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
# Quick kills: SIGCONT+SIGTERM, then SIGKILL KillWait seconds later.  Time limits are whole
# minutes and slurmctld checks them every 30 s: --time=1 ends the job 60-90 s after its start.
KillWait=2
OverTimeLimit=0
InactiveLimit=0
UnkillableStepTimeout=30
MessageTimeout=10

{node_lines}
PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
""")
    return conf, sock
