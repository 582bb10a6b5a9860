#!/usr/bin/env python3
"""Compression ratio of fanfs codecs vs squashfs (zstd) on the same mixed tree, overall and per kind of file.

The default tree mixes what a training job ships: Python sources (a stdlib subset), real photos and
JPEG re-encodes of them, float32 ``.npy`` weight-like arrays (normal * 0.02) and a CSV table.  fanfs
per-kind bytes are the stored blob bytes of that kind's files (from the index); its total is the whole
store directory (index + shards).  squashfs per-kind bytes are images of that kind's directory alone;
its total is the image of the whole tree.  Ratio = source bytes / stored bytes (higher is better).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

import benchlib as bl
from fanfs.store.format import FILE
from fanfs.store import Store

PY_FIRST = ("email", "json", "asyncio", "concurrent", "http", "urllib", "xml", "logging", "multiprocessing",
            "unittest", "importlib", "ctypes", "sqlite3", "tomllib", "wsgiref", "xmlrpc", "idlelib", "lib2to3")


def copy_python(dst: Path, budget: int) -> None:
    """Copy ``*.py`` of the stdlib (the packages above first, then the rest) until ``budget`` bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    candidates = [stdlib / p for p in PY_FIRST] + sorted(stdlib.iterdir())
    used, seen = 0, set()
    for top in candidates:
        files = sorted(top.rglob("*.py")) if top.is_dir() else [top] if top.suffix == ".py" else []
        for src in files:
            if used >= budget or src in seen or "site-packages" in src.parts or "__pycache__" in src.parts:
                continue
            seen.add(src)
            out = dst / src.relative_to(stdlib)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
            used += out.stat().st_size


def build_tree(root: Path, py_mb: float, jpegs: int, npy_mb: float, csv_mb: float) -> list[str]:
    """The mixed tree, one top directory per kind; returns the kinds."""
    rng = np.random.default_rng(0)
    copy_python(root / "py", int(py_mb * 1e6))
    (root / "jpg").mkdir()
    for path in bl.photo_paths():
        shutil.copyfile(path, root / "jpg" / path.name)
    for i, data in enumerate(bl.make_jpegs(jpegs, 110_000)):
        (root / "jpg" / f"variant_{i:04d}.jpg").write_bytes(data)
    (root / "npy").mkdir()
    remaining, i = int(npy_mb * 1e6) // 4, 0
    for shape in ((1024, 1024), (768, 768), (512, 2048), (4096,), (1000, 512), (256, 256)) * 20:
        n = min(int(np.prod(shape)), remaining)
        if n <= 0:
            break
        arr = (rng.standard_normal(n) * 0.02).astype(np.float32)
        np.save(root / "npy" / f"layer_{i:02d}.npy", arr.reshape(shape) if n == np.prod(shape) else arr)
        remaining, i = remaining - n, i + 1
    (root / "csv").mkdir()
    rows = int(csv_mb * 1e6 / 60)
    cats = np.array(["train", "val", "test", "holdout"])
    with open(root / "csv" / "metrics.csv", "w") as f:
        f.write("id,timestamp,split,loss,accuracy,lr,epoch\n")
        ts = 1_700_000_000 + np.cumsum(rng.integers(1, 30, rows))
        loss = np.abs(rng.normal(1.0, 0.3, rows))
        acc = rng.uniform(0.5, 0.99, rows)
        split = cats[rng.integers(0, 4, rows)]
        for k in range(rows):
            f.write(f"{k},{ts[k]},{split[k]},{loss[k]:.6f},{acc[k]:.4f},{1e-3 * 0.97 ** (k // 1000):.3e},{k // 1000}\n")
    return ["py", "jpg", "npy", "csv"]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fanfs_stored(store: Path, kinds: list[str]) -> dict[str, int]:
    """Stored blob bytes per kind (top directory) from the index; ``all`` is the whole store on disk."""
    s = Store(str(store))
    ix = s.index
    out = dict.fromkeys(kinds, 0)
    stored = np.concatenate([[0], np.cumsum(ix.blob_stored, dtype=np.int64)])
    for entry in np.flatnonzero(ix.type == FILE).tolist():
        first, count = int(ix.first[entry]), int(ix.count[entry])
        out[ix.path(entry).split(b"/")[0].decode()] += int(stored[first + count] - stored[first])
    s.close()
    out["all"] = dir_bytes(store)
    return out


def squashfs_stored(root: Path, kinds: list[str], image: Path, options: list[str]) -> dict[str, int]:
    out = {}
    for kind, src in [(k, root / k) for k in kinds] + [("all", root)]:
        bl.run(["mksquashfs", src, image, "-comp", "zstd", *options, "-noappend", "-quiet", "-no-progress"])
        out[kind] = image.stat().st_size
    image.unlink()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--codecs", default="zstd:3", help="comma-separated fanfs codecs (default zstd:3, the "
                        "fanfs default); e.g. zstd:3,zstd:19,lz4")
    parser.add_argument("--py-mb", type=float, default=20, help="MB of stdlib Python sources (default 20)")
    parser.add_argument("--jpegs", type=int, default=40, help="JPEG re-encodes besides the originals (default 40)")
    parser.add_argument("--npy-mb", type=float, default=16, help="MB of float32 .npy arrays (default 16)")
    parser.add_argument("--csv-mb", type=float, default=4, help="MB of CSV (default 4)")
    args = parser.parse_args()
    if not shutil.which("mksquashfs"):
        sys.exit("mksquashfs not found: install squashfs-tools")

    systems: dict[str, dict[str, int]] = {}
    with bl.temp_dir(args.workdir, "fanfs-bench-ratio-") as work:
        tree = work / "tree"
        kinds = build_tree(tree, args.py_mb, args.jpegs, args.npy_mb, args.csv_mb)
        source = {k: dir_bytes(tree / k) for k in kinds} | {"all": dir_bytes(tree)}
        files = {k: sum(1 for p in (tree / k).rglob("*") if p.is_file()) for k in kinds}
        print("tree: " + ", ".join(f"{k} {files[k]:,} files {source[k] / 1e6:.1f} MB" for k in kinds))
        for codec in args.codecs.split(","):
            t = time.perf_counter()
            bl.fanfs("pack", tree, work / "store", "--codec", codec, "--quiet", "--force")
            systems[f"fanfs {codec}"] = fanfs_stored(work / "store", kinds)
            print(f"fanfs pack --codec {codec}: {time.perf_counter() - t:.1f} s")
            shutil.rmtree(work / "store")
        for name, options in (("squashfs zstd (15)", []), ("squashfs zstd 19", ["-Xcompression-level", "19"])):
            t = time.perf_counter()
            systems[name] = squashfs_stored(tree, kinds, work / "image.sqfs", options)
            print(f"mksquashfs {name}: {time.perf_counter() - t:.1f} s (5 images)")

    names = list(systems)
    rows = [[k, source[k] / 1e6, *(source[k] / systems[s][k] for s in names)] for k in [*kinds, "all"]]
    print("\nratio = source / stored (higher is better)")
    print(bl.table(["kind", "source MB", *names], rows))
    print("\nstored MB")
    print(bl.table(["kind", "source MB", *names], [[k, source[k] / 1e6, *(systems[s][k] / 1e6 for s in names)]
                                                  for k in [*kinds, "all"]]))
    fanfs0 = names[0]
    print(f"\n{fanfs0} vs squashfs zstd (15), whole tree: {systems['squashfs zstd (15)']['all'] / systems[fanfs0]['all']:.3f}x "
          "(>1: fanfs stores less)")
    bl.write_json(args.json, {"source": source, "files": files, "stored": systems})
    return 0


if __name__ == "__main__":
    sys.exit(main())
