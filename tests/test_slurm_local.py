"""Issue 35: ``tools/slurm-local`` gives a user a one-host Slurm to try the README's ``sbatch -N 2`` line on: it
starts, runs a two-node job, and stops with nothing left running, not even a job still running at ``stop``.

Issue 39: it touches nothing else of the user's.  ``stop --dir D`` removed D whole though no cluster ever ran there,
and ``start`` took a user's directory (made it 0700) for ``stop`` to remove later; ``stop`` killed every process
holding the cluster's ``SLURM_CONF``, i.e. all the user's shell had started since ``eval "$(tools/slurm-local
start)"``.

Issue 49: ``stop`` removed all it found in a marked directory, a job's output written there and a user's notes
included, and a copy of a cluster's directory was a cluster (``cp -a``: "was not running", then the copy went);
root's ``start`` killed every process of the host whose environment named a dead owner, whoever's.  Issue 50: root's
cluster is every user's, each job running as its user; ``--help`` printed reStructuredText.

One cluster runs here, its whole life in one module fixture; the directory tests need none."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from emuhost import alive
import slurm_local as local
from slurm_config import CONF_VAR, DAEMON_TREES, MADE_DIRS, MADE_FILES, OWNER_VAR
from slurm_processes import find_processes, kill_all, kill_stale_clusters

REPO = Path(__file__).resolve().parent.parent
COMMAND = REPO / "tools" / "slurm-local"

pytestmark = pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                reason="needs Debian's slurmctld slurmd slurm-client munge (tools/setup --test)")


def slurm_local(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=120, check=check, env=env)


EVERY_USER = range(2 ** 32)
"""Every uid: whose processes a test looks at (the tools kill those of the cluster's users alone)."""


def cluster_processes(conf: str) -> list[int]:
    return find_processes(lambda env: env.get(CONF_VAR.encode()) == conf.encode(), EVERY_USER)


def one_error_line(done: subprocess.CompletedProcess) -> bool:
    lines = done.stderr.strip().splitlines()
    return done.returncode == 1 and len(lines) == 1 and lines[0].startswith("slurm-local: error: ")


def short_temporary_dir() -> Path:
    """A directory with a short path (Slurm's step sockets live under the cluster's), private as mkdtemp makes it."""
    return Path(tempfile.mkdtemp(prefix="fsl-", dir="/tmp"))


def as_user(user) -> dict:
    """subprocess's arguments that run a command as ``user`` (a pwd entry)."""
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


@pytest.fixture
def short_dir():
    path = short_temporary_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_directory_too_deep_for_slurm_s_sockets_is_refused_in_one_line(tmp_path):
    """A step's socket path over 107 bytes failed every job's launch, the job held for ever (seen in the full suite,
    whose temporary directories are deeper): refused at start, with what to do."""
    deep = tmp_path / ("d" * 60)
    done = slurm_local("start", "-N", "2", "--dir", str(deep), check=False)
    assert one_error_line(done) and "give a shorter --dir" in done.stderr
    assert not deep.exists()


def test_stop_in_a_directory_start_never_made_removes_nothing(short_dir):
    """Issue 39: it removed the directory whole, the user's thesis with it, and said 'was not running'."""
    (short_dir / "thesis.tex").write_text("\\chapter{Results}\n")
    done = slurm_local("stop", "--dir", str(short_dir), check=False)
    assert (short_dir / "thesis.tex").read_text() == "\\chapter{Results}\n"
    assert one_error_line(done) and "nothing removed" in done.stderr, done.stderr


@pytest.mark.parametrize(("content", "mode", "why"), [(["thesis.tex"], 0o755, "is not empty"),
                                                      ([], 0o777, "is open to other users")],
                         ids=["not-empty", "empty-but-open"])
def test_start_refuses_a_directory_of_the_user_s_in_one_line(short_dir, content, mode, why):
    """Issue 39: it made the user's directory 0700 and ran the cluster in it, for 'stop' to remove later.  An empty
    one it may have, if no other user may write to it (nor enter it, for a user's own cluster: the next test): it is
    not made private behind the user's back."""
    for name in content:
        (short_dir / name).write_text("mine\n")
    short_dir.chmod(mode)
    done = slurm_local("start", "-N", "1", "--dir", str(short_dir), check=False)
    try:
        assert one_error_line(done) and why in done.stderr, done.stderr
        assert sorted(os.listdir(short_dir)) == content and (short_dir.stat().st_mode & 0o777) == mode
    finally:
        if done.returncode == 0:                # a cluster runs there after all: end it
            slurm_local("stop", "--dir", str(short_dir), check=False)


def test_a_user_s_own_cluster_refuses_a_directory_others_may_enter(short_dir, local_users):
    """Root's cluster is every user's, so its directory is theirs to enter; a user's own is theirs alone."""
    alice = local_users[0]
    short_dir.chmod(0o755)
    lent = short_dir / "lent"
    lent.mkdir(mode=0o755)
    os.chown(lent, alice.pw_uid, alice.pw_gid)
    done = subprocess.run([sys.executable, str(REPO / "tools" / "slurm_local.py"), "start", "-N", "1", "--dir",
                           str(lent)], capture_output=True, text=True, timeout=120, cwd="/", **as_user(alice),
                          env={"PATH": os.environ["PATH"]})
    assert one_error_line(done) and "is open to other users (mode 755): 'chmod 700' it" in done.stderr, done.stderr
    assert os.listdir(lent) == [] and (lent.stat().st_mode & 0o777) == 0o755


def test_stop_empties_a_directory_start_was_lent_and_removes_one_it_made(short_dir):
    """What ``start`` makes goes, an empty directory it was given stays (its contents go); no cluster needed."""
    lent, made = local.Cluster(short_dir / "lent"), local.Cluster(short_dir / "made")
    lent.base.mkdir(mode=0o700)
    for cluster in (lent, made):
        local.claim(cluster)
        cluster.conf.parent.mkdir()
        cluster.conf.write_text("# as the cluster writes it\n")
        local.stop(cluster)
    assert os.listdir(short_dir) == ["lent"] and os.listdir(lent.base) == []
    assert (lent.base.stat().st_mode & 0o777) == 0o700


def made_by_a_cluster(base: Path) -> None:
    """Write in ``base`` every file a cluster of one node makes there, by its names (tools/slurm_config.py and
    slurm_local.py)."""
    files = [pattern.replace("*", "1") for pattern in (*local.SUPERVISOR_FILES, *MADE_FILES)]
    files += [f"{tree}/n1/state-{i}" for tree in DAEMON_TREES for i in range(2)]
    for name in files:
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text("as the cluster writes it\n")
    for pattern in MADE_DIRS:
        (base / pattern.replace("*", "1")).mkdir(parents=True, exist_ok=True)


USERS_FILES = ["job.out", "log/job-7.out", "notes/todo.txt", "tmp/n1/results.txt"]
"""What a user writes in a cluster's directory: a job's output (``sbatch -o D/job.out``), a note, what a job left
in its node's $TMPDIR."""


@pytest.mark.parametrize("kind", ["made", "lent"])
def test_stop_removes_only_what_start_made_and_keeps_the_rest_marked(short_dir, capsys, kind):
    """Issue 49: it removed all it found in a marked directory.  What it keeps keeps the mark too: a later start
    takes the directory again, and a later stop removes it once the user's files are gone."""
    cluster = local.Cluster(short_dir / "d")
    if kind == "lent":
        cluster.base.mkdir(mode=0o700)
    local.claim(cluster)
    made_by_a_cluster(cluster.base)
    for name in USERS_FILES:
        (cluster.base / name).parent.mkdir(parents=True, exist_ok=True)
        (cluster.base / name).write_text("mine\n")
    local.stop(cluster)
    assert capsys.readouterr().err == (f"slurm-local: was not running; kept what start did not make in {cluster.base}: "
                                       "job.out, log/job-7.out, notes/todo.txt and 1 more\n")
    assert local.leaves(cluster.base) == USERS_FILES and cluster.mark() == kind
    assert all((cluster.base / name).read_text() == "mine\n" for name in USERS_FILES)
    for name in USERS_FILES:
        (cluster.base / name).unlink()
    shutil.rmtree(cluster.base / "notes")
    local.stop(cluster)
    assert capsys.readouterr().err == "slurm-local: was not running\n"
    assert local.leaves(short_dir) == ([] if kind == "made" else ["d"])     # the directory lent, empty


@pytest.mark.root("to mount a tmpfs")
def test_stop_keeps_a_mount_a_job_left_in_a_node_s_tmpdir_and_does_not_enter_it(short_dir, capsys):
    """A job that died mounted leaves its mount point in its node's $TMPDIR: stop names it, goes no further, and
    removes nothing through it."""
    cluster = local.Cluster(short_dir / "d")
    local.claim(cluster)
    made_by_a_cluster(cluster.base)
    mnt = cluster.base / "tmp" / "n1" / "fanfs-7-n1" / "mnt"
    mnt.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)], check=True)
    try:
        (mnt / "train").mkdir()
        (mnt / "train" / "0001.jpg").write_text("a store's file\n")
        local.stop(cluster)
        assert capsys.readouterr().err == \
            f"slurm-local: was not running; kept what start did not make in {cluster.base}: tmp/n1/fanfs-7-n1/mnt\n"
        assert (mnt / "train" / "0001.jpg").read_text() == "a store's file\n"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_copy_of_a_cluster_s_directory_is_no_cluster(short_dir):
    """Issue 49: ``cp -a`` of a cluster's directory copies its marker: 'stop' of the copy said "was not running",
    then removed the copy whole.  The marker names the directory it was written in."""
    cluster = local.Cluster(short_dir / "d")
    local.claim(cluster)
    made_by_a_cluster(cluster.base)
    (cluster.base / "job.out").write_text("mine\n")
    copy = short_dir / "copy"
    subprocess.run(["cp", "-a", str(cluster.base), str(copy)], check=True)
    before = local.leaves(copy)
    stopped = slurm_local("stop", "--dir", str(copy), check=False)
    assert one_error_line(stopped) and "nothing removed" in stopped.stderr, stopped.stderr
    started = slurm_local("start", "--dir", str(copy), check=False)
    assert one_error_line(started) and "is not empty" in started.stderr, started.stderr
    assert local.leaves(copy) == before and local.Cluster(copy).mark() is None and cluster.mark() == "made"


def test_help_is_plain_text_that_says_whose_jobs_run_as_whom():
    """Issue 50: ``--help`` printed the module's reStructuredText (double backquotes)."""
    help_text = slurm_local("--help").stdout
    text = " ".join(help_text.split())
    assert not [mark for mark in ("``", ":ref:", "**") if mark in text], text
    assert not [line for line in help_text.splitlines() if line.lstrip().startswith(".. ")], help_text
    for said in ("Started by root, it is every local user's", "each job runs as the user who submitted it",
                 "stop removes only what start made there, by name", "A copy of it is no cluster"):
        assert said in text, said


def absent_pid() -> int:
    """A pid no process of this namespace has: an owner long dead."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(top - 1, 1000, -1) if not Path(f"/proc/{pid}").exists())


def test_the_stale_cluster_sweep_kills_only_this_user_s_processes_of_this_pid_namespace(local_users):
    """Issue 49: root's ``start`` SIGKILLed every process of the host whose environment named an owner pid that did
    not run, whoever's: another user's (an environment is anyone's to write) and a container's (a pid of another
    namespace).  Root's own such process is what the sweep is for (a killed test runner's leftovers)."""
    bob, dead = local_users[1], str(absent_pid())
    marks = {"PATH": os.environ["PATH"], OWNER_VAR: dead, CONF_VAR: "/tmp/gone/etc/slurm.conf"}
    procs = {"bob's": subprocess.Popen(["sleep", "300"], env=marks, **as_user(bob)),
             "a container's": subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "env",
                                                f"{OWNER_VAR}={dead}", "sleep", "300"]),
             "root's": subprocess.Popen(["sleep", "300"], env=marks)}
    try:
        inside = started_inside(procs["a container's"].pid)
        kill_stale_clusters()
        assert procs["root's"].wait(timeout=30) == -signal.SIGTERM
        assert procs["bob's"].poll() is None and procs["a container's"].poll() is None and alive(inside)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def started_inside(unshare: int) -> int:
    """The pid (as this namespace sees it) of the ``sleep`` that ``unshare --fork`` started, once it runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for child in map(int, Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()):
                if program(child).endswith(b"sleep"):
                    return child
        time.sleep(0.05)
    raise AssertionError("unshare's sleep did not start in 60 s")


def test_waiting_for_a_job_s_tasks_ends():
    """Issue 49: ``tasks_of`` waited for ever for tasks that never ran."""
    with pytest.raises(AssertionError, match="0 of its 3 sleep processes"):
        tasks_of("0", 3, timeout=0.5)


@pytest.fixture(scope="module")
def life(local_users):
    """A cluster's life as the docs tell it, and what was seen of it: root's, hence every user's.  The line to eval;
    a process the user's shell then starts (an editor, say), which holds SLURM_CONF; a two-node job, its output
    written in the cluster's directory; jobs still running at ``stop``, one run from that same shell and one of
    fanfs-alice's; a process of fanfs-bob's, who ran no job there, with the cluster's marks in its environment."""
    short = short_temporary_dir()
    short.chmod(0o755)                                      # every user's cluster: theirs to reach
    seen = SimpleNamespace(base=short / "s", conf=None, env=None, user=None, forged=None, supervisor=None)
    try:
        try:
            live(seen, short, *local_users)
        finally:
            seen.stopped = slurm_local("stop", "--dir", str(seen.base), check=False, env=seen.env)
        yield seen
    finally:
        clean_up(seen)
        shutil.rmtree(short, ignore_errors=True)


def clean_up(seen: SimpleNamespace) -> None:
    """Whatever is left if ``stop`` failed (it once killed itself): the supervisor (its daemons follow it), all that
    holds the cluster's SLURM_CONF (this module's alone: the directory is its own), the users' processes."""
    with contextlib.suppress(OSError):
        if seen.supervisor and os.fsencode(seen.base) in Path(f"/proc/{seen.supervisor}/cmdline").read_bytes():
            os.kill(seen.supervisor, signal.SIGKILL)
    if seen.conf:
        kill_all(lambda env: env.get(CONF_VAR.encode()) == seen.conf.encode(), EVERY_USER)
    for proc in (seen.user, seen.forged):
        if proc:
            proc.kill()
            proc.wait()


def live(seen: SimpleNamespace, work: Path, alice, bob) -> None:
    """The part of the cluster's life before ``stop``, recorded in ``seen``."""
    seen.started = slurm_local("start", "-N", "2", "--dir", str(seen.base))
    (line,) = seen.started.stdout.splitlines()              # the one line to eval
    assert line.startswith(f"export {CONF_VAR}=")
    seen.conf = line.partition("=")[2]
    seen.env = env = {**os.environ, CONF_VAR: seen.conf}     # the user's shell after the eval
    seen.user = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    seen.supervisor = int((seen.base / "supervisor.pid").read_text())
    seen.forged = subprocess.Popen(["sleep", "300"], env={CONF_VAR: seen.conf, OWNER_VAR: str(seen.supervisor)},
                                   **as_user(bob))
    seen.again = slurm_local("start", "-N", "2", "--dir", str(seen.base), env=env)
    seen.status = slurm_local("status", "--dir", str(seen.base), check=False, env=env)
    job = work / "job.sh"
    job.write_text("#!/bin/bash\nsrun printenv SLURMD_NODENAME\n")
    output = seen.base / "out.txt"
    try:
        seen.job = subprocess.run(["sbatch", "--wait", "-N", "2", "--output", str(output), str(job)],
                                  env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:  # say why the job did not end (seen once in a full suite at load 3-4)
        why = subprocess.run(["scontrol", "show", "job"], env=env, capture_output=True, text=True, timeout=30)
        nodes = subprocess.run(["sinfo", "-N", "-l"], env=env, capture_output=True, text=True, timeout=30)
        logs = "".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]) + "\n"
                       for log in sorted((seen.base / "log").glob("slurm*.log")))
        raise AssertionError(f"the job did not end in 240 s:\n{why.stdout}\n{nodes.stdout}\n{logs}") from None
    seen.output = output.read_text() if output.exists() else ""
    # Jobs still running at stop: two tasks, and a process that left its step, which only the sweep ends.
    running = subprocess.run(["sbatch", "--parsable", "-N", "2", "--output", "/dev/null",
                              "--wrap", "(setsid sleep 700 &); srun sleep 600"],
                             env=env, check=True, capture_output=True, text=True, timeout=60).stdout.split(";")[0].strip()
    seen.alice, seen.alice_output = alice, work / "alice" / "out.txt"
    seen.alice_output.parent.mkdir(mode=0o700)
    os.chown(seen.alice_output.parent, alice.pw_uid, alice.pw_gid)
    alices = subprocess.run(["sbatch", "--parsable", "-N", "1", "--output", str(seen.alice_output),
                             "--wrap", "id -u; (setsid sleep 700 &); sleep 600"], cwd=seen.alice_output.parent,
                            env={"PATH": os.environ["PATH"], CONF_VAR: seen.conf}, **as_user(alice),
                            check=True, capture_output=True, text=True, timeout=60).stdout.split(";")[0].strip()
    seen.tasks = tasks_of(running, 3) + tasks_of(alices, 2)
    seen.before = sorted(set(cluster_processes(seen.conf)) - {seen.user.pid, seen.forged.pid})


def tasks_of(job: str, count: int, timeout: float = 120) -> list[int]:
    """The running job's ``count`` ``sleep`` processes, once they all run."""
    deadline = time.monotonic() + timeout
    while len(sleeping := [pid for pid in find_processes(lambda env: env.get(b"SLURM_JOB_ID") == job.encode(),
                                                         EVERY_USER) if program(pid).endswith(b"sleep")]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job}: {len(sleeping)} of its {count} sleep processes ran after {timeout} s")
        time.sleep(0.2)
    return sleeping


def program(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:                              # gone meanwhile
        return b""


@pytest.mark.slow
def test_start_gives_the_line_to_eval_and_runs_a_two_node_job(life):
    assert life.again.stdout == life.started.stdout, "a second start: same cluster"
    assert life.status.returncode == 0, life.status.stderr
    assert life.job.returncode == 0, life.job.stdout + life.job.stderr
    assert sorted(life.output.split()) == ["n1", "n2"]


@pytest.mark.slow
def test_root_s_cluster_runs_a_user_s_job_as_that_user(life):
    """Issue 50: every job ran as whoever started the cluster; another user could not even read its slurm.conf."""
    assert life.alice_output.read_text().splitlines()[0] == str(life.alice.pw_uid)  # then: CANCELLED, by stop


@pytest.mark.slow
def test_stop_ends_every_daemon_and_the_running_jobs_tasks_and_removes_what_start_made(life):
    """And only that: the job's output written in the cluster's directory stays (issue 49), with the mark, until
    the user removes it and stops again."""
    assert life.stopped.returncode == 0, life.stopped.stderr
    assert life.stopped.stderr == f"slurm-local: stopped; kept what start did not make in {life.base}: out.txt\n"
    assert len(life.tasks) == 5 and set(life.tasks) <= set(life.before)
    assert not alive(life.supervisor)
    assert not [pid for pid in life.before if alive(pid)], "a daemon, slurmstepd or job task survived 'stop'"
    assert sorted(os.listdir(life.base)) == [local.MARKER, "out.txt"]
    gone = slurm_local("status", "--dir", str(life.base), check=False)
    assert one_error_line(gone) and "not running" in gone.stderr
    again = slurm_local("stop", "--dir", str(life.base), check=False)
    assert again.returncode == 0 and again.stderr == \
        f"slurm-local: was not running; kept what start did not make in {life.base}: out.txt\n"
    (life.base / "out.txt").unlink()
    last = slurm_local("stop", "--dir", str(life.base), check=False)
    assert last.returncode == 0 and last.stderr == "slurm-local: was not running\n" and not life.base.exists()


@pytest.mark.slow
def test_stop_spares_what_the_user_s_shell_started_with_slurm_conf(life):
    """Issue 39: 'stop' SIGTERMed, then SIGKILLed, every process holding the cluster's SLURM_CONF: an editor
    started from the shell that ran the eval line, and ``stop`` run from that shell."""
    assert life.user.poll() is None, "the user's process was killed"
    assert sorted(cluster_processes(life.conf)) == sorted([life.user.pid, life.forged.pid])


@pytest.mark.slow
def test_root_s_stop_spares_another_user_s_process_bearing_the_cluster_s_marks(life):
    """Issue 49: root killed any process whose environment held the cluster's SLURM_CONF and its supervisor's pid,
    which any user can write into their own processes' environment: fanfs-bob's, who ran no job there, lives on
    (fanfs-alice's stray process, of her job, did not: the previous test)."""
    assert life.forged.poll() is None, "another user's process was killed"
