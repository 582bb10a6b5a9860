#!/usr/bin/env python3
"""The in-process front (fsspec) against native reads, as a DataLoader's workers read small photos.

A class-per-directory tree of distinct real-photo JPEGs (default 608 of ~28 KB, the small tree of
tools/bench_cluster.py) on a tmpfs, packed with fanfs's defaults.  The store is opened once, in this
process, before any worker is forked (docs/fsspec.rst's advice); every round, for each way of reading
in turn, N worker processes are forked afresh (as a DataLoader forks its workers every epoch unless
``persistent_workers``) and each reads its share of the files whole, once: native ``open``/``read`` of
the tree, ``fs.cat_file`` and ``fs.open().read()``.  The clock starts once every worker has started.
Rounds interleave the ways of reading, so on a loaded box each ratio compares reads made under the same
load; the medians of the rounds and their ratios to native are reported, with the load average, and the
workers' CPU time per file (user + system, page faults included: under load, wall time is mostly waiting).
Goal: in-process >= 80% of native.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable

import benchlib as bl

sys.path.insert(0, str(bl.REPO))  # this checkout's fanfs, as the fanfs commands run it
from fanfs.fsspec import FanfsFileSystem  # noqa: E402

GOAL = 0.8
_fs: FanfsFileSystem | None = None  # opened before the fork: the workers inherit it
_root = ""


def native(rels: list[str]) -> int:
    total = 0
    for rel in rels:
        with open(os.path.join(_root, rel), "rb") as f:
            total += len(f.read())
    return total


def cat_file(rels: list[str]) -> int:
    assert _fs is not None
    return sum(len(_fs.cat_file(rel)) for rel in rels)


def open_read(rels: list[str]) -> int:
    assert _fs is not None
    total = 0
    for rel in rels:
        with _fs.open(rel) as f:
            total += len(f.read())
    return total


WAYS: dict[str, Callable[[list[str]], int]] = {"native": native, "cat_file": cat_file, "open+read": open_read}


def _share(job: tuple[str, list[str]]) -> tuple[int, float]:
    """(bytes, CPU seconds: user + system, page faults included) of one worker's share read ``job[0]``'s way."""
    way, rels = job
    started = time.process_time()
    got = WAYS[way](rels)
    return got, time.process_time() - started


def epoch(way: str, rels: list[str], workers: int) -> tuple[float, float, int]:
    """(files/s, CPU us per file, bytes) of every file read once by ``workers`` processes forked now."""
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(time.sleep, [0.05] * workers, chunksize=1)  # every worker started
        started = time.perf_counter()
        shares = pool.map(_share, [(way, rels[i::workers]) for i in range(workers)], chunksize=1)
        seconds = time.perf_counter() - started
    return len(rels) / seconds, sum(cpu for _, cpu in shares) / len(rels) * 1e6, sum(got for got, _ in shares)


def main() -> int:
    global _fs, _root
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=608, help="JPEGs (default 608)")
    parser.add_argument("--size", type=int, default=28, metavar="KB", help="mean JPEG size in KB (default 28)")
    parser.add_argument("--classes", type=int, default=8, help="class directories (default 8)")
    parser.add_argument("--workers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds, medians reported (default 7)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average before: {bl.load_average()}", flush=True)
    with bl.temp_dir(args.workdir, "fanfs-bench-fsspec-") as work:
        src, store = work / "src", work / "store"
        rels = []
        for i, data in enumerate(bl.make_jpegs(args.files, args.size * 1000)):
            rel = f"class_{i % args.classes:03d}/img_{i:06d}.jpg"
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
            rels.append(rel)
        total = sum((src / rel).stat().st_size for rel in rels)
        bl.fanfs("pack", src, store, "--quiet")
        _root, _fs = str(src), FanfsFileSystem(store=str(store), skip_instance_cache=True)
        rates: dict[str, list[float]] = {way: [] for way in WAYS}
        cpus: dict[str, list[float]] = {way: [] for way in WAYS}
        for rnd in range(args.rounds):
            for way in WAYS:
                rate, cpu, got = epoch(way, rels, args.workers)
                if got != total:
                    raise RuntimeError(f"{way}: read {got} bytes, expected {total}")
                rates[way].append(rate)
                cpus[way].append(cpu)
            print(f"[round {rnd + 1}/{args.rounds}] " + "  ".join(f"{w} {rates[w][-1]:,.0f} files/s {cpus[w][-1]:.1f} us"
                                                                  for w in WAYS), flush=True)
        print(f"load average after: {bl.load_average()}")
    med = {way: bl.median(r) for way, r in rates.items()}
    cpu = {way: bl.median(c) for way, c in cpus.items()}
    per_round = {way: [a / b for a, b in zip(r, rates["native"])] for way, r in rates.items()}
    rows = [[way, med[way], med[way] / med["native"], f"{min(per_round[way]):.2f}-{max(per_round[way]):.2f}",
             cpu[way], cpu["native"] / cpu[way]] for way in WAYS]
    print(f"\nmedian of {args.rounds} interleaved rounds ({len(rels):,} JPEGs of {total / len(rels) / 1e3:.0f} KB, "
          f"{args.workers} worker processes forked afresh each round, the store opened before the fork); CPU: the "
          "workers' user + system time per file (on a loaded box, the steadier of the two)")
    print(bl.table(["reads", "files/s", "/native", "/native per round", "CPU us per file", "native CPU / CPU"], rows))
    misses = [f"{way}: {med[way] / med['native']:.2f}x native (goal >= {GOAL})"
              for way in WAYS if way != "native" and med[way] < GOAL * med["native"]]
    print(f"\ngoal (in-process >= {GOAL:.0%} of native): " + ("met" if not misses else "MISSED: " + "; ".join(misses)))
    bl.write_json(args.json, {"files": len(rels), "bytes": total, "workers": args.workers, "rounds": args.rounds,
                              "files_per_s": rates, "cpu_us_per_file": cpus, "median": med, "median_cpu": cpu,
                              "misses": misses})
    return 0


if __name__ == "__main__":
    sys.exit(main())
