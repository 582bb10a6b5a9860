"""``tools/mutants [--list] [NAME ...]``: break each promise of docs/guarantees.rst in the smallest way and check that
the tests named for it catch the break.

The breaks are the table ``tools/mutants.toml``: per promise, a file, a text found exactly once in it, what replaces
it, and the tests that must then fail.  The working tree is copied (what ``git ls-files`` lists, uncommitted changes
included) to a temporary directory; the named tests are run there once as they are (they must pass), then once per
break, with that one text replaced in the copy.  A break whose tests still pass *survived*: the promise is guarded by
nothing.  A row whose text no longer occurs exactly once, or whose test is gone, is *stale*: an error too, so the
table follows the code.  The working tree is never written.  Exit 0 only if every break is caught.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).resolve().parent / "mutants.toml"


@dataclass(frozen=True)
class Break:
    """One row of the table: ``find`` in ``file`` becomes ``replace``; then one of ``tests`` must fail.  ``needs``:
    "root" where every one of them needs root (marked so: a plain user's run skips them, and judges nothing)."""

    name: str
    promise: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    needs: str = ""


def load(path: Path = TABLE) -> list[Break]:
    """The table's rows, in its order."""
    with open(path, "rb") as f:
        rows = tomllib.load(f)["break"]
    return [Break(**{**row, "tests": tuple(row["tests"])}) for row in rows]


def stale(breaks: list[Break], root: Path = REPO) -> list[str]:
    """What no longer holds of the table in the tree at ``root``, one line each: names twice, a file or a test that
    is gone, a text that does not occur exactly once, a replacement that changes nothing."""
    problems = []
    names = [b.name for b in breaks]
    problems += [f"{name}: named twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for b in breaks:
        path = root / b.file
        if not path.is_file():
            problems.append(f"{b.name}: {b.file} does not exist")
        elif (found := path.read_text().count(b.find)) != 1:
            problems.append(f"{b.name}: its text occurs {found} times in {b.file}, not once")
        if b.find == b.replace:
            problems.append(f"{b.name}: its replacement is its text")
        if not b.tests:
            problems.append(f"{b.name}: no test named")
        problems += [f"{b.name}: {test}: {why}" for test in b.tests if (why := _missing(root, test))]
    return problems


def _missing(root: Path, test: str) -> str | None:
    """Why node id ``tests/test_x.py::test_name[param]`` names no test of the tree (None: it names one)."""
    module, _, function = test.partition("::")
    path = root / module
    if not path.is_file():
        return "no such module"
    name = function.partition("[")[0]
    defined = {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
    return None if name.startswith("test_") and name in defined else "no such test"


def copy_tree(root: Path, to: Path) -> None:
    """The working tree's files (tracked and new ones git does not ignore, as they are now) under ``to``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout
    for name in sorted(set(filter(None, listed.decode().split("\0")))):
        if os.path.lexists(root / name):  # not a tracked file deleted since
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, to / name, follow_symlinks=False)


def run_tests(copy: Path, tests: tuple[str, ...], workers: str) -> tuple[int, str]:
    """pytest's exit status and what it said of the failure, if any, and its last line, for ``tests`` run in ``copy``
    (its fanfs, its tests), stopping at the first failure."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", workers, "-p", "no:cacheprovider",
                           f"--basetemp={copy.parent / 'pytest'}", *tests], cwd=copy, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = done.stdout.strip().splitlines()
    said = [line for line in lines if line.startswith(("E ", "FAILED", "ERROR"))][:12]
    return done.returncode, "\n".join([*said, *lines[-1:]])


def try_break(copy: Path, b: Break, workers: str) -> tuple[str, str]:
    """Apply ``b`` to the copy, run its tests, put the file back: "caught", "SURVIVED", "SKIPPED" (its tests did not
    run here: they need root, or a tool) or "ERROR" (pytest could not run them: a break that does not import), and
    what pytest said."""
    path = copy / b.file
    text = path.read_text()
    path.write_text(text.replace(b.find, b.replace))
    try:
        status, said = run_tests(copy, b.tests, workers)
    finally:
        path.write_text(text)
    if status == 0:
        return ("SURVIVED" if " passed" in said.splitlines()[-1] else "SKIPPED"), said
    return ("caught" if status == 1 else "ERROR"), said  # 2-5: interrupted, internal, usage, nothing collected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these rows (default: every one)")
    parser.add_argument("--list", action="store_true", help="print the table's rows and check it; run nothing")
    parser.add_argument("-n", "--workers", default="0", help="pytest-xdist workers for each run (default 0: none)")
    parser.add_argument("-v", "--verbose", action="store_true", help="say how the tests failed on each caught break too")
    args = parser.parse_args(argv)
    breaks = load()
    problems = stale(breaks)
    unknown = sorted(set(args.names) - {b.name for b in breaks})
    problems += [f"{name}: no such row" for name in unknown]
    chosen = [b for b in breaks if not args.names or b.name in args.names]
    if args.list:
        for b in chosen:
            print(f"{b.name}: {b.file}" + (f" (its tests need {b.needs})" if b.needs else "") + f"\n    {b.promise}\n    "
                  + "\n    ".join(b.tests))
    for line in problems:
        print(f"stale: {line}", file=sys.stderr)
    if problems or args.list:
        return 1 if problems else 0
    with tempfile.TemporaryDirectory(prefix="fanfs-mutants-") as work:
        os.chmod(work, stat.S_IMODE(REPO.stat().st_mode))  # as open as the tree: tests run fanfs as another user
        copy = Path(work) / "tree"
        copy_tree(REPO, copy)
        tests = tuple(dict.fromkeys(t for b in chosen for t in b.tests))
        started = time.monotonic()
        status, said = run_tests(copy, tests, args.workers)
        print(f"unbroken: {len(tests)} tests in {time.monotonic() - started:.0f} s: {said.splitlines()[-1]}", flush=True)
        if status != 0:
            print(f"the tests fail on the unbroken tree: no break can be judged\n{said}", file=sys.stderr)
            return 1
        survived = []
        for b in chosen:
            began = time.monotonic()
            outcome, said = try_break(copy, b, args.workers)
            print(f"{outcome:8} {b.name} ({time.monotonic() - began:.0f} s"
                  + (f"; its tests need {b.needs})" if outcome == "SKIPPED" and b.needs else ")"), flush=True)
            if outcome != "caught":
                survived.append(b.name)
            if outcome != "caught" or args.verbose:
                print("    " + said.replace("\n", "\n    "), flush=True)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} breaks caught in {time.monotonic() - started:.0f} s" +
          (f"; not caught: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
