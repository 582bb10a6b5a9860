"""``fanfs pack`` and ``fanfs select``: making a store, and choosing its codecs first."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ..util.server import default_workers
from ..util.units import human_rate, human_size
from ..records import kinds
from ..codecs import codec_forms
from .args import codec, nonnegative_float, positive, positive_size, print_json, seconds, size
from .presentation import adder

Command = Callable[[argparse.Namespace], int]


def cmd_pack(args: argparse.Namespace) -> int:
    from ..pack.pack import PackOptions, pack
    from ..records import pack_kinds
    from ..peers.world import launched_ranks, local_ranks
    from ..util.mounts import fanfs_mounts_of
    from ..util.server import keep_large_buffers
    from ..ingest.sources import split_source
    from ..util.privacy import narrow_umask, shared_read_bits
    keep_large_buffers()  # shards of members' bytes, and their copies, reuse heap pages (workers inherit it)
    paths = [split_source(src)[1] for src in args.src]  # PREFIX=SRC: SRC's own read bits, not a missing path's none
    narrowed = narrow_umask(shared_read_bits(path for path in paths if path != "-"))  # no more open than its sources
    ranks = launched_ranks()[1]
    jobs = args.jobs or max(1, len(os.sched_getaffinity(0)) // (local_ranks() if ranks > 1 else 1))
    options = PackOptions(codec=args.codec, shard_size=args.shard_size, jobs=jobs,
                          force=args.force, progress=not args.quiet, expand_archives=args.expand_archives,
                          max_expansion=args.max_expansion)
    if args.plan:
        from ..pack.plan import Plan
        options.plan = Plan.load(args.plan)
    options.kinds = pack_kinds(vars(args), options.plan.records() if options.plan else {})
    def warn(text: str) -> None:
        print(f"fanfs: warning: {text}", file=sys.stderr)

    serving = fanfs_mounts_of(args.store) if args.force else []  # the store they serve is replaced: said once packed
    if ranks > 1:  # under mpiexec or srun: every rank packs shards, rank 0 reads the sources and reports
        from ..cluster.pack import pack_on_ranks
        report = pack_on_ranks(args.src, args.store, options, warn)
        if report is None:
            return 0
    else:
        report = pack(args.src, args.store, options, on_warning=warn)
    for mountpoint in serving:
        warn(f"{mountpoint} still serves the store this pack replaced until it is remounted: 'fanfs umount {mountpoint}', "
             "then mount it again")
    for kind in options.kinds:
        for note in kind.pack_notes():
            print(f"fanfs: note: {note}", file=sys.stderr)
    ratio = f" (ratio {report.bytes_in / report.bytes_stored:.2f})" if report.bytes_in and report.bytes_stored else ""
    rate = f" ({human_rate(report.bytes_in / max(report.seconds, 1e-9))})" if report.bytes_in else ""
    print(f"packed {report.files:,} files, {report.dirs:,} dirs, {report.symlinks:,} symlinks: "
          f"{human_size(report.bytes_in)} -> {human_size(report.bytes_stored)}{ratio} "
          f"in {report.shards:,} shards, {report.seconds:.1f} s{rate}")
    for kind in options.kinds:
        kept = [(path, reason) for name, path, reason in report.fallbacks if name == kind.name]
        records = report.records.get(kind.name, 0)
        if not records and not kept:
            continue  # nothing to say of this kind
        print(f"{kind.name}: {records:,} {kind.label}, {len(kept):,} {kind.fallback}")
        if args.quiet:
            continue  # their count only
        listed = [(kind.adopted_as, path, why) for name, path, why in report.adopted if name == kind.name]
        listed += [(kind.kept_as(reason), path, reason) for path, reason in kept]
        for became, path, why in listed[:20]:
            print(f"  {became}: {path}: {why}")
        if len(listed) > 20:
            print(f"  ... and {len(listed) - 20} more")
    if report.shards_by_rank:
        print(f"shards packed by {len(report.shards_by_rank)} ranks: "
              + ", ".join(f"rank {rank} {n:,}" for rank, n in enumerate(report.shards_by_rank)))
    if report.hard_links:
        print(f"{report.hard_links:,} hard link{'s' * (report.hard_links != 1)} stored once, as the file they name")
    if report.skipped:
        print(f"skipped {report.skipped:,} entries (special files, links pointing out of an archive): see the "
              "warnings")
    if narrowed:
        print(f"fanfs: note: {args.store} is as private as its sources, more than your umask makes files (directories "
              f"{0o777 & ~narrowed:04o}, files {0o666 & ~narrowed:04o}); 'chmod -R go+rX {args.store}' opens it",
              file=sys.stderr)
    return 0


def cmd_select(args: argparse.Namespace) -> int:
    from ..pack.select import Demand, format_report, make_plan, parse_fraction, parse_rate, plot, select, selection_json
    from ..util.privacy import narrow_umask, shared_read_bits
    narrow_umask(shared_read_bits([args.src]))  # a plan's dictionaries hold pieces of the source's files
    demand = Demand(mode=args.mode, rate=parse_rate(args.rate) if args.rate else None,
                    samples_per_sec=args.samples_per_sec, threads=args.threads, overhead=parse_fraction(args.overhead),
                    headroom=parse_fraction(args.headroom), capacity=args.capacity, nodes=args.nodes,
                    replicas=args.replicas)
    if args.plot:
        from ..util.images import pyplot
        pyplot()  # matplotlib is an extra: say so before measuring, not after
    fraction = parse_fraction(args.sample)
    if not 0 < fraction <= 1:
        raise ValueError(f"--sample must be more than 0% and at most 100%, not {args.sample}")
    sel = select(args.src, demand, fraction=fraction, cap=args.sample_cap, seed=args.seed, jobs=args.jobs,
                 float_error=False if args.float_error is None else args.float_error.bound,
                 **({"timing": args.timing} if args.timing else {}))
    if args.json:
        print_json(selection_json(sel))
    else:
        print(format_report(sel, every=args.all))
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
    p = command("pack", cmd_pack, "pack directory trees and archives into a new store (compressed shards + index)")
    p.add_argument("src", nargs="+", metavar="SRC",
                   help="what to pack: a directory, an archive (tar, tar.gz/.bz2/.xz/.zst, zip: told by its bytes, "
                        "read once, never extracted to disk), - (a tar stream on standard input) or any other file "
                        "(a labels file: that one file at the root, or PREFIX/FILE as PREFIX=FILE); several merge "
                        "into one tree (a name in two of them is an error); PREFIX=SRC puts SRC under the folder "
                        "PREFIX (train=ILSVRC2012_img_train.tar val=ILSVRC2012_img_val.tar); an argument naming an "
                        "existing path is that path")
    p.add_argument("store", metavar="STORE",
                   help="store directory to create (must not exist, or be empty; --force replaces a store)")
    p.add_argument("--codec", type=codec, default="zstd:3", help=f"{codec_forms()} (default zstd:3)")
    p.add_argument("--shard-size", type=positive_size, default="256M",
                   help="source bytes per shard at most (default 256M; a small tree is cut finer so that every "
                        "worker has shards to pack)")
    p.add_argument("--jobs", "-j", type=positive,
                   help="worker processes (default: every core this process may use; under mpiexec or srun, shared "
                        "among the ranks of the node: each rank packs shards, rank 0 reads the sources)")
    p.add_argument("--force", action="store_true",
                   help="replace STORE if it is a fanfs store (never anything else: not a tree holding SRC, "
                        "not a directory of other files)")
    p.add_argument("--plan", metavar="FILE", help="per-class codecs chosen by fanfs select -o FILE (overrides --codec)")
    p.add_argument("--expand-archives", action="store_true",
                   help="an archive inside a source (a member or file named .tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, "
                        ".tar.zst or .zip) becomes a directory of its members, named without the suffix, recursively: "
                        "ImageNet's ILSVRC2012_img_train.tar packs as n01440764/n01440764_10026.JPEG ...")
    p.add_argument("--max-expansion", type=nonnegative_float, default=1000.0, metavar="RATIO",
                   help="refuse archives whose members hold more than RATIO times their bytes, all the pack's "
                        "archives together, sparse holes included (a decompression bomb; default 1000, 0: no "
                        "limit)")
    for kind in kinds().values():
        kind.pack_options(adder(p.add_argument_group(f"{kind.label}")))
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar, and no list of the files a record kind let go (their count only)")

    p = command("select", cmd_select, "measure codecs per kind of file on this node and choose, for a demanded "
                "read rate, the best ratio that keeps up (writes a plan for pack --plan)")
    p.add_argument("src", help="directory to sample")
    p.add_argument("--sample", default="2%", help="fraction of files to sample, e.g. 2%% (at least 32 and ~8 MiB per extension)")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: a read waits for its decode, as in a fanfs mount's serving processes (default); async: "
                        "decoding overlaps compute (readers that prefetch, e.g. fsspec in DataLoader workers)")
    demand = p.add_mutually_exclusive_group()
    demand.add_argument("--rate", help="demanded read rate, e.g. 800MB/s (decimal; MiB/s binary)")
    demand.add_argument("--samples-per-sec", type=float, help="demanded files per second (x mean file size = rate)")
    p.add_argument("--threads", type=positive, default=default_workers(),
                   help="threads that decode: a mount's serving processes (mount --workers) or the DataLoader workers "
                        f"reading through fsspec (default: a mount's default here, {default_workers()})")
    p.add_argument("--overhead", default="5%", help="sync: decode time allowed, as part of the read budget (default 5%%)")
    p.add_argument("--headroom", default="20%", help="async: decode throughput above the rate (default 20%%)")
    p.add_argument("--capacity", type=size, help="node-local space per node for the store, e.g. 400G")
    p.add_argument("--nodes", type=positive, default=1, help="nodes sharing the store (default 1)")
    p.add_argument("--replicas", type=positive, default=1, help="copies of each shard across nodes (default 1)")
    p.add_argument("--json", action="store_true", help="the measurements and the choice as JSON")
    p.add_argument("--all", action="store_true", help="list every candidate, not only the best trade-offs and the choice")
    p.add_argument("-o", "--output", metavar="PLAN", help="write the plan (JSON) for fanfs pack --plan")
    p.add_argument("--plot", metavar="PNG", help="ratio against decode speed per class, feasible region and choice")
    p.add_argument("--sample-cap", type=size, default="16M", help="bytes read per class (default 16M)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--timing", type=seconds, metavar="SECONDS",
                   help="how long each of the ~100 candidates' decoding is timed (default 0.2: a select takes ~20 s; "
                        "less is quicker and noisier)")
    for kind in kinds().values():
        kind.select_options(adder(p))
    p.add_argument("--jobs", "-j", type=positive, default=1,
                   help="classes measured in parallel (default 1: per-thread speeds on an otherwise idle node)")
