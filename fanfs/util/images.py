"""Images: decoded to pixels (Pillow: how a JPEG record is compared with its source, and images with each other), and
drawn as plots (matplotlib for ``--plot``: an extra, ``fanfs[plots]``, never needed to pack, mount or serve)."""

from __future__ import annotations

import io
from types import ModuleType

import numpy as np

from ..errors import UsageError


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


EXTRA = "pip install 'matplotlib>=3.7' (fanfs's plots extra; from its checkout: .venv/bin/pip install -e '.[plots]')"
"""How to get it: fanfs is installed from its checkout, not from a package index that an extra's name would be
looked up in."""


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, drawing to files; one line naming the extra if matplotlib is not installed.

    Called before a measurement starts too, so that a missing matplotlib is said at once, not after it.
    """
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"--plot needs matplotlib, which is not installed: {EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
