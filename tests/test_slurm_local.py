"""Issue 35: ``tools/slurm-local`` gives a user a one-host Slurm to try the README's ``sbatch -N 2`` line on: it
starts, runs a two-node job, and stops with nothing left running, not even a job still running at ``stop``.

Issue 39: it touches nothing else of the user's.  ``stop --dir D`` removed D whole though no cluster ever ran there,
and ``start`` took a user's directory (made it 0700) for ``stop`` to remove later; ``stop`` killed every process
holding the cluster's ``SLURM_CONF``, i.e. all the user's shell had started since ``eval "$(tools/slurm-local
start)"``.  One cluster runs here, its whole life in one module fixture; the directory tests need none."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from emuhost import alive
import slurm_local as local
from slurm_processes import CONF_VAR, find_processes, kill_all

REPO = Path(__file__).resolve().parent.parent
COMMAND = REPO / "tools" / "slurm-local"

pytestmark = pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                reason="needs Debian's slurmctld slurmd slurm-client munge (tools/setup --test)")


def slurm_local(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=120, check=check, env=env)


def cluster_processes(conf: str) -> list[int]:
    return find_processes(lambda env: env.get(CONF_VAR.encode()) == conf.encode())


def one_error_line(done: subprocess.CompletedProcess) -> bool:
    lines = done.stderr.strip().splitlines()
    return done.returncode == 1 and len(lines) == 1 and lines[0].startswith("slurm-local: error: ")


def short_temporary_dir() -> Path:
    """A directory with a short path (Slurm's step sockets live under the cluster's), private as mkdtemp makes it."""
    return Path(tempfile.mkdtemp(prefix="fsl-", dir="/tmp"))


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


@pytest.mark.parametrize(("content", "why"), [(["thesis.tex"], "is not empty"), ([], "is open to other users")],
                         ids=["not-empty", "empty-but-open"])
def test_start_refuses_a_directory_of_the_user_s_in_one_line(short_dir, content, why):
    """Issue 39: it made the user's directory 0700 and ran the cluster in it, for 'stop' to remove later.  An empty
    one it may have, if nobody else may enter it (as ``mktemp -d`` makes it): it is not made private behind the
    user's back."""
    for name in content:
        (short_dir / name).write_text("mine\n")
    short_dir.chmod(0o755)
    done = slurm_local("start", "-N", "1", "--dir", str(short_dir), check=False)
    try:
        assert one_error_line(done) and why in done.stderr, done.stderr
        assert sorted(os.listdir(short_dir)) == content and (short_dir.stat().st_mode & 0o777) == 0o755
    finally:
        if done.returncode == 0:                # a cluster runs there after all: end it
            slurm_local("stop", "--dir", str(short_dir), check=False)


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


@pytest.fixture(scope="module")
def life(tmp_path_factory):
    """A cluster's life as the docs tell it, and what was seen of it: the line to eval; a process the user's
    shell then starts (an editor, say), which holds SLURM_CONF; a two-node job; a job still running at ``stop``,
    run from that same shell."""
    work, short = tmp_path_factory.mktemp("slurm-local"), short_temporary_dir()
    seen = SimpleNamespace(base=short / "s", conf=None, env=None, user=None, supervisor=None)
    try:
        try:
            live(seen, work)
        finally:
            seen.stopped = slurm_local("stop", "--dir", str(seen.base), check=False, env=seen.env)
        yield seen
    finally:
        clean_up(seen)
        shutil.rmtree(short, ignore_errors=True)


def clean_up(seen: SimpleNamespace) -> None:
    """Whatever is left if ``stop`` failed (it once killed itself): the supervisor (its daemons follow it), all that
    holds the cluster's SLURM_CONF (this module's alone: the directory is its own), the user's process."""
    with contextlib.suppress(OSError):
        if seen.supervisor and os.fsencode(seen.base) in Path(f"/proc/{seen.supervisor}/cmdline").read_bytes():
            os.kill(seen.supervisor, signal.SIGKILL)
    if seen.conf:
        kill_all(lambda env: env.get(CONF_VAR.encode()) == seen.conf.encode())
    if seen.user:
        seen.user.kill()
        seen.user.wait()


def live(seen: SimpleNamespace, work: Path) -> None:
    """The part of the cluster's life before ``stop``, recorded in ``seen``."""
    seen.started = slurm_local("start", "-N", "2", "--dir", str(seen.base))
    (line,) = seen.started.stdout.splitlines()              # the one line to eval
    assert line.startswith(f"export {CONF_VAR}=")
    seen.conf = line.partition("=")[2]
    seen.env = env = {**os.environ, CONF_VAR: seen.conf}     # the user's shell after the eval
    seen.user = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    seen.supervisor = int((seen.base / "supervisor.pid").read_text())
    seen.again = slurm_local("start", "-N", "2", "--dir", str(seen.base), env=env)
    seen.status = slurm_local("status", "--dir", str(seen.base), check=False, env=env)
    job = work / "job.sh"
    job.write_text("#!/bin/bash\nsrun printenv SLURMD_NODENAME\n")
    try:
        seen.job = subprocess.run(["sbatch", "--wait", "-N", "2", "--output", str(work / "out.txt"), str(job)],
                                  env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:  # say why the job did not end (seen once in a full suite at load 3-4)
        why = subprocess.run(["scontrol", "show", "job"], env=env, capture_output=True, text=True, timeout=30)
        nodes = subprocess.run(["sinfo", "-N", "-l"], env=env, capture_output=True, text=True, timeout=30)
        logs = "".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]) + "\n"
                       for log in sorted((seen.base / "log").glob("slurm*.log")))
        raise AssertionError(f"the job did not end in 240 s:\n{why.stdout}\n{nodes.stdout}\n{logs}") from None
    seen.output = (work / "out.txt").read_text() if (work / "out.txt").exists() else ""
    # A job still running at stop: two tasks, and a process that left its step, which only the sweep ends.
    running = subprocess.run(["sbatch", "--parsable", "-N", "2", "--output", "/dev/null",
                              "--wrap", "(setsid sleep 700 &); srun sleep 600"],
                             env=env, check=True, capture_output=True, text=True, timeout=60).stdout.split(";")[0].strip()
    seen.tasks = tasks_of(running)
    seen.before = sorted(set(cluster_processes(seen.conf)) - {seen.user.pid})


def tasks_of(job: str) -> list[int]:
    """The running job's three ``sleep``, once they all run."""
    while len(sleeping := [pid for pid in find_processes(lambda env: env.get(b"SLURM_JOB_ID") == job.encode())
                           if program(pid).endswith(b"sleep")]) < 3:
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
def test_stop_ends_every_daemon_and_a_running_job_s_tasks_and_removes_its_directory(life):
    assert life.stopped.returncode == 0 and "stopped" in life.stopped.stderr, life.stopped.stderr
    assert life.tasks and set(life.tasks) <= set(life.before)
    assert not alive(life.supervisor)
    assert not [pid for pid in life.before if alive(pid)], "a daemon, slurmstepd or job task survived 'stop'"
    assert not life.base.exists()
    gone = slurm_local("status", "--dir", str(life.base), check=False)
    assert one_error_line(gone) and "not running" in gone.stderr
    again = slurm_local("stop", "--dir", str(life.base), check=False)
    assert again.returncode == 0 and again.stderr == "slurm-local: was not running\n"


@pytest.mark.slow
def test_stop_spares_what_the_user_s_shell_started_with_slurm_conf(life):
    """Issue 39: 'stop' SIGTERMed, then SIGKILLed, every process holding the cluster's SLURM_CONF: an editor
    started from the shell that ran the eval line, and ``stop`` run from that shell."""
    assert life.user.poll() is None, "the user's process was killed"
    assert cluster_processes(life.conf) == [life.user.pid]
