#!/usr/bin/env python3
"""Issue 3 figures: what a lower fidelity buys when reading a whole image set through the mount.

One run: make N distinct real-photo JPEGs (~110 KB, baseline), pack them as progressive records
(timed: images/s per core), run ``fanfs fidelity`` on a sample, then for K = 1, 2, 5, the
recommended K and full: a fresh mount at K, every image read once by 4 reader processes (a
DataLoader's workers) and decoded by Pillow, reporting files/s, MB presented, MB read from storage
and each as a ratio of full fidelity.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(parser)
    parser.add_argument("--images", type=int, default=1000, help="images in the set (default 1000)")
    parser.add_argument("--size-kb", type=int, default=110, help="approximate size of each image (default 110)")
    parser.add_argument("--workers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--sample", type=int, default=200, help="images sampled by 'fanfs fidelity' (default 200)")
    parser.add_argument("--min-ssim", type=float, default=0.95)
    parser.add_argument("--repeat", type=int, default=3, help="fresh-mount epochs per K; the median is shown")
    args = parser.parse_args()

    with temp_dir(args.workdir, "bench-fidelity-") as work:
        src = work / "src"
        rels = []
        for i, data in enumerate(make_jpegs(args.images, args.size_kb * 1024)):
            rel = f"class{i % 20:02d}/img{i:06d}.jpg"
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
            rels.append(rel)
        source_bytes = sum((src / r).stat().st_size for r in rels)
        store = work / "store"
        jobs = os.cpu_count() or 1
        started = time.perf_counter()
        fanfs("pack", src, store, "--progressive-jpeg", "--jobs", str(jobs), "--quiet")
        pack_seconds = time.perf_counter() - started
        print(f"pack: {args.images} images ({source_bytes / 1e6:.1f} MB) in {pack_seconds:.1f} s with {jobs} "
              f"processes = {args.images / pack_seconds / jobs:.1f} images/s per core")

        curve = json.loads(fanfs("fidelity", store, "--sample", str(args.sample), "--min-ssim", str(args.min_ssim),
                                 "--json").stdout)
        print("\n" + fanfs("fidelity", store, "--sample", str(args.sample), "--min-ssim", str(args.min_ssim)).stdout)
        recommended = curve["recommended"]
        ks = sorted({1, 2, 5, recommended} - {65535}) + ["full"]
        results = {}
        for k in ks:
            runs = []
            for r in range(args.repeat):
                with fanfs_mount(store, work / f"mnt-{k}-{r}", "--fidelity", str(k)):
                    seconds, presented = epoch(work / f"mnt-{k}-{r}", rels, args.workers)
                    stats = json.loads(fanfs("stats", work / f"mnt-{k}-{r}", "--json").stdout)
                runs.append((seconds, presented, stats["bytes_stored_read"]))
            seconds = median([s for s, _, _ in runs])
            results[str(k)] = {"files_per_s": args.images / seconds, "mb_presented": runs[0][1] / 1e6,
                               "mb_stored_read": runs[0][2] / 1e6}
        full = results["full"]
        rows = [[k + (" (recommended)" if k == str(recommended) else ""), v["files_per_s"], v["mb_presented"],
                 v["mb_stored_read"], v["files_per_s"] / full["files_per_s"], v["mb_presented"] / full["mb_presented"],
                 v["mb_stored_read"] / full["mb_stored_read"]] for k, v in results.items()]
        print(f"read + decode every image once, {args.workers} processes, fresh mount, median of {args.repeat} "
              f"(load {load_average()})")
        print(table(["K", "files/s", "MB presented", "MB from storage", "x files/s", "x presented", "x storage"], rows))
        write_json(args.json, {"pack_images_per_s_per_core": args.images / pack_seconds / jobs, "curve": curve,
                               "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
