"""``fanfs stage``: each node copies the shards placement gives it from the shared store to local disk.

Every copy is checked against the index's whole-shard checksum before it is renamed into place, and
a shard already there and intact is skipped, so a rerun after a crash resumes where it stopped.
The index is read from the shared file system once per job and broadcast.  Rank 0 shows one progress
bar for the whole job (the other ranks send it their progress) and prints the per-node report.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..store.format import SHARD_DIR, digest_file, read_blocks, shard_name
from ..store.index import Index
from ..util.checksum import Digest
from ..util.progress import Progress
from ..util.units import human_rate, human_size
from .placement import Placement, place
from .world import World

PROGRESS_SECONDS = 0.25
LINE_SECONDS = 5.0
_PROGRESS_TAG = 7


@dataclass
class NodeReport:
    """What one node staged."""

    rank: int
    shards: int = 0
    copied_shards: int = 0
    copied_bytes: int = 0
    skipped_bytes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.copied_bytes / self.seconds if self.seconds else 0.0


@dataclass
class StageReport:
    nodes: list[NodeReport]
    replicas: int
    seconds: float

    def format(self) -> str:
        copied = sum(n.copied_bytes for n in self.nodes)
        skipped = sum(n.skipped_bytes for n in self.nodes)
        lines = [f"staged {len(self.nodes)} node(s), {self.replicas} replica(s) per shard: copied {human_size(copied)}, "
                 f"already there {human_size(skipped)}, in {self.seconds:.1f} s "
                 f"({human_rate(copied / self.seconds if self.seconds else 0)} for the job)",
                 "node   shards   copied    copied bytes   already there   seconds        rate"]
        for n in self.nodes:
            lines.append(f"{n.rank:<6} {n.shards:>6} {n.copied_shards:>8} {human_size(n.copied_bytes):>15} "
                         f"{human_size(n.skipped_bytes):>15} {n.seconds:>9.2f} {human_rate(n.rate):>11}")
        return "\n".join(lines)


class JobProgress:
    """One display for the job on rank 0; other ranks send it their byte counts (a few times a second).

    A bar on a terminal; under mpiexec/srun, whose output is a pipe, a line every few seconds instead.
    """

    def __init__(self, world: World, total: int, enabled: bool) -> None:
        self.world = world
        self.comm = world.dup() if world.comm is not None else None
        self.done = [0] * world.size
        self.finished = 1  # rank 0 itself
        self._sends: list[Any] = []
        self._last = 0.0
        self.bar = Progress(total, "stage", enabled=enabled, unit="B") if world.rank == 0 else None
        self.total = total
        self._lines = enabled and world.size > 1 and world.rank == 0 and not sys.stderr.isatty()
        self._started = self._printed = time.monotonic()

    def update(self, done: int, final: bool = False) -> None:
        if self.comm is None or self.world.rank == 0:
            self.done[0] = done
            self._poll()
            return
        now = time.monotonic()
        if final or now - self._last >= PROGRESS_SECONDS:
            self._last = now
            self._sends.append(self.comm.isend((done, final), 0, _PROGRESS_TAG))

    def _poll(self) -> None:
        if self.comm is not None:
            from mpi4py import MPI
            status = MPI.Status()
            while self.comm.iprobe(tag=_PROGRESS_TAG):
                done, final = self.comm.recv(tag=_PROGRESS_TAG, status=status)
                self.done[status.Get_source()] = done
                self.finished += final
        assert self.bar is not None
        done = sum(self.done)
        self.bar.update_to(done)
        now = time.monotonic()
        if self._lines and now - self._printed >= LINE_SECONDS:
            self._printed = now
            print(f"stage: {human_size(done)} of {human_size(self.total)} ({done / max(1, self.total):.0%}), "
                  f"{human_rate(done / (now - self._started))}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Rank 0 waits for every rank's last count; the others for their sends to be taken."""
        if self.world.rank == 0:
            while self.finished < self.world.size:
                self._poll()
                time.sleep(0.01)
            assert self.bar is not None
            self.bar.__exit__(None, None, None)
        else:  # the final count was sent by update(..., final=True)
            for request in self._sends:
                request.wait()
        if self.comm is not None:
            self.comm.Free()


def intact(path: str, size: int, expected: int) -> bool:
    """Is the file at ``path`` this shard, whole (size first: cheap; then the checksum of every byte)?"""
    try:
        if os.stat(path).st_size != size:
            return False
        with open(path, "rb", buffering=0) as f:
            return digest_file(f) == (size, expected)
    except OSError:
        return False


def _copy(src: str, dst: str, expected: int, advance: Any) -> str | None:
    """Copy one shard through a temporary name, checking its checksum; returns a problem or None."""
    tmp = dst + ".tmp"
    digest = Digest()
    try:
        with open(src, "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as fout:
            for block in read_blocks(fin):
                digest.update(block)
                fout.write(block)
                advance(len(block))
            fout.flush()
            os.fsync(fout.fileno())
        if digest.intdigest() != expected:
            os.unlink(tmp)
            return f"{src}: checksum mismatch in the shared store (run 'fanfs verify' on it)"
        os.replace(tmp, dst)
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        return f"{dst}: {err.strerror or err}"
    return None


def stage(store_root: str, local_dir: str, replicas: int, world: World, index: Index, *,
          progress: bool = True) -> StageReport | None:
    """Collective: stage this node's shards into ``local_dir``; rank 0 gets the job's report, others None."""
    started = time.monotonic()
    placement: Placement = place(index.shard_size, world.size, replicas)
    sizes, checksums = index.shard_size, index.shard_checksum
    report = NodeReport(world.rank)
    todo: list[int] = []
    error = None
    try:
        make_local_dir(local_dir)
        for shard in placement.shards_of(world.rank).tolist():
            report.shards += 1
            if intact(os.path.join(local_dir, shard_name(shard)), int(sizes[shard]), int(checksums[shard])):
                report.skipped_bytes += int(sizes[shard])
            else:
                todo.append(shard)
        need = sum(int(sizes[s]) for s in todo)
        free = shutil.disk_usage(local_dir).free + sum(_size_or_zero(os.path.join(local_dir, shard_name(s)))
                                                       for s in todo)
        if need > free:
            error = (f"{local_dir} has {human_size(free)} free but this node needs {human_size(need)} more for its "
                     f"{len(todo)} shards ({placement.replicas} replicas): use more nodes, fewer replicas or a bigger disk")
    except OSError as err:
        error = f"{local_dir}: {err.strerror or err}"
    world.agree(error)  # before any copying: a full disk anywhere stops the whole job

    total = sum(world.allgather(sum(int(sizes[s]) for s in todo)))
    bar = JobProgress(world, total, progress)
    copy_started = time.monotonic()

    def advance(n: int) -> None:
        report.copied_bytes += n
        bar.update(report.copied_bytes)

    for shard in todo:
        problem = _copy(os.path.join(store_root, SHARD_DIR, shard_name(shard)),
                        os.path.join(local_dir, shard_name(shard)), int(checksums[shard]), advance)
        if problem:
            report.problems.append(problem)
        else:
            report.copied_shards += 1
    report.seconds = time.monotonic() - copy_started
    bar.update(report.copied_bytes, final=True)
    bar.close()
    reports: list[NodeReport] = world.allgather(report)
    world.agree("; ".join(report.problems) or None)
    return StageReport(reports, placement.replicas, time.monotonic() - started) if world.rank == 0 else None


def make_local_dir(path: str) -> None:
    """Create the node-local directory itself, never its missing parents (a typo must not build a tree)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise OSError(errno.ENOTDIR, f"{path} exists and is not a directory") from None
    except FileNotFoundError:
        raise OSError(errno.ENOENT, f"{os.path.dirname(path)} does not exist: create it, or pick another "
                      "local directory") from None


def _size_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
