"""Check that nothing of an older README.rst was lost: every sentence and every line of its code blocks and
tables must appear in today's README.rst or docs/*.rst (whitespace, line breaks and link markup aside).

    python tools/docs_moved.py [REV]     # default: the last README.rst that held everything (over 300 lines)

Prints what is missing, one unit a line, and exits 1 if anything is; a sentence edited on purpose shows here
too, so read the list rather than silence it.  Written for the move of the README's sections into docs/ (issue
29); also a check for anyone merging README edits made against the old layout.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FRONT_PAGE_LINES = 300
"""README.rst's size as a front page at most: a longer one in the history held the whole documentation."""
RULE = re.compile(r"[=~^-]{3,}")
TABLE_RULE = re.compile(r"[=\s-]+")


def _plain(text: str) -> str:
    """Whitespace collapsed, and every link (a section of the old README, a page, a Sphinx ref) one placeholder:
    link texts changed with the move (a section became a page), and the Sphinx build checks that refs resolve."""
    text = re.sub(r":ref:`[^`]+`|`[^`]+`__?", "<link>", text)
    text = text.replace("\\*", "*")
    return " ".join(text.split())


def _units(text: str) -> Iterator[str]:
    """Section titles, sentences of prose, and lines of literal blocks and tables."""
    lines = text.splitlines() + [""]
    body = []
    for line, after in zip(lines, lines[1:]):
        if RULE.fullmatch(line):
            continue  # a title's overline or underline
        if line.strip() and RULE.fullmatch(after):
            yield line.strip()  # a title: its own unit, apart from the paragraph that may follow it
            body.append("")
        else:
            body.append(line)
    literal = False
    for block in re.split(r"\n\s*\n", "\n".join(body)):
        if not block.strip():
            continue
        first = block.lstrip("\n").splitlines()[0]
        if literal and first.startswith(" ") or first.lstrip().startswith("==="):
            yield from (line for line in block.splitlines() if line.strip() and not TABLE_RULE.fullmatch(line))
        else:
            yield from (s for s in re.split(r"(?<=[.:;!?])\s+", " ".join(block.split())) if s)
        literal = block.rstrip().endswith("::") or bool(re.search(r"^\.\. (code-block|code)::", block, re.MULTILINE))


def missing(old: str, new_texts: list[str]) -> list[str]:
    haystack = _plain("\n".join(new_texts))
    return [unit for unit in _units(old) if _plain(unit) not in haystack]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def last_whole_readme() -> str:
    """The newest commit whose README.rst was longer than a front page."""
    for rev in _git("rev-list", "HEAD", "--", "README.rst").split():
        if len(_git("show", f"{rev}:README.rst").splitlines()) > FRONT_PAGE_LINES:
            return rev
    raise SystemExit("no README.rst in this history held the whole documentation: give REV")


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else last_whole_readme()
    old = _git("show", f"{rev}:README.rst")
    new = [(REPO / "README.rst").read_text()] + [p.read_text() for p in sorted((REPO / "docs").glob("*.rst"))]
    lost = missing(old, new)
    for unit in lost:
        print(unit)
    print(f"{len(lost)} of {sum(1 for _ in _units(old))} units of {rev}:README.rst not found", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
