#!/usr/bin/env python3
"""Many nodes on one host: staging speed, reads through one mount with local vs remote shards, remote latency.

Builds distinct real-photo JPEGs of about 110 KB on a tmpfs, packs them, then for each rank count
(``mpiexec -n R``, every rank a "node" with its own local dir and mount point):

* staging: ``fanfs stage`` of every shard once (replicas 1), job MB/s and the slowest node's MB/s,
  against one ``cp`` of the same shard files;
* reads through rank 0's freshly mounted file system by 4 reader processes, every file once: with
  ``--replicas R`` (every node holds every shard: all local) and with ``--replicas 1`` (rank 0 holds
  1/R of the bytes: the rest comes from peers over MPI);
* remote latency: the mean and max of rank 0's remote requests during that pass (one request per
  file: each file is one blob), and the median time to open and read one remote file, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import benchlib as bl

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
READERS = 4


def _read(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def mpi_fanfs(ranks: int, *args: str | os.PathLike) -> list[str]:
    return [MPIEXEC, "-n", str(ranks), *bl.FANFS, *map(str, args)]


def stage(store: Path, base: Path, ranks: int) -> dict[str, float]:
    started = time.perf_counter()
    report = json.loads(bl.run(mpi_fanfs(ranks, "stage", store, base / "local{rank}", "--quiet", "--json"),
                               timeout=600).stdout)
    wall = time.perf_counter() - started
    copied = sum(n["copied_bytes"] for n in report["nodes"])
    return {"job MB/s": copied / report["seconds"] / 1e6, "slowest node MB/s":
            min(n["copied_bytes"] / n["seconds"] for n in report["nodes"]) / 1e6,
            "wall s (with mpiexec start)": wall}


def cp_rate(store: Path, dst: Path) -> float:
    started = time.perf_counter()
    bl.run(["cp", "-r", store / "shards", dst])
    seconds = time.perf_counter() - started
    shutil.rmtree(dst)
    return sum(p.stat().st_size for p in (store / "shards").iterdir()) / seconds / 1e6


@contextmanager
def job(store: Path, base: Path, ranks: int, replicas: int) -> Iterator[list[Path]]:
    """A mount job (staging first), unmounted and ended however the block ends."""
    mounts = [base / f"mnt{rank}" for rank in range(ranks)]
    for mnt in mounts:
        mnt.mkdir(exist_ok=True)
    log = open(base / "job.log", "w")
    proc = subprocess.Popen(mpi_fanfs(ranks, "mount", store, base / "mnt{rank}", "--local-dir", base / "local{rank}",
                                      "--replicas", str(replicas), "--stage", "--foreground"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for mnt in mounts:
            bl.run([*bl.FANFS, "wait", mnt, "--timeout", "120"], timeout=150)
        yield mounts
    finally:
        subprocess.run([*bl.FANFS, "umount", mounts[0]], capture_output=True, timeout=60)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for mnt in mounts:
            if os.path.ismount(mnt):
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        log.close()
        for rank in range(ranks):
            shutil.rmtree(base / f"local{rank}", ignore_errors=True)


def read_pass(mnt: Path, rels: list[str]) -> tuple[float, float]:
    """(files/s, MB/s) of every file read once by READERS processes."""
    paths = [str(mnt / rel) for rel in rels]
    started = time.perf_counter()
    with ProcessPoolExecutor(READERS) as pool:
        total = sum(pool.map(_read, paths, chunksize=16))
    seconds = time.perf_counter() - started
    return len(paths) / seconds, total / seconds / 1e6


def remote_files(store: Path, rels: list[str], ranks: int) -> list[str]:
    """Files whose shard rank 0 does not hold with one replica."""
    from fanfs.store.index import Index
    from fanfs.cluster.placement import place
    index = Index(str(store / "index"))
    held = place(index.shard_size, ranks, 1).holds(0)
    return [rel for rel in rels if not held[int(index.shard[index.lookup(rel.encode())])]]


def one_by_one_ms(mnt: Path, rels: list[str]) -> float:
    times = []
    for rel in rels:
        started = time.perf_counter()
        _read(str(mnt / rel))
        times.append((time.perf_counter() - started) * 1e3)
    return bl.median(times)


def stats(mnt: Path) -> dict[str, Any]:
    return json.loads(bl.run([*bl.FANFS, "stats", mnt, "--json"]).stdout)["cluster"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=2000, help="JPEGs of ~110 KB (default 2000)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4], help="rank counts (default 3 4)")
    parser.add_argument("--shard-size", default="8M", help="pack shard size (default 8M)")
    args = parser.parse_args()
    results: dict[str, Any] = {"files": args.files, "host cores": os.cpu_count()}
    with bl.temp_dir(args.workdir, "bench-cluster-") as base:
        src = base / "src"
        for i, data in enumerate(bl.make_jpegs(args.files, 110_000)):
            (src / f"c{i % 20:02d}").mkdir(parents=True, exist_ok=True)
            (src / f"c{i % 20:02d}" / f"{i:05d}.jpg").write_bytes(data)
        rels = sorted(str(p.relative_to(src)) for p in src.rglob("*.jpg"))
        random.Random(0).shuffle(rels)
        store = base / "store"
        bl.run([*bl.FANFS, "pack", src, store, "--shard-size", args.shard_size, "--quiet"])
        stored = sum(p.stat().st_size for p in (store / "shards").iterdir())
        print(f"{args.files} JPEGs, {stored / 1e6:.0f} MB stored in {len(list((store / 'shards').iterdir()))} shards; "
              f"{os.cpu_count()} cores; load {bl.load_average()}", flush=True)
        stage_rows, read_rows = [], []
        for ranks in args.ranks:
            bl.wait_for_quiet()
            staged = stage(store, base, ranks)
            for rank in range(ranks):
                shutil.rmtree(base / f"local{rank}")
            stage_rows.append([ranks, staged["job MB/s"], staged["slowest node MB/s"], cp_rate(store, base / "cp"),
                               staged["wall s (with mpiexec start)"]])
            for replicas in (ranks, 1):
                with job(store, base, ranks, replicas) as mounts:
                    files_s, mb_s = read_pass(mounts[0], rels)
                    s = stats(mounts[0])
                remote = s["remote_bytes"] / max(1, s["remote_bytes"] + s["local_bytes"])
                row = [ranks, f"{remote:.0%} remote", files_s, mb_s, "-", "-", "-"]
                if replicas == 1:
                    with job(store, base, ranks, replicas) as mounts:  # fresh: nothing cached
                        one = one_by_one_ms(mounts[0], remote_files(store, rels, ranks)[:200])
                        t = stats(mounts[0])
                    row[4:] = [t["remote_latency_mean_ms"], t["remote_latency_max_ms"], one]
                read_rows.append(row)
                print(bl.table(["ranks", "through rank 0", "files/s", "MB/s", "remote mean ms", "remote max ms",
                                "remote file ms"], read_rows[-1:]), flush=True)
        print("\nstaging (replicas 1, every shard copied once)")
        print(bl.table(["ranks", "job MB/s", "slowest node MB/s", "cp MB/s", "wall s"], stage_rows))
        print(f"\nreads through rank 0's mount, {READERS} reader processes, every file once (cold mount)")
        print(bl.table(["ranks", "through rank 0", "files/s", "MB/s", "remote mean ms", "remote max ms",
                        "remote file ms"], read_rows))
        results.update(staging=stage_rows, reads=read_rows)
    bl.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
