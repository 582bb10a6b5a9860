#!/usr/bin/env python3
"""Read throughput of a fanfs mount and of the store read in-process vs native tmpfs and squashfuse(_ll).

Builds a class-per-directory tree of distinct real-photo JPEGs (about 110 KB each) on a tmpfs, packs it
with fanfs and with mksquashfs (zstd), and reads every file whole (open, read, close) in a shuffled
order: from 1 thread, from N threads, and from N processes each taking a disjoint share (a PyTorch
DataLoader with N workers); "unbuffered" opens with ``buffering=0``; "cat" is ``xargs -P N cat`` (readers in
C, whose own CPU per file is small: the file system's cost shows).  Each FUSE file system is mounted
fresh for the first pass (cold kernel page cache and daemon cache); the second pass follows on the same
mount.  Pass 1 begins, within its time, by listing the class directories with their attributes
(``os.scandir`` + ``stat``), as a training dataset does when it is built (torchvision's ImageFolder
lists, and stats to filter); pass 2 reads the same dataset again.  Native tmpfs cannot be made cold, so its two passes are what they are.  "in-process" reads the
store without a mount through its fsspec file system (``fs.open(path).read()``; unbuffered rows:
``fs.cat_file(path)``), opened afresh in every reading process before each first pass.  Goals checked:
fanfs >= squashfuse on every row, fanfs's second pass >= 50% of native, in-process >= 80% of native
and >= 3x the mount's first pass with N processes.  ``--serving 1,2`` mounts fanfs with one serving loop
("fanfs") and with 2 serving processes ("fanfs x2"); the daemons' CPU per file (every process of the
daemon, user + system) is reported for fanfs and squashfuse alike.  ``--sets large`` (or ``small,large``)
reads large files instead (HDF5 of 1 MiB, ``.npz`` of 30 and 150 MB, on a disk: tools/bench/bench_large.py).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import bench_large
import benchlib as bl

sys.path.insert(0, str(bl.REPO))  # this checkout's fanfs, as the fanfs commands run it
from fanfs.fsspec import FanfsFileSystem  # noqa: E402

PASSES = ("pass 1", "pass 2")


@dataclass(frozen=True)
class InProcess:
    """The store read in-process through fsspec; each ``generation`` is opened afresh (a "fresh mount")."""

    store: str
    generation: int

    def fs(self) -> FanfsFileSystem:
        fs = _opened.get(self)
        if fs is None:
            for old in _opened.values():
                old.store.close()
            _opened.clear()
            fs = _opened[self] = FanfsFileSystem(store=self.store, skip_instance_cache=True)
        return fs


_opened: dict[InProcess, FanfsFileSystem] = {}


def read_all(root: str | InProcess, rels: list[str], buffering: int = -1) -> int:
    """Open, read whole, close each file; returns the bytes read (the work of one loader worker).

    ``buffering=0`` skips the ``isatty()`` that CPython <= 3.13 makes in every buffered ``open()``: on
    FUSE that ioctl is a round trip to the daemon, on tmpfs it is answered in the kernel.  In-process,
    it reads with ``cat_file`` (no file object at all).
    """
    total = 0
    if isinstance(root, InProcess):
        fs = root.fs()
        if buffering == 0:
            return sum(len(fs.cat_file(rel)) for rel in rels)
        for rel in rels:
            with fs.open(rel) as f:
                total += len(f.read())
        return total
    for rel in rels:
        with open(os.path.join(root, rel), "rb", buffering=buffering) as f:
            total += len(f.read())
    return total


def _read_share(args: tuple[Any, list[str], int]) -> int:
    return read_all(*args)


def _open_in_process(target: InProcess) -> int:
    """Open the store in this pool process (and stay busy a moment, so that each process gets one of these)."""
    target.fs()
    time.sleep(0.05)
    return os.getpid()


def list_dataset(root: str | InProcess) -> int:
    """What a dataset does when it is built: list every class directory and stat its files; returns the count."""
    if isinstance(root, InProcess):
        fs = root.fs()
        return sum(len(fs.ls(folder, detail=True)) for folder in fs.ls("", detail=False))
    count = 0
    with os.scandir(root) as classes:
        for folder in classes:
            with os.scandir(folder.path) as files:
                count += sum(1 for entry in files if entry.stat().st_size >= 0)
    return count


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


def cat_all(root: str, rels: list[str], workers: int) -> int:
    """``xargs -P N cat``: readers in C, whose own CPU per file is small, so the file system's shows."""
    listing = "\0".join(rels).encode()
    subprocess.run(["xargs", "-0", "-P", str(workers), "-n", "64", "cat"], input=listing, cwd=root,
                   stdout=subprocess.DEVNULL, check=True)  # the bytes go nowhere: no pipe to copy them through
    return sum(os.stat(os.path.join(root, rel)).st_size for rel in rels)  # cat read them all, or failed


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds used so far by ``pid`` and every process below it (a mount's serving processes)."""
    if pid is None:
        return 0.0
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        todo += map(int, children)
    return total


def make_modes(workers: int, pool: mp.pool.Pool) -> dict[str, Callable[[str, list[str]], int]]:
    def threads(root: str, rels: list[str]) -> int:
        with ThreadPoolExecutor(workers) as ex:
            return sum(ex.map(read_all, [root] * workers, [rels[i::workers] for i in range(workers)]))

    def processes(root: Any, rels: list[str], buffering: int = -1) -> int:
        shares = [(root, rels[i::workers], buffering) for i in range(workers)]
        return sum(pool.map(_read_share, shares, chunksize=1))

    return {"1 thread": read_all, "1 thread, unbuffered": lambda root, rels: read_all(root, rels, 0),
            f"{workers} threads": threads, f"{workers} procs": processes,
            f"{workers} procs, unbuffered": lambda root, rels: processes(root, rels, 0),
            f"{workers} cat (xargs -P)": lambda root, rels: cat_all(root, rels, workers)}


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
    parser.add_argument("--serving", default="1,2", metavar="N,...",
                        help="fanfs mounts with these numbers of serving processes (--workers of 'fanfs mount'; "
                             "default 1,2: a row 'fanfs' and a row 'fanfs x2')")
    parser.add_argument("--modes", metavar="NAME,...", help="only the reading modes whose names start with these "
                        "(e.g. '4 procs,4 cat'); default all")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also mount with the fanfs of another checkout (e.g. the last release: git worktree add "
                             "/tmp/base v0.2), one serving loop: a before/after in one run, as row 'fanfs@base'")
    parser.add_argument("--sets", default="small", metavar="small,large",
                        help="which rows: small (the JPEG tree, default) and/or large (large files on a disk)")
    parser.add_argument("--large-dir", default="/var/tmp", metavar="DIR",
                        help="where the large files, their store and image go: a directory on a disk (default /var/tmp)")
    parser.add_argument("--large-total", type=int, default=300_000_000, metavar="BYTES",
                        help="bytes of each large dataset (default 300 MB)")
    parser.add_argument("--large-readers", default="1,4", metavar="N,...", help="reader processes (default 1,4)")
    args = parser.parse_args()
    sets = args.sets.split(",")
    if "large" in sets:
        large_json = args.json if "small" not in sets else args.json and f"{args.json}.large.json"
        misses = bench_large.run(args, cpu_seconds, large_json)
        print("\nlarge-file goals (bench_large.GOALS): "
              + ("all met" if not misses else "MISSED:\n  " + "\n  ".join(misses)))
        if "small" not in sets:
            return 0

    peers = [] if args.no_squashfuse else [b for b in ("squashfuse", "squashfuse_ll") if shutil.which(b)]
    if peers and not shutil.which("mksquashfs"):
        sys.exit("mksquashfs not found: install squashfs-tools or use --no-squashfuse")
    serving = {("fanfs" if n == 1 else f"fanfs x{n}"): n for n in map(int, args.serving.split(","))}
    base = {"fanfs@base": {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}} if args.baseline else {}
    systems = ["native", *serving, *base, "in-process", *peers]
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

        generations = itertools.count()

        @contextmanager
        def served(system: str) -> Iterator[tuple[str | InProcess, int | None]]:
            """The root to read and the pid of the daemon serving it (None: no daemon)."""
            mnt = work / f"mnt-{system.replace(' ', '')}"
            if system == "in-process":  # opened in this process and in every pool process, before the clock starts
                target = InProcess(str(work / "store"), next(generations))
                target.fs()
                for _ in range(20):
                    if len(set(pool.map(_open_in_process, [target] * args.workers, chunksize=1))) == args.workers:
                        break
                yield target, None
                return
            if system == "native":
                ctx = nullcontext()
            elif system in serving:
                ctx = bl.fanfs_mount(work / "store", mnt, "--workers", str(serving[system]))
            elif system in base:
                ctx = bl.fanfs_mount(work / "store", mnt, env=base[system], cwd=args.baseline)
            else:
                ctx = bl.squashfuse_mount(system, work / "image.sqfs", mnt)
            with ctx as pid:
                yield str(src if system == "native" else mnt), pid

        modes = make_modes(args.workers, pool)
        if args.modes:
            modes = {name: mode for name, mode in modes.items() if name.startswith(tuple(args.modes.split(",")))}
        rates: dict[tuple[str, str, str], list[float]] = {}  # (mode, pass, system) -> files/s per repeat
        cpu: dict[tuple[str, str, str], list[float]] = {}  # (mode, pass, system) -> daemon CPU us per file
        bl.wait_for_quiet()
        for rep in range(args.repeat):
            for mode, reader in modes.items():
                orders = [list(np.random.default_rng(rep * 10 + p).permutation(rels)) for p in range(len(PASSES))]
                for system in systems:
                    if system == "in-process" and "cat" in mode:
                        continue  # no path to give cat
                    line = []
                    with served(system) as (root, pid):
                        for pas, order in zip(PASSES, orders):
                            used, t = cpu_seconds(pid), time.perf_counter()
                            if pas == PASSES[0] and list_dataset(root) != len(rels):
                                raise RuntimeError(f"{system}: the listing does not show {len(rels)} files")
                            got = reader(root, order)
                            seconds = time.perf_counter() - t
                            if got != total:
                                raise RuntimeError(f"{system} {mode} {pas}: read {got} bytes, expected {total}")
                            rates.setdefault((mode, pas, system), []).append(len(rels) / seconds)
                            if pid is not None:
                                cpu.setdefault((mode, pas, system), []).append((cpu_seconds(pid) - used) / len(rels) * 1e6)
                            line.append(f"{pas} {len(rels) / seconds:9,.0f} files/s")
                    print(f"[run {rep + 1}/{args.repeat}] {mode:<10} {system:<14} " + "   ".join(line), flush=True)
        print(f"load average after: {bl.load_average()}")

    mb_per_file = total / len(rels) / 1e6
    med = {key: bl.median(values) for key, values in rates.items()}
    cpu_med = {key: bl.median(values) for key, values in cpu.items()}
    daemons = [s for s in systems if s not in ("native", "in-process")]
    rows, mb_rows, cpu_rows, misses = [], [], [], []
    for mode in modes:
        for pas in PASSES:
            f = {s: med.get((mode, pas, s), float("nan")) for s in systems}
            inproc = f["in-process"]
            rows.append([mode, pas, *(f[s] for s in systems), f["fanfs"] / f["native"],
                         *(f[s] / f["fanfs"] for s in serving if s != "fanfs"),
                         *(f["fanfs"] / f[p] for p in peers), inproc / f["native"], inproc / f["fanfs"]])
            mb_rows.append([mode, pas, *(f[s] * mb_per_file for s in systems)])
            cpu_rows.append([mode, pas, *(cpu_med[(mode, pas, s)] for s in daemons)])
            misses += [f"{mode} {pas}: fanfs {f['fanfs']:,.0f} < {p} {f[p]:,.0f} files/s" for p in peers if f["fanfs"] < f[p]]
            if pas == "pass 2" and f["fanfs"] < 0.5 * f["native"]:
                misses.append(f"{mode} {pas}: fanfs is {f['fanfs'] / f['native']:.0%} of native (goal >= 50%)")
            if mode.startswith(f"{args.workers} procs") and inproc < 0.8 * f["native"]:
                misses.append(f"{mode} {pas}: in-process is {inproc / f['native']:.0%} of native (goal >= 80%)")
            if mode.startswith(f"{args.workers} procs") and pas == "pass 1" and inproc < 3 * f["fanfs"]:
                misses.append(f"{mode} {pas}: in-process is {inproc / f['fanfs']:.1f}x the mount (goal >= 3x)")
    print(f"\nfiles/s, median of {args.repeat} (fresh mount before every pass 1; {len(rels):,} files of "
          f"{mb_per_file * 1e3:.0f} KB; fanfs codec {args.codec}; squashfs zstd)")
    print(bl.table(["mode", "pass", *systems, "fanfs/native", *(f"{s}/fanfs" for s in serving if s != "fanfs"),
                    *(f"fanfs/{p}" for p in peers), "in-process/native", "in-process/fanfs"], rows))
    print("\nMB/s, median")
    print(bl.table(["mode", "pass", *systems], mb_rows))
    print("\ndaemon CPU per file (user + system, every process of the daemon), microseconds, median")
    print(bl.table(["mode", "pass", *daemons], cpu_rows))
    print(f"\ngoals (fanfs >= every squashfuse row; pass 2 >= 50% of native; in-process with {args.workers} procs >= 80% of "
          "native and >= 3x the mount's pass 1): " +
          ("all met" if not misses else "MISSED:\n  " + "\n  ".join(misses)))
    bl.write_json(args.json, {
        "files": len(rels), "bytes": total, "codec": args.codec, "repeat": args.repeat, "workers": args.workers,
        "files_per_s": [{"mode": m, "pass": p, "system": s, "runs": v, "median": med[(m, p, s)]}
                        for (m, p, s), v in rates.items()],
        "daemon_cpu_us_per_file": [{"mode": m, "pass": p, "system": s, "runs": v, "median": cpu_med[(m, p, s)]}
                                   for (m, p, s), v in cpu.items()],
        "misses": misses})
    return 0


if __name__ == "__main__":
    sys.exit(main())
