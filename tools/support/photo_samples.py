"""Real-photo JPEGs for the tests and benchmarks: the photos installed packages ship, and distinct variants of them.

The originals come with scikit-learn, scikit-image and matplotlib (a missing package means fewer
photos).  Variants are random crops, re-encoded: real photo content, and no two files alike (squashfs
would deduplicate copies; a store would compress them unlike real data).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# name -> (package, path inside the package)
PHOTO_SOURCES = {
    "china": ("sklearn", "datasets/images/china.jpg"),
    "flower": ("sklearn", "datasets/images/flower.jpg"),
    "rocket": ("skimage", "data/rocket.jpg"),
    "retina": ("skimage", "data/retina.jpg"),
    "hubble": ("skimage", "data/hubble_deep_field.jpg"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
}


def _package_file(package: str, rel: str) -> Path | None:
    try:
        mod = __import__(package)
    except ImportError:
        return None
    path = Path(mod.__file__).parent / rel
    return path if path.is_file() else None


def photo_paths() -> dict[str, Path]:
    """The shipped photos that are installed here."""
    found = {name: _package_file(*src) for name, src in PHOTO_SOURCES.items()}
    return {name: p for name, p in found.items() if p is not None}


def make_photo_set(dst: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` distinct real-photo JPEGs (random crops of the shipped photos, ~250-500 px, qualities
    75-95, some grayscale, some 4:4:4): an ImageNet-like folder for tests that need many images."""
    dst.mkdir(parents=True, exist_ok=True)
    photos = [Image.open(p).convert("RGB") for p in photo_paths().values()]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        im = photos[int(rng.integers(len(photos)))]
        w, h = im.size
        cw, ch = int(rng.integers(w // 3, w)), int(rng.integers(h // 3, h))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = im.crop((x, y, x + cw, y + ch))
        crop.thumbnail((int(rng.integers(250, 500)),) * 2)
        if i % 7 == 3:
            crop = crop.convert("L")
        path = dst / f"img_{i:05d}.jpg"
        crop.save(path, "JPEG", quality=int(rng.integers(75, 96)), subsampling=0 if i % 5 == 1 else 2)
        out.append(path)
    return out


_photos: list[Any] = []
_bytes_per_pixel: dict[tuple[int, int], float] = {}  # (photo, quality) -> last seen, so most files need one encode


def _jpeg_variant(args: tuple[int, int]) -> bytes:
    """One distinct JPEG of about ``target`` bytes: a random crop of a real photo, resized, flipped, re-encoded.

    The pixel count comes from the last encode of that photo at that quality, corrected if the size is
    off by more than 15%.
    """
    seed, target = args
    rng = np.random.default_rng(seed)
    if not _photos:
        photos = photo_paths()
        if not photos:
            raise RuntimeError("no sample photos: install scikit-learn, scikit-image or matplotlib")
        _photos.extend(Image.open(p).convert("RGB") for p in photos.values())
    pick = int(rng.integers(len(_photos)))
    im = _photos[pick]
    w, h = im.size
    scale = rng.uniform(0.5, 1.0)
    cw, ch = int(w * scale), int(h * scale)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    crop = im.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    quality = int(rng.integers(85, 96))
    for _ in range(3):
        bpp = _bytes_per_pixel.get((pick, quality), 0.25)
        side = (target / bpp / (cw * ch)) ** 0.5
        size = (max(16, int(cw * side)), max(16, int(ch * side)))
        out = io.BytesIO()
        crop.resize(size, Image.Resampling.BILINEAR).save(out, "JPEG", quality=quality)
        data = out.getvalue()
        _bytes_per_pixel[(pick, quality)] = len(data) / (size[0] * size[1])
        if abs(len(data) - target) < 0.15 * target:
            break
    return data


def make_jpegs(count: int, target: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct real-photo JPEGs of about ``target`` bytes (all cores; squashfs would dedupe copies)."""
    with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        return pool.map(_jpeg_variant, [(seed * 1_000_003 + i, target) for i in range(count)], chunksize=16)
