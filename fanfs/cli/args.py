"""The command line's parser, argument types and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ..util.units import parse_seconds, parse_size

if TYPE_CHECKING:
    from ..codecs import Codec


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors say what the user meant: an unknown option is the error of the (sub)command it
    was given to, with that command's usage and the closest of its options (argparse 3.11 reports it with the top
    level's usage, suggesting nothing); an argument like ``-=SRC`` that argparse took for an option is told to go
    after ``--``."""

    given: Sequence[str] = ()

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command(parsed)
            command.error(f"unrecognized arguments: {' '.join(extras)}{command._closest(extras)}")
        return parsed

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.given = list(sys.argv[1:] if args is None else args)  # a subcommand's: what its error looks at
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        at = next((i for i, arg in enumerate(self.given) if arg.startswith("-") and "=" in arg
                   and not self._closest([arg], prefix=True)), None)
        if at is not None:  # a PREFIX=SRC whose PREFIX begins with '-': argparse allows it as an option's value or after --
            dashed = self.given[at]
            option = next((arg for arg in reversed(self.given[:at]) if arg.startswith("-")), None)
            takes = next((action for action in self._actions if option in action.option_strings and action.nargs), None)
            message += f" ({dashed} was taken for an option: " + (
                f"write {option}={dashed})" if takes else f"write the sources after '--': {self.prog} [OPTIONS] -- "
                                                          f"{dashed} ...)")
        super().error(message)

    def _command(self, parsed: argparse.Namespace) -> "Parser":
        """The deepest (sub)command ``parsed`` went through (``fanfs job run``)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
                return action.choices[getattr(parsed, action.dest)]._command(parsed)
        return self

    def _closest(self, args: Sequence[str], prefix: bool = False) -> str:
        """" (did you mean --OPTION?)" for the first of ``args`` close to an option of this parser (``prefix``: also
        one that abbreviates it, as argparse takes it); "" if none is."""
        options = [option for action in self._actions for option in action.option_strings]
        for arg in args:
            name = arg.partition("=")[0]
            if not arg.startswith("-") or name == "-":
                continue
            close = difflib.get_close_matches(name, options, n=1)
            if not close and prefix and name.startswith("--"):
                close = [option for option in options if option.startswith(name)][:1]
            if close:
                return f" (did you mean {close[0]}?)"
        return ""


def codec(text: str) -> "Codec":
    """A ``--codec`` value: a codec a user may name (argparse's error, exit 2, lists them)."""
    from ..codecs import CodecError, parse_codec
    try:
        return parse_codec(text)
    except CodecError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """A duration above 0, in seconds (:func:`~fanfs.util.units.parse_seconds`: every timeout of every command)."""
    try:
        return parse_seconds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def seconds_or_zero(text: str) -> float:
    """A duration in seconds, 0 too (which the option says the meaning of: e.g. "wait for ever")."""
    try:
        return parse_seconds(text, zero=True)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def nonnegative_float(text: str) -> float:
    """A finite number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number, 0 or more, got {text!r}")
    return value


def positive_size(text: str) -> int:
    value = size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a size above 0, got {text!r}")
    return value


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    print()
