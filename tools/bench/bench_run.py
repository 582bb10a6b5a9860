#!/usr/bin/env python3
"""Reads without the round trip (issue 48): the native tree, a fanfs mount, the same mount under ``fanfs run`` and
squashfuse_ll, on the same data in one run.

Everything lies on a disk (``--dir``, default /var/tmp).  **cold**: the page cache dropped (root) before the pass, on
a fresh mount; **warm**: the same files again.  Workloads, each read in a seeded random order, medians of
``--repeat`` runs:

* **small files**: a class-per-directory tree of real-photo JPEGs (``--files``, ~58 KB), each opened, read whole and
  closed, with buffered ``open()`` (PIL's way) and unbuffered, by 1 and by ``--readers`` processes (forked from one
  reader, as a DataLoader's workers);
* **30 MB .npz**: ``np.load`` of float32 arrays (stored raw: extents), every array read;
* **ImageFolder epoch**: a PyTorch DataLoader (``--readers`` workers, forked) over an ImageFolder of the JPEGs: PIL
  decodes each to RGB, as torchvision's ImageFolder does (torchvision itself does not install here beside the pinned
  CPU torch).

A reader process's one-time costs (Python, its imports, a mount's store opened at its first file: measured on its
own and reported) are outside the timed part; under ``fanfs run`` the reader's first file is read before the clock
starts, as an epoch's first one would be.  Printed: files/s (MB/s for the .npz), ratios to native and to the mount.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import benchlib as bl
from bench_large import drop_caches

SYSTEMS = ("native", "fanfs", "fanfs run", "squashfuse_ll")
HERE = Path(__file__).resolve()


def reader(args: list[str]) -> None:
    """``bench_run.py reader ROOT LIST HOW PROCESSES``: read LIST's files under ROOT, print the seconds it took (the
    clock starts after a warm-up read of a file outside LIST)."""
    root, listing, how, processes = args[0], args[1], args[2], int(args[3])
    rels = Path(listing).read_text().splitlines()
    warm = rels.pop()
    first = time.perf_counter()
    with open(os.path.join(root, warm), "rb") as f:  # the store opened, modules imported: outside the clock
        f.read()
    first = time.perf_counter() - first
    if how == "imagefolder":
        started = time.perf_counter()
        _imagefolder(root, rels, processes)
    else:
        shares = [rels[i::processes] for i in range(processes)]
        started = time.perf_counter()
        if processes == 1:
            _read(root, shares[0], how)
        else:
            with mp.get_context("fork").Pool(processes) as pool:
                pool.starmap(_read, [(root, share, how) for share in shares])
    print(json.dumps([time.perf_counter() - started, first]))


def _read(root: str, rels: list[str], how: str) -> None:
    if how == "npz":
        import numpy as np
        for rel in rels:
            with np.load(os.path.join(root, rel)) as arrays:
                for name in arrays.files:
                    arrays[name]
        return
    for rel in rels:
        with open(os.path.join(root, rel), "rb", buffering=0 if how == "unbuffered" else -1) as f:
            f.read()


def _imagefolder(root: str, rels: list[str], workers: int) -> None:
    import numpy as np
    import torch
    from PIL import Image

    classes = sorted({rel.split("/")[0] for rel in rels})

    class Folder(torch.utils.data.Dataset):  # torchvision's ImageFolder: (RGB image as a tensor, class index)
        def __len__(self) -> int:
            return len(rels)

        def __getitem__(self, i: int) -> tuple:
            with Image.open(os.path.join(root, rels[i])) as im:
                pixels = np.asarray(im.convert("RGB"))
            return torch.from_numpy(pixels.copy()), classes.index(rels[i].split("/")[0])

    loader = torch.utils.data.DataLoader(Folder(), batch_size=1, num_workers=workers, multiprocessing_context="fork",
                                         collate_fn=lambda batch: len(batch))
    for _ in loader:
        pass


def timed(system: str, root: Path, mnt: Path | None, listing: Path, how: str, processes: int) -> tuple[float, float]:
    """(seconds of the timed part, seconds of the reader's first file)."""
    command = [sys.executable, str(HERE), "reader", str(root), str(listing), how, str(processes)]
    if system == "fanfs run":
        command = [*bl.FANFS, "run", "--mount", str(mnt), "--", *command]
    done = bl.run(command)
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_data(src: Path, files: int, arrays: int) -> tuple[list[str], list[str]]:
    """The JPEG tree (20 classes) and the .npz files; their relative paths."""
    import numpy as np
    from photo_samples import make_photo_set
    photos = []
    for c in range(20):
        made = make_photo_set(src / "photos" / f"n{c:08d}", -(-files // 20), seed=c)
        photos += [str(p.relative_to(src)) for p in made]
    rng = np.random.default_rng(48)
    npz = []
    for i in range(arrays):
        path = src / "arrays" / f"a{i:02d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, x=rng.standard_normal(7_500_000).astype(np.float32))
        npz.append(str(path.relative_to(src)))
    return photos[:files], npz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/var/tmp", help="a directory on a disk for the data (default /var/tmp)")
    parser.add_argument("--files", type=int, default=2000, help="JPEGs in the small-file set (default 2,000)")
    parser.add_argument("--arrays", type=int, default=10, help="30 MB .npz files (default 10)")
    parser.add_argument("--readers", type=int, default=4, help="reader processes / DataLoader workers (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row, the median reported (default 3)")
    parser.add_argument("--workloads", default="small,npz,imagefolder", help="which (default all three)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args()
    if not drop_caches():
        print("bench_run: the page cache cannot be dropped here (root needed): cold rows are warm", file=sys.stderr)
    squash = shutil.which("squashfuse_ll") and shutil.which("mksquashfs")
    results: dict[str, dict[str, float]] = {}
    with bl.temp_dir(args.dir, "fanfs-bench-run-") as work:
        photos, arrays = make_data(work / "src", args.files, args.arrays)
        bl.fanfs("pack", work / "src", work / "store", "--quiet")
        if squash:
            bl.run(["mksquashfs", work / "src", work / "image.sqfs", "-comp", "zstd", "-quiet", "-no-progress"])
        rows = _rows(args, photos, arrays)
        for system in SYSTEMS:
            if system == "squashfuse_ll" and not squash:
                continue
            for key, by in _measure(system, work, rows, args.repeat).items():
                results.setdefault(key, {}).update(by)
    _report(results, rows, args)
    bl.write_json(args.json, {"results": results, "load": bl.load_average()})
    return 0


def _rows(args: argparse.Namespace, photos: list[str], arrays: list[str]) -> list[tuple[str, str, int, list[str]]]:
    """(name, how, processes, files) of each row asked for."""
    import random
    order = random.Random(48).sample(photos, len(photos))
    wanted = args.workloads.split(",")
    rows = []
    if "small" in wanted:
        for processes in (1, args.readers):
            for how in ("buffered", "unbuffered"):
                rows.append((f"small, {processes} reader{'s' if processes > 1 else ''}, {how}", how, processes, order))
    if "npz" in wanted:
        rows.append(("30 MB .npz, np.load", "npz", 1, random.Random(49).sample(arrays, len(arrays))))
    if "imagefolder" in wanted:
        rows.append((f"ImageFolder epoch, {args.readers} workers", "imagefolder", args.readers, order))
    return rows


def _measure(system: str, work: Path, rows: list, repeat: int) -> dict[str, dict[str, float]]:
    """Files/s of each (row, pass) on ``system``, the median of ``repeat`` runs: each cold pass on a fresh mount, the
    page cache dropped; and the seconds a reader's first file took (its store opened, under fanfs run)."""
    rates: dict[str, list[float]] = {}
    for name, how, processes, rels in rows:
        listing = work / "listing"
        listing.write_text("\n".join([*rels, rels[0]]))  # the last line is the warm-up read's
        for _ in range(repeat):
            mnt = work / "mnt"
            with _mounted(system, work, mnt) as root:
                drop_caches()
                for pas in ("cold", "warm"):
                    seconds, first = timed(system, root, mnt, listing, how, processes)
                    rates.setdefault(f"{name}|{pas}", []).append(len(rels) / seconds)
                    rates.setdefault(f"{name}|{pas}|first", []).append(first)
    return {key: {system: statistics.median(values)} for key, values in rates.items()}


class _mounted:
    """The tree as ``system`` presents it: the source itself, or a fresh mount of the store or image."""

    def __init__(self, system: str, work: Path, mnt: Path) -> None:
        self.system, self.work, self.mnt = system, work, mnt
        self._context = None

    def __enter__(self) -> Path:
        if self.system == "native":
            return self.work / "src"
        if self.system == "squashfuse_ll":
            self._context = bl.squashfuse_mount("squashfuse_ll", self.work / "image.sqfs", self.mnt)
        else:
            self._context = bl.fanfs_mount(self.work / "store", self.mnt)
        self._context.__enter__()
        return self.mnt

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


def _report(results: dict[str, dict[str, float]], rows: list, args: argparse.Namespace) -> None:
    systems = [s for s in SYSTEMS if any(s in by for by in results.values())]
    table = []
    for name, how, _, _ in rows:
        for pas in ("cold", "warm"):
            by = results[f"{name}|{pas}"]
            unit = 1 if how != "npz" else 30
            table.append([name, pas, *(f"{by[s] * unit:,.0f}" for s in systems),
                          f"{by['fanfs run'] / by['native']:.2f}x", f"{by['fanfs run'] / by['fanfs']:.2f}x",
                          *([f"{by['fanfs run'] / by['squashfuse_ll']:.2f}x"] if "squashfuse_ll" in by else [])])
    headers = ["workload", "pass", *systems, "run/native", "run/mount", *(["run/squashfuse"] if "squashfuse_ll" in
                                                                             systems else [])]
    print(f"files/s (MB/s for the .npz), medians of {args.repeat}; load {bl.load_average()}")
    print(bl.table(headers, table))
    first = statistics.median(v["fanfs run"] for k, v in results.items() if k.endswith("|first") and "fanfs run" in v)
    print(f"a reader's first file under fanfs run (its imports and the store opened): {first * 1e3:.0f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] == ["reader"]:
        reader(sys.argv[2:])
    else:
        sys.exit(main())
