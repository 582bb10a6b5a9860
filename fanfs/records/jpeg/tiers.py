"""Resolution tiers: a JPEG record's image downscaled by 1/s, stored beside its scans as a baseline JPEG.

A scan prefix saves bytes but not decode time (IDCT, upsampling and colour conversion still run at full
resolution); fewer pixels is what decodes fast.  So ``pack --scales 2,4`` stores, per record, a baseline
JPEG of the image reduced by each factor (``ceil(w/s) x ceil(h/s)``, Pillow's ``reduce``: an exact box
average), encoded with the source's own quantization tables and chroma subsampling (its quality) and
carrying its EXIF and ICC segments (a viewer orients and colours the tier as it would the original; the
pixels are not rotated).  A mount at fidelity ``1/s`` presents that JPEG as the file.
"""

from __future__ import annotations

import io

MAX_SCALE = 16
MAX_TIERS = 4
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


def make_tiers(data: bytes, scales: tuple[int, ...]) -> list[bytes] | str:
    """The baseline JPEG of ``data``'s image at each 1/s of ``scales``, or why there is none (CMYK, no decode)."""
    from PIL import Image, JpegImagePlugin
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode not in ("L", "RGB"):
                return f"no resolution tiers for a {im.mode} JPEG (kept at its scans only)"
            options = {"qtables": im.quantization, "optimize": True, "exif": im.info.get("exif", b""),
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
