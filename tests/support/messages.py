"""What a command said on stderr, less its progress lines.

A command whose stderr is not a terminal (a batch job's log, a test's pipe) prints where its work is, ``fanfs LABEL:
...``, every 10 s (:mod:`fanfs.util.progress`): how many such lines come depends on the machine's pace, not on what
the command does.  A test of what it says (one error line) reads the rest.
"""

from __future__ import annotations

import re

PROGRESS = re.compile(r"fanfs [a-z][a-z ]*: ")
"""A progress line's start (``fanfs pack: ``, ``fanfs decode speed: ``); an error's is ``fanfs: error: ``."""


def messages(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not progress lines."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS.match(line)]
