#!/usr/bin/env python3
"""Figures for issue 4 (compressor selection): plans at three rates on a mixed tree of real files.

    .venv/bin/python tools/bench/bench_select.py [--workdir DIR] [--rates 20MB/s,300MB/s,1500MB/s] [--threads 1]

The tree: Python sources (stdlib + numpy, real text, small files), real photos (the JPEGs and PNGs that
sklearn / scikit-image / matplotlib ship, plus crops of them re-encoded as JPEG quality 90) and float
arrays (.npy: weights of an MLP trained on sklearn's digits, photo crops as normalised float32 tensors,
scikit-image's lfw faces as float64).  One ``fanfs select`` measurement, decided at each rate (sync: the mount decodes on the read path),
then per plan: pack, per-class ratio from ``fanfs info``, the same vs ``zstd -19`` per file and vs
``mksquashfs -comp zstd`` (per class directory and whole tree), and the read throughput of the packed
store through a real mount (first pass after mounting, 2 reader processes) against the demanded rate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fanfs.pack.select import Demand, format_report, make_plan, parse_rate, plot, select  # noqa: E402
from fanfs.pack.select.decide import decide  # noqa: E402

CLASS_DIRS = {"text": "text", "jpeg": "photos_jpeg", "png": "photos_png", "float": "arrays"}


def fanfs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fanfs", *map(str, args)], capture_output=True, text=True, check=True,
                          cwd=ROOT)


def build_tree(root: Path) -> None:
    from PIL import Image
    import matplotlib
    import numpy as _np
    import skimage
    import sklearn
    if root.exists():
        shutil.rmtree(root)
    for d in CLASS_DIRS.values():
        (root / d).mkdir(parents=True)
    # text: real Python sources
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p for base in (stdlib, Path(_np.__file__).parent) for p in sorted(base.glob("**/*.py"))
               if "site-packages" not in str(p.relative_to(base)) and 0 < p.stat().st_size < 400_000]
    for i, p in enumerate(sources[:2500]):
        shutil.copyfile(p, root / "text" / f"{i:05d}_{p.name}")
    # photos
    sk_img = Path(sklearn.__file__).parent / "datasets" / "images"
    ski = Path(skimage.__file__).parent / "data"
    jpegs = sorted(sk_img.glob("*.jpg")) + sorted(ski.glob("*.jpg")) + \
        [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"]
    for p in jpegs:
        shutil.copyfile(p, root / "photos_jpeg" / p.name)
    rng = np.random.default_rng(0)
    photos = [np.asarray(Image.open(p).convert("RGB")) for p in jpegs]
    tensors = []
    for i in range(240):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        s = int(rng.integers(160, min(h, w, 420)))
        y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        crop = img[y:y + s, x:x + s]
        Image.fromarray(crop).save(root / "photos_jpeg" / f"crop{i:04d}.jpg", quality=90)
        if i < 48:
            t = np.asarray(Image.fromarray(crop).resize((128, 128)), np.float32) / 255.0
            tensors.append(((t - 0.45) / 0.225).transpose(2, 0, 1).astype(np.float32))
    for name in ("astronaut", "coffee", "chelsea", "motorcycle_left", "motorcycle_right", "rocket"):
        src = ski / f"{name}.png"
        if src.exists():
            shutil.copyfile(src, root / "photos_png" / src.name)
    # float arrays: trained weights, preprocessed image tensors, faces
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier
    import warnings
    digits = load_digits()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPClassifier(hidden_layer_sizes=(512, 512, 256), max_iter=30, random_state=0)
        mlp.fit(digits.data / 16.0, digits.target)
    for i, (w, b) in enumerate(zip(mlp.coefs_, mlp.intercepts_)):
        np.save(root / "arrays" / f"mlp_layer{i}_weight.npy", w.astype(np.float32))
        np.save(root / "arrays" / f"mlp_layer{i}_bias.npy", b.astype(np.float32))
    for i, t in enumerate(tensors):
        np.save(root / "arrays" / f"tensor{i:03d}.npy", t)
    shutil.copyfile(ski / "lfw_subset.npy", root / "arrays" / "lfw_subset.npy")


def du(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def zstd19_per_file(path: Path, work: Path) -> int:
    out = work / "zstd19"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    files = sorted(str(p) for p in path.rglob("*") if p.is_file())
    for i in range(0, len(files), 500):
        subprocess.run(["zstd", "-19", "-q", "-f", "--output-dir-flat", str(out), *files[i:i + 500]], check=True)
    return sum(p.stat().st_size for p in out.iterdir())


def squashfs(path: Path, image: Path, level: int | None = None) -> int:
    image.unlink(missing_ok=True)
    cmd = ["mksquashfs", str(path), str(image), "-comp", "zstd", "-noappend", "-quiet", "-no-progress"]
    if level:
        cmd += ["-Xcompression-level", str(level)]
    subprocess.run(cmd, check=True, capture_output=True)
    return image.stat().st_size


def _read_files(paths: list[str]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while block := f.read(1 << 20):
                n += len(block)
    return n


def read_throughput(root: Path, readers: int = 2) -> tuple[float, float, int]:
    files = sorted(str(p) for p in root.rglob("*") if p.is_file())
    parts = [files[i::readers] for i in range(readers)]
    with ProcessPoolExecutor(readers) as pool:
        list(pool.map(len, [[1]] * readers))  # start the workers before timing
        t0 = time.perf_counter()
        total = sum(pool.map(_read_files, parts))
        seconds = time.perf_counter() - t0
    return total / seconds, len(files) / seconds, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/fanfs-bench-select")
    parser.add_argument("--rates", default="2MB/s,45MB/s,90MB/s")
    parser.add_argument("--mode", default="sync", choices=("sync", "async"),
                        help="sync (default): the mount decodes on the read path, so decode time adds to each read")
    parser.add_argument("--threads", type=int, default=1, help="decoder threads (the mount decodes in one thread)")
    parser.add_argument("--keep-tree", action="store_true", help="reuse the tree in WORKDIR/src")
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    if not (args.keep_tree and src.exists()):
        build_tree(src)
    print("## Tree\n")
    print("| class dir | files | bytes |\n|---|---:|---:|")
    for cls, d in CLASS_DIRS.items():
        n, b = du(src / d)
        print(f"| {d} ({cls}) | {n:,} | {b / 1e6:.1f} MB |")
    total_files, total_bytes = du(src)
    print(f"| all | {total_files:,} | {total_bytes / 1e6:.1f} MB |\n")

    t0 = time.perf_counter()
    sel = select(str(src), Demand(), fraction=0.02)
    measure_s = time.perf_counter() - t0
    print(f"fanfs select measurement (2% sample, {len(sel.sample.sampled)} files): {measure_s:.1f} s\n")

    rates = [parse_rate(r) for r in args.rates.split(",")]
    plans = []
    for rate in rates:
        demand = Demand(mode=args.mode, rate=rate, threads=args.threads)
        d = decide(sel.sample, demand, sel.classes)
        d.seconds = measure_s
        name = f"{rate / 1e6:g}MBps"
        (work / f"report-{name}.txt").write_text(format_report(d) + "\n")
        plot(d, str(work / f"pareto-{name}.png"))
        plan = make_plan(d)
        plan.save(str(work / f"plan-{name}.json"))
        chosen = {cr.name: (cr.chosen.spec, cr.chosen.ratio, cr.chosen.decode_speed())
                  for cr in d.classes if cr.candidates}  # decide() re-flags the shared candidates
        plans.append((name, rate, d.required_Bps, chosen))

    print(f"## Plans ({args.mode}, {args.threads} decoder thread(s), overhead 5% / headroom 20%)\n")
    print("| rate | need decode MB/s/thread | " + " | ".join(CLASS_DIRS) + " |")
    print("|---|---:|" + "---|" * len(CLASS_DIRS))
    for name, rate, required, chosen in plans:
        cells = []
        for cls in CLASS_DIRS:
            if cls in chosen:
                spec, ratio, speed = chosen[cls]
                cells.append(f"{spec} ({ratio:.2f}, " + ("no decode" if speed == float("inf") else f"{speed / 1e6:,.0f} MB/s") + ")")
            else:
                cells.append("-")
        print(f"| {rate / 1e6:g} MB/s | {required / 1e6:,.0f} | " + " | ".join(cells) + " |")

    # baselines per class directory and whole tree
    base = {}
    for cls, d in CLASS_DIRS.items():
        raw = du(src / d)[1]
        base[cls] = (raw, zstd19_per_file(src / d, work), squashfs(src / d, work / "cls.sqfs"),
                     squashfs(src / d, work / "cls19.sqfs", 19))
    base["all"] = (total_bytes, zstd19_per_file(src, work), squashfs(src, work / "all.sqfs"),
                   squashfs(src, work / "all19.sqfs", 19))

    results = []
    for name, rate, _, _ in plans:
        store = work / f"store-{name}"
        t0 = time.perf_counter()
        fanfs("pack", src, store, "--plan", work / f"plan-{name}.json", "--force", "--quiet")
        pack_s = time.perf_counter() - t0
        info = json.loads(fanfs("info", store, "--json").stdout)
        mnt = work / f"mnt-{name}"
        mnt.mkdir(exist_ok=True)
        firsts, seconds = [], []
        for _ in range(3):  # median of three fresh mounts: the machine is shared
            fanfs("mount", store, mnt)
            try:
                firsts.append(read_throughput(mnt))
                seconds.append(read_throughput(mnt))
            finally:
                fanfs("umount", mnt)
        bps, fps, nbytes = sorted(firsts)[1]
        bps2, fps2, _ = sorted(seconds)[1]
        assert nbytes == total_bytes, (nbytes, total_bytes)
        results.append((name, rate, info, bps, fps, bps2, fps2, pack_s))

    print("\n## Ratio per class: fanfs plan vs zstd -19 per file vs squashfs (zstd, 128K blocks)\n")
    print("| class | " + " | ".join(f"fanfs @ {r / 1e6:g} MB/s" for _, r, *_ in results)
          + " | zstd -19 per file | squashfs zstd (15) | squashfs zstd -19 |")
    print("|---|" + "---:|" * (len(results) + 3))
    for cls in list(CLASS_DIRS) + ["all"]:
        raw, z19, sq, sq19 = base[cls]
        cells = []
        for _, _, info, *_ in results:
            if cls == "all":
                cells.append(f"{info['bytes_in'] / info['shard_bytes']['total']:.3f}")
            else:
                c = next((c for c in info["classes"] if c["class"] == cls), None)
                cells.append(f"{c['ratio']:.3f} ({c['codec']})" if c and c["ratio"] else "-")
        print(f"| {cls} | " + " | ".join(cells) + f" | {raw / z19:.3f} | {raw / sq:.3f} | {raw / sq19:.3f} |")
    print("\n(fanfs 'all' = source bytes / shard bytes, index excluded; squashfs = image size incl. metadata)\n")

    print("## Read throughput through the mount (2 reader processes, all files; median of 3 fresh mounts)\n")
    print("| plan | demanded | first pass after mount | second pass | met? | pack time |")
    print("|---|---:|---:|---:|---|---:|")
    for name, rate, info, bps, fps, bps2, fps2, pack_s in results:
        print(f"| {rate / 1e6:g} MB/s | {rate / 1e6:,.0f} MB/s | {bps / 1e6:,.0f} MB/s ({fps:,.0f} files/s) | "
              f"{bps2 / 1e6:,.0f} MB/s ({fps2:,.0f} files/s) | {'yes' if bps >= rate else 'NO'} | {pack_s:.1f} s |")
    raw_bps, raw_fps, _ = read_throughput(src)
    print(f"| source dir (page cache) | | {raw_bps / 1e6:,.0f} MB/s ({raw_fps:,.0f} files/s) | | | |")
    print(f"\nreports, plots and plans in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
