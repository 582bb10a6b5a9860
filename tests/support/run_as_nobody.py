"""``fanfs ARGS`` run as the user nobody: the modules a mount needs are imported first (as root: the
interpreter's own files may be unreadable to nobody), then the process drops to nobody's uid and gid."""

import os
import pwd
import sys

import fanfs.cache.share  # noqa: F401
import fanfs.cli.demo  # noqa: F401
import fanfs.cli.serve  # noqa: F401
import fanfs.serve.daemon  # noqa: F401
import fanfs.serve.fusefs  # noqa: F401
import fanfs.store  # noqa: F401
import fanfs.tune.fidelity  # noqa: F401
from fanfs.cli.main import main

nobody = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)
sys.exit(main(sys.argv[1:]))
