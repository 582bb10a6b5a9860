#!/usr/bin/env python3
"""What staging at a fidelity saves: bytes and time to stage, burst-buffer capacity, and reads from it.

One run: real-photo JPEGs (~110 KB, baseline) packed as progressive records; then for K = 1, 2, the
recommended K (``auto:0.95``) and full, on R ranks under ``mpiexec`` (each rank a "node" with its own
local dir, replicas 1): ``fanfs stage --fidelity K`` into fresh dirs (bytes copied, disk really used by
the sparse copies, seconds; the median of three), against one ``cp -r`` of the store's shards; then one
node staged at K and its fresh mount at K read by 4 processes, every file once (files/s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def staged_disk(local: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in local.iterdir() if p.name.isdigit())


def drop_caches() -> None:
    """Empty the page cache (root only), so that staging reads the store from the disk, as from a shared
    file system, rather than from memory."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def stage_at(store: Path, base: Path, ranks: int, k: str, cold: bool) -> dict[str, Any]:
    """Stage at K into fresh dirs three times; the median run's figures (dirs of the last run kept)."""
    runs = []
    for _ in range(3):
        for rank in range(ranks):
            shutil.rmtree(base / f"local{rank}", ignore_errors=True)
        if cold:
            drop_caches()
        started = time.perf_counter()
        out = bl.run([MPIEXEC, "-n", str(ranks), *bl.FANFS, "stage", store, base / "local{rank}", "--fidelity", k,
                      "--quiet", "--json"], timeout=600).stdout
        runs.append((time.perf_counter() - started, json.loads(out)))
    seconds, report = sorted(runs, key=lambda run: run[0])[1]
    return {"seconds": seconds, "copied": sum(n["copied_bytes"] for n in report["nodes"]),
            "disk": sum(staged_disk(base / f"local{rank}") for rank in range(ranks))}


def read_at(store: Path, base: Path, rels: list[str], k: str) -> float:
    """files/s of every file read at K by 4 processes from a fresh one-node mount staged at K."""
    from clusterjob import read_pass
    local, mnt = base / "local-one", base / "mnt"
    shutil.rmtree(local, ignore_errors=True)
    mnt.mkdir(exist_ok=True)
    bl.run([*bl.FANFS, "stage", store, local, "--fidelity", k, "--quiet"])
    with bl.fanfs_mount(store, mnt, "--local-dir", local, "--fidelity", k):
        return read_pass(mnt, rels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=2000, help="JPEGs of ~110 KB (default 2000)")
    parser.add_argument("--ranks", type=int, default=3, help="nodes under mpiexec (default 3)")
    parser.add_argument("--scan-script", help="passed to fanfs pack (default: its default)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each staging (root; use a "
                        "--workdir on a disk, not the default tmpfs): staging then reads from the disk")
    args = parser.parse_args()
    print(f"load {bl.load_average()}", flush=True)
    with bl.temp_dir(args.workdir, "bench-staging-") as base:
        src = base / "src"
        src.mkdir()
        for i, data in enumerate(bl.make_jpegs(args.files, 110_000)):
            (src / f"{i:05d}.jpg").write_bytes(data)
        rels = sorted(p.name for p in src.iterdir())
        store = base / "store"
        bl.run([*bl.FANFS, "pack", src, store, "--progressive-jpeg", "--quiet",
                *(["--scan-script", args.scan_script] if args.scan_script else [])])
        recommended = bl.run([*bl.FANFS, "fidelity", store, "--sample", "200", "--json"]).stdout
        k_rec = json.loads(recommended)["recommended"]
        if args.cold:
            drop_caches()
        started = time.perf_counter()
        bl.run(["cp", "-r", store / "shards", base / "cp"])
        cp_seconds = time.perf_counter() - started
        shutil.rmtree(base / "cp")
        originals = sum(p.stat().st_size for p in src.iterdir())

        rows, results = [], {"files": args.files, "ranks": args.ranks, "recommended": k_rec, "load": bl.load_average()}
        figures = {k: {**stage_at(store, base, args.ranks, k, args.cold), "files/s": read_at(store, base, rels, k)}
                   for k in dict.fromkeys(["1", "2", str(k_rec), "full"])}
        full = figures["full"]
        for k, f in figures.items():
            rows.append([k + (" (auto:0.95)" if k == str(k_rec) else ""), f"{f['copied'] / 1e6:.1f}",
                         f"{f['disk'] / 1e6:.1f}", f"{full['copied'] / f['copied']:.2f}",
                         f"{f['seconds']:.2f}", f"{full['seconds'] / f['seconds']:.2f}", f"{f['files/s']:,.0f}"])
        results["by_k"] = figures
        print(f"\n{args.files} photos of ~110 KB ({originals / 1e6:.0f} MB as baseline JPEGs), {args.ranks} ranks, "
              f"replicas 1; {'page cache dropped before each staging; ' if args.cold else ''}cp -r of the store's "
              f"shards: {cp_seconds:.2f} s")
        print(bl.table(["K", "MB staged", "MB on disk", "capacity x", "stage s", "x faster", "files/s at K"], rows))
        print("(stage s: the whole mpiexec job, start-up included; files/s: one node staged at K, a fresh mount "
              "at K, 4 readers)")
        bl.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
