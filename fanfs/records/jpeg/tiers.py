"""Resolution tiers: a JPEG record's image downscaled by 1/s, stored beside its scans as a baseline JPEG.

A scan prefix saves bytes but not decode time (IDCT, upsampling and colour conversion still run at full
resolution); fewer pixels is what decodes fast.  So ``pack --scales 2,4`` stores, per record, a baseline
JPEG of the image reduced by each factor (``ceil(w/s) x ceil(h/s)``, Pillow's ``reduce``: an exact box
average), encoded with the source's chroma subsampling and carrying its EXIF and ICC segments (a viewer
orients and colours the tier as it would the original; the pixels are not rotated).  A mount at fidelity
``1/s`` presents that JPEG as the file.

Its quantization is the source's, coarsened to ``pack --tier-quality Q`` (:func:`tier_tables`): the source's
own quality on a quarter of the pixels (busier blocks) cost 43-45% of the store for ``--scales 2,4``; at
most quality 80 costs 30-33% at an SSIM of 0.95-0.96 against the reduced image, and decodes no slower
(docs/fidelity.rst, "Resolution tiers").
"""

from __future__ import annotations

import functools
import io

MAX_SCALE = 16
MAX_TIERS = 4
DEFAULT_TIER_QUALITY = 80
"""``pack --tier-quality``: measured on the photo sets of docs/fidelity.rst, the highest libjpeg quality whose
tiers keep ``--scales 2,4`` within +35% of the store (+30% colour photos of ~110 KB, +33% mixed 250-500 px ones; 85
made +35-37%), at a mean SSIM of 0.96 and 0.95 (the source's tables: 0.98 and 0.96)."""
TIER = 0x8000
"""Fidelity codes ``TIER | s`` present the 1/s tier (below FULL = 0xFFFF; scan counts K stay under TIER)."""


def is_tier(value: int) -> bool:
    """Whether a fidelity value (or a record's view) is a tier's code rather than K or FULL."""
    return TIER < value < 0xFFFF


def parse_scales(text: str) -> tuple[int, ...]:
    """``--scales 2,4``: distinct factors from 2 to MAX_SCALE, at most MAX_TIERS of them, kept in increasing order."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"bad scales {text!r}: give downscale factors separated by commas, e.g. 2,4")
    scales = [int(part) for part in parts]
    if not all(2 <= s <= MAX_SCALE for s in scales) or len(set(scales)) != len(scales) or len(scales) > MAX_TIERS:
        raise ValueError(f"bad scales {text!r}: up to {MAX_TIERS} distinct factors from 2 to {MAX_SCALE}, e.g. 2,4")
    return tuple(sorted(scales))


def parse_tier_quality(text: str) -> int:
    """``--tier-quality 80``: a libjpeg quality from 1 to 100 (100: the source's tables unchanged)."""
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise ValueError(f"bad tier quality {text!r}: a JPEG quality from 1 to 100 (100: the source's own), e.g. 80")
    return int(value)


@functools.lru_cache(maxsize=4)
def libjpeg_tables(quality: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """libjpeg's luma and chroma quantization tables at ``quality`` (its scaled Annex K tables, as Pillow's
    encoder sets them), read back from an 8x8 encode: the encoder's own tables, not a copy of them."""
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "JPEG", quality=quality)
    with Image.open(out) as im:
        return tuple(im.quantization[0]), tuple(im.quantization[1])


def tier_tables(source: dict[int, list[int]], quality: int) -> list[list[int]]:
    """Each quantization step the coarser of the source's and libjpeg's at ``quality`` (table 0 against the luma
    table, the others against the chroma one): a tier is never finer than its source nor than ``quality``, so
    a source below it keeps its own tables (100: every step the source's)."""
    limits = libjpeg_tables(quality)
    return [[max(step, limit) for step, limit in zip(table, limits[min(slot, 1)])]
            for slot, table in sorted(source.items())]


def make_tiers(data: bytes, scales: tuple[int, ...], quality: int = DEFAULT_TIER_QUALITY) -> list[bytes] | str:
    """The baseline JPEG of ``data``'s image at each 1/s of ``scales`` (at most ``quality``: :func:`tier_tables`),
    or why there is none (CMYK, no decode)."""
    from PIL import Image, JpegImagePlugin
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode not in ("L", "RGB"):
                return f"no resolution tiers for a {im.mode} JPEG (kept at its scans only)"
            options = {"qtables": tier_tables(im.quantization, quality), "optimize": True, "exif": im.info.get("exif", b""),
                       "icc_profile": im.info.get("icc_profile")}
            sampling = JpegImagePlugin.get_sampling(im)
            if sampling >= 0:
                options["subsampling"] = sampling
            im.load()
            tiers = []
            for scale in scales:
                out = io.BytesIO()
                im.reduce(scale).save(out, "JPEG", **options)
                tiers.append(out.getvalue())
            return tiers
    except Exception as err:  # noqa: BLE001 - any image Pillow cannot reduce or encode keeps its scans only
        return f"no resolution tiers: {err}"
