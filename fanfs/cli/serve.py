"""``fanfs mount``, ``stage``, ``umount``, ``wait``, ``ctl``, ``stats`` and ``fidelity``: serving a store."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from ..serve.readahead import PREFETCH, READAHEAD
from ..util.deadline import DEFAULT_SECONDS
from ..util.deadline import VARIABLE as STORE_TIMEOUT_VARIABLE
from ..util.server import default_workers
from ..util.units import human_size
from .args import count, positive, positive_size, print_json, seconds, seconds_or_zero, size
from .presentation import add_presentation_options, known, presentation_values, resolved
from .stats import cmd_stats
from .supervise import alone

Command = Callable[[argparse.Namespace], int]


def cmd_mount(args: argparse.Namespace) -> int:
    from ..peers.world import expand
    from ..records import unresolved
    from ..serve.daemon import MountOptions
    args.store, args.mountpoint = expand(args.store), expand(args.mountpoint)
    if args.local_dir is None and (args.stage or args.replicas != 1 or args.no_mount):
        raise UsageError("--stage, --replicas and --no-mount need --local-dir")
    check_stage_options(args)
    args.foreground = args.foreground or args.no_mount  # a node serving without a mount stays attached
    set_store_timeout(args)
    values = presentation_values(args)
    job = args.local_dir is not None  # a job resolves auto values once, for every node
    if not job:  # before auto values are measured (seconds to minutes): a bad mount point is known at once
        from ..serve.daemon import check_fuse, check_mountpoint
        check_fuse()
        check_mountpoint(os.path.abspath(args.mountpoint), args.store)
    presentation = known(values) if job else resolved(args.store, values)
    options = MountOptions(cache_size=args.cache_size, presentation=presentation, foreground=args.foreground,
                           allow_other="allow_other" in args.o, debug=args.debug,
                           workers=args.workers or default_workers(), readahead=args.readahead, prefetch=args.prefetch)
    if args.local_dir is not None:
        from ..cluster.node import mount_node
        from ..cluster.serving import NodeOptions
        node = NodeOptions(options, os.path.abspath(expand(args.local_dir)), replicas=args.replicas, stage=args.stage,
                           capacity=args.capacity, auto=unresolved(values), peer_timeout=args.peer_timeout,
                           serve_only=args.no_mount, shared=args.shared_local and expand(args.shared_local))
        pid = mount_node(os.path.abspath(args.store), os.path.abspath(args.mountpoint), node)
    else:
        from ..cache.share import store_hooks
        from ..serve.daemon import mount
        pid = mount(args.store, args.mountpoint, options, store_hooks(presentation, os.path.abspath(args.mountpoint),
                                                                      args.prefetch))
    if not args.foreground:
        from ..serve.control import log_path
        print(f"mounted {args.store} at {args.mountpoint} (daemon pid {pid}, log {log_path(args.mountpoint)})")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from ..cluster.node import job_presentation
    from ..cache.stage import stage
    from ..peers.world import AgreedError, World, expand, load_index
    from ..records import check_presentation
    set_store_timeout(args)
    world = World.detect()
    try:
        store = os.path.abspath(expand(args.store))
        index = load_index(store, world)
        presentation = check_presentation(index, job_presentation(world, store, index, presentation_values(args)))
        report = stage(store, os.path.abspath(expand(args.local_dir)), args.replicas, world, index,
                       presentation=presentation, progress=not args.quiet)
    except AgreedError:
        world.finalize()  # every rank raised it at the same agreement, alive (after another error one may not be)
        raise
    world.finalize()
    if report is not None:
        if args.json:
            import dataclasses
            print_json(dataclasses.asdict(report))
        else:
            print(report.format())
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    from ..serve.control import was_mounted
    from ..serve.daemon import umount
    if umount(args.mountpoint, lazy=args.lazy):
        print(f"unmounted {args.mountpoint}")
    elif was_mounted(args.mountpoint):  # a mount of this user's was there: it ended already
        print(f"{args.mountpoint}: not mounted (ended already); nothing to do")
    else:  # never a fanfs mount of this user's: a wrong path (a typo in a job script) must not pass unnoticed
        raise UsageError(f"{args.mountpoint} is not a fanfs mount, and none of yours was ever mounted there: check "
                         "the path")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from ..serve.daemon import wait_ready
    status = wait_ready(args.mountpoint, args.timeout)
    print(f"{args.mountpoint} serves {status['store']} (pid {status['pid']})")
    return 0


def cmd_ctl(args: argparse.Namespace) -> int:
    from ..records import Presentation, settings, unresolved
    from ..serve.control import request
    values = presentation_values(args)
    if not values and args.order is None:
        raise UsageError("say what to change: " + " and/or ".join(f"{s.option} {s.metavar}" for s in settings())
                         + " and/or --order FILE")
    if args.order is not None:
        _order(args.mountpoint, args.order, args.stream)
    if not values:
        return 0
    if unresolved(values):
        chosen = resolved(request(args.mountpoint, {"cmd": "status"}, needs=("store",))["store"], values)
        values = {name: chosen[name] for name in values}  # only what was asked: the others stay as they are
    answer = request(args.mountpoint, {"cmd": "present", **values}, timeout=600,
                     needs=(*Presentation.NAMES, "invalidated"))
    shown = Presentation({name: answer[name] for name in Presentation.NAMES}).describe()
    print(f"{args.mountpoint}: {shown} for files opened from now on "
          f"({answer['invalidated']:,} cached names invalidated; files already open keep their bytes)")
    return 0


def _order(mountpoint: str, path: str, stream: str) -> None:
    """Give a mount the order its readers will read in (``ctl --order``)."""
    from ..serve.control import request
    if not os.path.isfile(path):
        raise UsageError(f"--order {path}: no such file (one path per line, an empty line between epochs)")
    answer = request(mountpoint, {"cmd": "order", "path": os.path.abspath(path), "stream": stream}, timeout=600,
                     needs=("files", "epochs", "unknown", "example_unknown", "stream"))
    unknown = f"; {answer['unknown']:,} paths left out, not files of the store (e.g. {answer['example_unknown']})" \
        if answer["unknown"] else ""
    many = f"; {answer['files'] / answer['store_files']:.1f} times the store's {answer['store_files']:,} files" \
        if answer.get("store_files") and answer["files"] > answer["store_files"] else ""
    print(f"{mountpoint}: {answer.get('how') or 'fetching ahead'}, along {answer['files']:,} files in "
          f"{answer['epochs']} epoch(s) (stream {answer['stream']}){many}{unknown}")


def cmd_fidelity(args: argparse.Namespace) -> int:
    from ..store import Store
    from ..tune.curve import save_curve
    from ..tune.fidelity import analyse, format_curve, plot_curve
    from ..util.images import pyplot
    if args.plot:
        pyplot()  # matplotlib is an extra: say so before measuring, not after
    store = Store(args.store, check_shards=False)
    if args.source and not args.timed:
        raise UsageError("--source compares decode speeds: it needs --timed above 0")
    if args.source and not os.path.isdir(args.source):
        raise UsageError(f"--source {args.source} is not a directory: give the tree the store was packed from")
    def starting(records: int) -> None:
        timed = f", then their decode timed on {min(args.timed, records):,}" if args.timed else ""
        print(f"fanfs fidelity: measuring {records:,} sampled JPEG records{timed} (the progress line gives an ETA; "
              "--sample N measures fewer, sooner, and --timed 0 times none)", file=sys.stderr, flush=True)

    curve = analyse(store, args.sample, args.seed, progress=not args.json, timed=args.timed, source=args.source,
                    max_pixels=args.max_pixels, starting=starting)
    saved = save_curve(store, curve) if args.save else None
    if args.plot:
        plot_curve(curve, args.min_ssim, args.plot)
    if args.json:
        from dataclasses import asdict
        print_json({**asdict(curve), "min_ssim": args.min_ssim, "recommended": curve.recommend(args.min_ssim)})
    else:
        print(format_curve(curve, args.min_ssim))
        if args.plot:
            print(f"plot: {args.plot}")
    if saved:
        print(f"saved: {saved} (auto:SSIM on this store now reads it: mounts, jobs and fsspec readers measure nothing)",
              file=sys.stderr if args.json else sys.stdout)
    return 0


STAGE_HELP = ("how this node gets its shards into --local-dir: 'full' (the default for a bare --stage) copies them "
              "all first, only the layers its presentation reads (higher ones are then read from the shared store); "
              "'lazy' serves at once and copies a blob the first time it is read (or a peer asks for it), so later "
              "reads are local; 'shared' reads the node's one copy of the whole store in --shared-local, which every "
              "job on the node shares and the first stages (--local-dir: where this job stages its own if it cannot)")
SHARED_HELP = ("with --stage shared: the node-local directory of the node's shared copies, made once by an "
               "administrator, open to all and sticky (install -d -m 1777 DIR) ($FANFS_SHARED_LOCAL)")
CAPACITY_HELP = ("with --stage lazy: local disk this node's cache may take (e.g. 200G); a share of the store that "
                 "does not fit is accepted: the node keeps what fits, a record's first layers before the rest, and "
                 "reads the other blobs through from the shared store (default: all it holds)")


def set_store_timeout(args: argparse.Namespace) -> None:
    """``--store-timeout``, read where the store's sources are made (the daemon and a job's nodes too)."""
    if args.store_timeout is not None:
        os.environ[STORE_TIMEOUT_VARIABLE] = repr(args.store_timeout)


def add_store_timeout_option(p: argparse.ArgumentParser) -> None:
    """``--store-timeout SECONDS`` (mount, stage)."""
    p.add_argument("--store-timeout", type=seconds_or_zero, metavar="SECONDS",
                   help=f"how long an access to a store on a network file system (NFS, sshfs, Lustre...) waits before "
                        f"it fails, the store being stalled: a read with EIO, opening or staging it with an error "
                        f"(${STORE_TIMEOUT_VARIABLE}; default {DEFAULT_SECONDS:g}; 0: for ever)")


def check_stage_options(args: argparse.Namespace) -> None:
    """A capacity only bounds a cache filled as the node reads, and shared copies need their directory (mount, job
    serve): ``args.shared_local`` is that directory (its option, else ``$FANFS_SHARED_LOCAL``) for ``--stage
    shared``, else None."""
    from ..cache.sharedbase import SHARED_VARIABLE, keep_size
    if args.capacity is not None and args.stage != "lazy":
        raise UsageError("--capacity is the budget of a cache filled as the node reads: add --stage lazy")
    if args.stage != "shared":
        if args.shared_local is not None:
            raise UsageError("--shared-local is where --stage shared keeps the node's shared copies: add --stage shared")
        return
    args.shared_local = args.shared_local or os.environ.get(SHARED_VARIABLE, "").strip() or None
    if args.shared_local is None:
        raise UsageError(f"--stage shared needs the node-local directory of the node's shared copies: --shared-local "
                         f"DIR or {SHARED_VARIABLE}=DIR (made once by an administrator: install -d -m 1777 DIR)")
    keep_size()  # a bad FANFS_SHARED_KEEP: one line here


def add_prefetch_option(p: argparse.ArgumentParser) -> None:
    """``--prefetch SIZE`` (mount, job serve): the read-ahead budget of a known order."""
    p.add_argument("--prefetch", type=size, default=human_size(PREFETCH), metavar="SIZE",
                   help=f"memory the mount may fill ahead of its readers once it knows their order ('fanfs ctl --order', "
                        f"fanfs.train's samplers): the next files' bytes are read into the page cache before they are "
                        f"opened (default {human_size(PREFETCH)}; 0: read nothing ahead; a --stage lazy node fetches "
                        f"ahead into its cache's window instead)")


def add_stage_options(p: argparse.ArgumentParser, stage: Any = "") -> None:
    """``--stage [full|lazy|shared]``, ``--capacity SIZE`` and ``--shared-local DIR`` (mount, job serve)."""
    p.add_argument("--stage", nargs="?", const="full", default=stage, choices=("full", "lazy", "shared"),
                   metavar="full|lazy|shared", help=STAGE_HELP)
    p.add_argument("--capacity", type=positive_size, metavar="SIZE", help=CAPACITY_HELP)
    p.add_argument("--shared-local", metavar="DIR", help=SHARED_HELP)


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = command("mount", cmd_mount, "mount a store read-only; returns once the mount serves")
    p.set_defaults(supervised=alone)
    p.add_argument("store", help="the store directory ('fanfs pack' made it)")
    p.add_argument("mountpoint", help="an existing directory where the store's files appear")
    p.add_argument("--cache-size", type=size, default="1G", help="memory for decoded blobs (default 1G)")
    add_presentation_options(p)
    p.add_argument("--foreground", "-f", action="store_true", help="stay attached (for srun/mpiexec, systemd)")
    p.add_argument("-o", action="append", default=[], metavar="OPTION", help="allow_other: let other users read")
    p.add_argument("--debug", action="store_true", help="log every FUSE request")
    p.add_argument("--local-dir", metavar="DIR", help="this node's staged shards (see 'fanfs stage'); under "
                   "mpiexec/srun, peers serve the shards this node lacks over TCP (needs --foreground)")
    p.add_argument("--replicas", type=positive, default=1, help="copies of each shard in the job (default 1)")
    add_stage_options(p)
    p.add_argument("--workers", type=positive, default=None, metavar="N",
                   help=f"serving processes (default: a quarter of this node's cores, 1 to 8: {default_workers()} "
                        "here); 1 serves from one loop in the daemon itself")
    p.add_argument("--readahead", type=size, default=human_size(READAHEAD), metavar="SIZE",
                   help=f"the kernel's readahead in the mount's files (default {human_size(READAHEAD)}: large files are "
                        "then asked for in 1 MiB requests, not 128 KiB; setting it needs root, else the kernel's "
                        "stays and the log says how to raise it; 0: leave the kernel's)")
    add_prefetch_option(p)
    p.add_argument("--peer-timeout", type=seconds, default=5.0, metavar="SECONDS",
                   help="how long to wait for a peer before asking the next holder (default 5)")
    add_store_timeout_option(p)
    p.add_argument("--no-mount", action="store_true",
                   help="where FUSE is not allowed: mount nothing, serve peers and in-process readers "
                        "(fsspec.filesystem('fanfs', node=MOUNTPOINT)) through MOUNTPOINT, a private directory made "
                        "if missing; stays attached until SIGTERM or the job's end (needs --local-dir)")

    p = command("stage", cmd_stage, "copy this node's shards of a store to local disk (one rank per node "
                "under mpiexec/srun; {rank} in paths is the rank); a rerun resumes")
    p.add_argument("store", help="the store, on a file system every node sees")
    p.add_argument("local_dir", metavar="LOCAL_DIR", help="node-local directory for this node's shards")
    p.add_argument("--replicas", type=positive, default=1, help="copies of each shard in the job (default 1)")
    add_presentation_options(p, what=". Staged: only the layers this reads (a prefix of each shard), so the local "
                                  "disk holds more; a mount above it reads the rest from the shared store")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="the report as JSON (per node: bytes copied, seconds)")
    add_store_timeout_option(p)
    p.set_defaults(supervised=alone)

    p = command("umount", cmd_umount, "unmount a fanfs mount and wait for its daemon to exit (a mount that has "
                "ended already is no error: in a job, the first unmount ends every node's mount)")
    p.add_argument("mountpoint", help="where the store is mounted")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now even if files are open")

    p = command("wait", cmd_wait, "wait until the mount at MOUNTPOINT serves")
    p.add_argument("mountpoint", help="the mount point 'fanfs mount' was given")
    p.add_argument("--timeout", type=seconds, default=600.0, metavar="SECONDS",
                   help="how long to wait before failing (default 600)")

    p = command("ctl", cmd_ctl, "change a running mount's presentation settings (files opened afterwards get them), "
                "or tell a mount the order its readers will read in (it reads ahead)")
    p.add_argument("mountpoint", help="a running fanfs mount")
    add_presentation_options(p, default=None)
    p.add_argument("--order", metavar="FILE", help="the paths the readers of this mount will open, one per line in their "
                   "order, an empty line between epochs (relative to the mount, or under it; at most 4 GiB, read a "
                   "piece at a time); the mount then reads the next files ahead of them, within its --prefetch budget "
                   "(into the page cache; a --stage lazy node fetches them from peers or the shared store into its "
                   "cache)")
    p.add_argument("--stream", default="ctl", metavar="NAME", help="with --order: whose order it is (one per reader "
                   "process of the node that tells its own; a new order of the same name replaces it, and past 64 "
                   "names the one told least recently goes; default ctl)")

    p = command("fidelity", cmd_fidelity, "measure bytes, SSIM/MS-SSIM and decode speed per fidelity K on sampled "
                "JPEG records")
    p.add_argument("store", help="a store packed with --progressive-jpeg (or --scan-script, --scales)")
    p.add_argument("--sample", type=positive, default=500, help="images to sample (default 500)")
    p.add_argument("--timed", type=count, default=100, metavar="N",
                   help="images of the sample whose Pillow decode is timed at every K, in this process (default "
                        "100, a few ms per image and K; 0: no timing); speeds are relative to the full presentation")
    p.add_argument("--source", metavar="DIR",
                   help="the tree the store was packed from: decode speed relative to the original files too")
    p.add_argument("--seed", type=int, default=0, help="seed of the random sample (default 0: the same images each run)")
    p.add_argument("--min-ssim", type=float, default=0.95, help="quality bar for the recommendation (default 0.95)")
    p.add_argument("--max-pixels", type=positive_size, default="64M", metavar="N",
                   help="sampled records with more pixels are skipped, as are those smaller than SSIM's 11x11 "
                        "window; the report says how many (default 64M = 67,108,864, pack's --max-pixels: measuring "
                        "needs ~16 bytes per pixel per worker)")
    p.add_argument("--plot", metavar="PNG", help="write a plot of both curves, the bytes and the decode speed")
    p.add_argument("--save", action="store_true",
                   help="keep the curve with the store (STORE/fidelity.json, beside the index): every mount, job and "
                        "fsspec reader of the store then looks auto:SSIM up in it and measures nothing (needs write "
                        "access to the store's directory)")
    p.add_argument("--json", action="store_true", help="the curve and the recommendation as JSON on stdout")

    p = command("stats", cmd_stats, "what a running mount has served; with no mount point, every fanfs mount of "
                "this node")
    p.add_argument("mountpoint", nargs="?",
                   help="a running fanfs mount (or a node directory served with --no-mount); a job's mount is found "
                        "from any shell, and root may inspect any user's mount (none: list every fanfs mount of this "
                        "node, whose it is, its store and, for yours, or all for root, its daemon and reads)")
    p.add_argument("--json", action="store_true", help="the counters as JSON (settings as their options write them)")
