"""Build a small set of real-photo JPEG samples for the JPEG and quality tests.

The originals are photos shipped by installed packages (tools/support/photo_samples.py); the variants are re-encoded from real
photo pixels so that each one exercises one code path (subsampling, markers, restarts, CMYK,
broken files). A missing package just means fewer samples.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms
from photo_samples import PHOTO_SOURCES, photo_paths

VARIANTS = ("gray", "s444", "s420", "exif_orient6", "icc", "restart", "progressive", "cmyk",
            "exif_thumb", "truncated", "fake")
ALL_NAMES = tuple(f"photo_{n}" for n in PHOTO_SOURCES) + VARIANTS
# Samples that must be refused: they are not (complete) JPEGs.
BROKEN = ("truncated", "fake")
ORIENTATION = 0x0112


def _save(im: Image.Image, path: Path, **kw) -> Path:
    im.save(path, "JPEG", quality=90, **kw)
    return path


def _app1_exif_with_thumbnail(thumb: bytes) -> bytes:
    """A little-endian EXIF APP1 payload: IFD0 (orientation 1) and IFD1 pointing at a JPEG
    thumbnail, which brings its own SOI/SOS/EOI markers into the APP1 segment."""
    ifd0 = 8
    ifd1 = ifd0 + 2 + 12 + 4
    data_at = ifd1 + 2 + 2 * 12 + 4
    tiff = b"II*\x00" + struct.pack("<I", ifd0)
    tiff += struct.pack("<H", 1) + struct.pack("<HHIHH", ORIENTATION, 3, 1, 1, 0) + struct.pack("<I", ifd1)
    tiff += struct.pack("<H", 2)
    tiff += struct.pack("<HHII", 0x0201, 4, 1, data_at)  # JPEGInterchangeFormat
    tiff += struct.pack("<HHII", 0x0202, 4, 1, len(thumb))  # JPEGInterchangeFormatLength
    tiff += struct.pack("<I", 0)
    return b"Exif\x00\x00" + tiff + thumb


def build_samples(dst: Path) -> dict[str, Path]:
    """Write the sample set into ``dst`` and return name -> path.

    Names: ``photo_<name>`` for the originals (baseline), then variants of the first photo
    (downscaled to <= 1024 px): gray, s444, s420, exif_orient6, icc, restart (if jpegtran is
    installed), progressive, cmyk, exif_thumb, truncated, fake.
    """
    dst.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    photos = photo_paths()
    for name, src in photos.items():
        out[f"photo_{name}"] = Path(shutil.copyfile(src, dst / f"photo_{name}.jpg"))
    if not photos:
        return out

    base = Image.open(next(iter(photos.values()))).convert("RGB")
    base.thumbnail((1024, 1024))
    out["gray"] = _save(base.convert("L"), dst / "gray.jpg")
    out["s444"] = _save(base, dst / "s444.jpg", subsampling=0)
    out["s420"] = _save(base, dst / "s420.jpg", subsampling=2)
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    out["exif_orient6"] = _save(base, dst / "exif_orient6.jpg", exif=exif.tobytes())
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    out["icc"] = _save(base, dst / "icc.jpg", icc_profile=icc)
    if shutil.which("jpegtran"):
        restart = dst / "restart.jpg"
        subprocess.run(["jpegtran", "-copy", "all", "-restart", "1", "-outfile", str(restart),
                        str(out["s420"])], check=True)
        out["restart"] = restart
    out["progressive"] = _save(base, dst / "progressive.jpg", progressive=True)
    out["cmyk"] = _save(base.convert("CMYK"), dst / "cmyk.jpg")

    thumb = io.BytesIO()
    base.resize((160, 107)).save(thumb, "JPEG", quality=75)
    app1 = _app1_exif_with_thumbnail(thumb.getvalue())
    s420 = out["s420"].read_bytes()
    thumbed = s420[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + s420[2:]
    (dst / "exif_thumb.jpg").write_bytes(thumbed)
    out["exif_thumb"] = dst / "exif_thumb.jpg"

    (dst / "truncated.jpg").write_bytes(s420[: len(s420) * 6 // 10])
    out["truncated"] = dst / "truncated.jpg"
    rng = np.random.default_rng(0)
    (dst / "fake.jpg").write_bytes(b"\xff\xd8\xff\xe0" + rng.bytes(20000))
    out["fake"] = dst / "fake.jpg"
    return out
