"""Issue 50's goal for shared datasets, under a real Slurm started by root (each job runs as the user who submits it):
fanfs-alice's array of 4 tasks and fanfs-bob's job of one store on one node at once, and a 2-node job of alice's
across it, read one staged copy per node (``FANFS_SHARED_LOCAL``, so ``FANFS_STAGE=shared``), each job exact; the copy
goes with the last job if that job's user made it, else with the epilog's ``fanfs shared prune`` (root); and after
``scancel``, SIGKILL of every job process or a node-local wipe, nothing is left but what the site's keep holds.

The cluster is this module's own (2 nodes of 8 CPUs: the session's have 4, fewer than these jobs at once).  The node's
disk is measured with the array staged per job (``FANFS_STAGE=full``) and shared."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fanfs_command import fanfs
from support.processes import kill_at_one_blow, remove_with_mounts
from support.slurm_jobs import SBATCH
from support.trees import make_spaced_tree

pytestmark = pytest.mark.slow  # a real Slurm, jobs of two users

TASK = Path(__file__).resolve().parent / "support" / "shared_task.py"
EPILOG = Path(__file__).resolve().parents[1] / "slurm" / "epilog.sh"


@pytest.fixture(scope="module")
def cluster(local_users):
    from slurm_cluster import slurm_cluster
    base = Path(tempfile.mkdtemp(prefix="fanfs-test-shared-slurm-", dir="/tmp"))
    try:
        base.chmod(0o755)
        with slurm_cluster(base, nodes=2, cpus_per_node=8, shared=True) as running:
            yield running
    finally:
        remove_with_mounts(base)


@pytest.fixture(scope="module")
def published(cluster):
    """A store a data manager published (open to all: 0755 from /tmp down), its source, and each node's directory of
    shared copies (``shared/{node}``, open to all and sticky, as an administrator makes it)."""
    top = cluster.base_dir / "data"
    src = make_spaced_tree(top / "src")
    fanfs("pack", src, top / "store", "--shard-size", "256K", "--quiet")
    for path in (top, *top.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    for node in cluster.nodes:
        (top / "shared" / node).mkdir(parents=True)
        (top / "shared" / node).chmod(0o1777)
    return src, top / "store", top / "shared"


class Jobs:
    """One scenario's jobs: their output directory, their go and end files (one end file per user), and what they
    say."""

    def __init__(self, cluster, published) -> None:
        self.cluster, (self.src, self.store, self.shared) = cluster, published
        self.dir = Path(tempfile.mkdtemp(prefix="jobs-", dir=cluster.base_dir))
        self.dir.chmod(0o777)
        self.go = self.dir / "go"
        self.ids: dict[str, str] = {}  # each job's tag: its user's name

    def submit(self, user, *options: str, tasks: int = 0, env: dict[str, str] | None = None) -> list[str]:
        """``sbatch OPTIONS slurm/train.sbatch STORE python shared_task.py ...`` as ``user`` (``tasks``: an array of
        so many); the jobs' tags (an array task's ``ARRAYID_TASK``)."""
        variables = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                     "PYTHONPATH": os.environ["PYTHONPATH"], "FANFS_SHARED_LOCAL": f"{self.shared}/{{node}}",
                     **(env or {})}
        array = [f"--array=0-{tasks - 1}", "-o", f"{self.dir}/%A_%a.out"] if tasks else ["-o", f"{self.dir}/%j.out"]
        first = self.cluster.submit(SBATCH, self.store, sys.executable, TASK, self.dir, "$FANFS_MNT", self.src,
                                    self.go, self.end(user), sbatch_options=[*options, *array], env=variables,
                                    user=user.pw_name)
        tags = [f"{first}_{task}" for task in range(tasks)] if tasks else [str(first)]
        self.ids.update({tag: user.pw_name for tag in tags})
        return tags

    def end(self, user) -> Path:
        return self.dir / f"end-{user.pw_name}"

    def cancel(self) -> bool:
        """Cancel what is still queued or running and wait for it (whether there was any): a failed test's jobs must
        not hold the nodes of the next test, which would find its own jobs pending."""
        left = sorted({tag.split("_")[0] for tag in self.ids if self.cluster.state(tag).state in {"PENDING", "RUNNING"}})
        if left:
            self.cluster.run("scancel", *left, check=False)
            for tag in self.ids:
                self.cluster.wait(tag, timeout=120)
        return bool(left)

    def ready(self, timeout: float = 180) -> None:
        """Until every job's task serves (the node staged and mounted)."""
        deadline = time.monotonic() + timeout
        while (waiting := [job for job in self.ids if not (self.dir / f"ready-{job}").exists()]):
            states = {job: self.cluster.state(job).state for job in waiting}
            assert time.monotonic() < deadline and not set(states.values()) - {"PENDING", "RUNNING"}, \
                (states, self.outputs())
            time.sleep(0.2)

    def finish(self, users, timeout: float = 180) -> dict[str, str]:
        """End ``users``' jobs (their end files) and wait for them; their final states."""
        for user in users:
            self.end(user).touch()
        return {job: self.cluster.wait(job, timeout=timeout).state for job, name in self.ids.items()
                if name in {user.pw_name for user in users}}

    def reports(self) -> dict[str, dict]:
        return {path.stem: json.loads(path.read_text()) for path in self.dir.glob("*.json")}

    def outputs(self) -> str:
        return "\n".join(f"== {path.name}\n{path.read_text(errors='replace')}" for path in sorted(self.dir.glob("*.out")))

    def copied(self) -> list[float]:
        """What each job's staging copied, in MiB (0: it read another job's copy)."""
        units = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
        return [float(number) * units[unit]
                for number, unit in re.findall(r"staged \d+ node\(s\).*: copied ([\d.]+) (\w+),", self.outputs())]


def node_dirs(cluster, node: str) -> list[Path]:
    """The jobs' own directories on a node (fanfs-JOBID-NODE-...)."""
    return sorted((cluster.base_dir / "tmp" / node).glob("fanfs-*"))


def disk(*paths: Path) -> int:
    """Bytes the files under ``paths`` take on disk (staged shards are sparse)."""
    return sum(os.lstat(os.path.join(top, name)).st_blocks * 512 for path in paths
               for top, _, names in os.walk(path) for name in names)


def copies(shared: Path, node: str) -> list[Path]:
    return sorted((shared / node).iterdir())


def epilog(shared: Path, node: str, keep: dict[str, str] | None = None) -> list[str]:
    """What slurm/epilog.sh, as root on the node, said it removed of the shared copies (no job uses them) once a job
    has ended there (one with nothing else left)."""
    env = {"FANFS": str(Path(sys.executable).parent / "fanfs"), "FANFS_SHARED_LOCAL": f"{shared}/{{node}}",
           "SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURMD_NODENAME": node, **(keep or {})}
    done = subprocess.run([EPILOG], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr, done
    return [line for line in done.stdout.splitlines() if line.startswith("removed ")]


@pytest.fixture
def new_jobs(cluster, published):
    """Makes a scenario's ``Jobs``; what any of them left queued or running is cancelled after the test."""
    made: list[Jobs] = []

    def make() -> Jobs:
        made.append(Jobs(cluster, published))
        return made[-1]

    yield make
    if any(jobs.cancel() for jobs in made):  # what they left, as the site's epilog would clean it
        for node in cluster.nodes:
            clean_after_kill(cluster, node)
            epilog(published[2], node)


def test_two_users_jobs_on_a_node_read_one_copy_staged_once(cluster, published, local_users, fuse_for_users, new_jobs):
    alice, bob = local_users
    src, store, shared = published
    per_job = new_jobs()  # before: the array staged once per task
    per_job.submit(alice, "-w", "n1", tasks=4, env={"FANFS_STAGE": "full"})
    per_job.ready()
    before = disk(*node_dirs(cluster, "n1"))
    per_job.go.touch()
    assert set(per_job.finish([alice]).values()) == {"COMPLETED"}, per_job.outputs()

    jobs = new_jobs()
    jobs.submit(alice, "-w", "n1", tasks=4)
    jobs.submit(bob, "-w", "n1")
    jobs.submit(alice, "-N", "2")
    jobs.ready()
    (copy,) = copies(shared, "n1")
    assert len(copies(shared, "n2")) == 1
    after = disk(copy, *node_dirs(cluster, "n1"))
    store_mib = disk(store / "shards") / 2**20
    print(f"\nnode n1's disk with alice's 4 array tasks: {before:,} bytes staged per job, {after:,} shared "
          f"(with bob's job and a 2-node job's node too); the store: {disk(store / 'shards'):,}")
    print("stage and mount times:", re.findall(r"\(([\d.]+ s) to stage and mount\)", jobs.outputs()))
    copied = jobs.copied()
    assert len(copied) == 6 and len([mib for mib in copied if mib]) <= 2, jobs.outputs()  # one staging per node
    assert abs(sum(copied) - 2 * store_mib) < 0.05 * store_mib, (copied, store_mib)
    assert after < 1.5 * store_mib * 2**20 < before / 2
    jobs.go.touch()
    owner = copy.stat().st_uid
    first, last = (bob, alice) if owner == alice.pw_uid else (alice, bob)
    deadline = time.monotonic() + 180
    while len(jobs.reports()) < len(jobs.ids):
        assert time.monotonic() < deadline, jobs.outputs()
        time.sleep(0.2)
    for report in jobs.reports().values():
        assert report["files"] == 120 and not report["mismatches"], report
        (node_copy,) = copies(shared, report["node"])
        assert report["shared_copy"] == {"directory": str(node_copy), "owner": node_copy.stat().st_uid,
                                         "spliced": report["uid"] == node_copy.stat().st_uid}, report
    assert set(jobs.finish([first]).values()) == {"COMPLETED"}, jobs.outputs()
    assert copies(shared, "n1") == [copy], "the copy's maker still reads it"
    assert set(jobs.finish([last]).values()) == {"COMPLETED"}, jobs.outputs()
    assert copies(shared, "n1") == copies(shared, "n2") == [], "gone with the last job, whose user made them"
    assert not node_dirs(cluster, "n1") and not node_dirs(cluster, "n2")


def job_processes(tags: list[str]) -> list[int]:
    """The processes of these jobs (an array task's carry its array's id and its task's), but Slurm's own."""
    found = []
    marks = [tag.split("_") for tag in tags]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"slurmstepd" in command:
            continue
        if any({f"SLURM_JOB_ID={mark[0]}".encode()} <= env if len(mark) == 1 else
               {f"SLURM_ARRAY_JOB_ID={mark[0]}".encode(), f"SLURM_ARRAY_TASK_ID={mark[1]}".encode()} <= env
               for mark in marks):
            found.append(int(pid))
    return found


def clean_after_kill(cluster, node: str) -> None:
    """What a job killed outright left besides its shared copy (its dead mount, its directory): the epilog's other
    half, not this module's concern (docs/admin.rst)."""
    with open("/proc/mounts") as f:
        dead = [line.split()[1] for line in f if f"/tmp/{node}/fanfs-" in line]
    for mountpoint in dead:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
    for path in node_dirs(cluster, node):
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("end", ["scancel", "sigkill", "wipe", "keep"])
def test_nothing_is_left_but_what_the_site_keeps(cluster, published, local_users, fuse_for_users, new_jobs, end):
    """Two tasks of alice's array and bob's job on n1, one copy: ended by ``scancel`` (SIGTERM to every process: each
    lease goes, the last one's user removes the copy if it made it, else the epilog does), by SIGKILL of every job
    process (every lease goes with its process; the copy is left unused for the epilog), after a wipe of the node's
    disk under the running jobs (they read on, exact, from the shared store, and nothing is left), or normally with
    the site keeping unused copies up to a size (``FANFS_SHARED_KEEP``: it stays, unused, until a prune without it)."""
    alice, bob = local_users
    src, store, shared = published
    jobs = new_jobs()
    keep = {"FANFS_SHARED_KEEP": "1G"} if end == "keep" else {}
    tags = [*jobs.submit(alice, "-w", "n1", tasks=2, env=keep), *jobs.submit(bob, "-w", "n1", env=keep)]
    jobs.ready()
    (copy,) = copies(shared, "n1")
    if end == "scancel":
        cluster.run("scancel", *(tag.split("_")[0] for tag in tags))
        assert {cluster.wait(tag).state for tag in tags} == {"CANCELLED"}
        assert epilog(shared, "n1") in ([], [f"removed {copy}"])
    elif end == "sigkill":
        kill_at_one_blow(lambda: job_processes(tags))
        assert {cluster.wait(tag).state for tag in tags} <= {"FAILED", "CANCELLED", "COMPLETED"}
        clean_after_kill(cluster, "n1")
        listed = json.loads(fanfs("shared", "list", shared / "n1", "--json").stdout)
        assert [entry["state"] for entry in listed] == ["unused"], "every lease went with its process"
        assert epilog(shared, "n1") == [f"removed {copy}"]
    else:
        if end == "wipe":
            shutil.rmtree(copy)
        jobs.go.touch()
        assert set(jobs.finish([alice, bob]).values()) == {"COMPLETED"}, jobs.outputs()
        assert all(report["files"] == 120 and not report["mismatches"] for report in jobs.reports().values())
        if end == "keep":  # the site's epilog prunes within its keep: the copy stays for the next job
            assert copies(shared, "n1") == [copy]
            assert epilog(shared, "n1", keep) == []
            assert fanfs("shared", "prune", shared / "n1", "--keep", "0").stdout.splitlines() == [f"removed {copy}"]
        assert epilog(shared, "n1") == []
    assert copies(shared, "n1") == [] and not node_dirs(cluster, "n1")
    with open("/proc/mounts") as f:
        assert not [line for line in f if str(cluster.base_dir) in line]
