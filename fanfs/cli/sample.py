"""A small built-in dataset: an ImageFolder of real-photo JPEGs plus the odds and ends of a real tree.

The photo (``grace_hopper.jpg``, a U.S. Navy portrait in the public domain, the one matplotlib ships
among its sample data) comes with fanfs, so the sample needs no download and no extra.
Crops, flips and scales re-encoded as baseline JPEGs give ImageNet-like files (~30-120 KB).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import PIL.Image

CLASSES = ("n01440764", "n01443537", "n01484850", "n01491361")


def _photo() -> "PIL.Image.Image":
    from PIL import Image
    return Image.open(Path(__file__).with_name("grace_hopper.jpg")).convert("RGB")


def make_sample(root: str | os.PathLike, images_per_class: int = 30, seed: int = 0) -> Path:
    """Write the sample tree under ``root`` (created) and return it."""
    from PIL import Image
    root = Path(root)
    rng = np.random.default_rng(seed)
    photo = _photo()
    width, height = photo.size
    for c, name in enumerate(CLASSES):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(images_per_class):
            w = int(rng.integers(width // 2, width))
            h = int(rng.integers(height // 2, height))
            x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            image = photo.crop((x, y, x + w, y + h))
            if (c + i) % 2:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            scale = float(rng.uniform(0.8, 1.6))
            image = image.resize((int(w * scale), int(h * scale)), Image.Resampling.BICUBIC)
            image.save(folder / f"{name}_{i:05d}.JPEG", quality=int(rng.integers(80, 96)))
    (root / "labels.csv").write_text("".join(f"{i},{name}\n" for i, name in enumerate(CLASSES)))
    (root / "README.txt").write_text("fanfs built-in sample: an ImageFolder tree plus metadata files.\n")
    weights = root / "weights"
    weights.mkdir(exist_ok=True)
    np.save(weights / "layer0.npy", (rng.standard_normal((256, 256)) * 0.02).astype(np.float32))
    source = Path(__file__).parent.parent  # fanfs's own sources: a tree of small text files
    for py in sorted(source.rglob("*.py")):
        target = root / "code" / py.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(py.read_bytes())
    (root / "empty.txt").write_bytes(b"")
    (root / "latest").symlink_to("train")
    return root
