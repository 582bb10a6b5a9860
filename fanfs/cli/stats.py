"""``fanfs stats``: what a mount served, from where, and what its cache and read-ahead hold, as text or JSON."""

from __future__ import annotations

import argparse
import os

from ..util.units import counted, human_size
from .args import print_json

STATS_NEEDS = ("store", "workers", "reads", "reads_by_process", "errors", "bytes_presented", "bytes_stored_read",
               "cache_hits", "cache_misses", "decode_seconds", "stored_by_layer")
"""What every daemon's answer holds and the text reads (another fanfs's daemon may answer otherwise: one line)."""


def cmd_stats(args: argparse.Namespace) -> int:
    from ..records import Presentation, setting
    from ..serve.control import request
    if args.mountpoint is None:
        return _list_mounts(args.json)
    stats = request(args.mountpoint, {"cmd": "stats"}, needs=(*STATS_NEEDS, *Presentation.NAMES))
    shown = Presentation({name: stats[name] for name in Presentation.NAMES}).describe()
    if args.json:  # settings as their options write them ("full", "4", "1/2"), not their codes (65535)
        for values in (stats, stats.get("staged", {})):
            values.update({name: setting(name).format(values[name]) for name in Presentation.NAMES if name in values})
        print_json(stats)
        return 0
    print("\n".join(_stats_lines(args.mountpoint, stats, shown)))
    return 0


def _stats_lines(mountpoint: str, stats: dict, shown: str) -> list[str]:
    """``fanfs stats`` as text: what was served, at what rate since the mount, from which layers and sources."""
    from ..records import Presentation
    lines = []
    hits, misses = stats["cache_hits"], stats["cache_misses"]
    seconds = stats.get("seconds")  # a node without a mount does not say
    rate = f" in {seconds:,.1f} s since the mount ({stats['reads'] / max(seconds, 1e-3):,.0f}/s on average)" if seconds else ""
    throughput = f" ({human_size(stats['bytes_presented'] / max(seconds, 1e-3))}/s)" if seconds else ""
    if "node_dir" in stats:  # a node serving without a mount: its readers read in-process
        lines.append(f"node       {mountpoint} -> {stats['store']}  (no mount: in-process readers read here; staged at {shown})")
    else:
        lines.append(f"mount      {mountpoint} -> {stats['store']}  ({shown})")
    lines.append(f"reads      {stats['reads']:,}{rate}   errors {stats['errors']:,}"
                 + (f"   by {stats['workers']} serving processes: {' / '.join(f'{n:,}' for n in stats['reads_by_process'])}"
                    if stats["workers"] > 1 else "")
                 + (f" ({silent} did not answer in time: theirs as they last gave them)"
                    if (silent := stats.get("processes_silent")) else ""))
    lines.append(f"presented  {human_size(stats['bytes_presented'])}{throughput}   read from storage "
                 f"{human_size(stats['bytes_stored_read'])}"
                 + (f"   in {human_size(stats['bytes_presented'] // stats['reads'])} per read" if stats["reads"] else ""))
    if stats.get("bytes_spliced") or stats.get("bytes_verified"):
        lines.append(f"spliced    {human_size(stats['bytes_spliced'])} of it by the kernel from the shards' pages (extents), "
                     f"{human_size(stats['bytes_verified'])} of those pages read here once to verify them")
    if stats.get("readahead"):
        low = ("; large files come in requests of that size: an administrator raises it, see the docs' Site notes"
               if stats["readahead"] < 1 << 20 else "")
        lines.append(f"readahead  {human_size(stats['readahead'])} (the kernel's, in the mount's files{low})")
    if "reads_in_memory" in stats:
        lines.append(f"requests   {stats['reads_in_memory']:,} answered at once (their bytes were in memory), "
                     f"{stats['reads_deferred']:,} by threads that waited on a disk or a peer")
    if (inside := stats.get("in_process")) and inside["processes"]:
        lines.append(f"in-process {counted(inside['files'], 'file')} ({human_size(inside['bytes'])}) read by "
                     f"{counted(inside['processes'], 'process', 'processes')} of 'fanfs run' in their own memory (not in "
                     f"the counts above); {counted(inside['to_mount'], 'open')} left to the mount")
    answers = stats.get("page_cache_answers", {})
    if any(answers.values()):
        ways = ", ".join(f"{count:,} by {way}" for way, count in answers.items() if count)
        lines.append(f"page cache asked {sum(answers.values()):,} times whether bytes were in memory: {ways}"
                     + (" (unknown: no way of this kernel's could say)" if answers.get("unknown") else ""))
    if "lookups" in stats:  # a mount's requests for names: one per name not seen in a listing first
        lines.append(f"names      {stats['lookups']:,} looked up, {stats['listed']:,} given with their attributes in listings")
    lines.append(f"blobs      {hits + misses:,} read, {hits:,} of them from fanfs's memory cache (--cache-size keeps only "
                 "blobs read in parts; a file read whole is cached by the kernel, whose hits never reach fanfs)")
    lines.append(f"decode     {stats['decode_seconds']:.3f} s decompressing blobs")
    lines += [f"note       {note}" for note in stats.get("notes", [])]
    if stats["stored_by_layer"] and stats.get("layered"):  # a store of plain files has one layer: nothing to tell
        lines.append("per layer  " + "  ".join(f"{i}: {human_size(b)}" for i, b in enumerate(stats["stored_by_layer"], 1)))
    if stats.get("stored_by_side_layer"):
        names = stats.get("side_names", [])
        lines.append("per tier   " + "  ".join(f"{names[i] if i < len(names) else f'side {i + 1}'}: {human_size(b)}"
                                            for i, b in enumerate(stats["stored_by_side_layer"]) if b))
    if "cache" in stats:
        lines += _cache_lines(stats["cache"], stats.get("prefetch"))
    elif "prefetch" in stats:
        lines += _ahead_lines(stats["prefetch"])
    elif "staged" in stats:
        staged = Presentation(stats["staged"]).describe(chosen_only=True) or "full"
        lines.append(f"staged     at {staged}; read from the shared store (above it, or no good copy here): "
                     f"{human_size(stats['shared_bytes'])}")
    if "shared_copy" in stats:  # the node's copy that every job on it reads (docs/shared.rst)
        copy = stats["shared_copy"]
        lines.append(f"shared     copy {copy['directory']} (uid {copy['owner']}'s; large files "
                     + ("spliced from it)" if copy["spliced"] else "read and checked on every read: not yours)"))
    if "cluster" in stats:
        c = stats["cluster"]
        lines.append(f"node       rank {c['rank']} of {c['nodes']}, {c['local_blobs']:,} blobs held, {c['replicas']} replicas")
        lines.append(f"local      {human_size(c['local_bytes'])}   remote {human_size(c['remote_bytes'])} in "
                     f"{c['remote_requests']:,} requests ({c['remote_latency_mean_ms']:.2f} ms mean, "
                     f"{c['remote_latency_max_ms']:.2f} ms max; {c['remote_timeouts']} timeouts, {c['remote_failures']} failed)")
        lines.append(f"served     {human_size(c['served_bytes'])} in {c['served_requests']:,} requests to peers "
                     f"({c['refused']} refused, {c['failed']} failed)")
    return lines


def _cache_lines(cache: dict, ahead: dict | None) -> list[str]:
    """``fanfs stats`` of a lazily staged node's cache, one account: what it may keep and has on disk; what reads fetched
    since the mount, kept or not; what it keeps now, and how much of that it had when the mount started; hits and
    read-throughs; what it fetched ahead of its readers (``ahead``, once it was given their order)."""
    capacity = f"capacity {human_size(cache['capacity'])}" if cache["capacity"] is not None else "no capacity set"
    ahead_kept = ahead["kept_fills"] if ahead is not None else 0
    peers = f", {cache['peer_fills']:,} of them copied from a peer that fetched them" if cache.get("peer_fills") else ""
    unkept = (f", {cache['unkept']:,} ({human_size(cache['unkept_bytes'])}) could not be kept (the local directory "
              "was full: see the log)") if cache["unkept"] else ""
    lines = [f"cache      filled as read, {capacity}: keeps up to {human_size(cache['keeps_bytes'])} of its "
             f"{human_size(cache['share_bytes'])} share; {human_size(cache['held_bytes'])} on disk now "
             f"({human_size(cache['ahead_bytes'])} of it fetched ahead)",
             f"fetched    {cache['fills']:,} blobs ({human_size(cache['fill_bytes'])}) by reads since the mount{peers}: "
             f"{cache['fills'] - cache['unkept']:,} kept ({human_size(cache['fill_bytes'] - cache['unkept_bytes'])})"
             f"{unkept}",
             f"kept now   {cache['kept_blobs']:,} blobs ({human_size(cache['kept_stored_bytes'])}), "
             f"{cache['kept_at_start']:,} of them kept when the mount started"
             + (f", {ahead_kept:,} fetched ahead of the readers" if ahead_kept else "")
             + (f"; {cache['dropped']:,} bad copies dropped since (see the log)" if cache["dropped"] else ""),
             f"hits       {cache['hit_blobs']:,} blobs read here ({human_size(cache['hit_bytes'])}), "
             f"{human_size(cache['read_through_bytes'])} read through (blobs this node does not keep)"]
    if ahead is not None:
        lines += _ahead_lines(ahead)
    return lines


WAITING = {"readers": "for the readers to read what it fetched", "budget": "for the readers: its budget is full",
           "orders": "for an order: every one is followed to its end"}


def _ahead_lines(ahead: dict) -> list[str]:
    """``fanfs stats`` of a mount's read-ahead of a known order: how far ahead it is, what it read, and where."""
    streams = ", ".join(f"{name} at {s['position']:,} of " + (f"{s['files']:,}" if s["files"] is not None else
                                                              "(still counting)")
                        for name, s in ahead["streams"].items())
    if "kept_fills" in ahead:  # a lazy cache's: fetched into it
        done = (f"{ahead['files']:,} files fetched ahead of the readers ({human_size(ahead['bytes'])}: "
                f"{ahead['kept_fills']:,} blobs kept, {ahead['from_peers']:,} from peers, {ahead['from_shared']:,} "
                "from the shared store)")
    else:  # the page cache's: the kernel was asked to read them (posix_fadvise), and reads what it will
        done = (f"{ahead.get('advised', 0):,} files asked of the kernel ahead of the readers "
                f"({human_size(ahead['bytes'])})")
    waiting = f"; waiting {WAITING[ahead['waiting']]}" if ahead.get("waiting") in WAITING else ""
    return [f"ahead      {done}, {ahead.get('in_memory', 0):,} in memory already, {ahead['skipped']:,} read before "
            f"their turn, {ahead['given_up']:,} given up",
            f"           now {ahead['ahead_files']:,} files, {human_size(ahead['ahead_bytes'])} ahead (budget "
            f"{human_size(ahead['budget'])}){waiting}; order: {streams}"]


def _list_mounts(as_json: bool) -> int:
    """``fanfs stats`` with no mount point: every fanfs mount of this node (from the kernel's mount table), whose it is,
    of which store and Slurm job, and for those this user may inspect (their own; root: every user's) its daemon and
    reads."""
    from ..serve.control import ControlError, request, user_name
    from ..util.mounts import fanfs_mounts
    rows = []
    for found in fanfs_mounts():
        row: dict = {"mountpoint": found.mountpoint, "store": found.store, "uid": found.owner,
                     "user": user_name(found.owner) if found.owner is not None else "?", "job": found.job}
        if os.getuid() in (found.owner, 0):
            try:
                row["pid"] = request(found.mountpoint, {"cmd": "status"}, timeout=5, needs=("pid",))["pid"]
                stats = request(found.mountpoint, {"cmd": "stats"}, timeout=5, needs=STATS_NEEDS)
                row.update(reads=stats["reads"], errors=stats["errors"], bytes_presented=stats["bytes_presented"])
            except (ControlError, TimeoutError, KeyError) as err:
                row["problem"] = str(err) or type(err).__name__
        rows.append(row)
    if as_json:
        print_json(rows)
        return 0
    if not rows:
        print("no fanfs mount on this node (a job's node serving without a mount, FANFS_MOUNT=0, has none)")
    for row in rows:
        if "reads" in row:
            what = (f"daemon pid {row['pid']}, {row['reads']:,} reads ({human_size(row['bytes_presented'])}), "
                    f"{row['errors']:,} errors")
        else:
            what = row.get("problem", "not yours: only its user or root may inspect it")
        job = f"  job {row['job']}" if row["job"] else ""
        print(f"{row['mountpoint']}  {row['user']}{job}  {row['store']}: {what}")
    return 0
