#!/usr/bin/env python3
"""Packing data as it ships: fanfs from a tree, from its tar, and from the tar through ratarmount, beside mksquashfs
and tar2sqfs, in one run; transcoding with 1 and 2 ranks; and a scale row of 1,000,000 small files.

Workloads (under --workdir, a tmpfs by default, so the source's disk is not what is measured):

* photos: --photos real-photo JPEGs of ~110 KB in class directories, as a tree, as a tar, and as ImageNet's
  layout (a tar of class tars, packed with --expand-archives); plain packs, then --progressive-jpeg packs with
  1 rank x 1 worker, 2 ranks x 1 worker (``mpiexec -n 2``) and 1 rank x 2 workers;
* small: --small text files of 0.3-3 KB in directories of 1,000, as a tree and as a tar;
* scale: --scale such files as a tar streamed into ``fanfs pack -`` (never on disk), and the same at a tenth of
  the count: pack time per file at both sizes, peak memory, and a fresh mount's launch to its first stat.

Every row: seconds (the median of --repeat rounds, every row once a round, so a shared box's load falls on all
alike), CPU seconds of the whole process tree (which load does not inflate: the fairer figure on a busy box),
files/s, MB/s of source, the peak resident memory of the whole process tree (sampled every 50 ms; for
the ratarmount route, ratarmount's too) and the image's size.  Ratios are against fanfs packing the tree.  Goals (issue 27): from a tar >= 0.9x the tree; >= 5x the ratarmount route; 2 ranks >= 1.6x one rank
transcoding; the scale row <= 1.5x the tenth's time per file and under 1 GB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import benchlib as bl
from fanfs.util.units import human_size

MPIEXEC = Path(sys.executable).parent / "mpiexec"
WORDS = [f"{i:x}".encode() * 3 for i in range(4096)]


def photo_tree(root: Path, count: int, classes: int = 20) -> int:
    for i, data in enumerate(bl.make_jpegs(count, 110_000)):
        path = root / f"n{i % classes:08d}" / f"n{i % classes:08d}_{i}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return count


def small_text(i: int) -> bytes:
    """0.3-3 KB of text-like bytes, different for every i (zstd finds ~2x in them)."""
    n = 300 + (i * 7919) % 2700
    out = b" ".join(WORDS[(i * 31 + k * 17) % len(WORDS)] for k in range(n // 9 + 1))
    return out[:n]


def small_tree(root: Path, count: int) -> int:
    for i in range(count):
        path = root / f"d{i // 1000:04d}" / f"f{i:07d}.txt"
        if i % 1000 == 0:
            path.parent.mkdir(parents=True)
        path.write_bytes(small_text(i))
    return count


def write_tar_stream(out, count: int) -> None:
    """A tar of ``count`` small files written to ``out`` as it is made (the scale row's source; tarfile's writer
    would keep every member's header in memory)."""
    for i in range(count):
        data = small_text(i)
        info = tarfile.TarInfo(f"d{i // 1000:04d}/f{i:07d}.txt")
        info.size, info.mtime = len(data), 1_700_000_000
        out.write(info.tobuf(tarfile.GNU_FORMAT) + data + bytes(-len(data) % 512))
    out.write(bytes(1024))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass
class Case:
    """One row: a command that makes ``image`` (removed before each run), timed with its peak memory."""

    name: str
    cmd: list[str]
    image: Path | None = None
    runs: list[tuple[float, int, float]] = field(default_factory=list)
    size: float = float("nan")  # bytes of the image it made


def fanfs_pack(*args: str | os.PathLike) -> list[str]:
    return [*bl.FANFS, "pack", *map(str, args), "--quiet"]


def clean(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def run_cases(cases: list[Case], repeat: int) -> None:
    """Every case once per round, ``repeat`` rounds: the load of a shared box falls on every row alike."""
    for round_ in range(repeat):
        for case in cases:
            if case.image is not None:
                clean(case.image)
            case.runs.append(bl.timed(case.cmd))
            if case.image is not None:
                case.size = size_of(case.image)
            seconds, peak, cpu = case.runs[-1]
            print(f"  [{round_ + 1}/{repeat}] {case.name}: {seconds:.1f} s, {cpu:.1f} s CPU, peak {human_size(peak)}",
                  flush=True)
    for case in cases:
        if case.image is not None:
            clean(case.image)


def show(title: str, cases: list[Case], files: int, source_bytes: int) -> dict[str, dict[str, float]]:
    """The table (medians; ratios against the first case: fanfs from the tree); name -> its row's figures."""
    seconds = {case.name: bl.median([t for t, _, _ in case.runs]) for case in cases}
    base = seconds[cases[0].name]
    rows = [[c.name, seconds[c.name], bl.median([cpu for _, _, cpu in c.runs]), files / seconds[c.name],
             source_bytes / seconds[c.name] / 1e6, max(m for _, m, _ in c.runs) / 2**20, c.size / 2**20,
             base / seconds[c.name]]
            for c in cases]
    print(f"\n{title}: {files:,} files, {human_size(source_bytes)}; medians of {len(cases[0].runs)} interleaved runs")
    columns = ["what", "seconds", "CPU s", "files/s", "MB/s", "peak MiB", "image MiB", "x tree"]
    print(bl.table(columns, rows))
    return {row[0]: dict(zip(columns[1:], row[1:])) for row in rows}


def common_cases(work: Path, tree: Path, tar: Path, jobs: str) -> list[Case]:
    """fanfs from the tree, from the tar, through ratarmount; mksquashfs twice; tar2sqfs twice."""
    store, image = work / "store", work / "image.sqfs"
    cases = [Case("fanfs pack TREE", fanfs_pack(tree, store, "--jobs", jobs), store),
             Case("fanfs pack TAR", fanfs_pack(tar, store, "--jobs", jobs), store)]
    ratarmount = shutil.which("ratarmount") or str(Path(sys.executable).parent / "ratarmount")
    if os.path.exists(ratarmount):
        mnt, index = work / "ratarmount", work / "ratarmount.index.sqlite"
        mnt.mkdir(exist_ok=True)
        script = (f"rm -f {index}; {ratarmount} --index-file {index} {tar} {mnt} && "  # its index made anew each run
                  f"{' '.join(fanfs_pack(mnt, store, '--jobs', jobs))}; s=$?; fusermount -u {mnt}; exit $s")
        cases.append(Case("ratarmount TAR + fanfs pack", ["sh", "-c", script], store))
    else:
        print("  ratarmount: not installed (tools/setup --bench)")
    for name, options in (("mksquashfs (default: gzip)", []),
                          ("mksquashfs -comp zstd level 3", ["-comp", "zstd", "-Xcompression-level", "3"])):
        cases.append(Case(name, ["mksquashfs", tree, image, "-noappend", "-quiet", "-processors", jobs, *options], image))
    if shutil.which("tar2sqfs"):
        for name, options in (("tar2sqfs < TAR (default: xz)", ""), ("tar2sqfs -c zstd level 3", "-c zstd -X level=3")):
            cases.append(Case(name, ["sh", "-c", f"tar2sqfs -q -f -j {jobs} {options} {image} < {tar}"], image))
    else:
        print("  tar2sqfs: not installed (Debian's squashfs-tools-ng: tools/setup --bench)")
    return [Case(c.name, [str(x) for x in c.cmd], c.image) for c in cases]


def photo_rows(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    tree, tar, classes_tar = work / "photos", work / "photos.tar", work / "ILSVRC-like_train.tar"
    print(f"making {args.photos:,} photo JPEGs of ~110 KB", flush=True)
    photo_tree(tree, args.photos)
    bl.run(["tar", "-cf", tar, "-C", tree, "."])
    for klass in sorted(tree.iterdir()):  # ImageNet's layout: one tar per class, inside one tar
        bl.run(["tar", "-cf", work / f"{klass.name}.tar", "-C", klass, "."])
    bl.run(["tar", "-cf", classes_tar, "-C", work, *[f"{k.name}.tar" for k in sorted(tree.iterdir())]])
    store = work / "store"
    cases = [*common_cases(work, tree, tar, args.jobs),
             Case("fanfs pack TAR-OF-TARS --expand-archives",
                  fanfs_pack(classes_tar, store, "--expand-archives", "--jobs", args.jobs), store)]
    transcode = ("--progressive-jpeg", "--jobs", "1")
    cases += [Case("--progressive-jpeg, 1 rank x 1 worker", fanfs_pack(tar, store, *transcode), store),
              Case("--progressive-jpeg, 1 rank x 2 workers", fanfs_pack(tar, store, "--progressive-jpeg", "--jobs", "2"),
                   store)]
    if MPIEXEC.exists():
        cases.append(Case("--progressive-jpeg, 2 ranks x 1 worker",
                          [str(MPIEXEC), "-n", "2", *fanfs_pack(tar, store, *transcode)], store))
    run_cases(cases, args.repeat)
    rows = show("photos (ImageNet-like JPEGs)", cases, args.photos, tree_bytes(tree))
    seconds = {name: row["seconds"] for name, row in rows.items()}
    one = seconds["--progressive-jpeg, 1 rank x 1 worker"]
    for name in ("--progressive-jpeg, 1 rank x 2 workers", "--progressive-jpeg, 2 ranks x 1 worker"):
        if name in seconds:
            print(f"transcoding, {name.split(', ')[1]} vs 1 rank x 1 worker: {one / seconds[name]:.2f}x (goal >= 1.6x)")


def small_rows(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    tree, tar = work / "small", work / "small.tar"
    print(f"making {args.small:,} small files", flush=True)
    small_tree(tree, args.small)
    bl.run(["tar", "-cf", tar, "-C", tree, "."])
    cases = common_cases(work, tree, tar, args.jobs)
    run_cases(cases, args.repeat)
    rows = show("small files", cases, args.small, tree_bytes(tree))
    shutil.rmtree(tree)
    tar.unlink()
    return rows


def scale_rows(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    """A tar of COUNT small files streamed into ``fanfs pack -``: time per file at COUNT/10 and COUNT, then a mount."""
    results = []
    for count in (args.scale // 10, args.scale):
        store = work / f"scale{count}"
        print(f"packing {count:,} small files from a tar stream", flush=True)
        feeder = subprocess.Popen([sys.executable, __file__, "--write-tar", str(count)], stdout=subprocess.PIPE)
        seconds, peak, _ = bl.timed(fanfs_pack("-", store, "--jobs", args.jobs), stdin=feeder.stdout)  # fanfs alone
        feeder.stdout.close()
        if feeder.wait():
            raise RuntimeError("the tar stream's writer failed")
        mnt = work / "mnt"
        mnt.mkdir(exist_ok=True)
        started = time.perf_counter()
        with bl.fanfs_mount(store, mnt):
            os.stat(mnt / f"d{(count - 1) // 1000:04d}" / f"f{count - 1:07d}.txt")
            first_stat = time.perf_counter() - started
        results.append([f"{count:,} files", seconds, count / seconds, seconds / count * 1e6, peak / 2**20,
                        size_of(store / "index") / 2**20, first_stat])
        clean(store)
    print("\nscale: small files (0.3-3 KB) as a tar on a pipe")
    columns = ["source", "seconds", "files/s", "us/file", "peak MiB (tree)", "index MiB", "mount->stat s"]
    print(bl.table(columns, results))
    print(f"per file at {args.scale:,} vs {args.scale // 10:,}: {results[1][3] / results[0][3]:.2f}x (goal <= 1.5x); "
          f"peak {results[1][4]:,.0f} MiB (goal < 1,024)")
    return {row[0]: dict(zip(columns[1:], row[1:])) for row in results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--photos", type=int, default=2000, help="photo JPEGs of ~110 KB (default 2,000; 0: none)")
    parser.add_argument("--small", type=int, default=100_000, help="small files (default 100,000; 0: none)")
    parser.add_argument("--scale", type=int, default=1_000_000,
                        help="small files of the scale row, streamed (default 1,000,000; 0: none)")
    parser.add_argument("--jobs", type=str, default=str(os.cpu_count() or 1), help="workers (default: all cores)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every row, interleaved (default 3)")
    parser.add_argument("--write-tar", type=int, metavar="COUNT", help=argparse.SUPPRESS)  # the scale row's feeder
    args = parser.parse_args()
    if args.write_tar:
        write_tar_stream(sys.stdout.buffer, args.write_tar)
        return
    print(f"load average {bl.load_average()}; {os.cpu_count()} cores; workdir {args.workdir}")
    with bl.temp_dir(args.workdir, "bench-pack-") as work:
        results = {"photos": photo_rows(args, work) if args.photos else None,
                   "small": small_rows(args, work) if args.small else None,
                   "scale": scale_rows(args, work) if args.scale else None}
    print(f"load average at the end {bl.load_average()}")
    bl.write_json(args.json, {**results, "load": bl.load_average()})


if __name__ == "__main__":
    main()
