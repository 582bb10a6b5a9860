"""Issue 50: a one-host Slurm started by root runs each job as the user who submitted it, as a real Slurm does (its
daemons as root): the session's cluster (tests/conftest.py) takes jobs of two real users of this host,
fanfs-alice and fanfs-bob (tests/support/users.py), both on one node at once, each with that node's own
``$TMPDIR`` and its own directories there.  Until then every job ran as whoever started the cluster: another
user could not even read its slurm.conf."""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = pytest.mark.slow  # a real Slurm

JOB = """\
#!/bin/bash
# As its user: who it runs as, its TMPDIR and a directory of its own there; then it waits for the test's word
# (at most 2 minutes), so that the test sees both users' jobs run at once.
id -u
echo "$TMPDIR"
mkdir "$TMPDIR/mine-$SLURM_JOB_ID"
for _ in $(seq 1200); do [ -e "$1" ] && break; sleep 0.1; done
rmdir "$TMPDIR/mine-$SLURM_JOB_ID"
[ -e "$1" ]
"""


def test_two_users_jobs_run_as_their_users_on_one_node_at_once(slurm, local_users):
    token = uuid.uuid4().hex
    script, go = slurm.job_dir / f"as-user-{token}.sh", slurm.job_dir / f"go-{token}"
    script.write_text(JOB)
    script.chmod(0o644)
    tmpdir = slurm.base_dir / "tmp" / "n1"
    try:
        jobs = {user: slurm.submit(script, go, sbatch_options=["-w", "n1"], user=user.pw_name) for user in local_users}
        mine = {user: tmpdir / f"mine-{job}" for user, job in jobs.items()}
        deadline = time.monotonic() + 120  # both started (a job starts on a once-a-second scheduler tick)
        while not all(path.is_dir() for path in mine.values()):
            assert time.monotonic() < deadline, {user.pw_name: slurm.state(job) for user, job in jobs.items()}
            time.sleep(0.1)
        owners = {user.pw_name: path.stat().st_uid for user, path in mine.items()}   # both jobs run now
        assert owners == {user.pw_name: user.pw_uid for user in local_users}
        assert (tmpdir.stat().st_mode & 0o7777) == 0o1777, "the node's TMPDIR is every user's, sticky as /tmp"
        assert {slurm.job_info(job)["NodeList"] for job in jobs.values()} == {"n1"}
    finally:
        go.touch()
    for user, job in jobs.items():
        result = slurm.wait(job, timeout=120)
        output = slurm.output(job)
        assert result == ("COMPLETED", 0, 0), output
        assert output.split() == [str(user.pw_uid), str(tmpdir)], output
        assert slurm.job_info(job)["UserId"] == f"{user.pw_name}({user.pw_uid})"
    script.unlink()
    go.unlink()
