"""A Slurm time limit ends a job like scancel does, and leaves nothing behind either.

The job (``slurm_jobs.time_limited_job``) was submitted at the start of test_slurm.py; this module runs
later in the session, so most of its minute has passed by now (run alone, it waits the whole of it).
"""

from __future__ import annotations

import pytest

from support.slurm_jobs import assert_nothing_left

pytestmark = pytest.mark.slow  # see docs/userguide.rst, 'Quick start'


def test_time_limit_leaves_nothing(slurm, time_limited_job):
    result = slurm.wait(time_limited_job, timeout=150)
    assert result.state == "TIMEOUT", slurm.output(time_limited_job)
    assert "fanfs: error" not in slurm.output(time_limited_job)
    assert_nothing_left(slurm, time_limited_job)
