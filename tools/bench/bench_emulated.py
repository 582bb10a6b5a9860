#!/usr/bin/env python3
"""fanfs against the shared file system on an emulated cluster (``tools/bench/bench_cluster.py --emulate``).

N nodes in network namespaces on shaped links, the dataset on a real network file system (sshfs from
an sshd in a storage namespace behind one shaped link that every node shares; ``tools/emulated/emucluster.py``).
Every node runs a training-style reader over its own 1/N of a shuffled epoch (``--readers`` processes
per node, all nodes at once): open, read and decode with Pillow (``convert('RGB')``); the "read" rows
leave out the decode (what the network and the file systems deliver).  Variants, each on fresh mounts:

* ``direct``: the original image tree read from the shared file system (what users do today);
* ``fanfs_full`` / ``fanfs_k``: the store (progressive records, on the shared file system) staged into
  the nodes' local dirs by ``fanfs stage`` over that same path, at full and at the recommended K
  (``fanfs fidelity``, SSIM 0.95), then read through each node's fanfs mount (a node's peers serve,
  over the node links, the blobs it does not hold); ``fanfs_plain``: the same with a store packed with
  the defaults (no progressive records), read at full; ``fanfs_half``: a store of progressive records with
  a half-resolution tier (``pack --scales 2``), staged and read at ``--fidelity 1/2``;
* ``local``: the originals read from the host's tmpfs, no network at all: the CPU's ceiling here.

Images/s per node and in total (median of ``--repeat``), staging seconds and bytes (per node, and what
crossed the storage link), at ``--storage-link`` and, once each, at every rate of ``--sweep`` (the
plot).  The host's cores are shared by every node, reader, daemon, sshd and sshfs: see docs/clusters.rst
("Emulated cluster") for what the figures mean.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import numpy as np
from clusterjob import job, make_tree, run_ranks
from bench_lazy import BATCH, capacity_rows, lazy_rows, print_capacity, print_lazy
from emucluster import Cluster, emulated_cluster, rate_bits

# The fanfs rows: (key, store, presentation), staged and mounted alike.  "store" holds progressive records,
# "plain" the same images packed with the defaults (what a job that reads only at full would use), "tiers"
# progressive records with a half-resolution tier (what a job training at low resolution would use).
VARIANTS = (("fanfs_plain", "plain", "full"), ("fanfs_full", "store", "full"), ("fanfs_k", "store", "K"),
            ("fanfs_half", "tiers", "1/2"))
MODES = {"decode": "img_s", "read": "read_img_s"}  # mode -> suffix of its JSON keys
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}


def _reader(node: int, paths: list[str], decode: bool, start: Any, out: Any) -> None:
    """One reader process: waits for the common start, then opens, reads (and decodes) each path once.  A file
    Pillow cannot decode is counted and skipped, as a loader's error handling would; any other error ends the
    reader, and the epoch with it."""
    from PIL import Image, UnidentifiedImageError
    start.wait()
    began, nbytes, undecodable = time.perf_counter(), 0, 0
    for path in paths:
        with open(path, "rb") as f:
            if decode:
                try:
                    Image.open(f).convert("RGB")
                except (UnidentifiedImageError, SyntaxError, ValueError, OSError):  # Pillow's ways to say "not an image"
                    undecodable += 1
                nbytes += f.tell()
            else:
                nbytes += len(f.read())
    out.put((node, began, time.perf_counter(), len(paths) - undecodable, nbytes, undecodable))


def epoch(roots: list[Path], rels: list[str], readers: int, decode: bool) -> dict[str, Any]:
    """Every node reads its 1/N of ``rels`` under its own root, all at once; images/s per node and in total."""
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(len(roots) * readers + 1), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(node, [str(root / p) for p in rels[node::len(roots)][r::readers]],
                                               decode, start, out))
             for node, root in enumerate(roots) for r in range(readers)]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    results: list[tuple] = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:  # it will never report: stop at once, not after the queue's timeout
                for p in procs:
                    p.kill()
                    p.join()
                raise RuntimeError(f"a reader died (exit code {dead[0]}; its error is above): the epoch is void") from None
    for p in procs:
        p.join()
    per_node = []
    for node in range(len(roots)):
        mine = [r for r in results if r[0] == node]
        per_node.append(sum(r[3] for r in mine) / (max(r[2] for r in mine) - min(r[1] for r in mine)))
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return {"total": sum(r[3] for r in results) / wall, "per_node": per_node, "MB": sum(r[4] for r in results) / 1e6,
            "undecodable": sum(r[5] for r in results)}


def is_image(path: Path) -> bool:
    """Whether Pillow recognises ``path`` as an image (its header; nothing is decoded)."""
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path):
            return True
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        return False


def median_epochs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"total": bl.median([r["total"] for r in runs]),
            "per_node": [bl.median([r["per_node"][i] for r in runs]) for i in range(len(runs[0]["per_node"]))],
            "runs": [r["total"] for r in runs]}


def stage(cluster: Cluster, store: str, fidelity: str, replicas: int, local: str = "local") -> dict[str, Any]:
    """``fanfs stage`` on every node from the shared file system into fresh dirs ``local``: seconds and bytes."""
    for node in cluster.nodes:
        shutil.rmtree(node.dir / local, ignore_errors=True)
        (node.dir / local).mkdir()
    before = cluster.counters()
    started = time.perf_counter()
    out = run_ranks(len(cluster.nodes), "stage", cluster.rank_path(f"shared/{store}"), cluster.rank_path(local),
                    "--replicas", replicas, "--fidelity", fidelity, "--quiet", "--json", logs=cluster.workdir / "ranks",
                    launcher=cluster.mpiexec())
    wall = time.perf_counter() - started
    after = cluster.counters()
    report = json.loads(out)
    return {"wall_s": wall, "job_s": report["seconds"], "per_node_s": [n["seconds"] for n in report["nodes"]],
            "per_node_bytes": [n["copied_bytes"] for n in report["nodes"]],
            "bytes": sum(n["copied_bytes"] for n in report["nodes"]),
            "storage_link_bytes": after["storage"]["out"] - before["storage"]["out"]}


def median_stage(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time (its bytes are every run's)."""
    return {**sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2], "runs_s": [r["wall_s"] for r in runs]}


def measure_point(cluster: Cluster, export: Path, rels: list[str], k: int, args: argparse.Namespace,
                  repeat: int) -> dict[str, Any]:
    """Every row at the cluster's current link settings: stagings, then ``repeat`` rounds of epochs, the
    variants interleaved in each round (so that the load of a shared box weighs on all alike)."""
    fidelity = {"full": "full", "K": str(k), "1/2": "1/2"}
    stagings: dict[str, list] = {}
    for _ in range(repeat):
        for key, store, presentation in VARIANTS:
            stagings.setdefault(key, []).append(stage(cluster, store, fidelity[presentation], args.replicas,
                                                      f"local-{key}"))
    runs: dict[str, list] = {}
    for _ in range(repeat):
        for mode, suffix in MODES.items():
            decode = mode == "decode"
            cluster.remount_shared()  # nothing cached on the client side
            runs.setdefault(f"direct_{suffix}", []).append(
                epoch([n.shared / "images" for n in cluster.nodes], rels, args.readers, decode))
            if args.local:
                runs.setdefault(f"local_{suffix}", []).append(
                    epoch([export / "images"] * len(cluster.nodes), rels, args.readers, decode))
            for key, store, presentation in VARIANTS:
                with job(cluster.rank_path(f"shared/{store}"), cluster.workdir, len(cluster.nodes), args.replicas,
                         "--fidelity", fidelity[presentation], launcher=cluster.mpiexec(), mnt="n{rank}/mnt",
                         local=f"n{{rank}}/local-{key}") as mounts:
                    runs.setdefault(f"{key}_{suffix}", []).append(epoch(mounts, rels, args.readers, decode))
    point: dict[str, Any] = {"links": cluster.settings()}
    point.update({f"stage_{key.removeprefix('fanfs_')}": median_stage(r) for key, r in stagings.items()})
    point.update({name: median_epochs(r) for name, r in runs.items()})
    return point


def print_point(point: dict[str, Any]) -> None:
    links = point["links"]
    print(f"\n{links['nodes']} nodes on {links['link']} links, storage link {links['storage_link']} (shared); "
          f"images/s in total (per node)")
    rows = []
    for mode, suffix in MODES.items():
        direct = point[f"direct_{suffix}"]["total"]
        for key in ["local", "direct", *(k for k, _, _ in VARIANTS)]:
            if f"{key}_{suffix}" in point:
                r = point[f"{key}_{suffix}"]
                rows.append([mode, key, r["total"], " / ".join(f"{x:,.0f}" for x in r["per_node"]), r["total"] / direct])
    print(bl.table(["reader", "variant", "images/s", "per node", "x direct"], rows))
    rows = [[key, s["wall_s"], " / ".join(f"{x:.2f}" for x in s["per_node_s"]), s["bytes"] / 1e6,
             s["storage_link_bytes"] / 1e6] for key, s in point.items() if key.startswith("stage_")]
    print(bl.table(["staging", "job s", "per node s", "MB staged", "MB over the storage link"], rows))
    print(f"staging at K: {point['stage_full']['wall_s'] / point['stage_k']['wall_s']:.2f}x faster than at full")


def plot(points: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = sorted(points, key=lambda p: p["links"]["storage_link_bits"])
    mbit = [p["links"]["storage_link_bits"] / 1e6 for p in points]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    for key, colour in (("direct", "tab:red"), ("fanfs_plain", "tab:purple"), ("fanfs_full", "tab:blue"),
                        ("fanfs_k", "tab:green"), ("fanfs_half", "tab:orange"), ("local", "gray")):
        for mode, style in (("decode", "-"), ("read", "--")):
            name = f"{key}_{MODES[mode]}"
            if all(name in p for p in points) and name != "local_read_img_s":  # tmpfs reads: off the scale
                ax.plot(mbit, [p[name]["total"] for p in points], style, color=colour, marker="o",
                        label=f"{key.replace('_', ' ')}, {'read+decode' if mode == 'decode' else 'read only'}")
    links = points[0]["links"]
    ax.set(xscale="log", yscale="log", xlabel="shared file system (storage link) Mbit/s",
           ylabel="images/s, all nodes", title=f"{links['nodes']} emulated nodes on {links['link']} links, 2 cores in all")
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=7, bbox_to_anchor=(0.5, -0.1))
    for which, colour in (("plain", "tab:purple"), ("full", "tab:blue"), ("k", "tab:green"), ("half", "tab:orange")):
        ax2.plot(mbit, [p[f"stage_{which}"]["wall_s"] for p in points], color=colour, marker="o",
                 label=f"stage {which}")
    ax2.set(xscale="log", yscale="log", xlabel="shared file system (storage link) Mbit/s", ylabel="staging s (whole job)",
            title="staging from the shared file system")
    ax2.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"plot written to {path}")


def prepare(args: argparse.Namespace, export: Path) -> tuple[list[str], int, dict[str, Any]]:
    """The image tree in the export (the shared file system's contents), its store and the recommended K."""
    images = export / "images"
    if args.source:
        shutil.copytree(args.source, images, symlinks=True)
    else:
        make_tree(images, args.images, 110_000)
    named = sorted(str(p.relative_to(images)) for p in images.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    rels = [rel for rel in named if is_image(images / rel)]  # what a loader's is_valid_file would keep
    if len(rels) < len(named):
        print(f"skipped {len(named) - len(rels)} of {len(named)} files named as images that Pillow cannot open, e.g. "
              f"{next(rel for rel in named if rel not in set(rels))}")
    if not rels:
        raise SystemExit(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {args.source}")
    np.random.default_rng(0).shuffle(rels)  # an epoch's order, cut among the nodes
    if args.rows == "cache":  # its rows read the plain store only
        bl.run([*bl.FANFS, "pack", images, export / "plain", "--quiet"], timeout=7200)
        return rels, 0, {"images": len(rels), "image_MB": sum((images / r).stat().st_size for r in rels) / 1e6,
                         "store_MB": sum(p.stat().st_size for p in (export / "plain" / "shards").iterdir()) / 1e6}
    started = time.perf_counter()
    bl.run([*bl.FANFS, "pack", images, export / "store", "--progressive-jpeg", "--quiet"], timeout=7200)
    pack_s = time.perf_counter() - started
    bl.run([*bl.FANFS, "pack", images, export / "plain", "--quiet"], timeout=7200)
    bl.run([*bl.FANFS, "pack", images, export / "tiers", "--progressive-jpeg", "--scales", "2", "--quiet"], timeout=7200)
    curve = json.loads(bl.run([*bl.FANFS, "fidelity", export / "store", "--sample", "100", "--timed", "0", "--json"]).stdout)
    k = curve["recommended"]
    if not isinstance(k, int):
        raise SystemExit("no K below full reaches SSIM 0.95 on these images: nothing to compare at K")
    data = {"images": len(rels), "image_MB": sum((images / r).stat().st_size for r in rels) / 1e6, "pack_s": pack_s,
            "recommended_k": k, "store_MB": sum(p.stat().st_size for p in (export / "store" / "shards").iterdir()) / 1e6}
    return rels, k, data


def scaled(export: Path, rels: list[str], times: int) -> list[str]:
    """The image tree ``times`` over (copies under ``images-xN/copyI``) and its store ``plain-xN``: its files."""
    tree = export / f"images-x{times}"
    for i in range(times):
        for rel in rels:
            (tree / f"copy{i}" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(export / "images" / rel, tree / f"copy{i}" / rel)
    bl.run([*bl.FANFS, "pack", tree, export / f"plain-x{times}", "--quiet"], timeout=7200)
    return [f"copy{i}/{rel}" for i in range(times) for rel in rels]


def cache_point(cluster: Cluster, export: Path, rels: list[str], larger: list[str], args: argparse.Namespace) -> dict:
    """The cache rows (tools/bench/bench_lazy.py), both readers, at ``--cache-link``."""
    if args.cache_link:
        cluster.shape(storage_link=args.cache_link)
    point: dict[str, Any] = {"links": cluster.settings()}
    stores = {"plain": (cluster.rank_path("shared/plain"), rels),
              f"plain-x{args.scale}": (cluster.rank_path(f"shared/plain-x{args.scale}"), larger)}
    for mode in MODES:
        args.decode = mode == "decode"
        lazy = lazy_rows(cluster, stores, args, args.repeat)
        print_lazy(lazy, args.decode)
        capacity = capacity_rows(cluster, export / "plain", "images", rels, args, args.repeat)
        print_capacity(capacity, args.decode)
        point[mode] = {"lazy": lazy, "capacity": capacity}
    if args.cache_link:
        cluster.shape(storage_link=args.storage_link)
    return point


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench_cluster.py --emulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emulate", action="store_true", required=True, help="this benchmark (an emulated cluster)")
    parser.add_argument("--nodes", type=int, default=4, help="node namespaces (default 4)")
    parser.add_argument("--source", help="the image tree (default: --images real-photo JPEGs of ~110 KB)")
    parser.add_argument("--images", type=int, default=2000, help="without --source: how many (default 2000)")
    parser.add_argument("--link", default="1gbit", help="each node's link, both directions (default 1gbit)")
    parser.add_argument("--storage-link", default="1gbit", help="the storage's one link, shared (default 1gbit)")
    parser.add_argument("--sweep", default="50mbit,100mbit,250mbit", help="more storage link rates, measured once "
                        "each, for the plot (default 50mbit,100mbit,250mbit; '' for none)")
    parser.add_argument("--readers", type=int, default=2, help="reader processes per node (default 2)")
    parser.add_argument("--replicas", type=int, default=2, help="copies of each blob among the nodes (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh-mount epochs at --storage-link (median; default 3)")
    parser.add_argument("--no-local", dest="local", action="store_false", help="skip the no-network ceiling row")
    parser.add_argument("--plot", metavar="PNG", help="images/s and staging time against the storage link's rate")
    parser.add_argument("--replot", metavar="JSON", help="only draw --plot from an earlier run's --json")
    parser.add_argument("--rows", choices=("all", "main", "cache"), default="all", help="main: the rows above; cache: "
                        "only lazy staging and capacity (tools/bench/bench_lazy.py); default all")
    parser.add_argument("--batch", type=int, default=BATCH, help="cache rows: a node's first batch, files (default 64)")
    parser.add_argument("--scale", type=int, default=4, help="cache rows: the larger store is the images this many "
                        "times (default 4)")
    parser.add_argument("--cache-link", help="cache rows: the storage link's rate for them (default --storage-link)")
    bl.common_args(parser)
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f)["sweep"], args.plot)
        return 0
    sweep = [r for r in args.sweep.split(",") if r.strip() and rate_bits(r) != rate_bits(args.storage_link)]
    results: dict[str, Any] = {"host_cores": os.cpu_count(), "readers_per_node": args.readers,
                               "replicas": args.replicas, "load_before": bl.load_average()}
    print(f"{os.cpu_count()} cores; load {bl.load_average()}", flush=True)
    with bl.temp_dir(args.workdir, "bench-emulated-") as base:
        export = base / "export"
        export.mkdir()
        rels, k, data = prepare(args, export)
        results.update(data)
        print(f"{len(rels)} images, {data['image_MB']:.0f} MB; store {data['store_MB']:.0f} MB"
              + ("" if args.rows == "cache" else f" (progressive records), recommended K {k}"), flush=True)
        if args.rows != "main":
            larger = scaled(export, rels, args.scale)
        with emulated_cluster(args.nodes, args.link, args.storage_link, export=export, workdir=base) as cluster:
            bl.wait_for_quiet(timeout=120)
            if args.rows != "main":
                results["cache"] = cache_point(cluster, export, rels, larger, args)
                if args.rows == "cache":
                    results["load_after"] = bl.load_average()
                    bl.write_json(args.json, results)
                    return 0
            main_point = measure_point(cluster, export, rels, k, args, args.repeat)
            print_point(main_point)
            points = [main_point]
            for rate in sweep:
                cluster.shape(storage_link=rate)
                points.append(measure_point(cluster, export, rels, k, args, 1))
                print_point(points[-1])
    results.update({key: value for key, value in main_point.items()})
    results["stage_s_full"] = {"total": main_point["stage_full"]["wall_s"], "per_node": main_point["stage_full"]["per_node_s"]}
    results["stage_s_k"] = {"total": main_point["stage_k"]["wall_s"], "per_node": main_point["stage_k"]["per_node_s"]}
    results["stage_s_half"] = {"total": main_point["stage_half"]["wall_s"],
                               "per_node": main_point["stage_half"]["per_node_s"]}
    results["stage_bytes_full"] = {"total": main_point["stage_full"]["bytes"],
                                   "per_node": main_point["stage_full"]["per_node_bytes"],
                                   "storage_link": main_point["stage_full"]["storage_link_bytes"]}
    results["stage_bytes_k"] = {"total": main_point["stage_k"]["bytes"], "per_node": main_point["stage_k"]["per_node_bytes"],
                                "storage_link": main_point["stage_k"]["storage_link_bytes"]}
    results["sweep"] = points
    results["load_after"] = bl.load_average()
    print(f"\nload after: {results['load_after']}")
    if args.plot:
        plot(points, args.plot)
    bl.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
