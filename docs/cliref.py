"""Sphinx directive ``.. argparse-help:: MODULE:FUNCTION``: every command of an argparse parser, each a section
with a label (``cli-pack``, ``cli-job-run``) and the ``--help`` text it prints, walked from the parser itself.

The help is shown as the program prints it, in a literal block: help strings are plain text written for a
terminal, so they are never parsed as reStructuredText (an asterisk or a trailing underscore in an option's
help cannot break the build), and the width is fixed so the page does not depend on the builder's terminal.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Iterator

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

WIDTH = 100
"""Columns of the help text, as on a terminal that wide."""

UNDERLINES = "-~^"
"""Title underlines of commands, their subcommands and theirs (the page's own title is overlined ``=``)."""


def help_text(parser: argparse.ArgumentParser) -> str:
    """What ``--help`` prints, at ``WIDTH`` columns."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        return parser.format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def commands(parser: argparse.ArgumentParser, depth: int = 0) -> Iterator[tuple[int, argparse.ArgumentParser]]:
    """The parser's subcommands in the order they were added, depth first, each with its depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                yield depth, sub
                yield from commands(sub, depth + 1)


def rst_lines(parser: argparse.ArgumentParser) -> Iterator[str]:
    yield from literal(parser)
    for depth, sub in commands(parser):
        label = "cli-" + "-".join(sub.prog.split()[1:])
        yield from (f".. _{label}:", "", sub.prog, UNDERLINES[depth] * len(sub.prog), "")
        yield from literal(sub)


def literal(parser: argparse.ArgumentParser) -> Iterator[str]:
    yield from (".. code-block:: text", "")
    yield from (f"   {line}".rstrip() for line in help_text(parser).splitlines())
    yield ""


class ArgparseHelp(SphinxDirective):
    required_arguments = 1  # MODULE:FUNCTION returning the parser

    def run(self) -> list:
        module, _, function = self.arguments[0].partition(":")
        parser = getattr(importlib.import_module(module), function)()
        content = StringList(list(rst_lines(parser)), source=self.arguments[0])
        node = nodes.container()
        nested_parse_with_titles(self.state, content, node)
        return node.children


def setup(app: Sphinx) -> dict:
    app.add_directive("argparse-help", ArgparseHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
