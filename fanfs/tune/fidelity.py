"""How much image quality each fidelity keeps, measured on a sample of a store's JPEG records.

For each K, over a seeded random sample of records: the mean fraction of bytes presented at K, and
the mean SSIM and MS-SSIM (luma, numpy) of the K-layer decode against the full decode.  The
recommendation for a quality bar X is the smallest K whose mean SSIM reaches X: the model-free way
to pick PCR's scan group (Kuchnik et al. choose per task by gradient similarity; SSIM needs no model).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import StoreError
from ..records import FULL
from ..records.jpeg import JpegRecords
from ..store import Store
from ..util.progress import Progress
from ..util.runtime import create_private, runtime_dir
from ..util.workers import process_pool


@dataclass
class FidelityCurve:
    """Per K = 1..len(ks): means over the sampled images (an image with fewer layers than K is whole)."""

    store_id: str
    images: int
    ks: list[int]
    bytes_fraction: list[float]
    ssim: list[float]
    ms_ssim: list[float]

    def recommend(self, min_ssim: float) -> int:
        """Smallest K whose mean SSIM reaches ``min_ssim``; FULL when none does."""
        for k, value in zip(self.ks, self.ssim):
            if value >= min_ssim:
                return k
        return FULL


def parse_fidelity(text: str) -> int | float:
    """``full`` -> FULL, ``5`` -> 5, ``auto:0.95`` -> 0.95 (a float: the SSIM bar to meet)."""
    value = text.strip().lower()
    if value == "full":
        return FULL
    if value.startswith("auto:"):
        try:
            bar = float(value[5:])
        except ValueError:
            bar = -1.0
        if not 0 < bar <= 1:
            raise ValueError(f"bad fidelity {text!r}: auto takes an SSIM bar in (0, 1], e.g. auto:0.95")
        return bar
    if value.isdigit() and 1 <= int(value) < FULL:
        return int(value)
    raise ValueError(f"bad fidelity {text!r}: use a layer count K >= 1, 'full', or auto:SSIM (e.g. auto:0.95)")


AUTO_SAMPLE = 100
"""Images sampled for ``--fidelity auto:SSIM`` (the curve is measured once per store and cached)."""

_store: Store | None = None  # the store being measured; forked workers inherit it


def _measure(entry: int) -> tuple[list[int], list[float], list[float]]:
    """Sizes, SSIM and MS-SSIM of one record at K = 1..layers."""
    from .quality import decode, similarity
    store = _store
    assert store is not None
    layers = int(store.index.layers[entry])
    path = store.index.path(entry)
    full = decode(store.read_file(path))
    sizes, ssims, msssims = [], [], []
    for k in range(1, layers + 1):
        sizes.append(store.size_at(entry, k))
        if k == layers:
            ssims.append(1.0)
            msssims.append(1.0)
        else:
            s, m = similarity(full, decode(store.read_file(path, k)))
            ssims.append(s)
            msssims.append(m)
    return sizes, ssims, msssims


def analyse(store: Store, sample: int = 500, seed: int = 0, jobs: int | None = None,
            progress: bool = True) -> FidelityCurve:
    """Measure the curve on ``sample`` records chosen with ``seed`` (parallel over ``jobs`` processes)."""
    records = np.flatnonzero(store.index.record == JpegRecords.kind_id)
    if records.size == 0:
        raise StoreError(f"{store.root} holds no progressive JPEG records: pack with --progressive-jpeg")
    chosen = np.sort(np.random.default_rng(seed).choice(records, size=min(sample, records.size), replace=False))
    global _store
    _store = store
    entries = chosen.tolist()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(entries)))
    results = []
    with Progress(len(entries), "fidelity", enabled=progress) as bar, contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(process_pool(jobs))
            measured = pool.map(_measure, entries, chunksize=4)
        else:
            measured = map(_measure, entries)  # in this process: an MPI rank must not fork
        for n, result in enumerate(measured, 1):
            results.append(result)
            bar.update_to(n)
    top = max(len(sizes) for sizes, _, _ in results)
    fraction = np.ones((len(results), top))
    ssims = np.ones((len(results), top))
    msssims = np.ones((len(results), top))
    for i, (sizes, s, m) in enumerate(results):
        n = len(sizes)
        fraction[i, :n] = np.asarray(sizes) / sizes[-1]
        ssims[i, :n] = s
        msssims[i, :n] = m
    return FidelityCurve(store.meta["store_id"], len(results), list(range(1, top + 1)),
                         fraction.mean(0).round(4).tolist(), ssims.mean(0).round(4).tolist(),
                         msssims.mean(0).round(4).tolist())


def cached_curve(store: Store, sample: int, seed: int = 0, progress: bool = False,
                 jobs: int | None = None) -> FidelityCurve:
    """The curve for ``auto`` fidelity, measured once per store and sample and kept in the runtime dir."""
    path = os.path.join(runtime_dir(), f"fidelity-{store.meta['store_id']}-{sample}-{seed}.json")
    try:
        with open(path) as f:
            return FidelityCurve(**json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    curve = analyse(store, sample, seed, jobs, progress=progress)
    tmp = f"{path}.{os.getpid()}"
    with open(create_private(tmp), "w") as f:
        json.dump(asdict(curve), f)
    os.replace(tmp, path)
    return curve


def auto_fidelity(store: Store, min_ssim: float, jobs: int | None = None) -> tuple[int, str]:
    """``auto:SSIM``: the smallest K whose mean SSIM reaches ``min_ssim``, and a line saying so."""
    curve = cached_curve(store, AUTO_SAMPLE, jobs=jobs)
    k = curve.recommend(min_ssim)
    return k, (f"fidelity auto:{min_ssim} -> {'full' if k == FULL else k} (smallest K with mean SSIM >= "
               f"{min_ssim} over {curve.images} sampled images)")


def format_curve(curve: FidelityCurve, min_ssim: float) -> str:
    best = curve.recommend(min_ssim)
    lines = [f"fidelity over {curve.images} sampled JPEG records (SSIM/MS-SSIM of the K-layer decode vs full)",
             "   K   bytes   SSIM  MS-SSIM"]
    for k, b, s, m in zip(curve.ks, curve.bytes_fraction, curve.ssim, curve.ms_ssim):
        mark = "  <- smallest K with SSIM >= %.3g" % min_ssim if k == best else ""
        lines.append(f"{k:>4} {b:>7.3f} {s:>6.3f} {m:>8.3f}{mark}")
    if best == FULL:
        lines.append(f"no K below full reaches SSIM {min_ssim}: mount at full fidelity")
    return "\n".join(lines)


def plot_curve(curve: FidelityCurve, min_ssim: float, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(curve.ks, curve.ssim, "o-", label="SSIM vs full")
    ax.plot(curve.ks, curve.ms_ssim, "s-", label="MS-SSIM vs full")
    ax.plot(curve.ks, curve.bytes_fraction, "^--", color="gray", label="bytes read (fraction of full)")
    ax.axhline(min_ssim, color="red", lw=0.8, ls=":", label=f"SSIM bar {min_ssim}")
    best = curve.recommend(min_ssim)
    if best != FULL:
        ax.axvline(best, color="green", lw=1, ls="--", label=f"recommended K = {best}")
    ax.set_xlabel("fidelity K (scan groups presented)")
    ax.set_ylabel("mean over sample")
    ax.set_xticks(curve.ks)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"fanfs fidelity: quality and bytes per K ({curve.images} images)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
