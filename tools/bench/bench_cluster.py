#!/usr/bin/env python3
"""Many nodes on one host (``mpiexec -disable-auto-cleanup -n R``, every rank a "node" with its own dirs).

Real-photo JPEGs of about 110 KB (and a small tree of ~28 KB ones) packed with fanfs's defaults, then:

* spread: bytes each node stages (``fanfs stage``, replicas 1) for 3 and 4 ranks and two dataset
  sizes, the worst node against the mean, and staging speed against one ``cp`` of the shard files;
* reads through rank 0's fresh mount by 4 reader processes, every file once: all local (replicas =
  ranks) against two thirds remote (3 ranks, replicas 1); and the same read in-process on rank 0 of
  nodes serving without a mount (``--no-mount``; 4 processes, each ``fsspec.filesystem("fanfs",
  node=DIR).cat_file``);
* a stopped peer (3 ranks, replicas 2): rank 0 reads the files it holds whole, with no peer stopped and
  with rank 2's daemon SIGSTOPped while 4 more readers keep rank 0's workers waiting on it;
* a dead peer: after kill -9 of rank 2's daemon, how long until rank 0 has read a file whose first
  holder was rank 2 (served by the replica).

``--reads``: only the reads (no spread, no stopped or dead peer).
``--emulate``: fanfs against a shared file system on an emulated cluster instead (nodes in network
namespaces, shaped links, sshfs): ``tools/bench/bench_emulated.py``, whose options follow ``--emulate``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import numpy as np
from clusterjob import READERS, job, make_tree, pool_pass, read_pass, read_size, run_ranks


def stage(store: Path, base: Path, ranks: int, replicas: int = 1) -> dict[str, Any]:
    started = time.perf_counter()
    report = json.loads(run_ranks(ranks, "stage", store, base / "local{rank}", "--replicas", replicas, "--quiet",
                                  "--json", logs=base / "ranks", timeout=600))
    wall = time.perf_counter() - started
    per_node = [n["copied_bytes"] for n in report["nodes"]]
    return {"per node MB": [round(b / 1e6, 2) for b in per_node],
            "worst vs mean": max(abs(b / np.mean(per_node) - 1) for b in per_node),
            "job MB/s": sum(per_node) / report["seconds"] / 1e6, "wall s": wall}


def cp_rate(store: Path, dst: Path) -> float:
    started = time.perf_counter()
    bl.run(["cp", "-r", store / "shards", dst])
    seconds = time.perf_counter() - started
    shutil.rmtree(dst)
    return sum(p.stat().st_size for p in (store / "shards").iterdir()) / seconds / 1e6


_node_fs: Any = None


def _open_node(directory: str) -> None:
    global _node_fs
    from fanfs.fsspec import FanfsFileSystem
    _node_fs = FanfsFileSystem(node=directory, skip_instance_cache=True)


def _cat(rel: str) -> int:
    return len(_node_fs.cat_file(rel))


def in_process_pass(directory: Path, rels: list[str], readers: int = READERS) -> float:
    """files/s of every file read once in-process on the node serving in ``directory``, by ``readers``
    processes, each with the node's view opened afresh (as a mount's first pass)."""
    import fanfs.fsspec  # noqa: F401  (imported by the parent, as in a training process: not timed in each worker)
    return pool_pass(_cat, rels, readers, _open_node, (str(directory),))


def holders(store: Path, rels: list[str], ranks: int, replicas: int) -> dict[str, set[int]]:
    """The nodes holding every blob of each file."""
    from fanfs.peers.placement import place
    from fanfs.store.index import Index
    index = Index(str(store / "index"))
    placement = place(index.blob_stored, ranks, replicas)
    out = {}
    for rel in rels:
        entry = index.lookup(rel.encode())
        first, count = int(index.first[entry]), int(index.count[entry])
        out[rel] = set.intersection(*(set(placement.holders(b)) for b in range(first, first + count)))
    return out


def main() -> int:
    """A job, rank or reader that fails ends the benchmark with one line saying which and why (clusterjob's
    RankFailed, a reader's death, a command that failed), not a traceback."""
    try:
        if "--emulate" in sys.argv[1:]:
            from bench_emulated import main as emulated
            return emulated()
        return measure()
    except RuntimeError as err:
        print(f"{Path(sys.argv[0]).name}{' --emulate' * ('--emulate' in sys.argv)}: error: "
              f"{str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 1


def measure() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=2000, help="JPEGs of ~110 KB (default 2000)")
    parser.add_argument("--small", type=int, default=608, help="JPEGs of ~28 KB of the small tree (default 608)")
    parser.add_argument("--reads", action="store_true", help="only the reads: mount and in-process, local and remote")
    args = parser.parse_args()
    results: dict[str, Any] = {"files": args.files, "host cores": os.cpu_count()}
    print(f"{os.cpu_count()} cores; load {bl.load_average()}", flush=True)
    with bl.temp_dir(args.workdir, "bench-cluster-") as base:
        stores, trees = {}, {}
        for name, files, size in (("small", args.small, 28_000), ("large", args.files, 110_000)):
            src = base / f"src-{name}"
            trees[name] = make_tree(src, files, size)
            stores[name] = base / f"store-{name}"
            bl.run([*bl.FANFS, "pack", src, stores[name], "--quiet"])  # fanfs's defaults
        spread = []
        for name, store in stores.items() if not args.reads else ():
            stored = sum(p.stat().st_size for p in (store / "shards").iterdir())
            for ranks in (3, 4):
                row = stage(store, base, ranks)
                spread.append([name, len(trees[name]), f"{stored / 1e6:.1f}", len(list((store / "shards").iterdir())),
                               ranks, " / ".join(f"{b:.2f}" for b in row["per node MB"]),
                               f"{100 * row['worst vs mean']:.1f}%", f"{row['job MB/s']:.0f}"])
                for rank in range(ranks):
                    shutil.rmtree(base / f"local{rank}", ignore_errors=True)
        if spread:
            cp = cp_rate(stores["large"], base / "cp")
            print("\nstaged bytes per node (replicas 1; fanfs's default pack of each tree)")
            print(bl.table(["tree", "files", "stored MB", "shards", "ranks", "MB per node", "worst vs mean",
                            "job MB/s"], spread))
            print(f"(one cp -r of the large store's shards: {cp:.0f} MB/s)")
            results["spread"] = spread

        store, rels = stores["large"], trees["large"]
        with job(store, base, 3, 3) as mounts:
            all_local = read_pass(mounts[0], rels)
        with job(store, base, 3, 1) as mounts:
            remote_share = np.mean([0 not in h for h in holders(store, rels, 3, 1).values()])
            two_thirds = read_pass(mounts[0], rels)
        with job(store, base, 3, 3, "--stage", "--no-mount", mnt="node{rank}") as nodes:
            in_local = in_process_pass(nodes[0], rels)
        with job(store, base, 3, 1, "--stage", "--no-mount", mnt="node{rank}") as nodes:
            in_remote = in_process_pass(nodes[0], rels)
        print(f"\nreads on rank 0, {READERS} reader processes, every file once: through its fresh mount, and "
              "in-process (fsspec) on nodes serving without a mount")
        print(bl.table(["ranks", "replicas", "remote share", "mount files/s", "in-process files/s", "in-process/mount"],
                       [[3, 3, "0%", f"{all_local:,.0f}", f"{in_local:,.0f}", f"{in_local / all_local:.2f}"],
                        [3, 1, f"{remote_share:.0%}", f"{two_thirds:,.0f}", f"{in_remote:,.0f}",
                         f"{in_remote / two_thirds:.2f}"]]))
        results["reads"] = {"all_local": all_local, "two_thirds_remote": two_thirds, "remote_share": remote_share,
                            "in_process_all_local": in_local, "in_process_two_thirds_remote": in_remote}
        if args.reads:
            bl.write_json(args.json, results)
            return 0

        held = holders(store, rels, 3, 2)
        local = [r for r in rels if 0 in held[r]]
        via_2 = [r for r in rels if 0 not in held[r] and 2 in held[r]]
        half = len(local) // 2
        with job(store, base, 3, 2) as mounts:
            normal = read_pass(mounts[0], local[:half])
            stopped = bl.daemon_pid(mounts[2])
            os.kill(stopped, signal.SIGSTOP)
            try:
                waiting = threading.Thread(target=read_pass, args=(mounts[0], via_2[:200], 4))
                waiting.start()
                time.sleep(0.3)
                with_stop = read_pass(mounts[0], local[half:])
                waiting.join(300)
            finally:
                os.kill(stopped, signal.SIGCONT)
        print(f"\nlocal files/s through rank 0 (3 ranks, replicas 2): {normal:,.0f} with every peer up, {with_stop:,.0f} "
              f"with rank 2 stopped and 4 readers waiting on it: {with_stop / normal:.2f}x (goal >= 0.80)")
        results["stopped_peer"] = {"normal": normal, "with_stop": with_stop, "ratio": with_stop / normal}

        with job(store, base, 3, 2) as mounts:
            victim = bl.daemon_pid(mounts[2])
            probe = via_2[200:220]
            os.kill(victim, signal.SIGKILL)
            died = time.perf_counter()
            size = read_size(str(mounts[0] / probe[0]))
            first = time.perf_counter() - died
            rest = [(time.perf_counter(), read_size(str(mounts[0] / r))) for r in probe[1:]]
            assert size > 0 and all(s > 0 for _, s in rest)
        print(f"\ndead peer: kill -9 of rank 2's daemon -> rank 0 read a file rank 2 held first in {first * 1e3:.1f} ms "
              f"(served by the replica); {len(probe)} such files, none failed")
        results["dead_peer_first_read_ms"] = first * 1e3
    print(f"\nload after: {bl.load_average()}")
    bl.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
