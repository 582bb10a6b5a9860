"""What the float kind declares to the rest of fanfs: its presentation setting (``precision``), its ``fanfs pack``
and ``fanfs select`` options, and the record a selection plan may name for the float class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import AddOption
from ..settings import FULL, Setting

MAX_PLANES = 8
"""Byte planes of the widest value (float64)."""


def parse_precision(text: str) -> int:
    """``full`` -> FULL, ``16`` -> 16: bits of each value as stored, a multiple of 8."""
    value = text.strip().lower()
    if value == "full":
        return FULL
    if value.isdigit() and 8 <= int(value) < 8 * MAX_PLANES and int(value) % 8 == 0:
        return int(value)
    raise ValueError(f"bad precision {text!r}: use a number of bits that is a multiple of 8 (8, 16, 24, ...) or 'full'")


def format_precision(value: int) -> str:
    return "full" if value == FULL else str(value)


PRECISION = Setting(
    name="precision", metavar="BITS|full", parse=parse_precision, format=format_precision,
    help="float records: present every value with its first BITS bits as stored (8, 16, 24, ...; the rest "
         "filled to the middle of the interval) and read only those byte planes")


class ErrorBound:
    """``--float-error``: an absolute bound above 0, or ``limit`` (ELF within the dtype's last mantissa bit)."""

    def __init__(self, text: str) -> None:
        self.bound: float | None = None
        if text.strip().lower() == "limit":
            return
        try:
            self.bound = float(text)
        except ValueError:
            self.bound = -1.0
        if not 0 < self.bound < float("inf"):
            raise ValueError(f"expected an error bound above 0 (e.g. 1e-6) or 'limit', got {text!r}")


def add_pack_options(add: AddOption) -> None:
    add("--float-records", action="store_true",
        help="store the values of .npy and safetensors files (found by content) as byte planes, so mounts "
             "can present them at a lower --precision; lossless")
    add("--float-error", type=ErrorBound, metavar="EPS|limit", default=None,
        help="like --float-records, but float32/float64 values are stored with ELF, each within EPS of "
             "its source (LOSSY; 'limit': within the last mantissa bit, e.g. 6e-8 for float32)")


def add_select_options(add: AddOption) -> None:
    add("--float-error", type=ErrorBound, metavar="EPS|limit",
        help="also measure ELF float records within EPS for float arrays (lossy; lossless float records "
             "are always measured)")


def asked(options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The float records pack is asked for, as the kind's arguments (``elf``, ``error``), or None: none.
    The options win over the plan's record of the float class."""
    if options.get("float_error") is not None:
        return {"elf": True, "error": options["float_error"].bound}
    if options.get("float_records"):
        return {"elf": False, "error": None}
    if plan_record:
        return {"elf": bool(plan_record.get("elf")), "error": plan_record.get("error")}
    return None


def plan_record_problem(class_name: str, record: Mapping[str, Any]) -> str | None:
    """A plan names float records, lossless or ELF within a bound, for the float class only."""
    error = record.get("error")
    if class_name == "float" and isinstance(record.get("elf"), bool) and (
            error is None or (type(error) in (int, float) and 0 < error < float("inf"))):
        return None
    return 'only the float class may name {"kind": "float", "elf": true|false, "error": EPS|null}'


def record_label(record: Mapping[str, Any], codec: str) -> str:
    """``float+zstd:3`` / ``elf:1e-06+zstd:3``: a float-record form and the codec of its blobs, for reports."""
    if not record.get("elf"):
        return f"float+{codec}"
    error = record.get("error")
    return f"elf:{'limit' if error is None else format(error, 'g')}+{codec}"
