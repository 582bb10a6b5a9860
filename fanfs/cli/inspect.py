"""``fanfs info``, ``verify`` and ``demo``: looking at a store, checking it, and the built-in tour."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..util.units import human_size
from .args import nonnegative_float, positive, positive_size, print_json
from .presentation import add_presentation_options, note_to_stderr, presentation_values

if TYPE_CHECKING:
    from ..store import Store

Command = Callable[[argparse.Namespace], int]


def cmd_verify(args: argparse.Namespace) -> int:
    from ..ingest.compare import against_sources
    from ..store.verify import verify
    from ..util.server import keep_large_buffers
    keep_large_buffers()  # every chunk read and compared reuses heap pages, not a fresh mmap faulted in anew
    against = against_sources(args.against, max_expansion=args.max_expansion) if args.against else None
    report = verify(args.store, against, progress=not args.quiet,
                    on_problem=lambda text: print(f"fanfs: {text}", file=sys.stderr))
    what = f"{report.shards:,} shards, {report.files:,} files ({human_size(report.bytes)})"
    if args.against:
        what += f", compared with {', '.join(args.against)}"
    if report.ok:
        print(f"ok: {what}")
        for note in report.notes:
            print(f"note: {note}")
        return 0
    print(f"FAILED: {len(report.problems)} problems in {what}")
    return 1


def cmd_info(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import tune  # noqa: F401  (registers the resolvers of auto values)
    from ..records import Presentation, blobs_read, check_presentation, resolve
    from ..store import Store
    from .info import format_info, store_info
    store = Store(args.store, check_shards=False)
    info = store_info(store)
    info["fidelity_curve"] = _saved_curve_line(store)
    presentation = resolve(store, presentation_values(args), note=note_to_stderr)
    staged = None
    if presentation != Presentation():
        check_presentation(store.index, presentation)
        weights = np.where(blobs_read(store.index, presentation), store.index.blob_stored, 0).astype(np.int64)
        label = presentation.describe(chosen_only=True)
        full, read = int(store.index.blob_stored.sum()), int(weights.sum())
        info["staged"] = {**presentation, "stored_bytes": read, "full_stored_bytes": full,
                          "capacity_gain": round(full / read, 3) if read else None}
    placement = None
    if args.nodes:
        from ..peers.placement import format_placement, place
        placement = place(store.index.blob_stored, args.nodes, args.replicas)
        info["placement"] = {"nodes": placement.nodes, "replicas": placement.replicas,
                             "node_bytes": placement.node_bytes.tolist(), "node_blobs": placement.node_blobs.tolist()}
        if "staged" in info:
            staged = (label, placement.held_bytes(weights))
            info["placement"]["staged_node_bytes"] = staged[1].tolist()
    figures = None
    if args.capacity is not None:
        import dataclasses

        from ..cache.capacity import CapacityFigures, plan_cache
        from ..peers.placement import place
        plan = plan_cache(store.index, placement or place(store.index.blob_stored, 1, 1), presentation, args.capacity)
        figures = CapacityFigures.of(plan, store.index.blob_stored, blobs_read(store.index, presentation))
        info["capacity"] = dataclasses.asdict(figures)
    if args.json:
        print_json(info)
        return 0
    print(format_info(info))
    if info["fidelity_curve"]:
        print(f"fidelity   {info['fidelity_curve']}")
    if "staged" in info:
        gain = info["staged"]["capacity_gain"]
        print(f"at {label}: {human_size(read)} of {human_size(full)} stored bytes are read ({read / max(1, full):.0%})"
              + (f": staged there, a burst buffer holds {gain:.2f}x the files it holds at full" if gain else ""))
    if placement is not None:
        print(format_placement(placement, staged))
    if figures is not None:
        print(figures.format())
    return 0


def _saved_curve_line(store: Store) -> str | None:
    """What ``info`` says of the fidelity curve saved with the store (None: there is none)."""
    from ..errors import StoreError
    from ..records import FULL
    from ..tune.curve import saved_curve
    try:
        curve = saved_curve(store)
    except StoreError as err:
        return f"the saved curve is refused: {err}"
    if curve is None:
        return None
    k = curve.recommend(0.95)
    return (f"curve saved with the store ({curve.images:,} sampled images; auto:0.95 -> {'full' if k == FULL else k}): "
            "auto:SSIM measures nothing")


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(args.workdir, keep=args.keep)


def add_commands(command: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = command("verify", cmd_verify, "re-check every checksum of a store (and with --against, every file: plain ones byte-exact, JPEG "
                "records pixel-exact)")
    p.add_argument("store", help="the store directory")
    p.add_argument("--against", metavar="SRC", nargs="+", action="extend",
                   help="also compare every entry and byte with the sources it was packed from (directories, "
                        "archives, files, - for a tar on standard input; PREFIX=SRC as pack had them; given again, "
                        "more of them), read as pack read them (archives inside expanded if the store's were)")
    p.add_argument("--max-expansion", type=nonnegative_float, default=1000.0, metavar="RATIO",
                   help="as pack's: refuse an archive whose members hold more than RATIO times its bytes (0: no limit)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    p = command("info", cmd_info, "what a store holds: files, bytes, ratio per codec, shards")
    p.add_argument("store", help="the store directory")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    p.add_argument("--nodes", type=positive, metavar="N", help="also show how N nodes would hold the shards")
    p.add_argument("--replicas", type=positive, default=1, help="with --nodes: copies of each shard (default 1)")
    add_presentation_options(p, what=". Shown: the bytes a job staged at this presentation holds (per node with "
                                  "--nodes), the burst-buffer capacity it gains")
    p.add_argument("--capacity", type=positive_size, metavar="SIZE",
                   help="also show what each node of a lazily staged job keeps with this much local disk (mount "
                        "--stage lazy --capacity; with --nodes and --replicas), and the bytes read through each epoch")

    p = command("demo", cmd_demo, "pack, mount and read back a built-in sample dataset, then unmount")
    p.add_argument("--workdir", help="where to put the sample, store and mount (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
