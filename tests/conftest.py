"""Shared fixtures: real FUSE mounts, always unmounted; a private runtime directory; the session's real Slurm.

Helpers that are not tests live in ``tests/support/`` (a package) and, when the benchmarks use them
too, in ``tools/support/`` (``fanfs_command``: the ``fanfs`` command and mounts; ``photo_samples``,
``float_samples``, ``photo_folder``); the tests also use ``tools/`` (the one-host Slurm), ``tools/emulated/``
(the emulated cluster) and ``tools/bench/`` (a benchmark's helpers): all are put on ``sys.path`` here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TOOLS = TESTS.parent / "tools"
sys.path[:0] = [str(TESTS), str(TOOLS), *(str(TOOLS / folder) for folder in ("support", "emulated", "bench"))]

from fanfs_command import fanfs, mounted  # noqa: E402
from support.trees import make_spaced_tree  # noqa: E402

SLURM_MODULES = {"test_slurm", "test_slurm_pack", "test_slurm_users", "test_time_limit", "test_slurm_local", "test_epilog",
                 "test_site_install", "test_slurm_shared"}
"""The modules that share the session's Slurm cluster and its time-limited job, and those whose own one-host Slurm
then never runs beside it (a two-node job timed out at 120 s while both ran at load 3-4)."""
HEAVY_MODULES = tuple(f"tests/test_{name}.py" for name in ("select", "tiers", "format_fixtures", "cluster", "scan_presets",
                                                          "float_records", "switch_race", "lazy_cluster"))
"""The modules of most test time (pytest --durations, 4 workers, Nov 2026), in that order: started first."""


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (setup.cfg's ``-n 4``) with the Slurm modules as one file: a module runs whole on
    one worker, so its module-scoped stores are packed once, and the Slurm modules share one worker, one
    cluster and one time-limited job, which starts first (the longest unit, and its minute must pass); then the
    heaviest modules, so that no long one starts last while the other workers have nothing left."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "slurm" if Path(module).stem in SLURM_MODULES else module

        def _assign_work_unit(self, node) -> None:
            for unit in (*reversed(HEAVY_MODULES), "slurm"):
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``in_process_too`` that mounts runs twice: reading through the mount, and in-process as under
    ``fanfs run`` (issue 48: every read test of the mount also runs through the fast path); but a test marked
    ``mount_only``, whose checks are of how the daemon serves (its counters, its requests, its cache's accounting),
    which reads in-process never reach.  The in-process runs are slow (the quick subset keeps the mount's)."""
    definition = metafunc.definition
    if "mount" in metafunc.fixturenames and definition.get_closest_marker("in_process_too") \
            and not definition.get_closest_marker("mount_only"):
        metafunc.parametrize("reading", ["mount", pytest.param("in-process", marks=pytest.mark.slow)], indirect=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``root`` (it builds a disk, mounts a tmpfs, acts as another user...) is skipped for a plain user,
    saying what it needs root for (tools/mutants.toml says which promises only such tests guard)."""
    marker = item.get_closest_marker("root")
    if marker is not None and os.geteuid() != 0:
        pytest.skip("needs root" + (f" {marker.args[0]}" if marker.args else ""))


@pytest.fixture
def reading(request: pytest.FixtureRequest) -> str:
    """How the test's reads of its mounts are made: "mount", or "in-process" (fanfs run's fast path)."""
    return getattr(request, "param", "mount")


@pytest.fixture
def mount(tmp_path: Path, reading: str):
    """``with mount(store, *options) as mnt:`` — a fresh mount point under tmp_path.  In-process (``reading``), the
    test's own reads of it go through fanfs run's fast path, and so do those of the Python processes it starts."""
    count = 0

    @contextlib.contextmanager
    def _mount(store: Path, *options: str):
        nonlocal count
        count += 1
        with mounted(store, tmp_path / f"mnt{count}", *options) as mnt:
            if reading != "in-process":
                yield mnt
                return
            with _in_process(mnt):
                yield mnt

    return _mount


@contextlib.contextmanager
def _in_process(mnt: Path):
    """Reads of ``mnt`` made in-process, in this process and the Python processes it starts, as ``fanfs run`` makes
    them."""
    from fanfs.cli.run import STARTUP
    from fanfs.inproc import hook
    saved = {name: os.environ.get(name) for name in (hook.MOUNTS_VARIABLE, "PYTHONPATH")}
    os.environ[hook.MOUNTS_VARIABLE] = json.dumps([os.path.realpath(mnt)])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [STARTUP, saved["PYTHONPATH"]]))
    hook.install([os.path.realpath(mnt)])
    try:
        yield
    finally:
        hook.uninstall()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def fuse_for_users():
    """/dev/fuse open to every user, as a distribution ships it (a container may make it root's alone)."""
    mode = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", mode | 0o666)
    yield
    os.chmod("/dev/fuse", mode)


@pytest.fixture(scope="session")
def runtime_dir(tmp_path_factory):
    """Set up before any other session fixture and so torn down after all of them: then nothing of this
    session (this xdist worker's, under ``-n``) may be left, no mount and no process under its directory."""
    path = tmp_path_factory.mktemp("runtime")
    os.environ["FANFS_RUNTIME_DIR"] = str(path)
    yield path
    base = f"{tmp_path_factory.getbasetemp()}/"
    deadline = time.monotonic() + 10  # a daemon may still be on its way out after its unmount
    while (left := _left_under(base)) and time.monotonic() < deadline:
        time.sleep(0.2)
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"the session left these behind: {left}"


def _left_under(base: str) -> list[str]:
    """Mounts under ``base`` and processes whose command line names a path under it."""
    with open("/proc/mounts") as f:
        left = [line.split()[1] for line in f if base in line]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if base in cmd and int(pid) != os.getpid():
            left.append(f"pid {pid}: {cmd}")
    return left


@pytest.fixture(autouse=True)
def _isolated_runtime(runtime_dir):
    """Control sockets and logs of test mounts live in a private directory."""
    yield


# --- a real Slurm (tools/slurm_cluster.py), for the job script's tests -----------------------------

@pytest.fixture(scope="session")
def slurm():
    """The session's cluster: started once (well under a second), always shut down with every job.  As root it is
    every local user's, as a real Slurm is (``slurm.submit(..., user="fanfs-alice")``: the job runs as that user),
    in a directory of /tmp every user may reach, removed at the end."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("needs Debian's slurmctld slurmd slurm-client munge (tools/setup --test installs them)")
    from slurm_cluster import slurm_cluster
    from support.processes import remove_with_mounts
    from support.slurm_jobs import NODES
    shared = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="fanfs-test-slurm-", dir="/tmp"))
    try:
        base.chmod(0o755 if shared else 0o700)
        with slurm_cluster(base, nodes=NODES, shared=shared) as cluster:
            yield cluster
    finally:
        remove_with_mounts(base)


@pytest.fixture(scope="session")
def local_users():
    """fanfs-alice and fanfs-bob, real users of this host that may run this interpreter and checkout
    (tests/support/users.py: made once, left in place, harmless)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setfacl") is None:
        pytest.skip("needs root, useradd and setfacl (tools/setup --test installs acl)")
    from support.users import imports_fanfs, local_users
    users = local_users()
    for user in users:
        done = imports_fanfs(user)
        assert done.returncode == 0, f"{user.pw_name} cannot run {sys.executable} with this checkout: {done.stderr}"
    return users


@pytest.fixture(scope="session")
def slurm_plain(tmp_path_factory) -> tuple[Path, Path]:
    """A source tree (names with spaces, sizes from 0 to ~200 KB) and its store."""
    root = tmp_path_factory.mktemp("plain")
    src = make_spaced_tree(root / "src")
    fanfs("pack", src, root / "store", "--shard-size", "256K", "--quiet")
    return src, root / "store"


@pytest.fixture(scope="session")
def time_limited_job(slurm, slurm_plain, tmp_path_factory) -> int:
    """A 3-node job whose training sleeps past ``--time=1``: Slurm checks limits every 30 s, so it ends
    60-90 s after its start.  test_slurm.py asks for it first (it then runs while the other tests do);
    test_time_limit.py, later in the session, looks at how it ended."""
    from support.slurm_jobs import submit
    return submit(slurm, slurm_plain[1], tmp_path_factory.mktemp("limited"), "--sleep", "600", options=("--time=1",))
