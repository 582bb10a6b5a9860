"""Large-file rows of bench_read: scientific datasets read whole, fanfs against the native directory on the same
disk and squashfuse_ll, in one run.

Three datasets, as MLPerf's storage and HPC suites read them (content random bytes, as their generator DLIO
writes: nothing to gain from compression, so every file system moves the same bytes): CosmoFlow-like HDF5 files
of 1 MiB (one contiguous dataset, read with h5py), UNet3D-like ``.npz`` of ~30 MB and ~150 MB (read with
``np.load``), each read whole by 1 and by 4 reader processes.  Pass "cold": a fresh mount, the page cache dropped
(``echo 3 > /proc/sys/vm/drop_caches``: the shards and the image too); pass "warm": the same files again.
Reported: MB/s, the ratios, and the daemons' CPU per GB read (every process of the daemon, user + system).  Row
"fanfs unpriv" is a daemon run by the user nobody (as root runs this: no capability, so its readahead stays the
kernel's 128 KiB), mounted with allow_other for the readers (benchlib.unprivileged_mount).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

import benchlib as bl

DATASETS = {"hdf5 1 MiB": ("h5", 1 << 20), "npz 30 MB": ("npz", 30_000_000), "npz 150 MB": ("npz", 150_000_000)}
PASSES = ("cold", "warm")


def make_dataset(directory: Path, kind: str, size: int, total: int, seed: int) -> list[str]:
    """Files of ``size`` bytes of payload (random bytes) adding up to about ``total``; returns their names."""
    import h5py
    rng = np.random.default_rng(seed)
    names = []
    for i in range(max(1, total // size)):
        values = rng.integers(0, 256, size, dtype=np.uint8)
        if kind == "h5":
            name = f"sample_{i:05d}.h5"
            with h5py.File(directory / name, "w") as f:
                f.create_dataset("x", data=values)  # contiguous, no filter: one read of the whole dataset
        else:
            name = f"volume_{i:04d}.npz"
            np.savez(directory / name, x=values[: size * 3 // 4], y=values[size * 3 // 4:])
        names.append(name)
    return names


def load(path: str) -> int:
    """Read one file as a training loader does; returns the bytes of its arrays."""
    if path.endswith(".h5"):
        import h5py
        with h5py.File(path, "r") as f:
            return int(f["x"][()].nbytes)
    with np.load(path) as z:
        return sum(z[name].nbytes for name in z.files)


def _load_share(paths: list[str]) -> int:
    return sum(map(load, paths))


def drop_caches() -> bool:
    """Drop the page cache (root only); False if this process may not."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def run(args: argparse.Namespace, cpu_seconds: Callable[[int | None], float], json_path: str | None) -> list[str]:
    """Build the datasets under ``args.large_dir``, read them on every system, print the tables (and write them to
    ``json_path``); returns the goals missed."""
    if importlib.util.find_spec("h5py") is None:
        raise SystemExit("the large-file rows need h5py (pip install -e '.[test]')")
    peers = [p for p in ("squashfuse_ll",) if shutil.which(p) and shutil.which("mksquashfs")]
    serving = {("fanfs" if n == 1 else f"fanfs x{n}"): n for n in map(int, args.serving.split(","))}
    base = {"fanfs@base": {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline)}} if args.baseline else {}
    unprivileged = ["fanfs unpriv"] if os.geteuid() == 0 else []
    systems = ["native", *serving, *unprivileged, *base, *peers]
    readers = [int(n) for n in args.large_readers.split(",")]
    rates: dict[tuple, list[float]] = {}
    cpu: dict[tuple, list[float]] = {}
    cold = drop_caches()
    if not cold:
        print("not root: the page cache cannot be dropped, so 'cold' passes are not cold")
    with bl.temp_dir(args.large_dir, "fanfs-bench-large-") as work, mp.get_context("fork").Pool(max(readers)) as pool:
        for label, (kind, size) in DATASETS.items():
            src = work / "src" / kind / str(size)
            src.mkdir(parents=True)
            names = make_dataset(src, kind, size, args.large_total, seed=size)
            total = sum((src / n).stat().st_size for n in names)
            store, image = work / f"store-{kind}-{size}", work / f"image-{kind}-{size}.sqfs"
            bl.fanfs("pack", src, store, "--codec", args.codec, "--quiet")
            if peers:
                bl.run(["mksquashfs", src, image, "-comp", "zstd", "-noappend", "-quiet"])
            print(f"{label}: {len(names)} files, {total / 1e6:,.0f} MB", flush=True)

            @contextlib.contextmanager
            def served(system: str) -> Iterator[tuple[Path, int | None]]:
                mnt = work / "mnt"
                if system == "native":
                    yield src, None
                elif system in serving:
                    with bl.fanfs_mount(store, mnt, "--workers", str(serving[system])) as pid:
                        yield mnt, pid
                elif system in unprivileged:
                    with bl.unprivileged_mount(store, mnt) as pid:
                        yield mnt, pid
                elif system in base:
                    with bl.fanfs_mount(store, mnt, env=base[system], cwd=args.baseline) as pid:
                        yield mnt, pid
                else:
                    with bl.squashfuse_mount(system, image, mnt) as pid:
                        yield mnt, pid

            for rep in range(args.repeat):
                for n in readers:
                    order = [names[i] for i in np.random.default_rng(rep).permutation(len(names))]
                    for system in systems:
                        with served(system) as (root, pid):
                            line = []
                            for pas in PASSES:
                                if pas == "cold":
                                    drop_caches()
                                paths = [str(root / name) for name in order]
                                used, t = cpu_seconds(pid), time.perf_counter()
                                got = sum(pool.map(_load_share, [paths[i::n] for i in range(n)], chunksize=1))
                                seconds = time.perf_counter() - t
                                if got < total * 0.99:
                                    raise RuntimeError(f"{system} {label}: loaded {got} bytes of {total}")
                                key = (label, n, pas, system)
                                rates.setdefault(key, []).append(total / seconds / 1e6)
                                if pid is not None:
                                    cpu.setdefault(key, []).append((cpu_seconds(pid) - used) * 1e3 / (total / 1e9))
                                line.append(f"{pas} {total / seconds / 1e6:7,.0f} MB/s")
                        print(f"[run {rep + 1}/{args.repeat}] {label:<11} {n} readers  {system:<14} " + "   ".join(line),
                              flush=True)
    misses = report(rates, cpu, systems, peers, readers, args.repeat)
    bl.write_json(json_path, {
        "repeat": args.repeat, "mb_per_s": [{"data": d, "readers": n, "pass": p, "system": s, "runs": v}
                                            for (d, n, p, s), v in rates.items()],
        "daemon_cpu_ms_per_gb": [{"data": d, "readers": n, "pass": p, "system": s, "runs": v}
                                 for (d, n, p, s), v in cpu.items()],
        "misses": misses})
    return misses


GOALS = {"fanfs": (0.9, 1.5), "fanfs unpriv": (0.75, 1.3)}
"""Cold passes: (times native, times squashfuse_ll) each fanfs row is to reach (issue 34); and its daemon's CPU per GB
at most 0.6x squashfuse_ll's.  Warm: >= 0.9x native with 1 reader, >= 1x squashfuse_ll with 4."""


def _missed(f: dict[str, float], cpu: dict, label: str, n: int, pas: str, peers: list[str]) -> list[str]:
    """The goals a row of medians misses, one line each."""
    misses, row = [], f"{label} {n} readers {pas}"
    for system, (native, peer) in GOALS.items():
        if system not in f:
            continue
        if pas == "cold":
            wants = [("native", native), *((p, peer) for p in peers)]
        else:
            wants = [("native", 0.9)] if n == 1 else [(p, 1.0) for p in peers]
        for other, goal in wants:
            if f[system] < goal * f[other]:
                misses.append(f"{row}: {system} {f[system] / f[other]:.2f}x {other} (goal >= {goal})")
        for p in peers:
            if pas == "cold" and cpu.get((label, n, pas, system), 0) > 0.6 * cpu.get((label, n, pas, p), float("inf")):
                misses.append(f"{row}: {system} daemon CPU per GB above 0.6x {p}'s")
    return misses


def report(rates: dict, cpu: dict, systems: list[str], peers: list[str], readers: list[int], repeat: int) -> list[str]:
    med = {key: bl.median(v) for key, v in rates.items()}
    cpu_med = {key: bl.median(v) for key, v in cpu.items()}
    daemons = [s for s in systems if s != "native"]
    rows, cpu_rows, misses = [], [], []
    for label in DATASETS:
        for n in readers:
            for pas in PASSES:
                f = {s: med.get((label, n, pas, s), float("nan")) for s in systems}
                rows.append([label, f"{n} readers", pas, *(f[s] for s in systems), f["fanfs"] / f["native"],
                             *(f["fanfs"] / f[p] for p in peers), *(f["fanfs"] / f[b] for b in systems if "@" in b)])
                cpu_rows.append([label, f"{n} readers", pas,
                                 *(cpu_med.get((label, n, pas, s), float("nan")) for s in daemons)])
                misses += _missed(f, cpu_med, label, n, pas, peers)
    print(f"\nlarge files: MB/s, median of {repeat} (cold: fresh mount, page cache dropped; warm: the same again)")
    print(bl.table(["data", "readers", "pass", *systems, "fanfs/native", *(f"fanfs/{p}" for p in peers),
                    *(f"fanfs/{b}" for b in systems if "@" in b)], rows))
    print("\ndaemon CPU per GB read (user + system, every process of the daemon), ms, median")
    print(bl.table(["data", "readers", "pass", *daemons], cpu_rows))
    return misses

