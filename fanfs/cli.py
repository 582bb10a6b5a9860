"""The ``fanfs`` command: pack a dataset once, mount it read-only anywhere, feed training from it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from . import __version__
from .format import StoreError
from .units import human_rate, human_size, parse_size

DESCRIPTION = """\
fanfs packs a dataset tree once into a store (compressed shards + one global index) and mounts it
read-only through FUSE, so unmodified training code reads plain POSIX files from node-local storage.

typical use:
  fanfs pack ~/imagenet /scratch/imagenet.fanfs --progressive-jpeg
  fanfs mount /scratch/imagenet.fanfs /tmp/imagenet --fidelity 5
  python train.py --data /tmp/imagenet
  fanfs umount /tmp/imagenet
"""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2)
    print()


def cmd_pack(args: argparse.Namespace) -> int:
    from .codecs import parse_codec
    from .pack import PackOptions, pack
    options = PackOptions(codec=parse_codec(args.codec), shard_size=args.shard_size, jobs=args.jobs,
                          force=args.force, progressive_jpeg=args.progressive_jpeg, progress=not args.quiet)
    if args.scan_script:
        from .jpeg import ScanScript
        options.scan_script = ScanScript.load(args.scan_script)
        options.progressive_jpeg = True
    if args.plan:
        from .plan import Plan
        options.plan = Plan.load(args.plan)
    report = pack(args.src, args.store, options, on_warning=lambda text: print(f"fanfs: warning: {text}",
                                                                                file=sys.stderr))
    ratio = report.bytes_in / report.bytes_stored if report.bytes_stored else float("nan")
    print(f"packed {report.files:,} files, {report.dirs:,} dirs, {report.symlinks:,} symlinks: "
          f"{human_size(report.bytes_in)} -> {human_size(report.bytes_stored)} (ratio {ratio:.2f}) "
          f"in {report.shards:,} shards, {report.seconds:.1f} s ({human_rate(report.bytes_in / max(report.seconds, 1e-9))})")
    if options.progressive_jpeg:
        print(f"jpeg: {report.jpeg_records:,} progressive records, {len(report.jpeg_fallbacks):,} kept as plain files")
        for line in report.jpeg_fallbacks[:20]:
            print(f"  kept as is: {line}")
        if len(report.jpeg_fallbacks) > 20:
            print(f"  ... and {len(report.jpeg_fallbacks) - 20} more")
    if report.skipped:
        print(f"skipped {len(report.skipped)} special files (FIFOs, sockets, devices)")
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    from .select import Demand, format_report, make_plan, parse_fraction, parse_rate, plot, select, selection_json
    demand = Demand(mode=args.mode, rate=parse_rate(args.rate) if args.rate else None,
                    samples_per_sec=args.samples_per_sec, threads=args.threads, overhead=parse_fraction(args.overhead),
                    headroom=parse_fraction(args.headroom), capacity=args.capacity, nodes=args.nodes,
                    replicas=args.replicas)
    fraction = parse_fraction(args.sample)
    if not 0 < fraction <= 1:
        raise ValueError(f"--sample must be more than 0% and at most 100%, not {args.sample}")
    sel = select(args.src, demand, fraction=fraction, cap=args.sample_cap, seed=args.seed, jobs=args.jobs)
    if args.json:
        _print_json(selection_json(sel))
    else:
        print(format_report(sel))
    notes = sys.stderr if args.json else sys.stdout
    if args.plot:
        plot(sel, args.plot)
        print(f"plot written to {args.plot}", file=notes)
    if not sel.feasible:
        for problem in sel.problems:
            print(f"fanfs: error: {problem}", file=sys.stderr)
        if args.output:
            print(f"fanfs: no plan written to {args.output}: the constraints cannot all be met", file=sys.stderr)
        return 1
    if args.output:
        make_plan(sel).save(args.output)
        print(f"plan written to {args.output}: use it with fanfs pack {args.src} STORE --plan {args.output}", file=notes)
    return 0


def _resolve_fidelity(store_path: str, text: str) -> int:
    """A fidelity option as a layer count; ``auto:X`` is looked up on the store's measured curve."""
    from .fidelity import auto_fidelity, parse_fidelity
    from .store import Store
    value = parse_fidelity(text)
    if isinstance(value, int):
        return value
    store = Store(store_path, check_shards=False)
    k, note = auto_fidelity(store, value)
    store.close()
    print(note)
    return k


def cmd_mount(args: argparse.Namespace) -> int:
    from .cluster import expand
    from .daemon import MountOptions, mount
    args.store, args.mountpoint = expand(args.store), expand(args.mountpoint)
    if args.local_dir is None and (args.stage or args.replicas != 1):
        raise StoreError("--stage and --replicas need --local-dir")
    from .fidelity import parse_fidelity
    from .store import FULL
    value = parse_fidelity(args.fidelity)
    auto = value if isinstance(value, float) and args.local_dir else None  # a job resolves auto once
    fidelity = FULL if auto is not None else _resolve_fidelity(args.store, args.fidelity)
    options = MountOptions(cache_size=args.cache_size, fidelity=fidelity, auto_ssim=auto,
                           foreground=args.foreground, allow_other="allow_other" in args.o, debug=args.debug,
                           local_dir=os.path.abspath(expand(args.local_dir)) if args.local_dir else None, replicas=args.replicas,
                           stage=args.stage, peer_timeout=args.peer_timeout)
    pid = mount(args.store, args.mountpoint, options)
    if not args.foreground:
        from .control import log_path
        print(f"mounted {args.store} at {args.mountpoint} (daemon pid {pid}, log {log_path(args.mountpoint)})")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from .cluster import World, expand, load_index
    from .stage import stage
    world = World.detect()
    try:
        store = os.path.abspath(expand(args.store))
        report = stage(store, os.path.abspath(expand(args.local_dir)), args.replicas, world, load_index(store, world),
                       progress=not args.quiet)
    finally:
        world.finalize()
    if report is not None:
        if args.json:
            import dataclasses
            _print_json(dataclasses.asdict(report))
        else:
            print(report.format())
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from .daemon import umount
    umount(args.mountpoint, lazy=args.lazy)
    print(f"unmounted {args.mountpoint}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from .daemon import wait_ready
    status = wait_ready(args.mountpoint, args.timeout)
    print(f"{args.mountpoint} serves {status['store']} (pid {status['pid']})")
    return 0


def cmd_ctl(args: argparse.Namespace) -> int:
    from .control import request
    from .store import FULL
    status = request(args.mountpoint, {"cmd": "status"})
    k = _resolve_fidelity(status["store"], args.fidelity)
    answer = request(args.mountpoint, {"cmd": "fidelity", "fidelity": k}, timeout=600)
    print(f"{args.mountpoint}: fidelity {'full' if k == FULL else k} for files opened from now on "
          f"({answer['invalidated']:,} cached names invalidated; files already open keep their bytes)")
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from .fidelity import analyse, format_curve, plot_curve
    from .store import Store
    store = Store(args.store, check_shards=False)
    curve = analyse(store, args.sample, args.seed, progress=not args.json)
    if args.plot:
        plot_curve(curve, args.min_ssim, args.plot)
    if args.json:
        from dataclasses import asdict
        _print_json({**asdict(curve), "min_ssim": args.min_ssim, "recommended": curve.recommend(args.min_ssim)})
    else:
        print(format_curve(curve, args.min_ssim))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from .control import request
    stats = request(args.mountpoint, {"cmd": "stats"})
    if args.json:
        _print_json(stats)
        return 0
    hits, misses = stats["cache_hits"], stats["cache_misses"]
    from .store import FULL
    fidelity = "full" if stats["fidelity"] == FULL else stats["fidelity"]
    print(f"mount      {args.mountpoint} -> {stats['store']}  (fidelity {fidelity})")
    print(f"opens      {stats['opens']:,}   reads {stats['reads']:,}   errors {stats['errors']:,}")
    print(f"presented  {human_size(stats['bytes_presented'])}   read from storage {human_size(stats['bytes_stored_read'])}")
    print(f"cache      {hits:,} hits / {misses:,} misses ({100 * hits / max(1, hits + misses):.0f}% hits)")
    print(f"decode     {stats['decode_seconds']:.3f} s")
    if stats["stored_by_layer"]:
        print("per layer  " + "  ".join(f"{i}: {human_size(b)}" for i, b in enumerate(stats["stored_by_layer"])))
    if "cluster" in stats:
        c = stats["cluster"]
        print(f"node       rank {c['rank']} of {c['nodes']}, {c['local_shards']:,} shards held, {c['replicas']} replicas")
        print(f"local      {human_size(c['local_bytes'])}   remote {human_size(c['remote_bytes'])} in "
              f"{c['remote_requests']:,} requests ({c['remote_latency_mean_ms']:.2f} ms mean, "
              f"{c['remote_latency_max_ms']:.2f} ms max; {c['remote_timeouts']} timeouts, {c['remote_failures']} failed)")
        print(f"served     {human_size(c['served_bytes'])} in {c['served_requests']:,} requests to peers "
              f"({c['refused']} refused, {c['failed']} failed)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify
    report = verify(args.store, args.against, progress=not args.quiet,
                    on_problem=lambda text: print(f"fanfs: {text}", file=sys.stderr))
    what = f"{report.shards:,} shards, {report.files:,} files ({human_size(report.bytes)})"
    if args.against:
        what += f", compared with {args.against}"
    if report.ok:
        print(f"ok: {what}")
        return 0
    print(f"FAILED: {len(report.problems)} problems in {what}")
    return 1


def cmd_info(args: argparse.Namespace) -> int:
    from .info import format_info, store_info
    from .store import Store
    store = Store(args.store, check_shards=False)
    info = store_info(store)
    placement = None
    if args.nodes:
        from .placement import format_placement, place
        placement = place(store.index.shard_size, args.nodes, args.replicas)
        info["placement"] = {"nodes": placement.nodes, "replicas": placement.replicas,
                             "node_bytes": placement.node_bytes.tolist(),
                             "node_shards": [int(placement.shards_of(n).size) for n in range(placement.nodes)]}
    if args.json:
        _print_json(info)
    else:
        print(format_info(info))
        if placement is not None:
            print(format_placement(placement))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(args.workdir, keep=args.keep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fanfs", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fanfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = command("pack", cmd_pack, "pack a directory tree into a new store (compressed shards + index)")
    p.add_argument("src", help="directory to pack")
    p.add_argument("store", help="store directory to create (must not exist, or be empty, or use --force)")
    p.add_argument("--codec", default="zstd:3", help="zstd:LEVEL (1-22), lz4, lz4:LEVEL (1-12) or raw (default zstd:3)")
    p.add_argument("--shard-size", type=_size, default="256M", help="source bytes per shard (default 256M)")
    p.add_argument("--jobs", "-j", type=_positive, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty STORE")
    p.add_argument("--progressive-jpeg", action="store_true",
                   help="store JPEGs as progressive records (lossless) so mounts can present lower fidelities")
    p.add_argument("--scan-script", metavar="FILE", help="jpegtran scan script for the progressive records")
    p.add_argument("--plan", metavar="FILE", help="per-class codecs chosen by fanfs select -o FILE (overrides --codec)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    p = command("select", cmd_select, "measure codecs per kind of file on this node and choose, for a demanded "
                "read rate, the best ratio that keeps up (writes a plan for pack --plan)")
    p.add_argument("src", help="directory to sample")
    p.add_argument("--sample", default="2%", help="fraction of files to sample, e.g. 2%% (at least 32 and ~8 MiB per extension)")
    p.add_argument("--mode", choices=("sync", "async"), default="async",
                   help="sync: decode time adds to each read; async: decoding overlaps compute (default async)")
    demand = p.add_mutually_exclusive_group()
    demand.add_argument("--rate", help="demanded read rate, e.g. 800MB/s (decimal; MiB/s binary)")
    demand.add_argument("--samples-per-sec", type=float, help="demanded files per second (x mean file size = rate)")
    p.add_argument("--threads", type=_positive, default=2, help="reader/decoder threads of the job (default 2)")
    p.add_argument("--overhead", default="5%", help="sync: decode time allowed, as part of the read budget (default 5%%)")
    p.add_argument("--headroom", default="20%", help="async: decode throughput above the rate (default 20%%)")
    p.add_argument("--capacity", type=_size, help="node-local space per node for the store, e.g. 400G")
    p.add_argument("--nodes", type=_positive, default=1, help="nodes sharing the store (default 1)")
    p.add_argument("--replicas", type=_positive, default=1, help="copies of each shard across nodes (default 1)")
    p.add_argument("--json", action="store_true", help="the measurements and the choice as JSON")
    p.add_argument("-o", "--output", metavar="PLAN", help="write the plan (JSON) for fanfs pack --plan")
    p.add_argument("--plot", metavar="PNG", help="ratio against decode speed per class, feasible region and choice")
    p.add_argument("--sample-cap", type=_size, default="16M", help="bytes read per class (default 16M)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--jobs", "-j", type=_positive, default=1,
                   help="classes measured in parallel (default 1: per-thread speeds on an otherwise idle node)")

    p = command("mount", cmd_mount, "mount a store read-only; returns once the mount serves")
    p.add_argument("store")
    p.add_argument("mountpoint")
    p.add_argument("--cache-size", type=_size, default="1G", help="memory for decoded blobs (default 1G)")
    p.add_argument("--fidelity", default="full", metavar="K|full|auto:SSIM",
                   help="present JPEG records as their first K scan groups (a smaller valid JPEG); auto:0.95 "
                        "picks the smallest K whose mean SSIM reaches 0.95 (see 'fanfs fidelity'); default full")
    p.add_argument("--foreground", "-f", action="store_true", help="stay attached (for srun/mpiexec, systemd)")
    p.add_argument("-o", action="append", default=[], metavar="OPTION", help="allow_other: let other users read")
    p.add_argument("--debug", action="store_true", help="log every FUSE request")
    p.add_argument("--local-dir", metavar="DIR", help="this node's staged shards (see 'fanfs stage'); under "
                   "mpiexec/srun, peers serve the shards this node lacks over MPI (needs --foreground)")
    p.add_argument("--replicas", type=_positive, default=1, help="copies of each shard in the job (default 1)")
    p.add_argument("--stage", action="store_true", help="stage this node's shards into --local-dir first")
    p.add_argument("--peer-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for a peer before asking the next holder (default 5)")

    p = command("stage", cmd_stage, "copy this node's shards of a store to local disk (one rank per node "
                "under mpiexec/srun; {rank} in paths is the rank); a rerun resumes")
    p.add_argument("store")
    p.add_argument("local_dir", metavar="LOCAL_DIR")
    p.add_argument("--replicas", type=_positive, default=1, help="copies of each shard in the job (default 1)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="the report as JSON (per node: bytes copied, seconds)")

    p = command("umount", cmd_umount, "unmount a fanfs mount and wait for its daemon to exit")
    p.add_argument("mountpoint")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now even if files are open")

    p = command("wait", cmd_wait, "wait until the mount at MOUNTPOINT serves")
    p.add_argument("mountpoint")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")

    p = command("ctl", cmd_ctl, "change a running mount's fidelity (files opened afterwards get it)")
    p.add_argument("mountpoint")
    p.add_argument("--fidelity", required=True, metavar="K|full|auto:SSIM")

    p = command("fidelity", cmd_fidelity, "measure bytes and SSIM/MS-SSIM per fidelity K on sampled JPEG records")
    p.add_argument("store")
    p.add_argument("--sample", type=_positive, default=500, help="images to sample (default 500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-ssim", type=float, default=0.95, help="quality bar for the recommendation (default 0.95)")
    p.add_argument("--plot", metavar="PNG", help="write a plot of both curves and the bytes")
    p.add_argument("--json", action="store_true")

    p = command("stats", cmd_stats, "what a running mount has served")
    p.add_argument("mountpoint")
    p.add_argument("--json", action="store_true")

    p = command("verify", cmd_verify, "re-check every checksum of a store (and with --against, every byte)")
    p.add_argument("store")
    p.add_argument("--against", metavar="SRC", help="also compare with the source tree")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    p = command("info", cmd_info, "what a store holds: files, bytes, ratio per codec, shards")
    p.add_argument("store")
    p.add_argument("--json", action="store_true")
    p.add_argument("--nodes", type=_positive, metavar="N", help="also show how N nodes would hold the shards")
    p.add_argument("--replicas", type=_positive, default=1, help="with --nodes: copies of each shard (default 1)")

    p = command("demo", cmd_demo, "pack, mount and read back a built-in sample dataset, then unmount")
    p.add_argument("--workdir", help="where to put the sample, store and mount (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("fanfs: interrupted; nothing was left half-done", file=sys.stderr)
        return 130
    except (StoreError, ValueError, OSError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"fanfs: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
