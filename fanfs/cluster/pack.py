"""``mpiexec -n N fanfs pack`` / ``srun fanfs pack``: a pack whose shard jobs run on every rank of the job.

Rank 0 reads the sources, cuts shard jobs exactly as a single node would (so the store does not depend on N)
and sends each to whichever rank has a free worker, its own included; a job of archive members carries their
bytes, a job of directory files their paths (the source must then be on a file system every rank sees, as the
store must be).  Each rank packs with its own worker processes (forked before MPI starts), writes its shards
into the store being built and returns the small tables; rank 0 writes the one index and puts the store in
place.

Failure is one line from rank 0 and nothing left: a job that fails on any rank (an unreadable file, a full
disk, a worker killed) is reported to rank 0, which removes the partial store and stops every rank; every
rank then finalises MPI, so the launcher kills nobody and the job's status is rank 0's.  A rank that dies
outright makes the launcher kill the job; rank 0's keeper process then removes the partial store
(:mod:`fanfs.pack.janitor`), and each rank's keeper the MPI shared-memory segments its host's ranks held.  A rank silent for :data:`SILENT_FOR` seconds while rank 0 waits on it fails the
pack too, and a rank that finds the store being built gone without a word from rank 0 for a minute stops by itself.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import FanfsError
from ..pack.janitor import Janitor
from ..pack.pack import PackOptions, PackReport, pack
from ..pack.runner import LocalRunner, ShardRunner, local_runner
from ..pack.shards import NoSpace, PackError, ShardJob, ShardResult
from ..peers.world import World, mpi_segments_held

JOB, RESULT, FAILED, ALIVE, STOP = 11, 12, 13, 14, 15
SILENT_FOR = 120.0
"""Seconds a rank holding jobs may stay silent (no result, no heartbeat) while rank 0 waits, before the pack fails."""
HEARTBEAT = 5.0
STOP_WITHIN = 60.0  # seconds rank 0 waits for every rank to acknowledge the end
_POLL = 0.01  # seconds between looks at MPI and the workers (3% of a core at 2 ms, 1.5% at 10 ms; a job waits queued)


class RanksRunner(ShardRunner):
    """Rank 0's runner: its own workers and every other rank's (``slots_of[rank]`` each)."""

    def __init__(self, world: World, local: LocalRunner, slots_of: list[int]) -> None:
        self.world, self.local, self.slots_of = world, local, slots_of
        self.slots = sum(slots_of)
        self._held: dict[int, set[int]] = {rank: set() for rank in range(1, world.size)}  # rank -> shards it packs
        self._heard = {rank: time.monotonic() for rank in self._held}
        self.sends: list[Any] = []
        self.started_on = [0] * world.size  # shards sent to each rank (its own: rank 0's)

    @property
    def window(self) -> int:
        """A job for each worker and one waiting on each rank (the least loaded rank always has room for it)."""
        return self.slots + self.world.size

    def start(self, job: ShardJob) -> None:
        load = {rank: len(held) / self.slots_of[rank] for rank, held in self._held.items()}
        load[0] = self.local.in_flight() / self.local.slots
        rank = min(load, key=lambda r: (load[r], r))
        self.started_on[rank] += 1
        if rank == 0:
            self.local.start(job)
            return
        if not self._held[rank]:
            self._heard[rank] = time.monotonic()  # silence counts from when it has work
        self._held[rank].add(job.shard)
        self.sends.append(self.world.comm.isend(job, dest=rank, tag=JOB))

    def in_flight(self) -> int:
        return self.local.in_flight() + sum(map(len, self._held.values()))

    def finished(self, timeout: float) -> list[ShardResult]:
        deadline = time.monotonic() + timeout
        self.sends = [request for request in self.sends if not request.Test()]
        while True:
            done = self.local.finished(_POLL if self.local.in_flight() else 0) + self._received()
            if done or time.monotonic() >= deadline:
                self._check_silence()
                return done
            if not self.local.in_flight():
                time.sleep(_POLL)

    def _received(self) -> list[ShardResult]:
        done = []
        for rank, tag, message in _messages(self.world):
            self._heard[rank] = time.monotonic()
            if tag == RESULT:
                self._held[rank].discard(message.shard)
                done.append(message)
            elif tag == FAILED:
                kind, text = message
                raise (NoSpace if kind == "nospace" else PackError)(f"rank {rank}: {text}")
        return done

    def _check_silence(self) -> None:
        now = time.monotonic()
        for rank, held in self._held.items():
            if held and now - self._heard[rank] > SILENT_FOR:
                raise PackError(f"rank {rank} has not answered for {SILENT_FOR:.0f} s with {len(held)} shard jobs: "
                                "it died or hangs; the pack failed and nothing was left")


def _messages(world: World, source: int | None = None) -> Iterator[tuple[int, int, Any]]:
    """Every message waiting for this rank: (from, tag, message)."""
    from mpi4py import MPI
    comm, status = world.comm, MPI.Status()
    while comm.Iprobe(source=MPI.ANY_SOURCE if source is None else source, tag=MPI.ANY_TAG, status=status):
        rank, tag = status.Get_source(), status.Get_tag()
        yield rank, tag, comm.recv(source=rank, tag=tag)


def pack_on_ranks(srcs: Sequence[str], store: str, options: PackOptions,
                  on_warning: Callable[[str], None]) -> PackReport | None:
    """Pack with every rank of the launcher's job (rank 0's report; None on the other ranks)."""
    with local_runner(options.jobs) as local:  # forked before MPI starts
        world = World.detect()
        janitor = Janitor()
        for segment in mpi_segments_held():
            janitor.watch_segment(segment)
        try:
            return _pack_here(srcs, store, options, on_warning, world, local)
        finally:
            janitor.done()


def _pack_here(srcs: Sequence[str], store: str, options: PackOptions, on_warning: Callable[[str], None],
               world: World, local: LocalRunner) -> PackReport | None:
    """This rank's part: rank 0 packs and hands out the shard jobs, the others pack what it sends."""
    slots_of = world.comm.gather(local.slots, root=0)
    if world.rank != 0:
        _serve(world, local)
        return None
    finished = False
    runners: list[RanksRunner] = []

    def runner(jobs: int) -> contextlib.AbstractContextManager[RanksRunner]:
        runners.append(RanksRunner(world, local, slots_of))
        return contextlib.nullcontext(runners[-1])

    try:
        report = pack(srcs, store, options, on_warning, runner=runner)
        report.shards_by_rank = runners[0].started_on
        finished = True
        return report
    finally:
        _stop(world, runners[0].sends if runners else [], failed=not finished)


def _stop(world: World, sends: list[Any], failed: bool) -> None:
    """Rank 0: tell every rank the pack is over, take what they still send, and end MPI once all have answered
    (a rank that does not answer within STOP_WITHIN is left to the launcher)."""
    for rank in range(1, world.size):
        world.comm.send(failed, dest=rank, tag=STOP)
    answered: set[int] = set()
    deadline = time.monotonic() + STOP_WITHIN
    while len(answered) < world.size - 1 and time.monotonic() < deadline:
        answered.update(rank for rank, tag, _ in _messages(world) if tag == STOP)
        sends = [request for request in sends if not request.Test()]
        time.sleep(_POLL)
    if len(answered) == world.size - 1:
        for request in sends:
            request.Wait()
        world.finalize()


def _serve(world: World, local: LocalRunner) -> None:
    """A rank other than 0: pack what rank 0 sends with this rank's workers until it says stop.

    A job that fails is reported to rank 0, which decides and says it once; when rank 0 stops the pack as
    failed, this rank drops its work and exits 1 quietly (after MPI ends, so that the launcher kills nobody).
    """
    partial, gone_since = None, None
    spoke = time.monotonic()
    while True:
        for _, tag, message in _messages(world, source=0):
            if tag == STOP:
                world.comm.send(None, dest=0, tag=STOP)
                world.finalize()
                if message:
                    err = FanfsError("the pack failed (rank 0 says why)")
                    err.said_elsewhere = True
                    raise err
                return
            partial = os.path.dirname(os.path.dirname(message.path))
            local.start(message)
        _report(world, local)
        if time.monotonic() - spoke > HEARTBEAT:
            world.comm.send(None, dest=0, tag=ALIVE)
            spoke = time.monotonic()
            if partial is not None and not os.path.isdir(partial):  # put in place, or rank 0 is gone
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > STOP_WITHIN:
                    raise FanfsError(f"rank {world.rank}: the store being built ({partial}) is gone and rank 0 has "
                                     f"said nothing for {STOP_WITHIN:.0f} s: rank 0 died; the pack failed")
        if not local.in_flight():
            time.sleep(_POLL * 5)


def _report(world: World, local: LocalRunner) -> None:
    """Send rank 0 what this rank's workers finished (waiting a moment for them), or how a job failed."""
    try:
        for result in local.finished(_POLL if local.in_flight() else 0):
            world.comm.send(result, dest=0, tag=RESULT)
    except NoSpace as err:
        world.comm.send(("nospace", str(err) or "no space left"), dest=0, tag=FAILED)
    except FanfsError as err:
        world.comm.send(("error", str(err)), dest=0, tag=FAILED)
    except Exception as err:  # noqa: BLE001 - a worker killed (BrokenProcessPool) or the like: rank 0 says it
        world.comm.send(("error", f"a worker process failed ({type(err).__name__}: {err}): killed, or out of "
                                  "memory?"), dest=0, tag=FAILED)
