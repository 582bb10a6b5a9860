"""How much image quality each fidelity keeps, and what it costs to decode, on a sample of a store's JPEG records.

For each K, over a seeded random sample of records: the mean fraction of bytes presented at K, and
the mean SSIM and MS-SSIM (luma, numpy) of the K-layer decode against the full decode.  The
recommendation for a quality bar X is the smallest K whose mean SSIM reaches X: the model-free way
to pick PCR's scan group (Kuchnik et al. choose per task by gradient similarity; SSIM needs no model).
On a subsample, the decode speed at each K (:mod:`.decode_speed`) relative to the full presentation
and, given the tree the store was packed from, to the original files: fewer bytes can mean more CPU.
A store packed with ``--scales`` gets a row per resolution tier too: its bytes, its SSIM against the full
image reduced by the same factor (the box average the tier was made with), and its decode speed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict

import numpy as np

from ..errors import StoreError, UsageError
from ..records import FULL, Auto, Presentation, register_resolver
from ..records.jpeg import DEFAULT_MAX_PIXELS, FIDELITY, MAX_SIZE, JpegError, JpegRecords, frame, tier_values
from ..store import Store
from ..util.files import read_regular
from ..util.images import pyplot
from ..util.progress import Progress
from ..util.runtime import create_private, runtime_dir
from ..util.processes import process_pool
from .curve import FidelityCurve, reasons, saved_curve
from .quality import WIN

__all__ = ["FidelityCurve", "analyse", "auto_fidelity", "format_curve", "plot_curve"]

log = logging.getLogger("fanfs")


AUTO_SAMPLE = 100
"""Images sampled for ``--fidelity auto:SSIM`` when the store has no saved curve (measured once per store and node,
cached in the runtime directory, untimed)."""

_store: Store | None = None  # the store being measured; forked workers inherit it


Measured = tuple[list[int], list[float], list[float], list[tuple[float, float, float] | None]]
UNDECODABLE = "that does not decode (a damaged or crafted store?)"


class _Undecodable(Exception):
    """A record's bytes that Pillow cannot decode (only a crafted or damaged store holds one whose checksums hold)."""


def _pixels(data: bytes) -> np.ndarray:
    from .quality import decode
    try:
        return decode(data)
    except Exception as err:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, ValueError, its bomb error...
        raise _Undecodable(str(err)) from None


def _measure(entry: int) -> Measured | str:
    """Sizes, SSIM and MS-SSIM of one record at K = 1..layers; per tier of the store, (bytes fraction, SSIM,
    MS-SSIM) against the full image reduced by the tier's factor, or None if the record has no tiers.  Or, for a
    record that does not decode, UNDECODABLE: it is left out of the means, not the end of the measurement."""
    from .quality import similarity
    store = _store
    assert store is not None
    layers = int(store.index.layers[entry])
    path = store.index.path(entry)
    try:
        full = _pixels(store.read_file(path))
        sizes, ssims, msssims = [], [], []
        for k in range(1, layers + 1):
            sizes.append(store.size_at(entry, k))
            if k == layers:
                ssims.append(1.0)
                msssims.append(1.0)
            else:
                s, m = similarity(full, _pixels(store.read_file(path, k)))
                ssims.append(s)
                msssims.append(m)
        tiers: list[tuple[float, float, float] | None] = []
        for value in tier_values(store.index):
            view = store.view(entry, _at(value))
            if view != value:
                tiers.append(None)
                continue
            reduced = _reduced(full, value & 0x7FFF)
            tiers.append((store.size_at(entry, view) / sizes[-1],
                          *similarity(reduced, _pixels(store.read_file(path, view)))))
    except _Undecodable:
        return UNDECODABLE
    return sizes, ssims, msssims, tiers


def _at(value: int) -> Presentation:
    """The presentation at fidelity ``value``."""
    return Presentation({FIDELITY.name: value})


def _reduced(pixels: np.ndarray, scale: int) -> np.ndarray:
    """The decoded image reduced ``scale`` times by box averaging (how pack made the tier)."""
    from PIL import Image
    return np.asarray(Image.fromarray(pixels).reduce(scale))


def _unmeasurable(store: Store, entry: int, max_pixels: int) -> str | None:
    """Why a record is left out of the measurement, read from its frame headers (layer 0's, then each resolution
    tier's), never by decoding it; None if it is measured.  An image narrower than SSIM's 11x11 window is skipped,
    not measured with a smaller window: SSIM's constants and window define the statistic, and a mean over values
    of differently defined statistics would mean nothing.  One with more than ``max_pixels`` pixels is
    skipped because decoding it twice and comparing costs ~16 bytes per pixel (10000x10000: 1.6 GB).  One whose
    tier's header is not the image reduced by the tier's factor is skipped: pack made no such tier, and a crafted
    one may claim any size (65535x65535: a decompression bomb to Pillow)."""
    try:
        image = frame(store.blob(entry, int(store.index.first[entry]), 0, keep=False))
    except JpegError:
        return "without a JPEG frame header"
    if min(image.width, image.height) < WIN:
        return f"smaller than {WIN}x{WIN} pixels (SSIM's window)"
    if image.pixels > max_pixels:
        return f"over {max_pixels:,} pixels (--max-pixels)"
    for value in tier_values(store.index):
        view = store.view(entry, _at(value))
        if view != value:
            continue  # a record without tiers
        scale = value & 0x7FFF
        try:
            tier = frame(store.read_file(store.index.path(entry), view))
        except JpegError:
            tier = None
        if tier is None or (tier.width, tier.height) != (-(-image.width // scale), -(-image.height // scale)):
            return "with a resolution tier whose header is not the image reduced (a crafted store?)"
    return None


def _original(source: str, path: bytes, full: bytes) -> bytes | None:
    """The source file a record was packed from, if it is there and decodes to the record's pixels."""
    from .quality import decode
    try:
        data = read_regular(os.path.join(os.fsencode(source), path), limit=MAX_SIZE)
        return data if np.array_equal(decode(data), decode(full)) else None
    except Exception:  # noqa: BLE001 - missing, unreadable or not the same image: not this record's original
        return None


def _time_decodes(store: Store, entries: list[int], top: int, source: str | None, seed: int,
                  progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per image and K = 1..top, then per tier of the store, decode speed relative to the full presentation and
    to the original (rows of images without a matching original are NaN in the second, a tier the image lacks
    NaN in both)."""
    from .decode_speed import decode_times
    rng = np.random.default_rng(seed)
    tiers = tier_values(store.index)
    vs_full = np.ones((len(entries), top + len(tiers)))
    vs_full[:, top:] = np.nan
    vs_source = np.full((len(entries), top + len(tiers)), np.nan)
    with Progress(len(entries), "decode speed", enabled=progress, unit="records") as bar:
        for i, entry in enumerate(entries):
            path = store.index.path(entry)
            layers = int(store.index.layers[entry])
            held = [t for t, value in enumerate(tiers) if store.view(entry, _at(value)) == value]
            variants = ([store.read_file(path, k) for k in range(1, layers)] + [store.read_file(path, tiers[t]) for t in held]
                        + [store.read_file(path)])
            original = _original(source, path, variants[-1]) if source else None
            seconds = np.asarray(decode_times(variants + ([original] if original else []), rng))
            full = seconds[len(variants) - 1]
            columns = [*range(layers - 1), *(top + t for t in held)]
            vs_full[i, columns] = full / seconds[:len(columns)]
            if original:
                vs_source[i, columns] = seconds[-1] / seconds[:len(columns)]
                vs_source[i, layers - 1:top] = seconds[-1] / full
            bar.update_to(i + 1)
    return vs_full, vs_source


def analyse(store: Store, sample: int = 500, seed: int = 0, jobs: int | None = None, progress: bool = True,
            timed: int = 0, source: str | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
            starting: Callable[[int], None] | None = None) -> FidelityCurve:
    """Measure the curve on ``sample`` records chosen with ``seed`` (parallel over ``jobs`` processes), then the
    decode speed on ``timed`` of those measured (in this process, against the originals under ``source``).
    Records that cannot be measured (:func:`_unmeasurable`, or that do not decode) are left out and counted in
    ``skipped``.  ``starting(n)``: told once the n records to measure are known, before the long part (a store
    with none is an error before it)."""
    records = np.flatnonzero(store.index.record == JpegRecords.kind_id)
    if records.size == 0:
        raise StoreError(f"{store.root} holds no progressive JPEG records: pack with --progressive-jpeg")
    rng = np.random.default_rng(seed)
    sampled = np.sort(rng.choice(records, size=min(sample, records.size), replace=False)).tolist()
    whys = [_unmeasurable(store, entry, max_pixels) for entry in sampled]
    chosen = np.array([entry for entry, why in zip(sampled, whys) if why is None], np.int64)
    skipped = dict(Counter(why for why in whys if why))
    if chosen.size == 0:
        raise StoreError(f"{store.root}: none of the {len(sampled)} sampled JPEG records can be measured "
                         f"({reasons(skipped)}): give a fidelity K or full instead of measuring")
    if starting is not None:
        starting(int(chosen.size))
    global _store
    _store = store
    entries = chosen.tolist()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(entries)))
    top = int(store.index.layers[chosen].max())
    fraction, ssims, msssims = np.ones((3, len(entries), top))
    tiers = tier_values(store.index)
    tier_rows = np.full((len(entries), len(tiers), 3), np.nan)
    kept = np.ones(len(entries), bool)
    with Progress(len(entries), "fidelity", enabled=progress, unit="records") as bar, contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(process_pool(jobs))
            measured = pool.map(_measure, entries, chunksize=4)
        else:
            measured = map(_measure, entries)  # in this process: an MPI rank must not fork
        for i, result in enumerate(measured):
            bar.update_to(i + 1)
            if isinstance(result, str):
                skipped[result] = skipped.get(result, 0) + 1
                kept[i] = False
                continue
            sizes, s, m, at_tiers = result
            n = len(sizes)
            fraction[i, :n] = np.asarray(sizes) / sizes[-1]
            ssims[i, :n] = s
            msssims[i, :n] = m
            for t, row in enumerate(at_tiers):
                if row is not None:
                    tier_rows[i, t] = row
    if not kept.any():
        raise StoreError(f"{store.root}: none of the {len(sampled)} sampled JPEG records can be measured "
                         f"({reasons(skipped)}): give a fidelity K or full instead of measuring")
    chosen = chosen[kept]  # what follows (the decode times too) concerns the records measured
    top = int(store.index.layers[chosen].max())
    curve = FidelityCurve(store.meta["store_id"], int(chosen.size), list(range(1, top + 1)),
                          fraction[kept, :top].mean(0).round(4).tolist(), ssims[kept, :top].mean(0).round(4).tolist(),
                          msssims[kept, :top].mean(0).round(4).tolist(), skipped=skipped)
    tier_rows = tier_rows[kept]
    if timed > 0:
        picked = np.sort(rng.choice(chosen, size=min(timed, chosen.size), replace=False)).tolist()
        vs_full, vs_source = _time_decodes(store, picked, top, source, seed, progress)
        found = ~np.isnan(vs_source[:, 0])
        if source and not found.any():
            raise UsageError(f"no timed record has its original under {source} (the same path, decoding to the "
                             "same pixels): give --source the tree the store was packed from")
        curve.timed, curve.with_source = len(picked), int(found.sum())
        curve.decode_vs_full = np.median(vs_full[:, :top], 0).round(3).tolist()
        if found.any():
            curve.decode_vs_source = np.median(vs_source[found, :top], 0).round(3).tolist()
    curve.tiers = [_tier_row(value, tier_rows[:, t], vs_full[:, top + t] if timed > 0 else None,
                             vs_source[found, top + t] if timed > 0 and found.any() else None)
                   for t, value in enumerate(tiers)]
    return curve


def _tier_row(value: int, rows: np.ndarray, vs_full: np.ndarray | None, vs_source: np.ndarray | None) -> dict:
    """A tier's means over the records that have it (NaN rows: records without), and its median decode speeds."""
    held = ~np.isnan(rows[:, 0])
    row: dict = {"fidelity": FIDELITY.format(value), "records": int(held.sum())}
    if held.any():
        row.update(zip(("bytes_fraction", "ssim", "ms_ssim"), rows[held].mean(0).round(4).tolist()))
    for name, speeds in (("decode_vs_full", vs_full), ("decode_vs_source", vs_source)):
        if speeds is not None and (~np.isnan(speeds)).any():
            row[name] = round(float(np.nanmedian(speeds)), 3)
    return row


def cached_curve(store: Store, sample: int, seed: int = 0, progress: bool = True,
                 jobs: int | None = None) -> FidelityCurve:
    """The curve for ``auto`` fidelity of a store without a saved one: measured once per store and sample on this
    node and kept in the runtime directory.  A measurement says first what it does and how to avoid it."""
    path = os.path.join(runtime_dir(), f"fidelity-{store.meta['store_id']}-{sample}-{seed}.json")
    try:
        with open(path) as f:
            return FidelityCurve(**json.load(f))
    except (OSError, ValueError, TypeError):
        pass

    def starting(images: int) -> None:
        log.warning("fanfs: measuring the fidelity curve of %s on %d sampled images for auto fidelity (once per store "
                    "on this node; 'fanfs fidelity %s --save' measures it once and keeps it with the store for every "
                    "node, job and reader)", store.root, images, store.root)

    curve = analyse(store, sample, seed, jobs, progress=progress, starting=starting)
    tmp = f"{path}.{os.getpid()}"
    with open(create_private(tmp), "w") as f:
        json.dump(asdict(curve), f)
    os.replace(tmp, path)
    return curve


def auto_fidelity(store: Store, min_ssim: float, jobs: int | None = None) -> tuple[int, str]:
    """``auto:SSIM``: the smallest K whose mean SSIM reaches ``min_ssim`` on the curve saved with the store (else
    measured: :func:`cached_curve`), and a line saying so."""
    curve = saved_curve(store)
    origin = "saved with the store" if curve is not None else "measured on this node"
    if curve is None:
        curve = cached_curve(store, AUTO_SAMPLE, jobs=jobs)
    k = curve.recommend(min_ssim)
    skipped = f"; {curve.skip_note()}" if curve.skipped else ""
    return k, (f"fidelity auto:{min_ssim} -> {'full' if k == FULL else k} (smallest K with mean SSIM >= "
               f"{min_ssim} over {curve.images} sampled images{skipped}; {origin})")


def _resolve_auto(store: Store, auto: Auto, processes: int | None) -> tuple[int, str]:
    return auto_fidelity(store, auto.argument, jobs=processes)


register_resolver("fidelity", _resolve_auto)  # fidelity auto:SSIM, wherever a presentation is resolved


def format_curve(curve: FidelityCurve, min_ssim: float) -> str:
    best = curve.recommend(min_ssim)
    lines = [f"fidelity over {curve.images} sampled JPEG records (SSIM/MS-SSIM of the K-layer decode vs full)"]
    if curve.skipped:
        lines.append(curve.skip_note())
    if curve.timed:
        against = " and (vs orig) the original file's" if curve.decode_vs_source else ""
        lines.append(f"decode: Pillow decode speed at K, x the full presentation's{against} (> 1: faster); median "
                     f"over {curve.timed} timed images" + (f", {curve.with_source} with their original" if against else ""))
    columns = [(name, values) for name, values in (("decode", curve.decode_vs_full),
                                                    ("vs orig", curve.decode_vs_source)) if values]
    lines.append("   K   bytes   SSIM  MS-SSIM" + "".join(f" {name:>7}" for name, _ in columns))
    for i, (k, b, s, m) in enumerate(zip(curve.ks, curve.bytes_fraction, curve.ssim, curve.ms_ssim)):
        mark = "  <- smallest K with SSIM >= %.3g" % min_ssim if k == best else ""
        speeds = "".join(f" {values[i]:>6.2f}x" for _, values in columns)
        lines.append(f"{k:>4} {b:>7.3f} {s:>6.3f} {m:>8.3f}{speeds}{mark}")
    for tier in curve.tiers:
        if "ssim" not in tier:
            lines.append(f"{tier['fidelity']:>4}  no sampled record has this tier")
            continue
        keys = {"decode": "decode_vs_full", "vs orig": "decode_vs_source"}
        speeds = "".join(f" {tier[keys[name]]:>6.2f}x" if keys[name] in tier else f" {'-':>7}" for name, _ in columns)
        lines.append(f"{tier['fidelity']:>4} {tier['bytes_fraction']:>7.3f} {tier['ssim']:>6.3f} {tier['ms_ssim']:>8.3f}"
                     f"{speeds}  (resolution tier, {tier['records']} records; SSIM vs the image reduced as much)")
    if best == FULL:
        lines.append(f"no K below full reaches SSIM {min_ssim}: mount at full fidelity")
    return "\n".join(lines)


def plot_curve(curve: FidelityCurve, min_ssim: float, path: str) -> None:
    """Quality and bytes per K, then per resolution tier (right of the Ks, marked apart: their SSIM is against the
    image reduced as much); below them, when timed, the decode speed of each."""
    plt = pyplot()
    timed = bool(curve.decode_vs_full)
    fig, axes = plt.subplots(2 if timed else 1, 1, figsize=(10, 7 if timed else 4.2), dpi=120, sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2]} if timed else None)
    ax = axes[0, 0]
    ax.plot(curve.ks, curve.ssim, "o-", label="SSIM vs full")
    ax.plot(curve.ks, curve.ms_ssim, "s-", label="MS-SSIM vs full")
    ax.plot(curve.ks, curve.bytes_fraction, "^--", color="gray", label="bytes read (fraction of full)")
    ax.axhline(min_ssim, color="red", lw=0.8, ls=":", label=f"SSIM bar {min_ssim}")
    tiers = [t for t in curve.tiers if "ssim" in t]  # a tier no sampled record has has no point
    at = [len(curve.ks) + 1 + i for i in range(len(tiers))]
    if tiers:
        ax.plot(at, [t["ssim"] for t in tiers], "D", color="tab:blue", mfc="none", ms=8,
                label="SSIM of a resolution tier vs the image reduced as much")
        ax.plot(at, [t["bytes_fraction"] for t in tiers], "v", color="gray", ms=8, label="bytes read at a tier")
    best = curve.recommend(min_ssim)
    for a in axes[:, 0]:
        if best != FULL:
            a.axvline(best, color="green", lw=1, ls="--", label=f"recommended K = {best}" if a is ax else None)
        if tiers:
            a.axvline(len(curve.ks) + 0.5, color="black", lw=0.6)
        a.set_xticks(curve.ks + at, [str(k) for k in curve.ks] + [t["fidelity"] for t in tiers])
        a.grid(alpha=0.3)
    ax.set_ylabel("mean over sample")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside the axes: over them it hid points
    ax.set_title(f"fanfs fidelity: quality and bytes per K ({curve.images} images)")
    if timed:
        speed = axes[1, 0]
        speed.plot(curve.ks, curve.decode_vs_full, "o-", color="purple", label="vs the full presentation")
        if curve.decode_vs_source:
            speed.plot(curve.ks, curve.decode_vs_source, "s-", color="darkorange",
                       label=f"vs the original file ({curve.with_source} images)")
        tier_speeds = []
        for key, marker, colour in (("decode_vs_full", "o", "purple"), ("decode_vs_source", "s", "darkorange")):
            points = [(x, t[key]) for x, t in zip(at, tiers) if key in t]
            if points:
                speed.plot(*zip(*points), marker, color=colour, mfc="none", ms=8)
                tier_speeds += [v for _, v in points]
        speed.axhline(1.0, color="black", lw=0.8)
        speed.set_ylim(0, max([1.1, *curve.decode_vs_full, *curve.decode_vs_source, *tier_speeds]) * 1.05)
        speed.set_ylabel(f"decode speed (x; median of {curve.timed})")
        speed.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    axes[-1, 0].set_xlabel("fidelity K (scan groups presented)" + (", then resolution tiers 1/S" if tiers else ""))
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
