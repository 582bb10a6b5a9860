#!/usr/bin/env python3
"""Read throughput of a fanfs mount vs native tmpfs and squashfuse(_ll), the way a training loader reads.

Builds a class-per-directory tree of distinct real-photo JPEGs (about 110 KB each) on a tmpfs, packs it
with fanfs and with mksquashfs (zstd), and reads every file whole (open, read, close) in a shuffled
order: from 1 thread, from N threads, and from N processes each taking a disjoint share (a PyTorch
DataLoader with N workers).  Each FUSE file system is mounted fresh for the first pass (cold kernel
page cache and daemon cache); the second pass follows on the same mount.  Native tmpfs cannot be made
cold, so its two passes are what they are.  Goals checked: fanfs >= squashfuse on every row, fanfs's
second pass >= 50% of native.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

import benchlib as bl

PASSES = ("pass 1", "pass 2")


def read_all(root: str, rels: list[str], buffering: int = -1) -> int:
    """Open, read whole, close each file; returns the bytes read (the work of one loader worker).

    ``buffering=0`` skips the ``isatty()`` that CPython <= 3.13 makes in every buffered ``open()``: on
    FUSE that ioctl is a round trip to the daemon, on tmpfs it is answered in the kernel.
    """
    total = 0
    for rel in rels:
        with open(os.path.join(root, rel), "rb", buffering=buffering) as f:
            total += len(f.read())
    return total


def _read_share(args: tuple[str, list[str]]) -> int:
    return read_all(*args)


def build_tree(src: Path, files: int, size_kb: int, classes: int) -> tuple[list[str], int]:
    """Write the JPEG tree; returns the relative paths and their total size."""
    jpegs = bl.make_jpegs(files, size_kb * 1000)
    rels = []
    for i, data in enumerate(jpegs):
        rel = f"class_{i % classes:03d}/img_{i:06d}.jpg"
        (src / rel).parent.mkdir(exist_ok=True)
        (src / rel).write_bytes(data)
        rels.append(rel)
    return rels, sum(map(len, jpegs))


def make_modes(workers: int, pool: mp.pool.Pool) -> dict[str, Callable[[str, list[str]], int]]:
    def threads(root: str, rels: list[str]) -> int:
        with ThreadPoolExecutor(workers) as ex:
            return sum(ex.map(read_all, [root] * workers, [rels[i::workers] for i in range(workers)]))

    def processes(root: str, rels: list[str]) -> int:
        return sum(pool.map(_read_share, [(root, rels[i::workers]) for i in range(workers)], chunksize=1))

    return {"1 thread": read_all, "1 thread, unbuffered": lambda root, rels: read_all(root, rels, 0),
            f"{workers} threads": threads, f"{workers} procs": processes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=4000, help="number of files (default 4000)")
    parser.add_argument("--size", type=int, default=110, metavar="KB", help="mean file size in KB (default 110)")
    parser.add_argument("--classes", type=int, default=40, help="class directories (default 40)")
    parser.add_argument("--codec", default="zstd:3", help="fanfs pack codec (default zstd:3, the fanfs default)")
    parser.add_argument("--workers", type=int, default=4, help="threads / processes of the parallel modes (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every row, medians reported (default 3)")
    parser.add_argument("--no-squashfuse", action="store_true", help="skip the squashfuse rows")
    args = parser.parse_args()

    peers = [] if args.no_squashfuse else [b for b in ("squashfuse", "squashfuse_ll") if shutil.which(b)]
    if peers and not shutil.which("mksquashfs"):
        sys.exit("mksquashfs not found: install squashfs-tools or use --no-squashfuse")
    systems = ["native", "fanfs", *peers]
    print(f"load average before: {bl.load_average()}")
    with bl.temp_dir(args.workdir, "fanfs-bench-read-") as work, \
            mp.get_context("fork").Pool(args.workers) as pool:
        src = work / "src"
        src.mkdir()
        t = time.perf_counter()
        rels, total = build_tree(src, args.files, args.size, args.classes)
        print(f"tree: {len(rels):,} JPEGs in {args.classes} dirs, {total / 1e6:,.1f} MB "
              f"(mean {total / len(rels) / 1e3:.0f} KB), made in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        bl.fanfs("pack", src, work / "store", "--codec", args.codec, "--quiet")
        print(f"fanfs pack --codec {args.codec}: {time.perf_counter() - t:.1f} s")
        if peers:
            t = time.perf_counter()
            bl.run(["mksquashfs", src, work / "image.sqfs", "-comp", "zstd", "-noappend", "-quiet"])
            print(f"mksquashfs -comp zstd: {time.perf_counter() - t:.1f} s")

        @contextmanager
        def served(system: str) -> Iterator[str]:
            mnt = work / f"mnt-{system}"
            if system == "native":
                ctx = nullcontext()
            elif system == "fanfs":
                ctx = bl.fanfs_mount(work / "store", mnt)
            else:
                ctx = bl.squashfuse_mount(system, work / "image.sqfs", mnt)
            with ctx:
                yield str(src if system == "native" else mnt)

        modes = make_modes(args.workers, pool)
        rates: dict[tuple[str, str, str], list[float]] = {}  # (mode, pass, system) -> files/s per repeat
        bl.wait_for_quiet()
        for rep in range(args.repeat):
            for mode, reader in modes.items():
                orders = [list(np.random.default_rng(rep * 10 + p).permutation(rels)) for p in range(len(PASSES))]
                for system in systems:
                    line = []
                    with served(system) as root:
                        for pas, order in zip(PASSES, orders):
                            t = time.perf_counter()
                            got = reader(root, order)
                            seconds = time.perf_counter() - t
                            if got != total:
                                raise RuntimeError(f"{system} {mode} {pas}: read {got} bytes, expected {total}")
                            rates.setdefault((mode, pas, system), []).append(len(rels) / seconds)
                            line.append(f"{pas} {len(rels) / seconds:9,.0f} files/s")
                    print(f"[run {rep + 1}/{args.repeat}] {mode:<10} {system:<14} " + "   ".join(line), flush=True)
        print(f"load average after: {bl.load_average()}")

    mb_per_file = total / len(rels) / 1e6
    med = {key: bl.median(values) for key, values in rates.items()}
    rows, mb_rows, misses = [], [], []
    for mode in modes:
        for pas in PASSES:
            f = {s: med[(mode, pas, s)] for s in systems}
            rows.append([mode, pas, *(f[s] for s in systems), f["fanfs"] / f["native"],
                         *(f["fanfs"] / f[p] for p in peers)])
            mb_rows.append([mode, pas, *(f[s] * mb_per_file for s in systems)])
            misses += [f"{mode} {pas}: fanfs {f['fanfs']:,.0f} < {p} {f[p]:,.0f} files/s" for p in peers if f["fanfs"] < f[p]]
            if pas == "pass 2" and f["fanfs"] < 0.5 * f["native"]:
                misses.append(f"{mode} {pas}: fanfs is {f['fanfs'] / f['native']:.0%} of native (goal >= 50%)")
    print(f"\nfiles/s, median of {args.repeat} (fresh mount before every pass 1; {len(rels):,} files of "
          f"{mb_per_file * 1e3:.0f} KB; fanfs codec {args.codec}; squashfs zstd)")
    print(bl.table(["mode", "pass", *systems, "fanfs/native", *(f"fanfs/{p}" for p in peers)], rows))
    print("\nMB/s, median")
    print(bl.table(["mode", "pass", *systems], mb_rows))
    print("\ngoals (fanfs >= every squashfuse row; pass 2 >= 50% of native): " +
          ("all met" if not misses else "MISSED:\n  " + "\n  ".join(misses)))
    bl.write_json(args.json, {
        "files": len(rels), "bytes": total, "codec": args.codec, "repeat": args.repeat, "workers": args.workers,
        "files_per_s": [{"mode": m, "pass": p, "system": s, "runs": v, "median": med[(m, p, s)]}
                        for (m, p, s), v in rates.items()],
        "misses": misses})
    return 0


if __name__ == "__main__":
    sys.exit(main())
