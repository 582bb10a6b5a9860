"""Images decoded to pixels (Pillow): how a JPEG record is compared with its source, and images with each other."""

from __future__ import annotations

import io

import numpy as np


def decode_pixels(data: bytes) -> np.ndarray:
    """Decode an image to uint8 HxW (grayscale) or HxWx3 (anything else, via RGB).

    Truncated data raises (Pillow's LOAD_TRUNCATED_IMAGES is left False), so a broken presented file
    is never mistaken for a coarse one.
    """
    from PIL import Image
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        if im.mode not in ("L", "RGB"):
            im = im.convert("RGB")
        return np.asarray(im)
