"""Acting as another user of this host (nobody), for the tests of what another user can and cannot do."""

from __future__ import annotations

import subprocess
from pathlib import Path

RUN_AS_NOBODY = Path(__file__).resolve().parent / "run_as_nobody.py"
"""``python RUN_AS_NOBODY ARGS``: ``fanfs ARGS`` as nobody, its modules imported first as the caller."""


def as_nobody(*command: str) -> None:
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command], check=True)
