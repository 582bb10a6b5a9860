"""``fanfs pack`` and ``fanfs select``: making a store, and choosing its codecs first."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..util.units import human_rate, human_size
from .args import positive, positive_size, print_json, size

if TYPE_CHECKING:
    from ..records import RecordKind

Command = Callable[[argparse.Namespace], int]


def cmd_pack(args: argparse.Namespace) -> int:
    from ..build.pack import PackOptions, pack
    from ..codecs import parse_codec
    from ..records.jpeg import DEFAULT_MAX_PIXELS, JpegRecords
    from ..records.scans import DEFAULT_SCANS
    options = PackOptions(codec=parse_codec(args.codec), shard_size=args.shard_size, jobs=args.jobs,
                          force=args.force, progress=not args.quiet)
    if args.progressive_jpeg or args.scan_script is not None or args.max_pixels is not None:
        options.kinds.append(JpegRecords(DEFAULT_SCANS if args.scan_script is None else args.scan_script,
                                         DEFAULT_MAX_PIXELS if args.max_pixels is None else args.max_pixels))
    if args.plan:
        from ..build.plan import Plan
        options.plan = Plan.load(args.plan)
    floats = _float_records(args, options.plan)
    if floats is not None:
        options.kinds.append(floats)
    report = pack(args.src, args.store, options, on_warning=lambda text: print(f"fanfs: warning: {text}",
                                                                                file=sys.stderr))
    if floats is not None and floats.elf:
        print(f"fanfs: note: LOSSY store: float32/float64 values are kept with ELF, each within "
              f"{'the last mantissa bit' if floats.error is None else format(floats.error, 'g')} of its source",
              file=sys.stderr)
    ratio = f" (ratio {report.bytes_in / report.bytes_stored:.2f})" if report.bytes_in and report.bytes_stored else ""
    rate = f" ({human_rate(report.bytes_in / max(report.seconds, 1e-9))})" if report.bytes_in else ""
    print(f"packed {report.files:,} files, {report.dirs:,} dirs, {report.symlinks:,} symlinks: "
          f"{human_size(report.bytes_in)} -> {human_size(report.bytes_stored)}{ratio} "
          f"in {report.shards:,} shards, {report.seconds:.1f} s{rate}")
    for kind in options.kinds:
        kept = [(path, reason) for name, path, reason in report.fallbacks if name == kind.name]
        print(f"{kind.name}: {report.records.get(kind.name, 0):,} {kind.label}, {len(kept):,} kept as plain files")
        for path, reason in kept[:20]:
            print(f"  kept as is: {path}: {reason}")
        if len(kept) > 20:
            print(f"  ... and {len(kept) - 20} more")
    if report.skipped:
        print(f"skipped {len(report.skipped)} special files (FIFOs, sockets, devices)")
    return 0


class FloatError:
    """``--float-error``: an absolute bound above 0, or ``limit`` (ELF within the dtype's last mantissa bit)."""

    def __init__(self, text: str) -> None:
        self.bound: float | None = None
        if text.strip().lower() == "limit":
            return
        try:
            self.bound = float(text)
        except ValueError:
            self.bound = -1.0
        if not 0 < self.bound < float("inf"):
            raise argparse.ArgumentTypeError(f"expected an error bound above 0 (e.g. 1e-6) or 'limit', got {text!r}")


def _float_records(args: argparse.Namespace, plan: object) -> "RecordKind | None":
    """The float-record kind asked for: by --float-records / --float-error, else by the plan's float class."""
    from ..records.floats import FloatRecords
    if args.float_error is not None:
        return FloatRecords(elf=True, error=args.float_error.bound)
    if args.float_records:
        return FloatRecords()
    record = plan.record("float") if plan is not None else None  # type: ignore[attr-defined]
    if record:
        return FloatRecords(elf=bool(record.get("elf")), error=record.get("error"))
    return None


def cmd_select(args: argparse.Namespace) -> int:
    from ..build.select import Demand, format_report, make_plan, parse_fraction, parse_rate, plot, select, selection_json
    demand = Demand(mode=args.mode, rate=parse_rate(args.rate) if args.rate else None,
                    samples_per_sec=args.samples_per_sec, threads=args.threads, overhead=parse_fraction(args.overhead),
                    headroom=parse_fraction(args.headroom), capacity=args.capacity, nodes=args.nodes,
                    replicas=args.replicas)
    fraction = parse_fraction(args.sample)
    if not 0 < fraction <= 1:
        raise ValueError(f"--sample must be more than 0% and at most 100%, not {args.sample}")
    sel = select(args.src, demand, fraction=fraction, cap=args.sample_cap, seed=args.seed, jobs=args.jobs,
                 float_error=False if args.float_error is None else args.float_error.bound)
    if args.json:
        print_json(selection_json(sel))
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


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = command("pack", cmd_pack, "pack a directory tree into a new store (compressed shards + index)")
    p.add_argument("src", help="directory to pack")
    p.add_argument("store", help="store directory to create (must not exist, or be empty; --force replaces a store)")
    p.add_argument("--codec", default="zstd:3", help="zstd:LEVEL (1-22), lz4, lz4:LEVEL (1-12) or raw (default zstd:3)")
    p.add_argument("--shard-size", type=positive_size, default="256M",
                   help="source bytes per shard at most (default 256M; a small tree is cut finer so that every "
                        "worker has shards to pack)")
    p.add_argument("--jobs", "-j", type=positive, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--force", action="store_true",
                   help="replace STORE if it is a fanfs store (never anything else: not a tree holding SRC, "
                        "not a directory of other files)")
    p.add_argument("--progressive-jpeg", action="store_true",
                   help="store JPEGs as progressive records (lossless) so mounts can present lower fidelities; a JPEG "
                        "the transcoder refuses, one with bytes after its end (EOI: MPO, motion photos, trailers) and "
                        "one over --max-pixels are kept byte for byte as plain files and listed")
    p.add_argument("--scan-script", metavar="compact|fast|libjpeg|FILE",
                   help="how progressive records are cut into scans (implies --progressive-jpeg): 'compact' "
                        "(default): few bytes at SSIM 0.95 (fidelity auto:0.95) and a fast decode there; 'fast': "
                        "the fastest decode at full fidelity; 'libjpeg': libjpeg's own 10-scan progression (the "
                        "default before the presets; fewer bytes at SSIM 0.95 on high-quality photos, slower "
                        "decode); or a jpegtran scan-script FILE (a lossy one is refused). Compare them with "
                        "'fanfs fidelity --source'; see the README, 'Scan scripts'")
    p.add_argument("--max-pixels", type=positive_size, metavar="N",
                   help="JPEGs with more pixels (width x height, read from the header) are kept byte for byte as "
                        "plain files and listed (implies --progressive-jpeg; default 64M = 67,108,864: every camera up "
                        "to 61 MP). The transcode needs up to 6 bytes per pixel, measuring fidelity ~16 (README)")
    p.add_argument("--plan", metavar="FILE", help="per-class codecs chosen by fanfs select -o FILE (overrides --codec)")
    p.add_argument("--float-records", action="store_true",
                   help="store the values of .npy and safetensors files (found by content) as byte planes, so mounts "
                        "can present them at a lower --precision; lossless")
    p.add_argument("--float-error", type=FloatError, metavar="EPS|limit", default=None,
                   help="like --float-records, but float32/float64 values are stored with ELF, each within EPS of "
                        "its source (LOSSY; 'limit': within the last mantissa bit, e.g. 6e-8 for float32)")
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
    p.add_argument("--threads", type=positive, default=2, help="reader/decoder threads of the job (default 2)")
    p.add_argument("--overhead", default="5%", help="sync: decode time allowed, as part of the read budget (default 5%%)")
    p.add_argument("--headroom", default="20%", help="async: decode throughput above the rate (default 20%%)")
    p.add_argument("--capacity", type=size, help="node-local space per node for the store, e.g. 400G")
    p.add_argument("--nodes", type=positive, default=1, help="nodes sharing the store (default 1)")
    p.add_argument("--replicas", type=positive, default=1, help="copies of each shard across nodes (default 1)")
    p.add_argument("--json", action="store_true", help="the measurements and the choice as JSON")
    p.add_argument("-o", "--output", metavar="PLAN", help="write the plan (JSON) for fanfs pack --plan")
    p.add_argument("--plot", metavar="PNG", help="ratio against decode speed per class, feasible region and choice")
    p.add_argument("--sample-cap", type=size, default="16M", help="bytes read per class (default 16M)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--float-error", type=FloatError, metavar="EPS|limit",
                   help="also measure ELF float records within EPS for float arrays (lossy; lossless float records "
                        "are always measured)")
    p.add_argument("--jobs", "-j", type=positive, default=1,
                   help="classes measured in parallel (default 1: per-thread speeds on an otherwise idle node)")
