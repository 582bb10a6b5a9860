"""SSIM / MS-SSIM in numpy: identities, agreement with scikit-image, and the fidelity trend."""

from __future__ import annotations

import numpy as np
import pytest

from fanfs.records.jpeg.markers import present, split_layers
from fanfs.records.jpeg.transcode import to_progressive
from fanfs.tune.quality import decode, ms_ssim, ssim

from support.jpeg_samples import build_samples


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    s = build_samples(tmp_path_factory.mktemp("quality_samples"))
    if "s420" not in s:
        pytest.skip("no sample photos installed (sklearn, skimage, matplotlib)")
    return {name: path.read_bytes() for name, path in s.items()}


@pytest.fixture(scope="module")
def photo_layers(samples):
    return split_layers(to_progressive(samples["s420"]))


def test_identity(samples):
    for name in ("s420", "gray"):
        x = decode(samples[name])
        assert ssim(x, x) == pytest.approx(1.0, abs=1e-12)
        assert ms_ssim(x, x) == pytest.approx(1.0, abs=1e-12)


def test_decode_modes_and_truncation(samples):
    assert decode(samples["gray"]).ndim == 2
    rgb, cmyk = decode(samples["s420"]), decode(samples["cmyk"])
    assert rgb.dtype == np.uint8 and rgb.shape[2] == 3 and cmyk.shape == rgb.shape
    with pytest.raises(OSError):
        decode(samples["truncated"])


def test_fewer_layers_lower_similarity(photo_layers):
    full = decode(b"".join(photo_layers))
    n = len(photo_layers)
    s = [ssim(full, decode(present(photo_layers, k))) for k in range(1, n + 1)]
    m = [ms_ssim(full, decode(present(photo_layers, k))) for k in range(1, n + 1)]
    assert s[-1] == pytest.approx(1.0) and m[-1] == pytest.approx(1.0)
    assert s[0] < 0.8 and s[0] < s[4] < s[-1]
    for series in (s, m):
        assert all(b >= a - 0.01 for a, b in zip(series, series[1:])), series
        assert all(0.0 <= v <= 1.0 + 1e-9 for v in series)


def test_matches_skimage(photo_layers, samples):
    metrics = pytest.importorskip("skimage.metrics")
    full = decode(b"".join(photo_layers))
    rng = np.random.default_rng(0)
    gray = decode(samples["gray"])
    pairs = [(full, decode(present(photo_layers, k))) for k in (1, 3, 6)]
    pairs.append((gray, np.clip(gray + rng.normal(0, 12, gray.shape), 0, 255).astype(np.uint8)))
    pairs.append((rng.integers(0, 256, (64, 80), dtype=np.uint8),
                  rng.integers(0, 256, (64, 80), dtype=np.uint8)))

    def luma(x):
        return x @ np.array([0.299, 0.587, 0.114]) if x.ndim == 3 else x.astype(np.float64)

    for a, b in pairs:
        ref = metrics.structural_similarity(luma(a), luma(b),
                                            gaussian_weights=True, sigma=1.5,
                                            use_sample_covariance=False, data_range=255)
        assert ssim(a, b) == pytest.approx(ref, abs=1e-3)


def test_small_images_and_bad_shapes():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
    b = np.clip(a + rng.normal(0, 20, a.shape), 0, 255).astype(np.uint8)
    assert 0 < ms_ssim(a, b) < 1  # only 2 scales fit (30 -> 15)
    assert ms_ssim(a[:11, :11], a[:11, :11]) == pytest.approx(1.0)
    for x, y in ((a, a[:, :20]), (a[:8, :8], a[:8, :8]), (a[..., :2], a[..., :2])):
        with pytest.raises(ValueError):
            ssim(x, y)
