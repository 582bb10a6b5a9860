"""Human-readable sizes, rates and counts, both ways (``256M`` on the command line, ``1.3 GiB`` in reports), and
durations given in seconds."""

from __future__ import annotations

import math
import re

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"256M"`` -> 268435456.  Binary multiples (K = 1024); a trailing ``B``/``iB`` is accepted."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 512K, 256M, 2G)")
    return int(float(match.group(1)) * _SUFFIX[match.group(2).upper()])


def human_size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``counted(1, "file")`` -> ``"1 file"``, ``counted(2000, "file")`` -> ``"2,000 files"`` (``plural``: if not
    the noun and an s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"


def human_rate(bytes_per_second: float) -> str:
    return human_size(bytes_per_second) + "/s"


_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?(?:/s)?\s*$", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """``800MB/s`` -> 8e8 bytes/s.  Decimal units (K, M, G, T = 10^3..10^12); ``MiB/s`` etc. are binary."""
    match = _RATE_RE.match(str(text))
    if not match:
        raise ValueError(f"not a rate: {text!r} (use e.g. 800MB/s, 1.5GB/s, 200MiB/s)")
    number, prefix, binary = float(match.group(1)), match.group(2).upper(), bool(match.group(3))
    power = " KMGT".index(prefix) if prefix else 0
    return number * ((1024 if binary else 1000) ** power)


MAX_SECONDS = 365 * 24 * 3600
"""The longest duration fanfs takes (a year): longer means "for ever" to anyone, and it stays within what the system's
waits take (a timeout of 1e10 s overflows them)."""


def parse_seconds(text: str, *, zero: bool = False) -> float:
    """A duration given in seconds (an option's or a variable's text): a number above 0 (0 too where ``zero``) and
    at most :data:`MAX_SECONDS`, else a ValueError saying so (``nan``, ``inf``, ``-1``, ``1e10``: every timeout and
    period of every command is read here)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (0 <= value if zero else 0 < value) or not value <= MAX_SECONDS:
        least = "0 or more" if zero else "above 0"
        raise ValueError(f"expected a number of seconds, {least} and at most {MAX_SECONDS:,} (a year), not {text!r}")
    return value
