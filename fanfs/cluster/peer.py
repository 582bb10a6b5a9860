"""Nodes read each other's shards over MPI: stored (compressed) byte ranges cross, the reader decodes.

Protocol, on two communicators duplicated from the job's world (so nothing else can match them):

* request (``requests`` comm, tag 1): ``kind, store id, shard, offset, length, reply tag``, 41 bytes;
  kind READ asks for a byte range, kind BYE says "this rank is done: the job is ending";
* reply (``replies`` comm, the request's own tag): one status byte (OK, REFUSED, FAILED) then the
  bytes or the reason.  The reader posts its ``Irecv`` before sending the request, so a reply never
  waits in MPI's unexpected queue, and a unique tag per request keeps a late answer to a request
  that timed out from being taken for another one.

The server thread polls with ``Improbe`` and backs off (:class:`Backoff`, ~1 ms sleeps when idle):
a thread blocked in ``Recv``/``Mprobe`` would spin a whole core for an idle job.  It answers
only ranges inside shards of its own store that placement gave it, within the index's shard size,
and refuses (and logs) anything else.  It ends once every peer has said BYE and its replies are
delivered; see :mod:`fanfs.node` for the shutdown of the job.
"""

from __future__ import annotations

import errno
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import NotHeld, StoreError
from ..store.format import shard_name
from ..store.sources import LocalShards, ShardSource
from .placement import Placement

log = logging.getLogger("fanfs")

REQUEST = struct.Struct("<B16sIQII")  # kind, store id, shard, offset, length, reply tag
READ, BYE = 1, 2
OK, REFUSED, FAILED = 0, 1, 2
REQUEST_TAG = 1
MAX_LENGTH = 64 << 20  # far above any blob; bounds what one request can make a peer allocate and send
MAX_REASON = 1024  # a refusal's text always fits the reader's receive buffer (at least 4 KiB)
SILENT_SECONDS = 30.0  # a holder that timed out is not asked again for this long (it is skipped at once)


class Backoff:
    """Polling pace: spin just after activity, poll every ~50 µs while reads keep coming, every 1 ms when idle.

    Training reads come in bursts; staying quick for a while after the last message keeps a burst's
    round trips short, while an idle job costs about a thousand cheap polls a second per thread.
    """

    SPIN = 1e-4
    WARM = 0.05
    FAST_SLEEP = 5e-5
    IDLE_SLEEP = 1e-3

    def __init__(self) -> None:
        self.last = time.monotonic()

    def reset(self) -> None:
        self.last = time.monotonic()

    def pause(self) -> None:
        idle = time.monotonic() - self.last
        if idle > self.SPIN:
            time.sleep(self.FAST_SLEEP if idle < self.WARM else self.IDLE_SLEEP)


@dataclass
class Channels:
    """The two private communicators of the peer protocol (created collectively, once per job)."""

    requests: Any
    replies: Any

    @classmethod
    def create(cls, comm: Any) -> "Channels":
        return cls(comm.Dup(), comm.Dup())

    @property
    def rank(self) -> int:
        return self.requests.Get_rank()

    @property
    def size(self) -> int:
        return self.requests.Get_size()

    def free(self) -> None:
        self.requests.Free()
        self.replies.Free()


class PeerServer(threading.Thread):
    """Answers peers' range requests from this node's local shards until every peer said BYE."""

    def __init__(self, channels: Channels, store_id: bytes, shard_sizes: np.ndarray, placement: Placement,
                 local: LocalShards, on_bye: Callable[[int], None]) -> None:
        super().__init__(name="fanfs-peer-server", daemon=True)
        self.channels = channels
        self.store_id = store_id
        self.shard_sizes = shard_sizes
        self.held = placement.holds(channels.rank)
        self.local = local
        self.on_bye = on_bye
        self.served_requests = self.served_bytes = self.refused = self.failed = 0

    def run(self) -> None:
        try:
            self._serve()
        except BaseException:  # logged here: a thread's exception would otherwise only reach stderr
            log.exception("peer: the server thread failed; the job will be aborted at shutdown")
            raise

    def _serve(self) -> None:
        requests, replies = self.channels.requests, self.channels.replies
        waiting = set(range(self.channels.size)) - {self.channels.rank}
        sending: list[tuple[Any, bytes]] = []  # Isend requests with the payloads they must keep alive
        backoff = Backoff()
        status = MPI.Status()
        while waiting or sending:
            message = requests.Improbe(MPI.ANY_SOURCE, REQUEST_TAG, status)
            if message is not None:
                source = status.Get_source()
                buf = bytearray(status.Get_count(MPI.BYTE))
                message.Recv([buf, MPI.BYTE])
                if len(buf) == REQUEST.size and buf[0] == BYE:
                    waiting.discard(source)
                    self.on_bye(source)
                else:
                    answer = self._answer(source, buf)
                    if answer is not None:
                        tag, payload = answer
                        sending.append((replies.Isend([payload, MPI.BYTE], source, tag), payload))
                backoff.reset()
                continue
            if sending:
                still = [(req, payload) for req, payload in sending if not req.Test()]
                if len(still) < len(sending):
                    backoff.reset()
                sending = still
            backoff.pause()

    def _answer(self, source: int, buf: bytearray) -> tuple[int, bytes] | None:
        """(reply tag, reply) for one request, or None for one too malformed to answer."""
        if len(buf) != REQUEST.size:
            self.refused += 1
            log.warning("peer: refused a malformed request from rank %d (%d bytes)", source, len(buf))
            return None
        kind, store_id, shard, offset, length, tag = REQUEST.unpack(buf)
        reason = self._refusal(kind, store_id, shard, offset, length)
        if reason:
            self.refused += 1
            log.warning("peer: refused request from rank %d: %s", source, reason)
            return tag, bytes([REFUSED]) + reason.encode()[:MAX_REASON]
        try:
            data = self.local.read(shard, offset, length)
            if len(data) != length:
                raise OSError(errno.EIO, f"short read ({len(data)} of {length} bytes)")
        except (OSError, StoreError) as err:
            self.failed += 1
            log.warning("peer: cannot serve shard %s to rank %d: %s", shard_name(shard), source, err)
            return tag, bytes([FAILED]) + str(err).encode()[:MAX_REASON]
        self.served_requests += 1
        self.served_bytes += length
        return tag, bytes([OK]) + data

    def _refusal(self, kind: int, store_id: bytes, shard: int, offset: int, length: int) -> str:
        if store_id != self.store_id:
            return f"store {store_id.hex()[:12]} is not this node's store {self.store_id.hex()[:12]}"
        if kind != READ:
            return f"unknown request kind {kind}"
        if shard >= self.shard_sizes.size:
            return f"no shard {shard} in this store"
        if not self.held[shard]:
            return f"shard {shard_name(shard)} is not placed on this node"
        if not 0 < length <= MAX_LENGTH or offset + length > int(self.shard_sizes[shard]):
            return f"range {offset}+{length} is outside shard {shard_name(shard)} ({int(self.shard_sizes[shard])} bytes)"
        return ""

    def stats(self) -> dict[str, int]:
        return {"served_requests": self.served_requests, "served_bytes": self.served_bytes,
                "refused": self.refused, "failed": self.failed}


class PeerClient:
    """Asks one peer for one byte range and waits for the answer, at most ``timeout`` seconds."""

    def __init__(self, channels: Channels, store_id: bytes, timeout: float) -> None:
        self.channels = channels
        self.store_id = store_id
        self.timeout = timeout
        self._lock = threading.Lock()
        self._next_tag = 0
        self._tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))
        self._orphans: dict[int, tuple[Any, bytearray]] = {}  # timed-out receives, by tag: kept posted
        self._silent_until: dict[int, float] = {}
        self.requests = self.bytes = self.timeouts = self.failures = 0
        self.latency_total = self.latency_max = 0.0

    def _tag(self) -> int:
        with self._lock:
            while True:
                self._next_tag = self._next_tag % self._tag_ub + 1
                if self._next_tag not in self._orphans:
                    return self._next_tag

    def read(self, holder: int, shard: int, offset: int, length: int) -> bytes:
        if time.monotonic() < self._silent_until.get(holder, 0.0):
            raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer lately; skipped")
        tag = self._tag()
        buf = bytearray(1 + max(length, 4096))
        status = MPI.Status()
        started = time.perf_counter()
        pending = self.channels.replies.Irecv([buf, MPI.BYTE], holder, tag)
        self.channels.requests.Send([REQUEST.pack(READ, self.store_id, shard, offset, length, tag), MPI.BYTE],
                                    holder, REQUEST_TAG)
        backoff = Backoff()
        while not pending.Test(status):
            if time.perf_counter() - started > self.timeout:
                with self._lock:
                    self._orphans[tag] = (pending, buf)  # cancelling could strand the peer's send: keep it posted
                    self._silent_until[holder] = time.monotonic() + SILENT_SECONDS
                    self.timeouts += 1
                log.warning("peer: rank %d did not answer within %g s (shard %s); asking the next holder",
                            holder, self.timeout, shard_name(shard))
                raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer within {self.timeout:g} s")
            backoff.pause()
        elapsed = time.perf_counter() - started
        count = status.Get_count(MPI.BYTE)
        with self._lock:
            self.requests += 1
            self.latency_total += elapsed
            self.latency_max = max(self.latency_max, elapsed)
            if buf[0] == OK:
                self.bytes += count - 1
            else:
                self.failures += 1
        if buf[0] != OK:
            what = "refused" if buf[0] == REFUSED else "failed"
            raise OSError(errno.EIO, f"rank {holder} {what}: {buf[1:count].decode(errors='replace')}")
        return bytes(memoryview(buf)[1:count])

    def say_bye(self) -> None:
        """Tell every peer this rank is done (small eager sends: they complete even if a peer is stuck)."""
        bye = REQUEST.pack(BYE, self.store_id, 0, 0, 0, 0)
        for peer in range(self.channels.size):
            if peer != self.channels.rank:
                self.channels.requests.Send([bye, MPI.BYTE], peer, REQUEST_TAG)

    def drain(self, timeout: float) -> None:
        """Let the answers to timed-out requests arrive (their peers' sends complete), then cancel the rest."""
        deadline = time.monotonic() + timeout
        backoff = Backoff()
        while self._orphans and time.monotonic() < deadline:
            self._orphans = {tag: item for tag, item in self._orphans.items() if not item[0].Test()}
            backoff.pause()
        for pending, _ in self._orphans.values():
            pending.Cancel()
            pending.Wait()
        self._orphans.clear()

    def stats(self) -> dict[str, float | int]:
        mean = self.latency_total / self.requests if self.requests else 0.0
        return {"remote_requests": self.requests, "remote_bytes_received": self.bytes, "remote_timeouts": self.timeouts,
                "remote_failures": self.failures, "remote_latency_mean_ms": round(mean * 1e3, 3),
                "remote_latency_max_ms": round(self.latency_max * 1e3, 3)}


class HeldShards(LocalShards):
    """This node's local directory, for the shards placement gave it; the others are for peers to serve."""

    def __init__(self, directory: str, store_id: bytes, placement: Placement, rank: int) -> None:
        super().__init__(directory, store_id)
        self.held = placement.holds(rank)

    def read(self, shard: int, offset: int, length: int) -> bytes:
        if not self.held[shard]:
            raise NotHeld(f"shard {shard_name(shard)} is placed on other nodes")
        return super().read(shard, offset, length)


class RemoteShards(ShardSource):
    """The ``choice``-th holder (in this reader's order) of a shard, other than this node.

    One source per choice, so that :meth:`Store._fetch` checks each holder's copy on its own and a
    bad or missing copy at one holder falls through to the next, like a bad local copy does.
    """

    def __init__(self, client: PeerClient, placement: Placement, choice: int) -> None:
        self.client = client
        self.placement = placement
        self.choice = choice
        self.name = f"peer#{choice + 1}"

    def read(self, shard: int, offset: int, length: int) -> bytes:
        holders = self.placement.remote_holders(shard, self.client.channels.rank)
        if self.choice >= len(holders):
            raise NotHeld(f"shard {shard_name(shard)} has no further holder")
        return self.client.read(holders[self.choice], shard, offset, length)


def remote_sources(client: PeerClient, placement: Placement) -> list[RemoteShards]:
    """Sources for every other holder a shard can have (a node that holds none has ``replicas`` of them)."""
    return [RemoteShards(client, placement, choice) for choice in range(placement.replicas)]
