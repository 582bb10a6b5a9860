"""Issue 39: the promise table (tools/mutants.toml) stays current: each row's text occurs exactly once in its file and
each test it names exists, so ``tools/mutants`` (which applies every row and runs its tests: minutes, not part of the
suite) can judge every row; and docs/guarantees.rst names the modules of those tests."""

from __future__ import annotations

from pathlib import Path

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
