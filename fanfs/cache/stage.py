"""``fanfs stage``: each node copies the blobs placement gives it from the shared store to local disk.

A node's blobs of a shard are one byte range per layer (layer-major shards, contiguous blob ranges),
copied with ``pread``/``pwrite`` into a *sparse* local copy of the shard (same name, size and offsets:
the header and the node's ranges written, the rest a hole), so the reader needs no other map.  Every
blob is checked against its checksum as it is copied (a bad shared copy is reported, not staged); a
new copy is written under a temporary name and renamed into place.  On a rerun a local copy already
there has every held blob re-checked and only the blobs that fail are copied again, so a crash resumes
where it stopped.  Copies are no more readable by other users than the store they come from
(:mod:`fanfs.util.privacy`).  The index is read from the shared file system once per job and broadcast.  Rank 0
shows one progress bar for the whole job (the other ranks send it their progress) and prints the
per-node report.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..records import Presentation, blob_shards, blobs_read
from ..store.format import INDEX_NAME, SHARD_DIR, SHARD_HEADER, shard_name
from ..store.index import Index
from ..store.sources import HeldShards
from ..util.checksum import checksum
from ..util.deadline import Deadline, Stalled, close_within, deadline_for, within
from ..util.privacy import file_mode, read_bits_in
from ..util.files import open_regular
from ..util.runtime import private_dir
from ..util.units import human_size
from ..peers.placement import Placement, place
from ..peers.world import World
from .stagereport import JobProgress, NodeReport, StageReport

STAGED_NAME = ".staged"  # in a staged directory: the store and the presentation it holds
@dataclass
class ShardPart:
    """The blobs of one shard this node holds, in offset order: numbers, offsets and stored sizes."""

    shard: int
    blobs: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.sizes.sum())


def held_parts(index: Index, placement: Placement, rank: int, staged: np.ndarray | None = None) -> list[ShardPart]:
    """Per shard, the blobs that ``rank`` holds and that have bytes to copy (holes are nothing); with
    ``staged`` (a bool per blob: those a presentation reads), only those."""
    blob_of, shard_of = blob_shards(index)
    held = placement.held(rank)
    if staged is not None:
        held &= staged
    keep = held[blob_of] & (index.blob_stored[blob_of] > 0)
    blob_of, shard_of = blob_of[keep], shard_of[keep]
    order = np.lexsort((index.blob_offset[blob_of], shard_of))
    blob_of, shard_of = blob_of[order], shard_of[order]
    cuts = np.flatnonzero(np.diff(shard_of)) + 1
    return [ShardPart(int(shards[0]), blobs, index.blob_offset[blobs].astype(np.int64),
                      index.blob_stored[blobs].astype(np.int64))
            for blobs, shards in zip(np.split(blob_of, cuts), np.split(shard_of, cuts)) if blobs.size]


def _bad_blobs(fd: int, part: ShardPart, index: Index) -> np.ndarray:
    """Positions in ``part`` of the blobs whose local bytes fail their checksum."""
    expected = index.blob_checksum[part.blobs].tolist()
    return np.array([i for i, (offset, size) in enumerate(zip(part.offsets.tolist(), part.sizes.tolist()))
                     if checksum(os.pread(fd, size, offset)) != expected[i]], np.int64)


def _copy_blobs(read: Callable[[int, int], bytes], dst_fd: int, part: ShardPart, which: np.ndarray, index: Index,
                advance: Any) -> None:
    """Copy blobs ``which`` of ``part``, adjacent ones as one range (``read(length, offset)`` of the shared shard),
    each checked as it is read."""
    offsets, sizes, blobs = part.offsets[which], part.sizes[which], part.blobs[which]
    expected = index.blob_checksum[blobs].tolist()
    starts = np.flatnonzero(np.r_[True, offsets[1:] != offsets[:-1] + sizes[:-1]])
    ends = np.r_[starts[1:], offsets.size]
    for a, b in zip(starts.tolist(), ends.tolist()):
        begin, length = int(offsets[a]), int(offsets[b - 1] + sizes[b - 1] - offsets[a])
        data = read(length, begin)
        if len(data) != length:
            raise OSError(errno.EIO, f"short read of the shared shard ({len(data)} of {length} bytes)")
        view = memoryview(data)
        for i in range(a, b):
            lo = int(offsets[i]) - begin
            if checksum(view[lo:lo + int(sizes[i])]) != expected[i]:
                raise FanfsError(f"blob {int(blobs[i])}: checksum mismatch in the shared store (run 'fanfs verify' on it)")
        written = 0
        while written < length:
            written += os.pwrite(dst_fd, view[written:], begin + written)
        advance(length)


def stage_part(store_root: str, local_dir: str, part: ShardPart, index: Index, advance: Any, mode: int,
               reads: Deadline | None) -> int:
    """Make the local copy of one shard hold ``part`` intact, its mode no wider than ``mode``; returns the
    bytes copied (0: it was).  ``reads``: the shared store's deadline (each of its reads waited on that long)."""
    name = shard_name(part.shard)
    dst = os.path.join(local_dir, name)
    size = int(index.shard_size[part.shard])
    src = os.path.join(store_root, SHARD_DIR, name)
    src_fd = within(reads, src, open_regular, src)
    # each run of blobs is read whole by one call: the kernel's read-ahead could only fetch bytes this node does not
    # stage (past a K prefix, another node's share), over the shared file system's link (measured: 570 KB more than
    # 12.2 MB staged at K over sshfs, as many bytes on the storage's link as staging at full)
    with contextlib.suppress(OSError):
        os.posix_fadvise(src_fd, 0, 0, os.POSIX_FADV_RANDOM)

    def read(length: int, offset: int) -> bytes:
        return within(reads, src, os.pread, src_fd, length, offset)

    try:
        header = read(SHARD_HEADER.size, 0)
        try:
            fd = os.open(dst, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:  # a copy from an earlier run: mend what is not intact
            try:
                if (now := stat.S_IMODE(os.fstat(fd).st_mode)) & ~mode:  # an older fanfs's 0644, a store made private
                    os.fchmod(fd, now & mode)
                if os.fstat(fd).st_size == size and os.pread(fd, SHARD_HEADER.size, 0) == header:
                    bad = _bad_blobs(fd, part, index)
                    if bad.size:
                        _copy_blobs(read, fd, part, bad, index, advance)
                        os.fsync(fd)
                    return int(part.sizes[bad].sum())
            finally:
                os.close(fd)
        tmp = dst + ".tmp"
        fd = _create_tmp(tmp, os.O_RDWR, mode)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, header, 0)
            _copy_blobs(read, fd, part, np.arange(part.blobs.size), index, advance)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, dst)
        return part.nbytes
    finally:
        close_within(reads, [src_fd])


LAZY_INSTEAD = ("or mount with --stage lazy --capacity SIZE: a cache that keeps what fits the disk and reads the rest "
                "through (FANFS_STAGE=lazy FANFS_CAPACITY=SIZE in a job)")
"""What a disk too small for a node's share may do instead of a full stage."""


def _create_tmp(path: str, access: int, mode: int) -> int:
    """A descriptor on ``path``, new and empty, no wider than ``mode``: a leftover there (a killed stage's) is emptied
    and narrowed, since the mode given to open() applies only to a file it creates."""
    fd = os.open(path, access | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def stage(store_root: str, local_dir: str, replicas: int, world: World, index: Index, *,
          presentation: Presentation = Presentation(), progress: bool = True, ready: bool = False,
          whole: bool = False) -> StageReport | None:
    """Collective: stage this node's blobs into ``local_dir``, only those read at ``presentation`` (the
    first K layers of a shard are its prefix); rank 0 gets the job's report, others None.  ``ready``: this node's copy
    is complete already (a shared copy another job staged, :mod:`.sharedcopy`): it copies nothing, and only takes its
    part in the job's steps.  ``whole``: every node holds the whole store (a shared copy), which a full disk says."""
    started = time.monotonic()
    placement: Placement = place(index.blob_stored, world.size, replicas)
    report = NodeReport(world.rank)
    parts: list[ShardPart] = []
    error, mode, reads = None, 0, None
    try:
        parts = held_parts(index, placement, world.rank, blobs_read(index, presentation))
        report.shards = len(parts)
        if ready:
            report.skipped_bytes, parts = sum(p.nbytes for p in parts), []
        else:
            reads = deadline_for(os.path.join(store_root, SHARD_DIR))
            index_path = os.path.join(store_root, INDEX_NAME)
            within(reads, index_path, os.stat, index_path)
            make_local_dir(local_dir)  # once the store answered: a stalled one leaves no directory made
            mode = file_mode(within(reads, index_path, read_bits_in, index_path, local_dir))
            _forget_staged(local_dir)  # until this staging is complete, the directory holds no known presentation
            need = sum(p.nbytes for p in parts if not _present(local_dir, p, index))
            free = shutil.disk_usage(local_dir).free
            if need > free:
                remedy = ("each node holds the whole store in a shared copy: stage each node's share for this job "
                          "alone (FANFS_STAGE=full, --stage full), " if whole else
                          "use more nodes, fewer replicas or a bigger disk, ")
                error = (f"{local_dir} has {human_size(free)} free but this node needs {human_size(need)} for its "
                         f"share of the store ({placement.replicas} replicas): {remedy}{LAZY_INSTEAD}")
    except (FanfsError, Stalled) as err:
        error = str(err)
    except OSError as err:
        error = f"{local_dir}: {err.strerror or err}"
    world.agree(error)  # before any copying: a full disk or a stalled store anywhere stops the whole job

    total = sum(world.allgather(sum(p.nbytes for p in parts)))
    bar = JobProgress(world, total, progress)
    copy_started = time.monotonic()
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        bar.update(done)

    for part in parts:
        try:
            copied = stage_part(store_root, local_dir, part, index, advance, mode, reads)
        except Stalled as err:  # every later shard would fail alike: say it once
            report.problems.append(str(err))
            break
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):  # every later shard would fail alike: say it once
                report.problems.append(f"{local_dir}: {err.strerror} after copying {human_size(done)} of "
                                       f"{human_size(sum(p.nbytes for p in parts))}: free space, or use more nodes "
                                       f"or fewer replicas, {LAZY_INSTEAD}")
                break
            report.problems.append(f"shard {shard_name(part.shard)}: {err.strerror or err}")
            continue
        except FanfsError as err:
            report.problems.append(f"shard {shard_name(part.shard)}: {err}")
            continue
        report.copied_bytes += copied
        report.skipped_bytes += part.nbytes - copied
        report.copied_shards += bool(copied)
        done += part.nbytes - copied
        bar.update(done)
    report.seconds = time.monotonic() - copy_started
    bar.update(done, final=True)
    bar.close()
    reports: list[NodeReport] = world.allgather(report)
    world.agree("; ".join(report.problems) or None)
    if not ready:
        write_staged(local_dir, index.meta["store_id"], presentation, mode)
    return StageReport(reports, placement.replicas, time.monotonic() - started, presentation) \
        if world.rank == 0 else None


def write_staged(local_dir: str, store_id: str, presentation: Presentation, mode: int) -> None:
    """Record which presentation a staged directory holds (a mount reads the other layers elsewhere)."""
    path = os.path.join(local_dir, STAGED_NAME)
    with open(_create_tmp(path + ".tmp", os.O_WRONLY, mode), "w") as f:
        json.dump({"store_id": store_id, **presentation}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def staged_presentation(local_dir: str, store_id: str) -> Presentation | None:
    """The presentation ``local_dir`` was staged at for this store; None if it was not (completely)."""
    try:
        fd = open_regular(os.path.join(local_dir, STAGED_NAME))
    except FileNotFoundError:
        return None
    try:
        record = json.loads(os.read(fd, 4096))
        staged = Presentation({name: int(record[name]) for name in Presentation.NAMES})
    except (ValueError, KeyError, TypeError) as err:
        raise FanfsError(f"{local_dir}/{STAGED_NAME}: not a staging record ({err}): stage again") from None
    finally:
        os.close(fd)
    return staged if record.get("store_id") == store_id else None


@dataclass
class StagedShare:
    """Where a node reads its blobs from: the ones it staged from ``local``; the layers no node staged (a job staged
    at fidelity K, read above it), and any blob whose staged copies are missing or bad (a wiped or damaged local
    disk), from ``shared``, the store's own shards, last: opened when first read, and on a network file system read
    by a thread, never the serving loop, within the store's deadline."""

    presentation: Presentation
    staged: np.ndarray  # a bool per blob: read at the staged presentation
    local: HeldShards
    shared: HeldShards

    def stats(self, counters: dict[str, Any]) -> dict[str, Any]:
        """For ``fanfs stats``: what the node staged, and what it read from the shared store above it."""
        copy = getattr(self.local, "copy_stats", None)  # a shared copy's (.sharedcopy.LeasedShards)
        return {"staged": dict(self.presentation), "shared_bytes": counters["by_source"].get(self.shared.name, 0),
                **({"shared_copy": copy()} if copy is not None else {})}

    def counters(self) -> dict[str, Any]:
        """What each serving process counts of the share (summed for ``fanfs stats``): nothing of its own."""
        return {}


def staged_share(store_root: str, local_dir: str, index: Index, presentation: Presentation, held: np.ndarray,
                 local: Callable[[str, bytes, np.ndarray], HeldShards] = HeldShards) -> StagedShare:
    """The sources of a node holding the blobs ``held`` (placement), staged at ``presentation``; ``local`` makes the
    source of its copies (a shared copy's: :class:`.sharedcopy.LeasedShards`)."""
    staged = blobs_read(index, presentation)
    store_id = bytes.fromhex(index.meta["store_id"])
    every = np.ones(staged.size, bool)  # the shared store holds them all: it serves what no copy here or a peer can
    return StagedShare(presentation, staged, local(local_dir, store_id, held & staged),
                       HeldShards(os.path.join(store_root, SHARD_DIR), store_id, every, name="shared store"))


def _forget_staged(local_dir: str) -> None:
    try:
        os.unlink(os.path.join(local_dir, STAGED_NAME))
    except FileNotFoundError:
        pass


def _present(local_dir: str, part: ShardPart, index: Index) -> bool:
    """Whether a local copy of the shard exists at its full size (its blobs are checked while staging)."""
    try:
        return os.stat(os.path.join(local_dir, shard_name(part.shard))).st_size == int(index.shard_size[part.shard])
    except OSError:
        return False


LOCAL_DIR_REMEDY = "use a directory of your own that only you can write (mkdir -m 700)"


def make_local_dir(path: str) -> None:
    """Create the node-local directory itself, never its missing parents (a typo must not build a tree),
    and use it only if nobody else can write it (they could replace the staged shards)."""
    private_dir(path, "local directory", LOCAL_DIR_REMEDY)
