"""What ``fanfs stage`` tells: one progress display for a job's nodes, and the per-node report at its end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..records import Presentation
from ..util.progress import Progress
from ..util.units import human_rate, human_size
from ..peers.world import World

PROGRESS_SECONDS = 0.25
_PROGRESS_TAG = 7


@dataclass
class NodeReport:
    """What one node staged."""

    rank: int
    shards: int = 0
    copied_shards: int = 0  # local shard copies written or mended
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
    presentation: Presentation = field(default_factory=Presentation)

    def format(self) -> str:
        copied = sum(n.copied_bytes for n in self.nodes)
        skipped = sum(n.skipped_bytes for n in self.nodes)
        at = self.presentation.describe(chosen_only=True)
        lines = [f"staged {len(self.nodes)} node(s), {self.replicas} replica(s) per shard{f' at {at}' if at else ''}: "
                 f"copied {human_size(copied)}, "
                 f"already there {human_size(skipped)}, in {self.seconds:.1f} s "
                 f"({human_rate(copied / self.seconds if self.seconds else 0)} for the job)",
                 "node   shards   copied    copied bytes   already there   seconds        rate"]
        for n in self.nodes:
            lines.append(f"{n.rank:<6} {n.shards:>6} {n.copied_shards:>8} {human_size(n.copied_bytes):>15} "
                         f"{human_size(n.skipped_bytes):>15} {n.seconds:>9.2f} {human_rate(n.rate):>11}")
        return "\n".join(lines)


class JobProgress:
    """One display for the job on rank 0; other ranks send it their byte counts (a few times a second).

    A bar on a terminal; under mpiexec/srun, whose output is a pipe, progress lines instead (:mod:`fanfs.util.progress`).
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
        self.bar.update_to(sum(self.done))

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
