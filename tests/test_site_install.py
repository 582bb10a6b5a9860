"""Issue 50, major 5: a site install, as docs/admin.rst gives it, run block by block from the page itself: a wheel
built from a copy of the checkout, installed (non-editable, with the pip MPICH) into a shared prefix whose ``bin/``
holds ``fanfs`` alone, the module file, used by another user (fanfs-alice, tests/support/users.py): the node check,
a mount, ``fanfs run`` from a training environment of her own, a two-node Slurm job whose steps use the install's
MPI, and root inspecting her mount.  Nothing of the checkout is on her paths: what runs is the installed package.

Needs PyPI (pip installs the wheel's requirements into fresh environments, as a site's install does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from fanfs_command import force_unmount
from support.admin_page import admin_block
from support.slurm_jobs import TASK, reports

pytestmark = pytest.mark.slow  # pip installs from PyPI, a real Slurm

REPO = Path(__file__).resolve().parent.parent
MODULES_INIT = Path("/usr/share/modules/init/bash")
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
TRAIN = """\
import builtins, sys
data = sys.argv[sys.argv.index("--data") + 1]
with open(data + "/a.txt") as f:
    how = "in-process" if builtins.open.__module__ == "fanfs.inproc.hook" else "through the mount"
    print("read", f.read().strip(), how)
"""


def bash(script: str, user=None, env: dict[str, str] | None = None, cwd: Path | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    """``script`` run by bash, as root or as ``user`` (a pwd entry), with ``env`` and nothing else of ours."""
    ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=cwd or "/",
                          timeout=timeout, **ids)
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def site(local_users):
    """The prefix, installed by root as the page says (from a copy of the checkout: a build writes into its tree)."""
    if not MODULES_INIT.exists():
        pytest.skip("needs Environment Modules (Debian's environment-modules: tools/setup --test installs it)")
    work = Path(tempfile.mkdtemp(prefix="fanfs-test-site-", dir="/tmp"))
    work.chmod(0o755)
    try:
        shutil.copytree(REPO, work / "checkout", ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "_build"))
        prefix = work / "opt-fanfs"
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        bash(admin_block("site-install", **{"PREFIX=/opt/fanfs": f"PREFIX={prefix}",
                                            "CHECKOUT=~/fanfs": f"CHECKOUT={work / 'checkout'}"}), env=env)
        subprocess.run(["chmod", "-R", "a+rX", prefix], check=True)
        yield work, prefix
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def alice(site, local_users, fuse_for_users):
    """fanfs-alice's home (a directory of hers) and her environment: the base PATH, the module system, no PYTHONPATH."""
    work, prefix = site
    user = local_users[0]
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    os.chown(home, user.pw_uid, user.pw_gid)
    env = {"PATH": BASE_PATH, "HOME": str(home), "USER": user.pw_name, "FANFS_RUNTIME_DIR": str(home / "run"),
           "LANG": "C.UTF-8"}
    yield user, home, env


def test_the_install_is_the_wheel_s_and_its_bin_holds_fanfs_alone(site):
    work, prefix = site
    assert sorted(p.name for p in (prefix / "bin").iterdir()) == ["fanfs"]
    assert (prefix / "venv" / "bin" / "mpiexec").exists(), "the mpi extra's MPICH is in the environment, off PATH"
    done = subprocess.run([prefix / "venv" / "bin" / "python", "-c", "import fanfs; print(fanfs.__file__)"],
                          capture_output=True, text=True, env={"PATH": BASE_PATH}, cwd="/")
    assert done.stdout.startswith(str(prefix / "venv" / "lib")), done.stdout + done.stderr
    startup = list((prefix / "venv" / "lib").glob("python3*/site-packages/fanfs/inproc/startup/sitecustomize.py"))
    assert len(startup) == 1, "fanfs run's start-up file is in the wheel"
    assert len(list((prefix / "modulefiles" / "fanfs").iterdir())) == 1


def test_another_user_runs_the_site_install_through_its_module(site, alice, slurm):
    work, prefix = site
    user, home, env = alice
    module = f"source {MODULES_INIT}\n" + admin_block("module", **{"/opt/fanfs": str(prefix)})
    done = bash(module.replace("command -v mpiexec", "command -v mpiexec || echo 'no mpiexec'"), user, env)
    assert done.stdout.splitlines()[0].startswith("fanfs ") and str(prefix) not in done.stdout.splitlines()[1], \
        done.stdout
    loaded = f"source {MODULES_INIT}\nmodule use {prefix}/modulefiles\nmodule load fanfs\n"
    checked = bash(loaded + admin_block("node-check"), user, env).stdout
    assert "crw-rw-rw-" in checked and "-rwsr-xr-x" in checked and ", 0 mismatches," in checked, checked
    store, mnt = home / "store", home / "mnt"
    bash(loaded + f"mkdir {home}/src {mnt} && echo a > {home}/src/a.txt && fanfs pack {home}/src {store} --quiet && "
         f"fanfs mount {store} {mnt}", user, env)
    try:
        (home / "train.py").write_text(TRAIN)
        run = admin_block("training-env", **{"/opt/fanfs": str(prefix)})
        trained = bash(loaded + f"export FANFS_MNT={mnt}\n" + run, user, env, cwd=home)
        assert "read a in-process" in trained.stdout, trained.stdout + trained.stderr
        root_env = {"PATH": f"{prefix}/bin:{BASE_PATH}", "MNT": str(mnt), "FANFS_RUNTIME_DIR": str(home / "root-run")}
        inspected = bash(admin_block("inspect"), env=root_env)
        assert f"{mnt}  {user.pw_name} (uid {user.pw_uid})  {store}: daemon pid " in inspected.stdout, inspected.stdout
        assert f"unmounted {mnt}" in inspected.stdout
    finally:
        force_unmount(mnt)

    out = home / "out"
    out.mkdir()
    os.chown(out, user.pw_uid, user.pw_gid)
    job = slurm.submit(prefix / "slurm" / "train.sbatch", store, home / "train-env" / "bin" / "python", TASK, out,
                       "$FANFS_MNT", "--source", home / "src", user=user.pw_name, sbatch_options=["-N", "2"],
                       env={"PATH": f"{prefix}/bin:{BASE_PATH}", "PYTHONPATH": ""})
    result = slurm.wait(job, timeout=180)
    assert result == ("COMPLETED", 0, 0), slurm.output(job)
    got = reports(out)
    assert len(got) == 2 and all(r["files"] == 1 and not r["mismatches"] and r["run"] for r in got.values()), got
    assert "Traceback" not in slurm.output(job)
