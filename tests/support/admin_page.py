"""The command blocks of docs/admin.rst (``.. code-block:: sh`` with a ``:name:``), as the tests that run them read
them: the page's own text, site paths replaced by the test's."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "admin.rst"
_BLOCK = re.compile(r"^\.\. code-block:: (\w+)\n((?:   :\w+:.*\n)*)\n((?:(?:   .*)?\n)+)", re.MULTILINE)


def blocks(page: Path = PAGE) -> list[tuple[str, str | None, str]]:
    """Every code block of the page: its language, its name (None without one) and its text."""
    found = []
    for language, options, text in _BLOCK.findall(page.read_text()):
        name = re.search(r":name: (\S+)", options)
        found.append((language, name[1] if name else None, textwrap.dedent(text).strip() + "\n"))
    return found


def admin_block(name: str, **replace: str) -> str:
    """The text of the page's block ``name``, each key of ``replace`` (a text of the block) replaced by its value."""
    (text,) = [text for _, found, text in blocks() if found == name]
    for old, new in replace.items():
        assert old in text, f"{old!r} is not in the block {name} of {PAGE.name}"
        text = text.replace(old, new)
    return text
