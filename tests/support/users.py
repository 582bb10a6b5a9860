"""Two real users of this host, fanfs-alice and fanfs-bob, for the tests of what several users do at once (their
jobs on the session's shared Slurm: ``slurm.submit(..., user="fanfs-alice")``, tools/slurm_client.py).

Made once, idempotently, and left in place, harmless: system accounts with no password, no login shell and no home
directory (``/nonexistent``), in no group but their own, owning nothing once the tests are done.  Each may search
(not list) the directories on the way to this interpreter, its virtual environment and this checkout where other
users may not (an ACL entry naming them: pyenv's Python lives under /root here), and nothing more."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

USERS = ("fanfs-alice", "fanfs-bob")
REPO = Path(__file__).resolve().parents[2]
ATTEMPTS = 50
"""useradd calls while another one (a concurrent session's) holds /etc/passwd's lock."""


def local_users() -> list[pwd.struct_passwd]:
    """USERS (made if missing: root only), each able to run this interpreter and import this checkout's fanfs."""
    users = [_user(name) for name in USERS]
    closed = sorted({directory for path in (Path(sys.executable).resolve(), Path(sys.prefix), REPO)
                     for directory in (*path.parents, path)
                     if directory.is_dir() and not directory.stat().st_mode & stat.S_IXOTH})
    if closed:
        entries = ",".join(f"u:{user.pw_name}:x" for user in users)
        subprocess.run(["setfacl", "-m", entries, *map(str, closed)], check=True, capture_output=True)
    return users


def _user(name: str) -> pwd.struct_passwd:
    for _ in range(ATTEMPTS):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", name], capture_output=True)
            time.sleep(0.1)
    raise RuntimeError(f"could not make the test user {name} (useradd failed {ATTEMPTS} times)")


def imports_fanfs(user: pwd.struct_passwd) -> subprocess.CompletedProcess:
    """This interpreter importing fanfs as ``user``, from the checkout (PYTHONPATH): what their jobs need."""
    return subprocess.run([sys.executable, "-c", "import fanfs; print(fanfs.__file__)"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}, cwd="/", user=user.pw_uid,
                          group=user.pw_gid, extra_groups=[], timeout=60)
