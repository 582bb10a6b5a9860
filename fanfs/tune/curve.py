"""The fidelity curve of a store (:mod:`.fidelity` measures it), and its copy saved with the store.

``fanfs fidelity STORE --save`` measures the curve once and keeps it in the store directory
(:mod:`fanfs.store.saved`: atomic, bound to the store id and the index checksum, checksummed); from
then on every mount, job and fsspec reader that asks for ``auto:SSIM`` looks it up there and measures
nothing.  What a saved curve says is checked here, value by value, before anything trusts it: a crafted
one is refused with one line, as a crafted index is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import StoreError
from ..records import FULL
from ..records.jpeg import FIDELITY, JpegRecords, tier_values
from ..store import Store
from ..store.saved import finite, read_saved, write_saved

CURVE_FILE = "fidelity.json"
SAVE_REMEDY = "measure and save it again with 'fanfs fidelity STORE --save', or remove it"


@dataclass
class FidelityCurve:
    """Per K = 1..len(ks): means over the sampled images (an image with fewer layers than K is whole)."""

    store_id: str
    images: int
    ks: list[int]
    bytes_fraction: list[float]
    ssim: list[float]
    ms_ssim: list[float]
    decode_vs_full: list[float] = field(default_factory=list)
    """Per K, median over the timed images of decode time at full / at K (> 1: faster); empty if none timed."""
    decode_vs_source: list[float] = field(default_factory=list)
    """Per K, the same against the original file; empty without the source tree."""
    timed: int = 0
    with_source: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Sampled records left out of the means, by reason (too small for SSIM's window, too many pixels)."""
    tiers: list[dict] = field(default_factory=list)
    """Per resolution tier (``fidelity``: ``1/2``): ``records`` that have it and, over them, ``bytes_fraction``,
    ``ssim`` and ``ms_ssim`` against the full image reduced as much; when timed ``decode_vs_full`` (and
    ``decode_vs_source``), as for K.  Not candidates of ``recommend``: their SSIM is at another size."""

    def skip_note(self) -> str:
        """``skipped 3 of 100 sampled records: 2 smaller than 11x11 pixels ...`` (when some were)."""
        left_out = sum(self.skipped.values())
        return f"skipped {left_out} of {self.images + left_out} sampled records: {reasons(self.skipped)}"

    def recommend(self, min_ssim: float) -> int:
        """Smallest K whose mean SSIM reaches ``min_ssim``; FULL when none does."""
        for k, value in zip(self.ks, self.ssim):
            if value >= min_ssim:
                return k
        return FULL


def reasons(skipped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))


def save_curve(store: Store, curve: FidelityCurve) -> str:
    """Keep ``curve`` with the store (beside its index); returns the file's path."""
    if curve.store_id != store.meta["store_id"]:
        raise StoreError(f"this curve was measured on another store than {store.root}")
    return write_saved(store.root, CURVE_FILE, store.index, asdict(curve),
                       "the store's owner can save it ('fanfs fidelity STORE --save')")


def saved_curve(store: Store) -> FidelityCurve | None:
    """The curve saved with the store, checked; None if there is none.  StoreError (one line) if it fails a check."""
    content = read_saved(store.root, CURVE_FILE, store.index, SAVE_REMEDY)
    if content is None:
        return None
    problem = _problem(content, store)
    if problem:
        raise StoreError(f"{store.root}/{CURVE_FILE}: {problem}: {SAVE_REMEDY}")
    return FidelityCurve(**content)


def _numbers(values: Any, n: int, low: float, high: float) -> bool:
    return isinstance(values, list) and len(values) == n and all(finite(v) and low <= v <= high for v in values)


def _count(value: Any, high: int = 1 << 40) -> bool:
    return type(value) is int and 0 <= value <= high


def _problem(c: dict[str, Any], store: Store) -> str | None:
    """What is wrong with a saved curve's content for ``store`` (None: nothing)."""
    names = {f.name for f in fields(FidelityCurve)}
    if set(c) != names:
        return f"not a fidelity curve (keys {sorted(set(c) ^ names)} unexpected or missing)"
    if c["store_id"] != store.meta["store_id"]:
        return "a curve of another store"
    records = np.flatnonzero(store.index.record == JpegRecords.kind_id)
    layers = int(store.index.layers[records].max()) if records.size else 0
    if not (_count(c["images"]) and 1 <= c["images"] <= records.size):
        return f"{c['images']!r} images measured, of {records.size} JPEG records"
    ks = c["ks"]
    if not (isinstance(ks, list) and 1 <= len(ks) <= layers and ks == list(range(1, len(ks) + 1))):
        return f"fidelities {str(ks)[:40]} are not 1..K for a K up to {layers}"
    n = len(ks)
    if not (_numbers(c["bytes_fraction"], n, 0, 1) and _numbers(c["ssim"], n, -1, 1) and _numbers(c["ms_ssim"], n, -1, 1)):
        return "bytes, SSIM or MS-SSIM are not one number per K within their range"
    for name in ("decode_vs_full", "decode_vs_source"):
        if c[name] != [] and not _numbers(c[name], n, 0, 1e6):
            return f"{name} is not one speed ratio per K"
    if not (_count(c["timed"]) and _count(c["with_source"]) and c["with_source"] <= c["timed"] <= c["images"]):
        return "the counts of timed images are impossible"
    skipped = c["skipped"]
    if not (isinstance(skipped, dict) and len(skipped) <= 16 and all(isinstance(k, str) and len(k) <= 200 and _count(v)
                                                                      for k, v in skipped.items())):
        return "the skipped records are not counts by reason"
    tiers = [FIDELITY.format(value) for value in tier_values(store.index)]
    if not (isinstance(c["tiers"], list) and [isinstance(t, dict) and t.get("fidelity") for t in c["tiers"]] == tiers):
        return f"its tiers are not the store's ({', '.join(tiers) or 'none'})"
    for tier in c["tiers"]:
        bounds = {"records": None, "bytes_fraction": (0, 1), "ssim": (-1, 1), "ms_ssim": (-1, 1),
                  "decode_vs_full": (0, 1e6), "decode_vs_source": (0, 1e6)}
        if not (set(tier) - {"fidelity"} <= set(bounds) and _count(tier.get("records"), c["images"])
                and all(finite(tier[k]) and low <= tier[k] <= high for k, (low, high) in
                        ((k, b) for k, b in bounds.items() if b and k in tier))):
            return f"tier {tier['fidelity']} is malformed"
    return None
