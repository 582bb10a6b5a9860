#!/usr/bin/env python3
"""Issues 3 and 13 figures: what a lower fidelity buys, and what each scan-script preset costs.

One run: make N distinct real-photo JPEGs (baseline; by default ``tools/support/photo_samples.make_photo_set``:
random crops of shipped photos, 250-500 px, qualities 75-95, a seventh grayscale and a fifth 4:4:4;
``--size-kb`` for colour 4:2:0 ones of about that size instead), then

1. per scan-script preset (``--presets``): pack them as progressive records (timed: images/s per
   core) and run ``fanfs fidelity --source`` on a sample: bytes, SSIM and Pillow decode speed per K
   relative to the originals, and a table comparing the presets at full fidelity and at each one's
   recommended K (smallest K with mean SSIM >= ``--min-ssim``);
2. the first preset packed again with resolution tiers (``--scales``, default 2,4, at ``--tier-quality``): the store's growth,
   the bytes staged at each tier, and ``fanfs fidelity``'s tier rows (bytes, SSIM against the image
   reduced as much, decode speed against the originals);
3. on that store, for K = 1, 2, 5, the recommended K, full and each tier: a fresh mount at K,
   every image read once by 4 reader processes (a DataLoader's workers) and decoded by Pillow,
   reporting files/s, MB presented, MB read from storage and each as a ratio of full fidelity.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import common_args, fanfs, fanfs_mount, load_average, make_jpegs, median, table, temp_dir, write_json  # noqa: E402

from photo_samples import make_photo_set  # noqa: E402

from fanfs.tune.fidelity import FidelityCurve, format_curve  # noqa: E402


def decoder() -> str:
    """The decoder every ratio depends on: a Pillow or libjpeg-turbo upgrade is a cause to rule out (issue 29)."""
    import PIL
    from PIL import features
    return f"Pillow {PIL.__version__}, libjpeg-turbo {features.version('libjpeg_turbo')}"


def _read_share(paths: list[str]) -> int:
    from PIL import Image
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        total += len(data)
        with Image.open(path) as im:
            im.load()
    return total


def epoch(root: Path, rels: list[str], workers: int) -> tuple[float, int]:
    """Read and decode every image once across ``workers`` processes; (seconds, bytes)."""
    shares = [[str(root / r) for r in rels[i::workers]] for i in range(workers)]
    with mp.get_context("fork").Pool(workers) as pool:
        started = time.perf_counter()
        total = sum(pool.map(_read_share, shares))
        return time.perf_counter() - started, total


def make_images(src: Path, count: int, size_kb: int | None) -> list[str]:
    """The image set, as paths relative to ``src`` in 20 class directories."""
    if size_kb is None:
        made = make_photo_set(src / "all", count)
        data = [p.read_bytes() for p in made]
        for p in made:
            p.unlink()
        (src / "all").rmdir()
    else:
        data = make_jpegs(count, size_kb * 1024)
    rels = []
    for i, jpeg in enumerate(data):
        rel = f"class{i % 20:02d}/img{i:06d}.jpg"
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(jpeg)
        rels.append(rel)
    return rels


def measure_preset(src: Path, store: Path, preset: str, args: argparse.Namespace, *pack: str) -> dict:
    """Pack with ``preset`` (timed; ``pack``: more options) and measure its fidelity curve with decode speeds
    against ``src``."""
    jobs = os.cpu_count() or 1
    started = time.perf_counter()
    fanfs("pack", src, store, "--scan-script", preset, "--jobs", str(jobs), *pack, "--quiet")
    seconds = time.perf_counter() - started
    info = json.loads(fanfs("info", store, "--json").stdout)
    options = ["--sample", str(args.sample), "--timed", str(args.timed), "--min-ssim", str(args.min_ssim),
               "--source", str(src)]
    report = json.loads(fanfs("fidelity", store, *options, "--json").stdout)
    curve = FidelityCurve(**{k: v for k, v in report.items() if k not in ("min_ssim", "recommended")})
    return {"pack_images_per_s_per_core": info["files"] / seconds / jobs,
            "full_bytes_vs_source": info["bytes_presented"] / info["bytes_in"], "curve": report,
            "stored_bytes": info["bytes_stored"], "text": format_curve(curve, args.min_ssim)}


def tier_costs(store: Path, plain_bytes: int, tiers: list[str]) -> dict:
    """What the tiers cost: the store's growth over ``plain_bytes`` (the same preset without tiers), and the share
    of its stored bytes a node stages at each tier."""
    out = {}
    for tier in tiers:
        staged = json.loads(fanfs("info", store, "--fidelity", tier, "--json").stdout)["staged"]
        out[tier] = {"staged_bytes": staged["stored_bytes"], "staged_share": staged["stored_bytes"] / staged["full_stored_bytes"],
                     "store_growth": staged["full_stored_bytes"] / plain_bytes - 1}
    return out


def preset_table(measured: dict[str, dict]) -> str:
    """The presets side by side at full fidelity and at their recommended K."""
    rows = []
    for preset, m in measured.items():
        c = m["curve"]
        k = min(c["recommended"], len(c["ks"]))  # FULL: the last K, the whole file
        at = k - 1
        rows.append([preset, len(c["ks"]), m["full_bytes_vs_source"], c["decode_vs_source"][-1],
                     "full" if c["recommended"] == 65535 else k, c["bytes_fraction"][at],
                     c["bytes_fraction"][at] * m["full_bytes_vs_source"], c["ssim"][at], c["decode_vs_source"][at],
                     c["decode_vs_full"][at], m["pack_images_per_s_per_core"]])
    return table(["preset", "max K", "full: bytes x orig", "decode x orig", "rec K", "bytes @K x full",
                  "bytes @K x orig", "SSIM @K", "decode @K x orig", "decode @K x full", "pack img/s/core"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser)
    parser.add_argument("--images", type=int, default=1000, help="images in the set (default 1000)")
    parser.add_argument("--size-kb", type=int, help="colour 4:2:0 images of about this size instead of the mixed photo set")
    parser.add_argument("--presets", default="compact,fast,libjpeg",
                        help="scan-script presets to compare; the first is read through the mount (default "
                             "compact,fast,libjpeg)")
    parser.add_argument("--timed", type=int, default=100, help="images of the sample whose decode is timed (default 100)")
    parser.add_argument("--workers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--sample", type=int, default=200, help="images sampled by 'fanfs fidelity' (default 200)")
    parser.add_argument("--min-ssim", type=float, default=0.95)
    parser.add_argument("--repeat", type=int, default=3, help="fresh-mount epochs per K; the median is shown")
    parser.add_argument("--scales", default="2,4", help="resolution tiers of the first preset's second store (default 2,4)")
    parser.add_argument("--tier-quality", help="the tiers' --tier-quality (default: pack's)")
    args = parser.parse_args()

    with temp_dir(args.workdir, "bench-fidelity-") as work:
        src = work / "src"
        rels = make_images(src, args.images, args.size_kb)
        source_bytes = sum((src / r).stat().st_size for r in rels)
        print(f"{args.images} images, {source_bytes / 1e6:.1f} MB (load {load_average()}; {decoder()})")
        measured = {}
        for preset in args.presets.split(","):
            measured[preset] = measure_preset(src, work / f"store-{preset}", preset, args)
            print(f"\n--scan-script {preset}\n{measured[preset]['text']}")
        print(f"presets on the same {args.images} images (fidelity sample {args.sample}, decode timed on "
              f"{args.timed}; x orig = relative to the baseline originals; load {load_average()})")
        print(preset_table(measured))
        first = args.presets.split(",")[0]
        store = work / f"store-{first}-tiers"
        quality = ["--tier-quality", args.tier_quality] if args.tier_quality else []
        tiered = measure_preset(src, store, first, args, "--scales", args.scales, *quality)
        tiers = [f"1/{s}" for s in args.scales.split(",")]
        costs = tier_costs(store, measured[first]["stored_bytes"], tiers)
        print(f"\n--scan-script {first} --scales {args.scales} {' '.join(quality)}\n{tiered['text']}")
        print(table(["tier", "store growth", "staged share", "MB staged"],
                    [[t, c["store_growth"], c["staged_share"], c["staged_bytes"] / 1e6] for t, c in costs.items()]))
        curve = tiered["curve"]
        recommended = curve["recommended"]
        ks = [*tiers, *sorted({1, 2, 5, recommended} - {65535}), "full"]
        runs: dict[str, list[tuple[float, int, int]]] = {str(k): [] for k in [*ks, "originals"]}
        for r in range(args.repeat):  # rounds over every K and the originals: load changes hit them alike
            for k in ks:
                mnt = work / f"mnt-{str(k).replace('/', '_')}-{r}"
                with fanfs_mount(store, mnt, "--fidelity", str(k)):
                    seconds, presented = epoch(mnt, rels, args.workers)
                    stats = json.loads(fanfs("stats", mnt, "--json").stdout)
                runs[str(k)].append((seconds, presented, stats["bytes_stored_read"]))
            runs["originals"].append((epoch(src, rels, args.workers)[0], 0, 0))
        results = {k: {"files_per_s": args.images / median([s for s, _, _ in v]), "mb_presented": v[0][1] / 1e6,
                       "mb_stored_read": v[0][2] / 1e6} for k, v in runs.items()}
        native = results.pop("originals")["files_per_s"]
        full = results["full"]
        rows = [[k + (" (recommended)" if k == str(recommended) else ""), v["files_per_s"], v["mb_presented"],
                 v["mb_stored_read"], v["files_per_s"] / full["files_per_s"], v["files_per_s"] / native,
                 v["mb_presented"] / full["mb_presented"], v["mb_stored_read"] / full["mb_stored_read"]]
                for k, v in results.items()]
        print(f"\n--scan-script {first}: read + decode every image once, {args.workers} processes, fresh mount, "
              f"median of {args.repeat} rounds over every K and the originals read from {args.workdir} directly "
              f"({native:,.0f} files/s; load {load_average()})")
        print(table(["K", "files/s", "MB presented", "MB from storage", "x files/s", "x originals", "x presented",
                     "x storage"], rows))
        write_json(args.json, {"decoder": decoder(), "presets": {p: {k: v for k, v in m.items() if k != "text"} for p, m in measured.items()},
                               "tiers": {"curve": tiered["curve"], "costs": costs},
                               "originals_files_per_s": native, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
