"""Nodes read each other's blobs over TCP: stored (compressed) bytes cross, the reader checks and decodes.

Why TCP and not MPI for this part (docs/clusters.rst, "Many nodes"): with MPI a dead rank takes every survivor
down (MPICH's fault-tolerant mode asserts at start-up in the pip build; without it a peer's death
aborts every rank's MPI), so a job uses MPI only for its collective start (index broadcast, staging,
the exchange of these endpoints and of every daemon's public key) and its daemons then serve each
other over plain sockets: a dead peer is a refused connection (the next holder is asked at once), a
stopped one a timeout in a worker thread, and neither touches another node's mount.

Every connection is a channel of :mod:`.peerwire` (both ends prove they are members of the job; frames
are sealed); this module is the client: it asks a holder for one blob and takes back exactly the
blob's stored size as the index gives it, or a refusal of at most ``MAX_REASON`` bytes, under one
deadline for the whole answer.  The server is :mod:`.peerserver`.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from ..errors import FanfsError, NotHeld
from ..store.sources import ShardSource
from ..util.sockets import recv_exactly
from .peerwire import BYE, MAX_REASON, OK, READ, REFUSED, REPLY, REPLY_FRAME, REQUEST, TAG, Channel, NodeKey, \
    Untrusted, connect
from .placement import Placement

log = logging.getLogger("fanfs")

SILENT_SECONDS = 30.0  # a holder that timed out is not asked again for this long (it is skipped at once)
DEAD_SECONDS = 5.0  # a holder that refused the connection (not serving) is skipped for this long
BYE_SECONDS = 2.0  # what saying goodbye to one peer may cost at most
BYE_AT_ONCE = 16  # peers told goodbye in parallel (a job of 1,024 nodes ends in seconds, not minutes)


def peer_host() -> str:
    """The address this node's peers reach it at: ``$FANFS_PEER_HOST`` (a name or IP on the fast
    network), else the address the host name resolves to."""
    name = os.environ.get("FANFS_PEER_HOST") or socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError as err:
        raise FanfsError(f"cannot resolve {name} for the peer connections ({err.strerror or err}): "
                         "set FANFS_PEER_HOST to this node's address") from None


def listen(host: str) -> socket.socket:
    """A listening socket for peers on ``host``, on a port the system picks."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(128)
    return listener


class PeerClient:
    """Asks the job's peers for blobs, each answer awaited at most ``timeout`` seconds; keeps idle channels.

    ``endpoints`` and ``publics``: every rank's address and public key (the job's start gathered them);
    ``stored``: each blob's stored size (the index's), the only length a holder may answer with.
    Safe after a fork (an in-process reader's DataLoader workers): a process that is not the one that made
    the channels opens its own (a channel's frames are numbered: two processes cannot share one).
    """

    def __init__(self, endpoints: Sequence[tuple[str, int]], publics: Sequence[bytes], rank: int, key: NodeKey,
                 store_id: bytes, stored: np.ndarray, timeout: float) -> None:
        self.endpoints = list(endpoints)
        self.publics = list(publics)
        self.rank = rank
        self.timeout = timeout
        self._key = key
        self._store_id = store_id
        self._stored = stored
        self._idle: dict[int, queue.SimpleQueue] = {peer: queue.SimpleQueue() for peer in range(len(endpoints))}
        self._skip_until: dict[int, float] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.requests = self.bytes = self.timeouts = self.failures = 0
        self.latency_total = self.latency_max = 0.0

    def _channel(self, peer: int, deadline: float, fresh: bool) -> tuple[socket.socket, Channel, bool]:
        """An idle channel to ``peer`` (unless ``fresh``) or a new one; and whether it was idle."""
        if not fresh:
            try:
                return (*self._idle[peer].get_nowait(), True)
            except queue.Empty:
                pass
        return (*connect(self.endpoints[peer], self._key, self.publics[peer], self._store_id, self.rank, peer,
                         deadline), False)

    def read(self, holder: int, blob: int, count: int = 1) -> bytes:
        """The stored bytes of blobs ``blob .. blob + count - 1`` (one file's, in one shard) from ``holder``, back to
        back, in one round trip; OSError (EIO, ETIMEDOUT) if it cannot give them."""
        if self._pid != os.getpid():
            self._after_fork()
        if time.monotonic() < self._skip_until.get(holder, 0.0):
            raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer lately; skipped")
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        expected = int(self._stored[blob:blob + count].sum()) if 0 <= blob < self._stored.size else 0
        sock = None
        try:
            for fresh in (False, True):
                sock, channel, idle = self._channel(holder, deadline, fresh)
                try:
                    sock.sendall(channel.seal(REQUEST.pack(READ, blob, count)))
                    header = recv_exactly(sock, REPLY_FRAME, deadline)
                    break
                except (BrokenPipeError, ConnectionResetError):
                    if not idle:
                        raise
                    # The holder closed this idle channel meanwhile (it keeps a member's newest MAX_PER_PEER
                    # connections, and a node's mount and in-process readers all speak as the node): a new one.
                    sock.close()
            status, length = REPLY.unpack(channel.open(header))
            if status == OK and length != expected or status != OK and length > MAX_REASON:
                raise Untrusted(f"rank {holder} announced {length} bytes for blob {blob} of {expected}")
            payload = channel.open(recv_exactly(sock, length + TAG, deadline))
        except TimeoutError:
            self._give_up(holder, SILENT_SECONDS, timeout=True, sock=sock)
            log.warning("peer: rank %d did not answer within %g s (blob %d); asking the next holder",
                        holder, self.timeout, blob)
            raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer within {self.timeout:g} s") from None
        except Untrusted as err:
            self._give_up(holder, DEAD_SECONDS, timeout=False, sock=sock)
            log.warning("peer: %s", err)
            raise OSError(errno.EIO, str(err)) from None
        except OSError as err:
            self._give_up(holder, DEAD_SECONDS, timeout=False, sock=sock)
            raise OSError(errno.EIO, f"rank {holder} is not serving ({err.strerror or err})") from None
        self._idle[holder].put((sock, channel))
        elapsed = time.perf_counter() - started
        with self._lock:
            self.requests += 1
            self.latency_total += elapsed
            self.latency_max = max(self.latency_max, elapsed)
            if status == OK:
                self.bytes += length
            else:
                self.failures += 1
        if status != OK:
            what = "refused" if status == REFUSED else "failed"
            raise OSError(errno.EIO, f"rank {holder} {what}: {payload.decode(errors='replace')}")
        return payload

    def _after_fork(self) -> None:
        """In a forked child: the idle channels are the parent's (it goes on using them): this process drops its
        copies (closing a copy ends nothing for the parent) and the lock another thread may have held."""
        self._lock = threading.Lock()
        for peer in range(len(self.endpoints)):
            self._close_idle(peer)
        self._pid = os.getpid()

    def _give_up(self, holder: int, seconds: float, timeout: bool, sock: socket.socket | None) -> None:
        if sock is not None:
            sock.close()
        with self._lock:
            self._skip_until[holder] = time.monotonic() + seconds
            if timeout:
                self.timeouts += 1
            else:
                self.failures += 1
        self._close_idle(holder)  # its idle channels are as suspect as the one that failed

    def _close_idle(self, peer: int) -> None:
        while True:
            try:
                self._idle[peer].get_nowait()[0].close()
            except queue.Empty:
                return

    def say_bye(self) -> None:
        """Tell every peer this node is done (a dead or stopped peer costs at most BYE_SECONDS, not a hang)."""
        peers = [peer for peer in range(len(self.endpoints)) if peer != self.rank]
        with ThreadPoolExecutor(max_workers=max(1, min(BYE_AT_ONCE, len(peers)))) as pool:
            list(pool.map(self._bye, peers))
        self.close()

    def close(self) -> None:
        """Close every idle channel (a later read opens a new one)."""
        for peer in range(len(self.endpoints)):
            self._close_idle(peer)

    def _bye(self, peer: int) -> None:
        try:
            sock, channel = connect(self.endpoints[peer], self._key, self.publics[peer], self._store_id, self.rank,
                                    peer, time.monotonic() + BYE_SECONDS)
            with sock:
                sock.sendall(channel.seal(REQUEST.pack(BYE, 0, 0)))
        except OSError:
            pass

    def counters(self) -> dict[str, float | int]:
        """This process's requests to peers, as counters that add up over a mount's serving processes."""
        return {"remote_requests": self.requests, "remote_bytes_received": self.bytes, "remote_timeouts": self.timeouts,
                "remote_failures": self.failures, "remote_latency_total_ms": self.latency_total * 1e3,
                "remote_latency_max_ms": round(self.latency_max * 1e3, 3)}


class Kept(Protocol):
    """Which blobs a holder has for its peers (of those placement gives it)."""

    def keeps(self, node: int, blob: int) -> bool: ...

    def keeps_run(self, node: int, first: int, count: int) -> bool: ...


class StagedBlobs:
    """A staged job's holders: every blob placement gives them, of the layers the job staged (``staged``, a bool per
    blob); the rest is no node's."""

    def __init__(self, staged: np.ndarray) -> None:
        self.staged = staged

    def keeps(self, node: int, blob: int) -> bool:
        return bool(self.staged[blob])

    def keeps_run(self, node: int, first: int, count: int) -> bool:
        return bool(self.staged[first:first + count].all())


class RemoteBlobs(ShardSource):
    """The ``choice``-th holder (in this reader's order) of a blob, among those other than this node that keep it.

    One source per choice, so that the store checks each holder's copy on its own and a bad or missing
    copy at one holder falls through to the next, like a bad local copy does.  ``mine`` (a bool per blob): what
    this node keeps itself, never fetched from a peer a run at a time (this node's cache fetches it); given, the
    job is lazily staged and every reader asks a blob's holders in the same order (:meth:`Placement.in_turn`), so
    that the first of them fetches it from the shared store once, not each holder it would spread the reads to.
    """

    def __init__(self, client: PeerClient, placement: Placement, kept: Kept, choice: int,
                 mine: np.ndarray | None = None) -> None:
        self.client = client
        self.placement = placement
        self.kept = kept
        self.choice = choice
        self.mine = mine
        self.spread = mine is None
        self.name = f"peer#{choice + 1}"

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        holders = [h for h in self.placement.remote_holders(blob, self.client.rank, self.spread)
                   if self.kept.keeps(h, blob)]
        if self.choice >= len(holders):
            raise NotHeld(f"blob {blob} has no further holder that keeps it")
        return self.client.read(holders[self.choice], blob)

    def read_run(self, first: int, count: int) -> bytes:
        """Blobs ``first .. first + count - 1`` of one file from this choice of holder, back to back, in one round
        trip (NotHeld as :meth:`read`; the store splits and checks them)."""
        if self.mine is not None and self.mine[first:first + count].any():
            raise NotHeld(f"blobs {first}+{count}: this node keeps some of them")
        if self.placement.primary(first) != self.placement.primary(first + count - 1):
            raise NotHeld(f"blobs {first}+{count} lie at the edge of two nodes' ranges")
        holders = [h for h in self.placement.remote_holders(first, self.client.rank, self.spread)
                   if self.kept.keeps_run(h, first, count)]
        if self.choice >= len(holders):
            raise NotHeld(f"blobs {first}+{count} have no further holder that keeps them all")
        return self.client.read(holders[self.choice], first, count)


def remote_sources(client: PeerClient, placement: Placement, kept: Kept,
                   mine: np.ndarray | None = None) -> list[RemoteBlobs]:
    """Sources for every other holder a blob can have (a node that holds none has ``replicas`` of them); ``kept``:
    which blobs a holder has for its peers (:class:`StagedBlobs` for a staged job, a cache plan for a lazy one)."""
    return [RemoteBlobs(client, placement, kept, choice, mine) for choice in range(placement.replicas)]
