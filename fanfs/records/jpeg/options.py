"""What the JPEG kind declares to the rest of fanfs: its presentation setting (``fidelity``, and the syntax of
its values) and its ``fanfs pack`` options.  Everything that lists settings or pack options (the command
line, a Slurm job's settings, the control socket, ``fanfs stats``) reads them from the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...util.units import parse_size
from ..base import AddOption
from ..settings import FULL, Auto, Setting
from .scans import DEFAULT_SCANS
from .tiers import DEFAULT_TIER_QUALITY, MAX_SCALE, TIER, is_tier, parse_scales, parse_tier_quality

DEFAULT_MAX_PIXELS = 64 << 20
"""``pack --max-pixels``: larger JPEGs (by their frame header) are kept as plain files.  Measured here
(docs/userguide.rst, "Using it", pack): the transcode peaks at up to 6 bytes per pixel (colour 4:4:4) and the
fidelity measurement at ~16, so 64M pixels (every camera up to 61 MP) costs a worker at most ~0.4 GB packing and
~1.1 GB measuring; a 65535x65535 JPEG would cost ~26 and ~69 GB."""


def parse_fidelity(text: str) -> int | Auto:
    """``full`` -> FULL, ``5`` -> 5 (the first K scans), ``1/4`` -> TIER | 4 (the quarter-resolution tier),
    ``auto:0.95`` -> :class:`Auto` (the SSIM bar to meet)."""
    value = text.strip().lower()
    if value == "full":
        return FULL
    if value.startswith("1/"):
        scale = value[2:]
        if scale.isdigit() and 2 <= int(scale) <= MAX_SCALE:
            return TIER | int(scale)
        raise ValueError(f"bad fidelity {text!r}: a resolution tier is 1/S with S from 2 to {MAX_SCALE}, e.g. 1/2")
    if value.startswith("auto:"):
        try:
            bar = float(value[5:])
        except ValueError:
            bar = -1.0
        if not 0 < bar <= 1:
            raise ValueError(f"bad fidelity {text!r}: auto takes an SSIM bar in (0, 1], e.g. auto:0.95")
        return Auto("fidelity", bar, f"auto:{value[5:]}")
    if value.isdigit() and 1 <= int(value) < TIER:
        return int(value)
    raise ValueError(f"bad fidelity {text!r}: use a layer count K >= 1, a resolution tier 1/S, 'full', or "
                     "auto:SSIM (e.g. auto:0.95)")


def format_fidelity(value: int) -> str:
    if value == FULL:
        return "full"
    return f"1/{value & ~TIER}" if is_tier(value) else str(value)


def rank_fidelity(value: int) -> tuple[int, int]:
    """Least data first: the tiers, coarsest first (1/4 before 1/2), then K = 1, 2, ..., then full."""
    if is_tier(value):
        return (0, -(value & ~TIER))
    return (2, 0) if value == FULL else (1, value)


FIDELITY = Setting(
    name="fidelity", metavar="K|1/S|full|auto:SSIM", parse=parse_fidelity, format=format_fidelity, rank=rank_fidelity,
    help="JPEG records: present each as its first K scan groups, a smaller valid JPEG; 1/S: as its "
         "resolution tier 1/S (a baseline JPEG of the image downscaled S times, stored by pack --scales); "
         "auto:0.95 picks the smallest K whose mean SSIM reaches 0.95 (see 'fanfs fidelity')")


def positive_count(text: str) -> int:
    """``--max-pixels``: a count above 0, with the sizes' suffixes (``64M``)."""
    value = parse_size(text)
    if value < 1:
        raise ValueError(f"expected a count above 0, got {text!r}")
    return value


def add_pack_options(add: AddOption) -> None:
    add("--progressive-jpeg", action="store_true",
        help="store JPEGs as progressive records (lossless) so mounts can present lower fidelities; a JPEG "
             "the transcoder refuses, one with bytes after its end (EOI: MPO, motion photos, trailers) and "
             "one over --max-pixels are kept byte for byte as plain files and listed")
    add("--scan-script", metavar="compact|fast|libjpeg|FILE",
        help="how progressive records are cut into scans (implies --progressive-jpeg): 'compact' "
             "(default): few bytes at SSIM 0.95 (fidelity auto:0.95) and a fast decode there; 'fast': "
             "the fastest decode at full fidelity; 'libjpeg': libjpeg's own 10-scan progression (the "
             "default before the presets; fewer bytes at SSIM 0.95 on high-quality photos, slower "
             "decode); or a jpegtran scan-script FILE (a lossy one is refused). Compare them with "
             "'fanfs fidelity --source'; see docs/fidelity.rst, 'Scan scripts'")
    add("--max-pixels", type=positive_count, metavar="N",
        help="JPEGs with more pixels (width x height, read from the header) are kept byte for byte as "
             "plain files and listed (implies --progressive-jpeg; default 64M = 67,108,864: every camera up "
             "to 61 MP). The transcode needs up to 6 bytes per pixel, measuring fidelity ~16 "
             "(docs/userguide.rst, pack)")
    add("--scales", type=parse_scales, metavar="S,S",
        help="also store each JPEG record's image downscaled by each factor S (2,4: half and quarter "
             "resolution) as a baseline JPEG, presented at --fidelity 1/S: decodes several times faster "
             "than the original, costs ~+22-25%% (1/2) and ~+7-9%% (1/4) of the store at --tier-quality 80 "
             "(docs/fidelity.rst, 'Resolution tiers'; implies --progressive-jpeg; default: none)")
    add("--tier-quality", type=parse_tier_quality, metavar="Q",
        help=f"encode the --scales tiers at JPEG quality Q at most (1-100; a source below Q keeps its own "
             f"quantization, 100 keeps every source's): lower trades the tiers' sharpness for store bytes (default "
             f"{DEFAULT_TIER_QUALITY}: --scales 2,4 costs ~+30-33%% at SSIM 0.95-0.96 against the reduced image; 100: "
             f"~+43-45%% at 0.96-0.98)")


def asked(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The progressive records pack is asked for, as the kind's arguments (``scans``: a preset's name or a
    scan-script file; ``max_pixels``; ``scales``: resolution tiers; ``tier_quality``: theirs), or None: none."""
    if options.get("tier_quality") is not None and not options.get("scales"):
        raise ValueError("--tier-quality sets the quality of resolution tiers: give --scales too (e.g. --scales 2,4)")
    if (options.get("scan_script") is None and not options.get("progressive_jpeg") and options.get("max_pixels") is None
            and not options.get("scales")):
        return None
    return {"scans": DEFAULT_SCANS if options.get("scan_script") is None else options["scan_script"],
            "max_pixels": DEFAULT_MAX_PIXELS if options.get("max_pixels") is None else options["max_pixels"],
            "scales": tuple(options.get("scales") or ()),
            "tier_quality": DEFAULT_TIER_QUALITY if options.get("tier_quality") is None else options["tier_quality"]}
