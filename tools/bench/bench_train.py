#!/usr/bin/env python3
"""Issue 13 figures: what fidelity does for a real PyTorch training loader, and what choosing it costs.

N real-photo JPEGs (``tools/support/photo_samples.py``) in 10 classes, read as a new user would: a hand-written
ImageFolder (PIL open + convert('RGB'), a random 64x64 crop, to tensor) through
``DataLoader(num_workers=4, batch_size=64, shuffle=True)``, one epoch, no model.  Images/s of that first
epoch and MB read from storage, for the native originals, a mount of a plain store, and a mount of a
progressive store (packed with resolution tiers, ``--scales 2,4``) at full, at the recommended K
(``fanfs fidelity --min-ssim``), at K=2 and at the tiers 1/2 and 1/4: a fresh mount per epoch, the variants interleaved, the median of ``--repeat`` epochs, ratios vs native.
Then the cost of PCR's gradient choice (``fanfs.train.choose_fidelity``) for a small CNN on that mount,
untrained and after one epoch of training at full fidelity (measured only: the mount stays at full).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (common_args, fanfs, fanfs_mount, load_average, median, table, temp_dir,  # noqa: E402
                      wait_for_quiet, write_json)

from photo_samples import make_jpegs, make_photo_set  # noqa: E402
from photo_folder import PhotoFolder  # noqa: E402

from fanfs.records import FULL  # noqa: E402
from fanfs.train import choose_fidelity  # noqa: E402

CLASSES, CROP = 10, 64
warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: the workload


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, CLASSES))


def epoch(root: Path, workers: int, batch_size: int, seed: int, model: torch.nn.Module | None = None) -> float:
    """Seconds for one epoch over ``root`` (a training step per batch when a model is given)."""
    loader = torch.utils.data.DataLoader(PhotoFolder(root, CROP), batch_size=batch_size, shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(seed))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05) if model is not None else None
    started = time.perf_counter()
    for x, y in loader:
        if optimiser is not None:
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimiser.step()
    return time.perf_counter() - started


def make_photos(src: Path, count: int, size_kb: int | None) -> int:
    """``count`` photos in CLASSES folders (one process per class; ``size_kb``: colour 4:2:0 ones of about that size
    instead of the mixed set); returns their total bytes."""
    per_class = count // CLASSES
    if size_kb is None:
        with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
            pool.starmap(make_photo_set, [(src / f"class{c:02d}", per_class, c) for c in range(CLASSES)])
    else:
        for i, data in enumerate(make_jpegs(per_class * CLASSES, size_kb * 1024)):
            (src / f"class{i % CLASSES:02d}").mkdir(parents=True, exist_ok=True)
            (src / f"class{i % CLASSES:02d}" / f"img{i:06d}.jpg").write_bytes(data)
    return sum(p.stat().st_size for p in src.rglob("*.jpg"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser)
    parser.add_argument("--images", type=int, default=2000, help="images in the set (default 2000)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    parser.add_argument("--batch-size", type=int, default=64, help="DataLoader batch size (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh-mount epochs per variant; the median is shown")
    parser.add_argument("--min-ssim", type=float, default=0.95, help="SSIM bar of the recommended K (default 0.95)")
    parser.add_argument("--scan-script", help="passed to 'fanfs pack --scan-script' (default: pack's default)")
    parser.add_argument("--size-kb", type=int, help="colour 4:2:0 photos of about this size instead of the mixed set "
                                                    "(250-500 px crops): a decode-bound loader")
    args = parser.parse_args()

    with temp_dir(args.workdir, "bench-train-") as work:
        src = work / "src"
        source_bytes = make_photos(src, args.images, args.size_kb)
        images = len(PhotoFolder(src, CROP))
        plain, progressive = work / "plain", work / "progressive"
        fanfs("pack", src, plain, "--quiet")
        script = ["--scan-script", args.scan_script] if args.scan_script else []
        fanfs("pack", src, progressive, "--progressive-jpeg", "--scales", "2,4", *script, "--quiet")
        curve = json.loads(fanfs("fidelity", progressive, "--sample", "200", "--min-ssim", str(args.min_ssim),
                                 "--json").stdout)
        recommended = curve["recommended"]
        print(f"{images} photos in {CLASSES} classes, {source_bytes / images / 1e3:.1f} KB each on average; scan script: "
              f"{args.scan_script or 'pack default'}; recommended K at SSIM {args.min_ssim}: "
              f"{'full' if recommended == FULL else recommended}")

        variants: dict[str, tuple[Path | None, list[str]]] = {"native": (None, []), "fanfs plain store": (plain, []),
                                                              "progressive full": (progressive, [])}
        if recommended != FULL:
            variants[f"progressive K={recommended} (recommended)"] = (progressive, ["--fidelity", str(recommended)])
        if recommended != 2:
            variants["progressive K=2"] = (progressive, ["--fidelity", "2"])
        for tier in ("1/2", "1/4"):
            variants[f"tier {tier}"] = (progressive, ["--fidelity", tier])
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in variants}
        for r in range(args.repeat):
            wait_for_quiet(timeout=120)  # the box is shared: start each round of variants on a quiet machine
            for name, (store, options) in variants.items():
                if store is None:
                    runs[name].append((epoch(src, args.workers, args.batch_size, r), source_bytes))
                    continue
                mnt = work / f"mnt-{len(runs[name])}-{name.replace(' ', '_').replace('/', '_')}"
                with fanfs_mount(store, mnt, *options):
                    seconds = epoch(mnt, args.workers, args.batch_size, r)
                    read = json.loads(fanfs("stats", mnt, "--json").stdout)["bytes_stored_read"]
                runs[name].append((seconds, read))
        results = {name: {"images_per_s": images / median([s for s, _ in rs]), "mb_read": median([b for _, b in rs]) / 1e6}
                   for name, rs in runs.items()}
        native = results["native"]
        rows = [[name, v["images_per_s"], v["mb_read"], v["images_per_s"] / native["images_per_s"],
                 v["mb_read"] / native["mb_read"]] for name, v in results.items()]
        print(f"\none epoch, DataLoader(num_workers={args.workers}, batch_size={args.batch_size}), random {CROP}x{CROP} "
              f"crop, fresh mount, median of {args.repeat} (load {load_average()})")
        print(table(["variant", "images/s", "MB from storage", "x images/s", "x MB"], rows))

        choices = {}
        torch.manual_seed(0)
        model = small_cnn()
        with fanfs_mount(progressive, work / "mnt-choice"):
            mnt = work / "mnt-choice"
            for when in ("untrained", "after 1 epoch"):
                if when != "untrained":
                    epoch(mnt, args.workers, args.batch_size, 0, model)
                started = time.perf_counter()
                choice = choose_fidelity(model, torch.nn.functional.cross_entropy, PhotoFolder(mnt, CROP), mnt, batches=4,
                                         batch_size=args.batch_size, num_workers=args.workers, switch=False)
                seconds = time.perf_counter() - started
                choices[when] = {"fidelity": choice.fidelity, "similarity": choice.similarity, "seconds": seconds}
                print(f"gradient choice, small CNN {when}: {choice}; {seconds:.1f} s "
                      f"({len(choice.similarity) + 1} passes over {choice.images} images)")
        write_json(args.json, {"images": images, "source_bytes": source_bytes, "scan_script": args.scan_script,
                               "curve": curve, "results": results, "choices": choices})
    return 0


if __name__ == "__main__":
    sys.exit(main())
