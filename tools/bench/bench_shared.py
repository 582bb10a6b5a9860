#!/usr/bin/env python3
"""What a node's shared copy saves (issue 50): the 4 tasks of a job array on one node, each mounting one store.

Staged per job (``--stage full``, a local directory each) against shared (``--stage shared``, one copy in a sticky
directory of the node's): the node's disk once the 4 mounts serve (blocks really used by the sparse copies), and each
mount's start (staging and mounting) one after another: the first stages, the others of a shared copy find it
complete.  Then the 4 started at once: the time until the last one serves, and what each copied.  Every copy is read
from a store in a directory the page cache is emptied of first (``--cold``, root), as a shared file system is.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from pathlib import Path

import benchlib as bl
import numpy as np

from fanfs.util.units import human_size

TASKS = 4


def make_store(work: Path, megabytes: int) -> Path:
    """A tree of files of 1 MiB (stored raw: extents) and of 20-200 KB, packed with the defaults."""
    src = work / "src"
    rng = np.random.default_rng(50)
    for i in range(megabytes // 2):
        (src / f"big{i // 100}").mkdir(parents=True, exist_ok=True)
        (src / f"big{i // 100}" / f"{i}.raw").write_bytes(rng.bytes(1 << 20))
    small = 0
    while small < (megabytes // 2) << 20:
        size = int(rng.integers(20_000, 200_000))
        (src / f"small{small // (50 << 20)}").mkdir(exist_ok=True)
        (src / f"small{small // (50 << 20)}" / f"{small}.bin").write_bytes(rng.bytes(size))
        small += size
    bl.fanfs("pack", src, work / "store", "--quiet")
    return work / "store"


def disk(*paths: Path) -> int:
    return sum(os.lstat(os.path.join(top, name)).st_blocks * 512 for path in paths
               for top, _, names in os.walk(path) for name in names)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def options(how: str, work: Path, task: int) -> list[str]:
    local = ["--local-dir", str(work / f"local{task}")]
    return [*local, "--stage", "full"] if how == "full" else [*local, "--stage", "shared", "--shared-local",
                                                               str(work / "shared")]


def one_after_another(store: Path, work: Path, how: str, cold: bool) -> dict:
    """The 4 mounts one after another: each one's start, and the node's disk once all serve."""
    starts, mounts = [], []
    try:
        if cold:
            drop_caches()
        for task in range(TASKS):
            mnt = work / f"mnt{task}"
            mnt.mkdir()
            began = time.perf_counter()
            bl.fanfs("mount", store, mnt, *options(how, work, task))
            starts.append(time.perf_counter() - began)
            mounts.append(mnt)
        used = disk(*(work / name for name in ("shared", *(f"local{t}" for t in range(TASKS)))))
    finally:
        for mnt in mounts:
            bl.fanfs("umount", mnt, check=False)
            bl.force_unmount(mnt)
    return {"starts": starts, "disk": used}


def at_once(store: Path, work: Path, how: str, cold: bool) -> dict:
    """The 4 mounts started at once: the time until the last serves, and what each one's staging copied."""
    points = [work / f"once{task}" for task in range(TASKS)]
    for mnt in points:
        mnt.mkdir()
    if cold:
        drop_caches()
    began = time.perf_counter()
    started = [subprocess.Popen([*bl.FANFS, "mount", str(store), str(mnt), *options(how, work, 10 + task)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for task, mnt in enumerate(points)]
    try:
        outputs = [process.communicate(timeout=600)[0] for process in started]
        seconds = time.perf_counter() - began
        copied = [re.search(r"copied ([^,]+),", out).group(1) for out in outputs]
    finally:
        for mnt in points:
            bl.fanfs("umount", mnt, check=False)
            bl.force_unmount(mnt)
    return {"seconds": seconds, "copied": copied}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--megabytes", type=int, default=512, help="the store's size (default 512)")
    parser.add_argument("--cold", action="store_true", help="empty the page cache before each staging (root)")
    args = parser.parse_args()
    results = {}
    with bl.temp_dir(args.workdir, "fanfs-bench-shared-") as work:
        store = make_store(work, args.megabytes)
        print(f"store: {human_size(disk(store / 'shards'))} in {len(list((store / 'shards').iterdir()))} shards; "
              f"load {bl.load_average()}", flush=True)
        for how in ("full", "shared"):
            case = work / how
            case.mkdir()
            (case / "shared").mkdir(mode=0o1777)
            results[how] = {"in turn": one_after_another(store, case, how, args.cold),
                            "at once": at_once(store, case, how, args.cold)}
    rows = [[how, human_size(r["in turn"]["disk"]), *(f"{s:.2f}" for s in r["in turn"]["starts"]),
             f"{r['at once']['seconds']:.2f}", " / ".join(r["at once"]["copied"])] for how, r in results.items()]
    print(bl.table(["staged", "node's disk", *(f"start {t + 1} (s)" for t in range(TASKS)), "4 at once (s)",
                    "copied by each at once"], rows))
    bl.write_json(args.json, results)


if __name__ == "__main__":
    main()
