"""Issue 50's goal: with slurm/epilog.sh as the nodes' epilog, nothing of a job is left on its nodes however it ends,
and nothing of another job is touched: two users' jobs (fanfs-alice's and fanfs-bob's, tests/support/users.py) on
one node at once, on a one-host Slurm that root started with ``tools/slurm-local start --epilog`` (each job runs as
its user, as on a real cluster).

* SIGKILL of every process of a job (what the OOM killer does): its nodes' mounts were left dead and their
  directories full of shards;
* a plain ``fanfs mount`` in a batch script: its detached daemon outlived the job (``proctrack/linuxproc``), and a
  node-local wipe after the job (a site's epilog removing the user's files) failed on its live mount;
* ``scancel``: the job cleans up itself, the epilog finds nothing.

After each: no mount, daemon, directory, socket or MPI segment of the job on any node."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from fanfs_command import fanfs
from slurm_client import FINAL_STATES, SlurmCluster
from slurm_config import CONF_VAR
from support.processes import kill_at_one_blow, mpi_segments, mpi_segments_left, remove_with_mounts
from support.slurm_jobs import SBATCH, TASK

pytestmark = pytest.mark.slow  # a real Slurm, jobs of two users

REPO = Path(__file__).resolve().parent.parent
SLURM_LOCAL = REPO / "tools" / "slurm-local"
NODES = ("n1", "n2")

EPILOG = """\
#!/bin/sh
# The site's node epilog on the test cluster: fanfs's, then a wipe of the node's local storage of the job's user where
# the test asks for one (a site's epilog removing what a user left in /tmp).
tmp={work}/slurm/tmp/$SLURMD_NODENAME
FANFS={work}/fanfs FANFS_LOCAL_DIRS=$tmp {repo}/slurm/epilog.sh >> {work}/epilog-$SLURM_JOB_ID-$SLURMD_NODENAME.log 2>&1
code=$?
if [ -e {work}/wipe-$SLURM_JOB_ID ]; then
    find "$tmp" -mindepth 1 -maxdepth 1 -user "$SLURM_JOB_UID" -exec rm -rf {{}} + 2>> {work}/wipe-$SLURM_JOB_ID.log
fi
exit $code
"""

PLAIN_MOUNT = """\
#!/bin/bash
# A user's own batch script: a plain 'fanfs mount' in the node's TMPDIR, a read, no unmount; then it waits for the
# test's word ($2) before it ends.
set -e
mnt=$TMPDIR/plain-$SLURM_JOB_ID
mkdir -p "$mnt"
fanfs mount "$1" "$mnt"
cat "$mnt/a.txt" > "$TMPDIR/read-$SLURM_JOB_ID"
for _ in $(seq 3000); do [ -e "$2" ] && break; sleep 0.1; done
"""


@pytest.fixture(scope="module")
def cluster(local_users):
    """Root's tools/slurm-local, two nodes, slurm/epilog.sh as the epilog (in the wrapper above); stopped at the end."""
    work = Path(tempfile.mkdtemp(prefix="fanfs-epi-", dir="/tmp"))
    work.chmod(0o755)
    (work / "fanfs").write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -c 'from fanfs.cli import entry; "
                                "entry()' \"$@\"\n")
    (work / "epilog.sh").write_text(EPILOG.format(work=work, repo=REPO))
    for script in ("fanfs", "epilog.sh"):
        (work / script).chmod(0o755)
    (work / "slurm").mkdir(mode=0o755)
    fuse = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", fuse | 0o666)  # as distributions ship it (slurm/prolog.sh does it on a node that differs)
    started = subprocess.run([SLURM_LOCAL, "start", "-N", str(len(NODES)), "--dir", work / "slurm", "--epilog",
                              work / "epilog.sh"], capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stderr
        conf = started.stdout.strip().removeprefix(f"export {CONF_VAR}=")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update({CONF_VAR: conf, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        handle = SlurmCluster(work / "slurm", list(NODES), Path(conf), env, work / "slurm" / "jobs")
        store = work / "store"
        (work / "src" / "d").mkdir(parents=True)
        (work / "src" / "a.txt").write_text("a\n")
        for i in range(40):
            (work / "src" / "d" / f"f{i}.bin").write_bytes(os.urandom(i * 900))
        fanfs("pack", work / "src", store, "--shard-size", "64K", "--quiet")
        subprocess.run(["chmod", "-R", "a+rX", work / "src", store], check=True)
        yield handle, work
    finally:
        subprocess.run([SLURM_LOCAL, "stop", "--dir", work / "slurm"], capture_output=True, timeout=120)
        remove_with_mounts(work)
        os.chmod("/dev/fuse", fuse)


def out_dir(cluster: SlurmCluster, user, name: str) -> Path:
    path = cluster.user_dir(user.pw_name) / name
    path.mkdir()
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def job_processes(job: int) -> list[int]:
    """The processes of a job (its SLURM_JOB_ID in their environment, its user's), Slurm's own slurmstepd aside, and
    root's: the epilog has the job's id too (a kill of the job's processes that went on into it killed the epilog)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}".encode() in env and not command.startswith(b"slurmstepd") and owner != 0:
            found.append(int(pid))
    return found


def left_of(job: int, user, work: Path) -> list[str]:
    """What a job of ``user`` left: its mounts, processes and directories on any node, and any socket of the user's
    in the nodes' local directories."""
    with open("/proc/self/mountinfo") as f:
        found = [line.split()[4] for line in f if f"fanfs@{job}:" in line or f"/fanfs-{job}-" in line]
    found += [f"pid {pid}" for pid in job_processes(job)]
    for node in NODES:
        tmp = work / "slurm" / "tmp" / node
        found += [str(p) for p in tmp.glob(f"fanfs-{job}-*")]
        for root, dirs, files in os.walk(tmp):
            found += [os.path.join(root, name) for name in files if name.endswith(".sock")
                      and os.lstat(os.path.join(root, name)).st_uid == user.pw_uid]
    return found


def owned_by(directory: Path, uid: int) -> list[Path]:
    """What ``uid`` owns in ``directory`` (not another user's mount point: root may not even look at it)."""
    found = []
    for path in directory.iterdir():
        try:
            if path.lstat().st_uid == uid:
                found.append(path)
        except PermissionError:
            continue
    return found


def nothing_left(job: int, user, work: Path) -> None:
    deadline = time.monotonic() + 30  # a final state comes once every node's epilog has run
    while (left := left_of(job, user, work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    logs = "".join(p.read_text() for p in sorted(work.glob(f"epilog-{job}-*.log")))
    assert not left, f"{left}\nepilog:\n{logs}"


def wait_for(condition, slurm: SlurmCluster, jobs: dict[str, int], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [job for job in jobs.values() if slurm.state(job).state in FINAL_STATES]
        assert not ended and time.monotonic() < deadline, {user: (slurm.state(job), slurm.output(job))
                                                           for user, job in jobs.items()}
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(cluster):
    """Whatever a test did, its jobs are cancelled after it: a failed test's running job would be found by the next
    one's checks (its socket, its processes) and fail it too."""
    yield
    slurm, _ = cluster
    left = slurm.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    if left:
        slurm.run("scancel", *left, check=False)
        for job in left:
            slurm.wait(int(job.split("_")[0]), timeout=120)


def test_a_job_killed_outright_leaves_nothing_and_the_other_user_s_job_runs_on(cluster, local_users):
    slurm, work = cluster
    alice, bob = local_users
    outs = {user.pw_name: out_dir(slurm, user, f"out-{uuid.uuid4().hex[:8]}") for user in local_users}
    before = mpi_segments()
    jobs = {}
    for user, nodes in ((alice, 2), (bob, 1)):
        jobs[user.pw_name] = slurm.submit(SBATCH, work / "store", sys.executable, TASK, outs[user.pw_name],
                                          "$FANFS_MNT", "--source", work / "src", "--sleep", "600", user=user.pw_name,
                                          sbatch_options=["-N", str(nodes), "-w", ",".join(NODES[:nodes])],
                                          env={"PATH": slurm.env["PATH"]})
    wait_for(lambda: len(list(outs["fanfs-alice"].glob("*.json"))) == 2 and len(list(outs["fanfs-bob"].glob("*.json"))),
             slurm, jobs)
    killed = jobs["fanfs-alice"]
    kill_at_one_blow(lambda: job_processes(killed))  # every process of alice's job
    assert slurm.wait(killed, timeout=120).state in ("FAILED", "CANCELLED", "OUT_OF_MEMORY")
    nothing_left(killed, alice, work)
    for node in NODES:  # the epilog removed what the job left (its mount, unless its rank lived to detach it)
        epilog = (work / f"epilog-{killed}-{node}.log").read_text()
        assert f"removed {work}/slurm/tmp/{node}/fanfs-{killed}-{node}-" in epilog, epilog
    assert mpi_segments_left(before, hosts=2) == []
    bob_job = jobs["fanfs-bob"]
    assert slurm.state(bob_job).state == "RUNNING"
    (mnt,) = [line.split()[4] for line in open("/proc/self/mountinfo") if f"fanfs@{bob_job}:" in line]
    assert subprocess.run(["cat", f"{mnt}/a.txt"], capture_output=True, text=True, user=bob.pw_uid, group=bob.pw_gid,
                          extra_groups=[]).stdout == "a\n", "bob's job is untouched"
    slurm.cancel(bob_job)
    assert slurm.wait(bob_job, timeout=120).state == "CANCELLED"
    nothing_left(bob_job, bob, work)
    # the job cleaned up itself (test_slurm's scancel test shows it), or, on a machine too busy for it to within
    # KillWait, the epilog did: of bob's job only
    said = (work / f"epilog-{bob_job}-n1.log").read_text().splitlines()
    own = f"fanfs cleanup: job {bob_job}: removed {work}/slurm/tmp/n1/fanfs-{bob_job}-n1-"
    assert said == [f"fanfs cleanup: job {bob_job}: nothing left on this node"] or \
        all(line.startswith(own) for line in said), said


def test_a_plain_mount_in_a_batch_script_and_a_wipe_leave_nothing(cluster, local_users):
    slurm, work = cluster
    alice, bob = local_users
    script = work / f"plain-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(PLAIN_MOUNT)
    script.chmod(0o755)
    go = {user.pw_name: work / f"go-{uuid.uuid4().hex}" for user in local_users}
    jobs = {user.pw_name: slurm.submit(script, work / "store", go[user.pw_name], user=user.pw_name,
                                       sbatch_options=["-w", "n1"], env={"PATH": slurm.env["PATH"]})
            for user in local_users}
    (work / f"wipe-{jobs['fanfs-alice']}").touch()  # alice's node-local files are wiped after her job
    tmp = work / "slurm" / "tmp" / "n1"
    wait_for(lambda: all((tmp / f"read-{job}").exists() for job in jobs.values()), slurm, jobs)
    slurm.cancel(jobs["fanfs-alice"])  # the batch shell goes; its mount's detached daemon would live on
    assert slurm.wait(jobs["fanfs-alice"], timeout=120).state == "CANCELLED"
    nothing_left(jobs["fanfs-alice"], alice, work)
    assert not owned_by(tmp, alice.pw_uid), "the wipe removed all of alice's"
    assert subprocess.run(["cat", tmp / f"plain-{jobs['fanfs-bob']}" / "a.txt"], capture_output=True, text=True,
                          user=bob.pw_uid, group=bob.pw_gid, extra_groups=[]).stdout == "a\n", "bob's mount serves on"
    go["fanfs-bob"].touch()  # bob's job ends by itself, its mount still mounted
    assert slurm.wait(jobs["fanfs-bob"], timeout=120) == ("COMPLETED", 0, 0)
    nothing_left(jobs["fanfs-bob"], bob, work)
    assert f"unmounted {tmp}/plain-{jobs['fanfs-bob']}" in (work / f"epilog-{jobs['fanfs-bob']}-n1.log").read_text()
