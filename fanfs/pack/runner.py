"""Where shard jobs run: this node's worker processes, or (``fanfs.cluster.pack``) every rank of a job.

A pack cuts its files into shard jobs in source order and hands each to a runner as soon as it is cut, keeping
no more in flight than its ``window``: a job for each worker and one waiting on each node, so no worker idles
while a finished job's result and the next job cross between ranks (a job of archive members carries their
bytes: memory stays bounded by a few shards a node, whatever the archive).  Which worker packs which
shard changes nothing in the store: a shard's contents are fixed when it is cut.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Iterator

from ..util.processes import process_pool
from .shards import PackError, ShardJob, ShardResult, pack_shard

class ShardRunner:
    """Packs shard jobs somewhere; ``slots``: how many it packs at once; ``window``: how many it takes at once."""

    slots = 1

    @property
    def window(self) -> int:
        return self.slots + 1

    def start(self, job: ShardJob) -> None:
        raise NotImplementedError

    def finished(self, timeout: float) -> list[ShardResult]:
        """The jobs done within ``timeout`` seconds (maybe none); a job's failure is raised here."""
        raise NotImplementedError

    def in_flight(self) -> int:
        raise NotImplementedError


class LocalRunner(ShardRunner):
    """``jobs`` worker processes of this node (forked, dying with it)."""

    def __init__(self, pool: cf.ProcessPoolExecutor, jobs: int) -> None:
        self.pool = pool
        self.slots = jobs
        self._pending: set[cf.Future] = set()

    def start(self, job: ShardJob) -> None:
        try:
            future = self.pool.submit(pack_shard, job)
        except cf.BrokenExecutor as err:  # a worker died since the last wait: say so where failures are
            future = cf.Future()
            future.set_exception(err)
        self._pending.add(future)

    def finished(self, timeout: float) -> list[ShardResult]:
        if not self._pending:
            return []
        done, self._pending = cf.wait(self._pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        try:
            return [future.result() for future in done]
        except cf.BrokenExecutor:  # a worker killed outright (the OOM killer's SIGKILL): one line, not a traceback
            raise PackError("a worker process failed: it was killed (out of memory?); the pack stopped") from None

    def in_flight(self) -> int:
        return len(self._pending)


@contextlib.contextmanager
def local_runner(jobs: int) -> Iterator[LocalRunner]:
    """A runner of ``jobs`` worker processes, stopped (killed, on an error) when the block ends."""
    with process_pool(jobs) as pool:
        yield LocalRunner(pool, jobs)
