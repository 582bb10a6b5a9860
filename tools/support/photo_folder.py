"""The dataset a user writes for photos in class folders (PIL decode, a random crop, a float tensor).

Shared by the training tests and ``tools/bench/bench_train.py``, so both read a mount the way unmodified
training code does.  Imports torch: only for the tests and tools that have it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image


class PhotoFolder(torch.utils.data.Dataset):
    """One folder per class under ``root``; item i is (a random ``crop`` x ``crop`` of the photo, its class)."""

    def __init__(self, root: Path, crop: int) -> None:
        classes = sorted(os.listdir(root))
        self.items = [(root / c / name, label) for label, c in enumerate(classes) for name in sorted(os.listdir(root / c))]
        self.crop = crop

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
        crop = self.crop
        if im.width < crop or im.height < crop:
            im = im.resize((max(crop, im.width), max(crop, im.height)))
        x, y = random.randint(0, im.width - crop), random.randint(0, im.height - crop)
        pixels = np.asarray(im.crop((x, y, x + crop, y + crop)), dtype=np.float32) / 255
        return torch.from_numpy(pixels).permute(2, 0, 1), label
