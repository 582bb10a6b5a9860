"""``fanfs job run|serve|exec``: a whole Slurm job's life (slurm/train.sbatch is one line of it); ``fanfs cleanup``:
what an ended job left on a node (the epilog's); ``fanfs shared list|prune``: the shared copies jobs leave on a node."""

from __future__ import annotations

import argparse
import fcntl
import os
from collections.abc import Callable

from ..errors import UsageError
from .args import positive, positive_size, size
from .presentation import add_presentation_options, as_text, known, presentation_values
from .serve import add_prefetch_option, add_stage_options, check_stage_options

Command = Callable[[argparse.Namespace], int]

JOB_HELP = """\
Run a training command on a fanfs mount on every node of a Slurm job: each node stages its shards,
mounts, and serves its peers; the command starts once every node serves, and each of its tasks finds
its own node's mount in $FANFS_MNT; at the end (or on scancel, or a time limit) every node unmounts
and removes what the job put there.

  sbatch -N 4 slurm/train.sbatch /shared/imagenet.fanfs python train.py --data '$FANFS_MNT'

settings (environment; the options of 'job run' win):
  FANFS_LOCAL     node-local directory under which each node keeps the job's shards in a directory of its
                  own, fanfs-JOBID-NODE-xxxxxxxx (default $TMPDIR, else /tmp; /dev/shm works)
  FANFS_MNT       the mount point on each node, {node} for the node's name (default: mnt/ in that directory)
  FANFS_REPLICAS  copies of each shard across the nodes (default 2; 1 on one node)
  FANFS_WORKERS   serving processes of each node's mount (default: a quarter of its cores, 1 to 8)
  FANFS_MPI       srun's --mpi for the nodes' start-up (default pmi2; pmix for a PMIx MPI)
  FANFS_MOUNT     0: where FUSE is not allowed, mount nothing; each node serves its peers and the training
                  tasks read in-process: fsspec.filesystem("fanfs", job=True) (default 1)
  FANFS_RUN       1: each task of the training command runs under 'fanfs run': its Python processes open its node's
                  mount's files in their own process, no FUSE round trip per file (default); 0: through the mount
  FANFS_STAGE     full: each node copies its shards before training starts (the default unless FANFS_SHARED_LOCAL
                  is set); lazy: training starts at once and a node copies a blob the first time it (or a peer)
                  reads it; shared: each node reads its one copy of the whole store, which every job on the node
                  shares, staged by the first (the default where FANFS_SHARED_LOCAL is set)
  FANFS_SHARED_LOCAL
                  with FANFS_STAGE=shared: the node-local directory of the nodes' shared copies, {node} for the
                  node's name, made once by an administrator (install -d -m 1777 DIR)
  FANFS_SHARED_KEEP
                  bytes of shared copies a node keeps when no job reads them (e.g. 500G; default 0: a copy goes
                  with the last job that reads it)
  FANFS_CAPACITY  with FANFS_STAGE=lazy: local disk each node's cache may take (e.g. 200G); a store whose share
                  does not fit is accepted, the rest is read through from the shared store (default: no limit)
  FANFS_STORE_TIMEOUT
                  seconds a read waits on a store on a network file system (NFS, sshfs, Lustre...) before it
                  fails with EIO, the store being stalled (default 30; 0: for ever)
{settings}"""


def job_help() -> str:
    """The help of 'job run', with a line for each presentation setting the record kinds declare."""
    from ..records import settings
    lines = [f"  {s.variable:<15} {s.metavar}: {s.help.split(':')[0]} (default full)" for s in settings()]
    return JOB_HELP.replace("{settings}", "".join(line + "\n" for line in lines))


def cmd_job_run(args: argparse.Namespace) -> int:
    from ..cache.sharedbase import SHARED_VARIABLE, keep_size
    from ..cluster.batch import JobSettings, run_job
    from ..cluster.job import LOCAL_VARIABLE, MNT_VARIABLE
    from ..records import parse_all, settings
    from ..util.deadline import store_timeout
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    replicas = args.replicas or int(os.environ.get("FANFS_REPLICAS") or (2 if nodes > 1 else 1))
    given = presentation_values(args)  # the options win over the environment
    from_environment = parse_all({s.name: os.environ.get(s.variable) or None for s in settings() if s.name not in given})
    values = {**from_environment, **given}  # a bad setting is one line here, not one per node
    text = os.environ.get("FANFS_WORKERS", "").strip()
    if text and not (text.isdigit() and int(text) > 0):
        raise UsageError(f"FANFS_WORKERS must be a positive whole number, not {text!r}")
    workers = args.workers or (int(text) if text else None)
    store_timeout()  # a bad FANFS_STORE_TIMEOUT: one line here, not one per node
    mount = os.environ.get("FANFS_MOUNT", "").strip() or "1"
    if mount not in ("0", "1"):
        raise UsageError(f"FANFS_MOUNT must be 1 (mount) or 0 (serve without a mount), not {mount!r}")
    in_process = os.environ.get("FANFS_RUN", "").strip() or "1"
    if in_process not in ("0", "1"):
        raise UsageError(f"FANFS_RUN must be 1 (the tasks read in-process, under 'fanfs run') or 0 (through the "
                         f"mount), not {in_process!r}")
    shared = args.shared_local or os.environ.get(SHARED_VARIABLE, "").strip()
    stage = args.stage or os.environ.get("FANFS_STAGE", "").strip() or ("shared" if shared else "full")
    if stage not in ("full", "lazy", "shared"):
        raise UsageError(f"FANFS_STAGE must be full, lazy or shared, not {stage!r}")
    if stage == "shared" and not shared:
        raise UsageError(f"FANFS_STAGE=shared needs the node-local directory of the nodes' shared copies: "
                         f"{SHARED_VARIABLE}=DIR (made once by an administrator: install -d -m 1777 DIR)")
    keep_size()  # a bad FANFS_SHARED_KEEP: one line here, not one per node
    capacity = args.capacity
    if capacity is None and os.environ.get("FANFS_CAPACITY", "").strip():
        try:
            capacity = positive_size(os.environ["FANFS_CAPACITY"].strip())
        except argparse.ArgumentTypeError as err:
            raise UsageError(f"FANFS_CAPACITY: {err}") from None
    if capacity is not None and stage != "lazy":
        raise UsageError("a capacity (FANFS_CAPACITY, --capacity) is the budget of a cache filled as the nodes read: "
                         "set FANFS_STAGE=lazy too")
    settings = JobSettings(nodes=nodes, replicas=min(replicas, nodes), presentation=as_text(values),
                           cache_size=args.cache_size, mpi=os.environ.get("FANFS_MPI") or "pmi2", workers=workers,
                           mount=mount == "1" and not args.no_mount, stage=stage, capacity=capacity,
                           in_process=in_process == "1" and not args.no_run)
    for variable, value in ((LOCAL_VARIABLE, args.local), (MNT_VARIABLE, args.mountpoint),
                            (SHARED_VARIABLE, args.shared_local)):
        if value:
            os.environ[variable] = value  # the steps inherit it
    return run_job(args.store, command, settings)


def cmd_job_serve(args: argparse.Namespace) -> int:
    from ..cluster.job import serve_node
    from ..records import unresolved
    from ..serve.daemon import MountOptions
    from ..util.server import default_workers
    values = presentation_values(args)
    options = MountOptions(cache_size=args.cache_size, workers=args.workers or default_workers(),
                           presentation=known(values), prefetch=args.prefetch)
    check_stage_options(args)
    serve_node(os.path.abspath(args.store), options, replicas=args.replicas, auto=unresolved(values),  # once for the job
               mount_fuse=not args.no_mount, stage=args.stage or "full", capacity=args.capacity,
               shared=args.shared_local)
    return 0


def cmd_job_exec(args: argparse.Namespace) -> int:
    from ..cluster.job import exec_on_node
    exec_on_node(args.command[1:] if args.command[:1] == ["--"] else args.command)
    return 1  # not reached: the process is the command now


CLEANUP_HELP = """\
End and remove what a Slurm job left on this node, once it has ended: its fanfs mounts (dead ones too),
its fanfs daemons (a plain 'fanfs mount' in a batch script outlives its job under proctrack/linuxproc),
its directories fanfs-JOBID-NODE-* and its daemons' sockets. A job cleans up after itself; not when all
its processes are killed at once (the OOM killer). Nothing of another job or user is touched, a job still
running here is refused, and a second run finds nothing to do. What slurm/epilog.sh runs as root
(Epilog= in slurm.conf); an administrator, or the job's user, may run it by hand.

  fanfs cleanup --job 123456 --user alice --local /scratch/local

Exits 1 if something of the job could not be ended or removed (each said on a line): Slurm then drains
the node, for an administrator to look.
"""
DEFAULT_LOCAL = ("/tmp", "/dev/shm")


def cmd_cleanup(args: argparse.Namespace) -> int:
    import pwd
    import sys
    from ..cluster.cleanup import Job, clean
    job = args.job or os.environ.get("SLURM_JOB_ID", "")
    if not job:
        raise UsageError("which job? --job JOBID (an epilog has it in $SLURM_JOB_ID)")
    user = args.user or os.environ.get("SLURM_JOB_UID", "")
    if not user and os.getuid() == 0:
        raise UsageError("whose job? --user USER (an epilog has it in $SLURM_JOB_UID)")
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid if user else os.getuid()
    except KeyError:
        raise UsageError(f"--user {user}: no such user") from None
    if os.getuid() not in (0, uid):
        raise UsageError("only root may clean up another user's job")
    local = os.environ.get("FANFS_LOCAL", "")
    given = (*(args.local or ()), *([local] if local else []), *DEFAULT_LOCAL)
    bases = list(dict.fromkeys(os.path.abspath(path) for path in given))
    done = clean(Job(job, uid, args.node or os.environ.get("SLURMD_NODENAME") or None), bases)
    for line in done.done or ["nothing left on this node"]:
        print(f"fanfs cleanup: job {job}: {line}", flush=True)
    for line in done.problems:
        print(f"fanfs: error: job {job}: {line}", file=sys.stderr, flush=True)
    return 1 if done.problems else 0


SHARED_HELP = """\
A node's shared copies: one copy of a store per node, which every job on it reads (FANFS_STAGE=shared, or
'fanfs mount --stage shared'), in DIR ($FANFS_SHARED_LOCAL): a directory an administrator makes once on
every node, open to all and sticky (install -d -m 1777 DIR).  A copy goes with the last job that reads
it, unless FANFS_SHARED_KEEP keeps it; a job killed outright (SIGKILL, the OOM killer) leaves its copy
for the next job or for 'fanfs shared prune', which a Slurm epilog runs as root:

  fanfs shared list /local/fanfs-shared
  fanfs shared prune /local/fanfs-shared --keep 500G   # as root: every user's copies; else your own
"""


def cmd_shared_list(args: argparse.Namespace) -> int:
    from ..cache.sharedbase import copies
    from ..util.units import human_size
    from .args import print_json
    found = copies(_shared_dir(args))
    state = {fcntl.F_RDLCK: "in use", fcntl.F_WRLCK: "being staged", fcntl.F_UNLCK: "unused", None: "?"}
    rows = [{"path": c.path, "owner": _user(c.owner), "bytes": c.bytes, "state": state[c.lock]
             if c.presentation is not None or c.lock == fcntl.F_WRLCK else "incomplete",
             "presentation": c.presentation and c.presentation.describe()} for c in found]
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        print(f"{row['path']}  {row['owner']}  {human_size(row['bytes'])}  {row['state']}"
              + (f"  ({row['presentation']})" if row["presentation"] else ""))
    print(f"{len(rows)} shared copies, {human_size(sum(row['bytes'] for row in rows))}")
    return 0


def cmd_shared_prune(args: argparse.Namespace) -> int:
    from ..cache.sharedbase import keep_size, prune, shared_base
    for path in prune(shared_base(_shared_dir(args)), keep_size() if args.keep is None else args.keep):
        print(f"removed {path}")
    return 0


def _shared_dir(args: argparse.Namespace) -> str:
    from ..cache.sharedbase import SHARED_VARIABLE
    given = args.dir or os.environ.get(SHARED_VARIABLE, "").replace("{node}", os.environ.get("SLURMD_NODENAME", ""))
    if not given:
        raise UsageError(f"which directory? give it, or set {SHARED_VARIABLE}")
    if not os.path.isdir(given):
        raise UsageError(f"{given}: no such directory")
    return given


def _user(uid: int) -> str:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = command("cleanup", cmd_cleanup, "end and remove what an ended Slurm job left on this node (the epilog's)")
    p.description = CLEANUP_HELP
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--job", metavar="JOBID", help="the job ($SLURM_JOB_ID, as an epilog has it)")
    p.add_argument("--user", metavar="USER", help="its user, a name or a uid ($SLURM_JOB_UID, as an epilog has it; "
                   "default: you; root must say)")
    p.add_argument("--node", metavar="NODE", help="this node's Slurm name, for hosts that run several "
                   "($SLURMD_NODENAME; default: any node's directories of the job here)")
    p.add_argument("--local", action="append", metavar="DIR", help="a node-local directory where the job may have "
                   f"kept its directories (its FANFS_LOCAL; again for more; always: {', '.join(DEFAULT_LOCAL)} and "
                   "$FANFS_LOCAL)")
    shared = command("shared", cmd_shared_list, "list or prune a node's shared copies of stores")
    shared.description, shared.formatter_class = SHARED_HELP, argparse.RawDescriptionHelpFormatter
    actions = shared.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("list", help="each copy: its owner, size, and whether a job uses it")
    p.set_defaults(func=cmd_shared_list)
    p.add_argument("dir", nargs="?", help="the node's directory of shared copies ($FANFS_SHARED_LOCAL)")
    p.add_argument("--json", action="store_true", help="one object per copy")
    p = actions.add_parser("prune", help="remove the copies no job uses (yours; root: everyone's), beyond --keep")
    p.set_defaults(func=cmd_shared_prune)
    p.add_argument("dir", nargs="?", help="the node's directory of shared copies ($FANFS_SHARED_LOCAL)")
    p.add_argument("--keep", type=size, metavar="SIZE", help="keep unused copies while all take at most SIZE, the "
                   "newest staged first ($FANFS_SHARED_KEEP; default 0)")

    job = command("job", cmd_job_run, "run a training command on fanfs mounts across a Slurm job")
    job.description = job_help()
    job.formatter_class = argparse.RawDescriptionHelpFormatter
    steps = job.add_subparsers(dest="step", metavar="STEP", required=True)

    p = steps.add_parser("run", help="the whole job (what slurm/train.sbatch runs in its batch step)",
                         description=job.description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=cmd_job_run)
    p.add_argument("--replicas", type=positive, help="copies of each shard across the nodes ($FANFS_REPLICAS)")
    add_presentation_options(p, default=None, what=" (default: its FANFS_ variable above, else full)")
    p.add_argument("--local", metavar="DIR", help="node-local directory for the job's shards ($FANFS_LOCAL)")
    p.add_argument("--mountpoint", metavar="PATH", help="mount point on each node, {node} for its name ($FANFS_MNT)")
    p.add_argument("--cache-size", type=size, default="1G", help="each mount's cache for decoded blobs (default 1G)")
    p.add_argument("--workers", type=positive, metavar="N", help="serving processes of each node's mount "
                   "($FANFS_WORKERS; default: a quarter of the node's cores, 1 to 8)")
    p.add_argument("--no-mount", action="store_true", help="mount nothing: the tasks read in-process, "
                   "fsspec.filesystem('fanfs', job=True) (FANFS_MOUNT=0)")
    p.add_argument("--stage", choices=("full", "lazy", "shared"), help="full: copy each node's shards before "
                   "training; lazy: start at once, copy a blob when it is first read; shared: read the node's one copy "
                   "that every job on it shares ($FANFS_STAGE; default shared where FANFS_SHARED_LOCAL is set, else full)")
    p.add_argument("--shared-local", metavar="DIR", help="node-local directory of the nodes' shared copies, {node} for "
                   "the node's name ($FANFS_SHARED_LOCAL)")
    p.add_argument("--capacity", type=positive_size, metavar="SIZE", help="with --stage lazy: local disk each node's "
                   "cache may take; the rest is read through ($FANFS_CAPACITY; default: no limit)")
    p.add_argument("--no-run", action="store_true", help="run the training command as it is, not under 'fanfs run': "
                   "every read goes through the mount (FANFS_RUN=0)")
    p.add_argument("store", help="the store, on a file system every node sees")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command; '$FANFS_MNT' and "
                   "'${FANFS_MNT}' in it (quoted at submission) become the node's mount point ($FANFS_MNT_X stays)")

    p = steps.add_parser("serve", help="one node's part: stage, mount, serve peers, clean up (one task per node)")
    p.set_defaults(func=cmd_job_serve)
    p.add_argument("store", help="the store, on a file system every node sees")
    p.add_argument("--no-mount", action="store_true", help="serve peers and in-process readers, mount nothing")
    add_stage_options(p, stage="full")
    add_prefetch_option(p)
    p.add_argument("--replicas", type=positive, default=1, help="copies of each shard across the nodes (default 1)")
    add_presentation_options(p)
    p.add_argument("--cache-size", type=size, default="1G", help="the mount's cache for decoded blobs (default 1G)")
    p.add_argument("--workers", type=positive, default=None, metavar="N",
                   help="serving processes (default: a quarter of the node's cores, 1 to 8)")

    p = steps.add_parser("exec", help="one task of the training command, given its node's mount in $FANFS_MNT")
    p.set_defaults(func=cmd_job_exec)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command of the task, run with $FANFS_MNT set")
