"""Issue 39: the promise table (tools/mutants.toml) stays current: each row's text occurs exactly once in its file and
each test it names exists, so ``tools/mutants`` (which applies every row and runs its tests: minutes, not part of the
suite) can judge every row; and docs/guarantees.rst names the modules of those tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mutants import REPO, Break, load, stale


def test_every_row_applies_to_the_tree_and_names_tests_that_exist():
    breaks = load()
    assert len(breaks) >= 20
    assert stale(breaks) == []


def test_every_test_module_the_table_names_is_named_in_the_guarantees():
    """The page names the tests that guard each promise; the table names the same modules, so a reader of either
    finds the other."""
    page = (REPO / "docs" / "guarantees.rst").read_text()
    modules = {Path(test.partition("::")[0]).stem for b in load() for test in b.tests}
    assert not [module for module in sorted(modules) if f"``{module}``" not in page]


def test_a_stale_row_is_found(tmp_path):
    """What tools/mutants refuses to run: a text that occurs twice or not at all, a test that is gone, a name twice."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "code.py").write_text("x = 1\ny = 1\n")
    rows = [Break("once", "", "code.py", "x = 1", "x = 2", ("tests/test_a.py::test_one[p]",)),
            Break("twice", "", "code.py", " = 1", " = 2", ("tests/test_a.py::test_one",)),
            Break("gone", "", "code.py", "z = 1", "z = 2", ("tests/test_a.py::test_two", "tests/test_b.py::test_one")),
            Break("once", "", "nosuch.py", "x", "y", ())]
    assert stale(rows, tmp_path) == [
        "once: named twice",
        "twice: its text occurs 2 times in code.py, not once",
        "gone: its text occurs 0 times in code.py, not once",
        "gone: tests/test_a.py::test_two: no such test",
        "gone: tests/test_b.py::test_one: no such module",
        "once: nosuch.py does not exist",
        "once: no test named",
    ]


@pytest.mark.slow  # the quick subset's time (meta: the table is checked by the whole suite)
def test_every_promise_keeps_a_quick_test():
    """Issue 42: ``-m "not slow"`` runs, for every row, at least one of the tests that guard it (a whole module
    named marked slow, or every named test slow, leaves the promise to the slow suite alone)."""
    named = sorted({test.partition("[")[0] for b in load() for test in b.tests})
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-n", "0",
                             "-p", "no:cacheprovider", *named], cwd=REPO, capture_output=True, text=True, check=True)
    quick = {line.partition("[")[0] for line in listed.stdout.splitlines() if "::" in line}
    assert [b.name for b in load() if not quick.intersection(t.partition("[")[0] for t in b.tests)] == []


@pytest.mark.slow  # the quick subset's time (meta: the table is checked by the whole suite)
def test_every_row_says_whether_only_tests_that_need_root_guard_it():
    """Issue 49: a promise guarded only by tests that need root (marked ``root``: a plain user's run skips them, and
    its tools/mutants judges nothing) says so, ``needs = "root"``; a row that says so has no test a plain user runs.
    And every test a row names with its parameters is one pytest collects (a module's parameters change the ids)."""
    breaks = load()
    named = sorted({test.partition("[")[0] for b in breaks for test in b.tests})

    def collected(*marks: str) -> set[str]:
        listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *marks, "-n", "0", "-p",
                                 "no:cacheprovider", *named], cwd=REPO, capture_output=True, text=True, check=True)
        return {line for line in listed.stdout.splitlines() if "::" in line}
    every, plain = collected(), collected("-m", "not root")
    assert [t for b in breaks for t in b.tests if "[" in t and t not in every] == []
    guarded = {b.name: any(t in plain if "[" in t else any(p.partition("[")[0] == t for p in plain) for t in b.tests)
               for b in breaks}
    assert [b.name for b in breaks if not guarded[b.name] and b.needs != "root"] == []
    assert [b.name for b in breaks if guarded[b.name] and b.needs] == []
