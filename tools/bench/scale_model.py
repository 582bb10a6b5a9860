#!/usr/bin/env python3
"""fanfs at 16 ... 1,024 nodes, on paper: a model of start-up, index broadcast, staging and remote-read
traffic, its constants measured on emulated clusters of 2, 4 and 8 nodes (``tools/emulated/emucluster.py``).

Per emulated size N: the launch of one rank per node to MPI ready (Hydra, proxies entering the
namespaces), the store's index read by rank 0 from the shared file system (sshfs) and broadcast, a
broadcast of ``--bcast-mb`` MB (what a large index costs), and ``fanfs stage`` at full (seconds, bytes
per node, bytes over the storage link).  Fitted: start-up = a + b*N; broadcast seconds per byte per
link bit/s = p + q*log2(N); staging's use of the storage link (bytes moved / (link rate * seconds)).
Then projected for an ImageNet-sized store (docs/clusters.rst, "Scale on paper"), with the parameters below.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import numpy as np
from clusterjob import make_tree
from bench_emulated import stage
from emucluster import emulated_cluster, rate_bits

RANK_PROGRAM = """
import json, sys, time
from fanfs.peers.world import World, expand, load_index
world = World.detect()
world.comm.Barrier()
ready = time.time()
load_index(expand(sys.argv[1]), world)
world.comm.Barrier()
indexed = time.time()
world.bcast_bytes(bytearray(int(sys.argv[2])) if world.rank == 0 else None)
world.comm.Barrier()
if world.rank == 0:
    print(json.dumps({"ready": ready, "indexed": indexed, "broadcast": time.time()}))
"""

# The projection's cluster: ImageNet-1k as ~110 KB JPEGs, fanfs's index at 133 B/file (docs/benchmarks.rst).
FILES, FILE_BYTES, INDEX_PER_FILE = 1_281_167, 110_000, 133


def calibrate(args: argparse.Namespace, export: Path, base: Path) -> list[dict[str, Any]]:
    rows = []
    index_bytes = (export / "store" / "index").stat().st_size
    for n in args.sizes:
        with emulated_cluster(n, args.link, args.storage_link, export=export, workdir=base) as cluster:
            launched = time.time()
            out = bl.run([*cluster.mpiexec(), sys.executable, "-c", RANK_PROGRAM, cluster.rank_path("shared/store"),
                          str(int(args.bcast_mb * 1e6))], timeout=600).stdout
            t = json.loads(out)
            staged = stage(cluster, "store", "full", args.replicas)
        rows.append({"nodes": n, "startup_s": t["ready"] - launched, "index_bytes": index_bytes,
                     "index_s": t["indexed"] - t["ready"], "bcast_bytes": int(args.bcast_mb * 1e6),
                     "bcast_s": t["broadcast"] - t["indexed"], "stage": staged})
        print(f"{n} nodes: start-up {rows[-1]['startup_s']:.2f} s, index ({index_bytes / 1e3:.0f} KB) read + broadcast "
              f"{rows[-1]['index_s']:.3f} s, {args.bcast_mb:.0f} MB broadcast {rows[-1]['bcast_s']:.2f} s, "
              f"stage {staged['wall_s']:.2f} s (copy {max(staged['per_node_s']):.2f} s, "
              f"{staged['storage_link_bytes'] / 1e6:.0f} MB over the storage link)", flush=True)
    return rows


def fit(rows: list[dict[str, Any]], link_bits: float, storage_bits: float) -> dict[str, float]:
    n = np.array([r["nodes"] for r in rows], dtype=float)
    b, a = np.polyfit(n, [r["startup_s"] for r in rows], 1)
    per_byte = np.array([r["bcast_s"] / r["bcast_bytes"] * link_bits / 8 for r in rows])  # in units of bytes / link B/s
    q, p = np.polyfit(np.log2(n), per_byte, 1)
    use = [r["stage"]["storage_link_bytes"] / (storage_bits / 8 * max(r["stage"]["per_node_s"])) for r in rows]
    return {"startup_a": a, "startup_b": b, "bcast_p": p, "bcast_q": q, "storage_use": float(np.mean(use))}


def project(model: dict[str, float], args: argparse.Namespace) -> list[list[Any]]:
    """Per node count: start-up, index broadcast, staging at full and K, per-node remote traffic, and the
    shared file system's load if every node read directly."""
    stored = FILES * FILE_BYTES
    index = FILES * INDEX_PER_FILE
    node_bps, shared_bps = rate_bits(args.project_link) / 8, rate_bits(args.project_storage) / 8
    rows = []
    for n in (16, 64, 256, 1024):
        startup = model["startup_a"] + model["startup_b"] * n
        bcast = index / node_bps * max(model["bcast_p"] + model["bcast_q"] * math.log2(n), 1.0)
        replicas = min(args.replicas, n)
        full = max(stored * replicas / (shared_bps * model["storage_use"]), stored * replicas / n / node_bps)
        at_k = full * args.k_bytes
        remote = (1 - replicas / n) * args.rate * FILE_BYTES
        direct = n * args.rate * FILE_BYTES
        rows.append([n, startup, bcast, full, at_k, remote / 1e6, direct / shared_bps, n * args.rate])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8],
                        help="emulated node counts (default 2,4,8)")
    parser.add_argument("--images", type=int, default=1000, help="real-photo JPEGs of ~110 KB staged (default 1000)")
    parser.add_argument("--link", default="1gbit", help="emulated node links (default 1gbit)")
    parser.add_argument("--storage-link", default="1gbit", help="emulated storage link (default 1gbit)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--bcast-mb", type=float, default=32, help="a broadcast of this size (default 32 MB)")
    parser.add_argument("--project-link", default="100gbit", help="projected node links (default 100gbit)")
    parser.add_argument("--project-storage", default="800gbit",
                        help="projected shared file system, aggregate (default 800gbit = 100 GB/s)")
    parser.add_argument("--rate", type=float, default=2000, help="projected images/s each node's training reads")
    parser.add_argument("--k-bytes", type=float, default=0.52, help="bytes at the recommended K / full (default 0.52)")
    parser.add_argument("--calibration", metavar="JSON", help="project from an earlier run's --json, emulating nothing")
    bl.common_args(parser)
    args = parser.parse_args()
    print(f"load {bl.load_average()}", flush=True)
    if args.calibration:
        with open(args.calibration) as f:
            rows = json.load(f)["calibration"]
    else:
        with bl.temp_dir(args.workdir, "scale-model-") as base:
            export = base / "export"
            export.mkdir()
            make_tree(export / "images", args.images, 110_000)
            bl.run([*bl.FANFS, "pack", export / "images", export / "store", "--quiet"], timeout=3600)
            rows = calibrate(args, export, base)
    model = fit(rows, rate_bits(args.link), rate_bits(args.storage_link))
    print(f"\nfitted: start-up {model['startup_a']:.2f} + {model['startup_b']:.3f} * N s; a broadcast of I bytes takes "
          f"I / link * ({model['bcast_p']:.2f} + {model['bcast_q']:.2f} * log2 N); staging uses "
          f"{model['storage_use']:.0%} of the storage link")
    print(f"\nprojected: ImageNet ({FILES:,} files, {FILES * FILE_BYTES / 1e9:.0f} GB, index "
          f"{FILES * INDEX_PER_FILE / 1e6:.0f} MB), replicas {args.replicas}, {args.project_link} node links, shared file "
          f"system {args.project_storage} in all, {args.rate:,.0f} images/s per node")
    table = project(model, args)
    print(bl.table(["nodes", "start-up s (bound)", "index bcast s", "stage full s", "stage K s", "remote MB/s per node",
                    "direct: x shared FS", "direct: opens/s"], table))
    bl.write_json(args.json, {"calibration": rows, "model": model, "projection": table, "load": bl.load_average(),
                              "parameters": {k: v for k, v in vars(args).items() if k != "sizes"} | {"sizes": args.sizes}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
