"""What the JPEG kind declares to the rest of fanfs: its presentation setting (``fidelity``, and the syntax of
its values) and its ``fanfs pack`` options.  Everything that lists settings or pack options (the command
line, a Slurm job's settings, the control socket, ``fanfs stats``) reads them from the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import AddOption
from ..settings import FULL, Auto, Setting
from .scans import DEFAULT_SCANS


def parse_fidelity(text: str) -> int | Auto:
    """``full`` -> FULL, ``5`` -> 5 (the first K scans), ``auto:0.95`` -> :class:`Auto` (the SSIM bar to meet)."""
    value = text.strip().lower()
    if value == "full":
        return FULL
    if value.startswith("auto:"):
        try:
            bar = float(value[5:])
        except ValueError:
            bar = -1.0
        if not 0 < bar <= 1:
            raise ValueError(f"bad fidelity {text!r}: auto takes an SSIM bar in (0, 1], e.g. auto:0.95")
        return Auto("fidelity", bar, f"auto:{value[5:]}")
    if value.isdigit() and 1 <= int(value) < FULL:
        return int(value)
    raise ValueError(f"bad fidelity {text!r}: use a layer count K >= 1, 'full', or auto:SSIM (e.g. auto:0.95)")


def format_fidelity(value: int) -> str:
    return "full" if value == FULL else str(value)


FIDELITY = Setting(
    name="fidelity", metavar="K|full|auto:SSIM", parse=parse_fidelity, format=format_fidelity,
    help="JPEG records: present each as its first K scan groups, a smaller valid JPEG; auto:0.95 picks the "
         "smallest K whose mean SSIM reaches 0.95 (see 'fanfs fidelity')")


def add_pack_options(add: AddOption) -> None:
    add("--progressive-jpeg", action="store_true",
        help="store JPEGs as progressive records (lossless) so mounts can present lower fidelities")
    add("--scan-script", metavar="compact|fast|libjpeg|FILE",
        help="how progressive records are cut into scans (implies --progressive-jpeg): 'compact' "
             "(default): few bytes at SSIM 0.95 (fidelity auto:0.95) and a fast decode there; 'fast': "
             "the fastest decode at full fidelity; 'libjpeg': libjpeg's own 10-scan progression (the "
             "default before the presets; fewer bytes at SSIM 0.95 on high-quality photos, slower "
             "decode); or a jpegtran scan-script FILE (a lossy one is refused). Compare them with "
             "'fanfs fidelity --source'; see the README, 'Scan scripts'")


def scans_asked(options: Mapping[str, Any]) -> str | None:
    """The scan script pack is asked for (a preset's name or a file), or None: no progressive records."""
    if options.get("scan_script") is not None:
        return options["scan_script"]
    return DEFAULT_SCANS if options.get("progressive_jpeg") else None
