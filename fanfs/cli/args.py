"""Argument types and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..util.units import parse_size


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
    """A duration above 0, in seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


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
