#!/usr/bin/env python3
"""Data on a disk, cold: fanfs against the native directory, squashfuse_ll and ratarmount, in one run.

Real nodes keep a staged store on an SSD, and a dataset larger than memory is cold in every epoch.  Here every
tree, store, image and archive lies on a disk (``--dir``, default /var/tmp) and the page cache is dropped (root)
before each pass but the last:

* **cold**: a fresh mount, the page cache dropped;
* **evicted**: the page cache dropped again on the same mount (fanfs has verified every extent by then: the next
  epoch of a dataset larger than memory);
* **warm**: the same files once more with the page cache as the evicted pass left it (a dataset that fits in memory).

Small files (a class-per-directory tree of real-photo JPEGs) are read whole by ``--readers`` processes (buffered
``open()`` and unbuffered), in three orders: **random** (a seeded shuffle, a DataLoader's); **known** (the same,
told to fanfs first with ``fanfs ctl --order``: it reads ahead); **shard** (``fanfs.train.shard_aware_order`` over
the store's shards, ``--window`` shards shuffled together, told to fanfs too: every system reads that order).
Large files (random bytes, so fanfs stores them as extents) of 1 MiB and of 30 MB are read whole in a random order.
The tree is listed (with attributes) once per mount, before its passes and outside their time, as a dataset is built.
Reported: files/s (MB/s for large files), ratios, each daemon's CPU (user + system, every process) per file or per
GB.  ``--baseline CHECKOUT`` adds "fanfs@base", another checkout's fanfs (before/after in one run).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import bench_read as br
import benchlib as bl
from bench_large import drop_caches, load

sys.path.insert(0, str(bl.REPO))
from fanfs.store import Store  # noqa: E402
from fanfs.train.shards import shard_aware_order  # noqa: E402

PASSES = ("cold", "evicted", "warm")
LARGE = {"1MiB": ("random bytes, 1 MiB", 1 << 20), "30MB": ("random bytes, 30 MB", 30_000_000),
         "h5f32": ("HDF5 of float32 noise, 1 MiB, read with h5py", 1 << 20)}
"""Large-file sets: key -> (what, file size).  h5f32 is a scientist's case (issue 41): values zstd:3 shrinks by 7-13%."""


def read_share(args: tuple[str, list[str], str]) -> int:
    """One reader process's share: each file opened, read whole, closed (buffered, unbuffered, or loaded with h5py:
    its header's small reads, then its dataset); the bytes read (h5py: of the dataset)."""
    root, rels, how = args
    if how == "buffered":
        return br.read_all(root, rels)
    if how == "h5py":
        return sum(load(os.path.join(root, rel)) for rel in rels)
    total, buf = 0, bytearray(1 << 20)
    for rel in rels:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY)
        try:
            while n := os.readv(fd, [buf]):
                total += n
        finally:
            os.close(fd)
    return total


def make_large(src: Path, key: str, total: int) -> tuple[list[str], int]:
    """A large-file set in ``src``: its files and the bytes a pass reads."""
    import h5py
    _, size = LARGE[key]
    rng = np.random.default_rng(size)
    rels = [f"f{i:05d}.{'h5' if key == 'h5f32' else 'bin'}" for i in range(max(1, total // size))]
    for rel in rels:
        if key == "h5f32":
            with h5py.File(src / rel, "w") as f:
                f.create_dataset("x", data=rng.standard_normal(size // 4).astype(np.float32))
        else:
            (src / rel).write_bytes(rng.bytes(size))
    return rels, len(rels) * size


class Systems:
    """What is compared, each mounted (or not) over the same data on the disk."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        ratarmount = shutil.which("ratarmount") or str(Path(sys.executable).parent / "ratarmount")
        self.peers = [p for p in ("squashfuse_ll",) if shutil.which(p) and shutil.which("mksquashfs")]
        self.ratarmount = ratarmount if args.ratarmount and os.path.exists(ratarmount) else None
        base = {"fanfs@base": {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}} if args.baseline else {}
        self.base = base

    def names(self, large: bool) -> list[str]:
        unpriv = ["fanfs unpriv"] if large and os.geteuid() == 0 and self.args.unprivileged else []
        tar = ["ratarmount"] if self.ratarmount and not large else []
        return ["native", "fanfs", *unpriv, *self.base, *self.peers, *tar]

    def prepare(self, src: Path, name: str) -> None:
        """The store, the squashfs image and the tar of ``src``, on the disk."""
        bl.fanfs("pack", src, self.work / f"{name}.fanfs", "--quiet")
        if self.peers:
            bl.run(["mksquashfs", src, self.work / f"{name}.sqfs", "-comp", "zstd", "-noappend", "-quiet"])
        if self.ratarmount and name == "small":
            with tarfile.open(self.work / f"{name}.tar", "w") as tar:
                tar.add(src, arcname=".")
            with self.mounted("ratarmount", src, name):  # its index, made once, outside every pass
                pass

    @contextlib.contextmanager
    def mounted(self, system: str, src: Path, name: str) -> Iterator[tuple[Path, int | None]]:
        """The root to read and the pid of the daemon serving it (None: no daemon)."""
        mnt = self.work / "mnt"
        store = self.work / f"{name}.fanfs"
        if system == "native":
            yield src, None
        elif system == "fanfs":
            with bl.fanfs_mount(store, mnt, "--workers", str(self.args.serving)) as pid:
                yield mnt, pid
        elif system == "fanfs unpriv":
            with bl.unprivileged_mount(store, mnt) as pid:
                yield mnt, pid
        elif system in self.base:
            with bl.fanfs_mount(store, mnt, env=self.base[system], cwd=self.args.baseline) as pid:
                yield mnt, pid
        elif system == "ratarmount":
            with bl.foreground_mount([self.ratarmount, "-f", "--index-file", str(self.work / f"{name}.index"),
                                      str(self.work / f"{name}.tar"), str(mnt)], mnt) as pid:
                yield mnt, pid
        else:
            with bl.squashfuse_mount(system, self.work / f"{name}.sqfs", mnt) as pid:
                yield mnt, pid


def tell_order(root: Path, rels: list[str], work: Path) -> None:
    """``fanfs ctl --order``: the order every reader process follows, as one stream (their shares interleave).  A
    fanfs that reads nothing ahead (fanfs@base, before issue 40) says so and reads as without it."""
    order = work / "order"
    order.write_text("\n".join(rels) + "\n")
    time.sleep(1.1)  # fanfs skips a file read in the last second (its readers are ahead): the pass before is not
    bl.fanfs("ctl", root, "--order", order, check=False)


def run_set(systems: Systems, pool: mp.pool.Pool, src: Path, name: str, orders: dict[str, list[str]],
            modes: list[str], total: int, rates: dict, cpu: dict, rep: int) -> None:
    """Every pass of every (order, mode) on every system; figures into ``rates`` and ``cpu``."""
    large = name != "small"
    n = systems.args.readers
    for order_name, rels in orders.items():
        for mode in modes:
            for system in systems.names(large):
                told = order_name in ("known", "shard") and system.startswith("fanfs")
                line = []
                with systems.mounted(system, src, name) as (root, pid):
                    if not large:
                        br.list_dataset(str(root))
                    for pas in PASSES:
                        if pas != "warm":
                            drop_caches()
                        if told:
                            tell_order(root, rels, systems.work)
                        used, started = br.cpu_seconds(pid), time.perf_counter()
                        got = sum(pool.map(read_share, [(str(root), rels[i::n], mode) for i in range(n)], chunksize=1))
                        seconds = time.perf_counter() - started
                        if got != total:
                            raise RuntimeError(f"{system} {name} {order_name} {pas}: read {got} bytes, expected {total}")
                        key = (name, order_name, mode, pas, system)
                        rate = total / seconds / 1e6 if large else len(rels) / seconds
                        rates.setdefault(key, []).append(rate)
                        if pid is not None:
                            per = total / 1e9 if large else len(rels) / 1e6  # CPU ms per GB, or us per file
                            cpu.setdefault(key, []).append((br.cpu_seconds(pid) - used) * (1e3 if large else 1) / per)
                        line.append(f"{pas} {rate:9,.0f} {'MB' if large else 'files'}/s")
                print(f"[run {rep + 1}] {name:<6} {order_name:<6} {mode:<10} {system:<13} " + "   ".join(line), flush=True)


def report(name: str, systems: list[str], peers: list[str], rates: dict, cpu: dict, repeat: int) -> None:
    med = {key: bl.median(v) for key, v in rates.items() if key[0] == name}
    cpu_med = {key: bl.median(v) for key, v in cpu.items() if key[0] == name}
    others = [s for s in systems if s not in ("native", "fanfs")]
    rows, cpu_rows = [], []
    for (_, order, mode, pas) in dict.fromkeys(key[:4] for key in med):
        f = {s: med.get((name, order, mode, pas, s), float("nan")) for s in systems}
        rows.append([order, mode, pas, *(f[s] for s in systems), f["fanfs"] / f["native"],
                     *(f["fanfs"] / f[s] for s in others)])
        cpu_rows.append([order, mode, pas, *(cpu_med.get((name, order, mode, pas, s), float("nan"))
                                             for s in systems if s != "native")])
    unit = "MB/s" if name != "small" else "files/s"
    print(f"\n{name}: {unit}, median of {repeat} (on a disk; page cache dropped before the cold and evicted passes)")
    print(bl.table(["order", "mode", "pass", *systems, "fanfs/native", *(f"fanfs/{s}" for s in others)], rows))
    print(f"\n{name}: daemon CPU " + ("ms per GB" if name != "small" else "us per file") + ", median")
    print(bl.table(["order", "mode", "pass", *(s for s in systems if s != "native")], cpu_rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/var/tmp", help="a directory on a disk for everything (default /var/tmp)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--sets", default="small,1MiB,30MB,h5f32",
                        help=f"which data: small (JPEGs) and large files: {', '.join(f'{k} ({v[0]})' for k, v in LARGE.items())}"
                             " (default all)")
    parser.add_argument("--files", type=int, default=3000, help="small files (default 3000)")
    parser.add_argument("--size", type=int, default=110, metavar="KB", help="mean small-file size (default 110 KB)")
    parser.add_argument("--large-total", type=int, default=300_000_000, metavar="BYTES",
                        help="bytes of each large-file set (default 300 MB)")
    parser.add_argument("--orders", default="random,known,shard", help="small-file orders (default all three)")
    parser.add_argument("--window", type=int, default=4, help="shards shuffled together in the shard order (default 4)")
    parser.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--serving", type=int, default=1, help="fanfs mount --workers (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs, medians reported (default 3)")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="also mount with another checkout's fanfs")
    parser.add_argument("--no-ratarmount", dest="ratarmount", action="store_false", help="skip ratarmount")
    parser.add_argument("--no-unprivileged", dest="unprivileged", action="store_false",
                        help="skip the large-file row of a daemon run by nobody")
    args = parser.parse_args()
    if not drop_caches():
        sys.exit("bench_disk drops the page cache between passes: run it as root")
    sets = args.sets.split(",")
    rates: dict = {}
    cpu: dict = {}
    print(f"load average before: {bl.load_average()}")
    with bl.temp_dir(args.dir, "fanfs-bench-disk-") as work, mp.get_context("fork").Pool(args.readers) as pool:
        systems = Systems(args, work)
        data: dict[str, tuple[Path, dict[str, list[str]], list[str], int]] = {}
        if "small" in sets:
            src = work / "small"
            src.mkdir()
            rels, total = br.build_tree(src, args.files, args.size, 40)
            systems.prepare(src, "small")
            data["small"] = (src, small_orders(rels, work / "small.fanfs", args), ["buffered", "unbuffered"],
                             total)
            print(f"small: {len(rels):,} JPEGs, {total / 1e6:,.0f} MB", flush=True)
        for key in LARGE:
            if key in sets:
                src = work / key
                src.mkdir()
                rels, total = make_large(src, key, args.large_total)
                systems.prepare(src, key)
                order = [rels[i] for i in np.random.default_rng(len(rels)).permutation(len(rels))]
                data[key] = (src, {"random": order}, ["h5py" if key == "h5f32" else "unbuffered"], total)
                print(f"{key}: {len(rels):,} files ({LARGE[key][0]})", flush=True)
        for rep in range(args.repeat):
            for name, (src, orders, modes, total) in data.items():
                run_set(systems, pool, src, name, orders, modes, total, rates, cpu, rep)
    print(f"load average after: {bl.load_average()}")
    for name in data:
        report(name, systems.names(name != "small"), systems.peers, rates, cpu, args.repeat)
    bl.write_json(args.json, {"args": vars(args), "rates": [[*k, v] for k, v in rates.items()],
                              "cpu": [[*k, v] for k, v in cpu.items()]})
    return 0


def small_orders(rels: list[str], store: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    """The small-file orders asked for: random (and known: the same order, told), shard-aware over the store."""
    shuffled = [rels[i] for i in np.random.default_rng(7).permutation(len(rels))]
    opened = Store(str(store), check_shards=False)
    shards = np.array([int(opened.index.shard[opened.lookup(rel.encode())]) for rel in rels])
    opened.close()
    shard = [rels[i] for i in shard_aware_order(shards, args.window, np.random.default_rng(7))]
    every = {"random": shuffled, "known": shuffled, "shard": shard}
    return {name: every[name] for name in args.orders.split(",")}


if __name__ == "__main__":
    sys.exit(main())
