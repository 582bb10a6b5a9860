"""Image fidelity metrics (SSIM, MS-SSIM) in plain numpy, to pick a progressive-JPEG fidelity.

Colour images are compared on their BT.601 luma (Y = 0.299 R + 0.587 G + 0.114 B, unrounded
float), as is usual for JPEG evaluation: chroma is subsampled and barely matters for SSIM.
Constants follow Wang et al.: K1=0.01, K2=0.03, L=255, 11x11 Gaussian window with sigma 1.5,
evaluated only where the window fits the image (equals skimage's ``structural_similarity`` with
``gaussian_weights=True, use_sample_covariance=False``, which crops its borders the same way).
"""

from __future__ import annotations

import numpy as np

from ..util.images import decode_pixels as decode

__all__ = ["decode", "ssim", "ms_ssim", "MS_SSIM_WEIGHTS"]

C1 = (0.01 * 255) ** 2
C2 = (0.03 * 255) ** 2
WIN = 11
MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
_LUMA = np.array([0.299, 0.587, 0.114])
_g = np.exp(-0.5 * ((np.arange(WIN) - WIN // 2) / 1.5) ** 2)
_GAUSS = _g / _g.sum()


def _luma(a: np.ndarray) -> np.ndarray:
    """Float luma of an image (or of a band of its rows)."""
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim == 2:
        return a.astype(np.float64)
    if a.ndim == 3 and a.shape[2] == 3:
        return a @ _LUMA
    raise ValueError(f"expected HxW, HxWx1 or HxWx3, got shape {a.shape}")


def _filter(x: np.ndarray) -> np.ndarray:
    """Separable 'valid' Gaussian filtering: 2 x 11 shifted multiply-adds."""
    h, w = x.shape
    rows = sum(_GAUSS[i] * x[:, i:w - WIN + 1 + i] for i in range(WIN))
    return sum(_GAUSS[i] * rows[i:h - WIN + 1 + i] for i in range(WIN))


BAND = 256
"""Rows of SSIM map computed at once.  A whole-image pass held a dozen float64 images (~100 bytes per
pixel: 10 GB for a 10000x10000 JPEG); in bands they are a dozen BAND-row strips, and what stays whole is
the two decoded images and the next scale's luma (a measurement peaks at ~12-16 bytes per pixel with the
decodes; docs/userguide.rst, "Using it", pack).  Each value of the map is computed exactly as before; only the order
of the final sums differs."""


def _ssim_cs_sums(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Sums of the SSIM map and of the contrast-structure map of two float images (a band)."""
    mx, my = _filter(x), _filter(y)
    mxx, myy, mxy = mx * mx, my * my, mx * my
    vx = _filter(x * x) - mxx
    vy = _filter(y * y) - myy
    cov = _filter(x * y) - mxy
    cs = (2 * cov + C2) / (vx + vy + C2)
    lum = (2 * mxy + C1) / (mxx + myy + C1)
    return float(np.sum(lum * cs)), float(np.sum(cs))


def _scale(x: np.ndarray, y: np.ndarray, last: bool) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Mean SSIM and mean contrast-structure term of one scale and, unless ``last``, the luma of the
    next (half) scale; ``x``, ``y``: the images as given (any shape :func:`_luma` takes) or float luma."""
    h, w = x.shape[:2]
    if min(h, w) < WIN:
        raise ValueError(f"images must be at least {WIN}x{WIN}, got {x.shape}")
    rows = h - WIN + 1
    ssim_sum = cs_sum = 0.0
    halves: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for top in range(0, rows, BAND):
        stop = min(top + BAND, rows)
        bx, by = _luma(x[top:stop + WIN - 1]), _luma(y[top:stop + WIN - 1])
        s, c = _ssim_cs_sums(bx, by)
        ssim_sum += s
        cs_sum += c
        if not last:  # rows [top, stop) halve to the next scale; the last band also takes the rows below
            end = (stop if stop < rows else h // 2 * 2) - top
            halves[0].append(_half(bx[:end]))
            halves[1].append(_half(by[:end]))
    count = rows * (w - WIN + 1)
    empty = np.zeros((0, 0))
    next_x, next_y = (np.concatenate(halves[0]), np.concatenate(halves[1])) if not last else (empty, empty)
    return ssim_sum / count, cs_sum / count, next_x, next_y


def _checked(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (1, 3))):
        raise ValueError(f"expected HxW, HxWx1 or HxWx3, got shape {a.shape}")
    return a, b


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean structural similarity of two uint8 images (1.0 = identical)."""
    return _scale(*_checked(a, b), last=True)[0]


def _half(x: np.ndarray) -> np.ndarray:
    h, w = x.shape[0] // 2 * 2, x.shape[1] // 2 * 2
    return x[:h, :w].reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Multi-scale SSIM (Wang, Simoncelli, Bovik 2003) over up to 5 dyadic scales.

    Small images use only the scales where the 11x11 window still fits, with the weights of
    those scales renormalised to sum to 1. Negative contrast terms are clamped to 0 so that the
    fractional powers stay real.
    """
    return similarity(a, b)[1]


def similarity(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(SSIM, MS-SSIM) in one pass: the full-scale SSIM is MS-SSIM's first scale anyway."""
    x, y = _checked(a, b)
    scales = 1
    while scales < len(MS_SSIM_WEIGHTS) and min(x.shape[:2]) >> scales >= WIN:
        scales += 1
    weights = np.array(MS_SSIM_WEIGHTS[:scales])
    weights /= weights.sum()
    terms = []
    first = 0.0
    for s in range(scales):
        full, cs, x, y = _scale(x, y, last=s == scales - 1)
        if s == 0:
            first = full
        terms.append(cs if s < scales - 1 else full)
    return first, float(np.prod(np.maximum(terms, 0.0) ** weights))
