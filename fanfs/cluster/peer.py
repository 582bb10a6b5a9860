"""Nodes read each other's blobs over TCP: stored (compressed) bytes cross, the reader checks and decodes.

Why TCP and not MPI for this part (README "Many nodes"): with MPI a dead rank takes every survivor
down (MPICH's fault-tolerant mode asserts at start-up in the pip build; without it a peer's death
aborts every rank's MPI), so a job uses MPI only for its collective start (index broadcast, staging,
the exchange of these endpoints and a per-job secret), finalises it, and its daemons then serve each
other over plain sockets: a dead peer is a refused connection (the next holder is asked at once), a
stopped one a timeout in a worker thread, and neither touches another node's mount.

Protocol: a connection opens with ``HELLO`` (magic, the job's secret, store id, rank), which the server
checks before anything else; then requests ``kind, blob`` (READ a blob's stored bytes, or BYE: "this
node is done, the job is ending") and replies ``status, length`` + bytes (OK, or REFUSED/FAILED and a
reason).  The server serves only whole blobs of its own store that it holds (placement gave them to it and the
job staged their layer), located by the index (a client names a blob, never a byte range), and
refuses (and logs) anything else.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import FanfsError, NotHeld
from ..store.format import shard_name
from ..store.sources import HeldShards, ShardSource
from ..util.sockets import recv_exactly
from .placement import Placement

log = logging.getLogger("fanfs")

MAGIC = b"FANFSPR1"
HELLO = struct.Struct("<8s32s16sI")  # magic, job secret, store id, rank
REQUEST = struct.Struct("<BQ")  # kind, blob
REPLY = struct.Struct("<BI")  # status, length of what follows
READ, BYE = 1, 2
OK, REFUSED, FAILED = 0, 1, 2
MAX_REASON = 1024
SILENT_SECONDS = 30.0  # a holder that timed out is not asked again for this long (it is skipped at once)
DEAD_SECONDS = 5.0  # a holder that refused the connection (not serving) is skipped for this long


def peer_host() -> str:
    """The address this node's peers reach it at: ``$FANFS_PEER_HOST`` (a name or IP on the fast
    network), else the address the host name resolves to."""
    name = os.environ.get("FANFS_PEER_HOST") or socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError as err:
        raise FanfsError(f"cannot resolve {name} for the peer connections ({err.strerror or err}): "
                         "set FANFS_PEER_HOST to this node's address") from None


class BlobLocator:
    """Where each blob lies (its file's shard; offset and size from the index), for a server."""

    def __init__(self, index: Any) -> None:
        files = np.flatnonzero((index.type == 1) & (index.count > 0))
        order = np.argsort(index.first[files], kind="stable")
        self._files = files[order]
        self._first = index.first[self._files].astype(np.int64)
        self._index = index

    def shard(self, blob: int) -> int:
        i = int(np.searchsorted(self._first, blob, side="right")) - 1
        entry = int(self._files[i])
        return int(self._index.shard[entry])


def listen(host: str) -> socket.socket:
    """A listening socket for peers on ``host``, on a port the system picks."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(128)
    return listener


class PeerServer:
    """Answers peers' blob requests from this node's local shards, one thread per connection."""

    def __init__(self, listener: socket.socket, index: Any, local: HeldShards, secret: bytes, store_id: bytes,
                 on_bye: Callable[[int], None]) -> None:
        """``local``: this node's staged share; only blobs it holds are served."""
        self.index = index
        self.local = local
        self.secret = secret
        self.store_id = store_id
        self.on_bye = on_bye
        self.locate = BlobLocator(index)
        self._listener = listener
        self.address = listener.getsockname()[:2]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.served_requests = self.served_bytes = self.refused = self.failed = 0

    def start(self) -> None:
        threading.Thread(target=self._accept, name="fanfs-peer-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name="fanfs-peer-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        try:
            conn.settimeout(10)
            magic, secret, store_id, rank = HELLO.unpack(recv_exactly(conn, HELLO.size))
            if magic != MAGIC or not hmac.compare_digest(secret, self.secret) or store_id != self.store_id:
                self.refused += 1
                log.warning("peer: refused a connection from %s: not of this job", peer[0])
                return
            conn.sendall(b"\0")
            conn.settimeout(None)
            while True:
                kind, blob = REQUEST.unpack(recv_exactly(conn, REQUEST.size))
                if kind == BYE:
                    self.on_bye(rank)
                    return
                conn.sendall(self._answer(rank, kind, blob))
        except (OSError, struct.error):
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _answer(self, rank: int, kind: int, blob: int) -> bytes:
        """The reply to one request: the blob's stored bytes, or a refusal with its reason."""
        reason = self._refusal(kind, blob)
        if reason:
            self.refused += 1
            log.warning("peer: refused request from rank %d: %s", rank, reason)
            text = reason.encode()[:MAX_REASON]
            return REPLY.pack(REFUSED, len(text)) + text
        ix = self.index
        shard, offset, length = self.locate.shard(blob), int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
        try:
            data = self.local.read(blob, shard, offset, length)
            if len(data) != length:
                raise OSError(errno.EIO, f"short read ({len(data)} of {length} bytes)")
        except (OSError, FanfsError) as err:
            self.failed += 1
            log.warning("peer: cannot serve blob %d (shard %s) to rank %d: %s", blob, shard_name(shard), rank, err)
            text = str(err).encode()[:MAX_REASON]
            return REPLY.pack(FAILED, len(text)) + text
        self.served_requests += 1
        self.served_bytes += length
        return REPLY.pack(OK, length) + data

    def _refusal(self, kind: int, blob: int) -> str:
        if kind != READ:
            return f"unknown request kind {kind}"
        if blob >= self.index.blob_offset.size:
            return f"no blob {blob} in this store"
        if not self.local.held[blob]:
            return f"blob {blob} is not held by this node (placed elsewhere, or in a layer not staged)"
        if not int(self.index.blob_stored[blob]):
            return f"blob {blob} is a hole: nothing to send"
        return ""

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stats(self) -> dict[str, int]:
        return {"served_requests": self.served_requests, "served_bytes": self.served_bytes,
                "refused": self.refused, "failed": self.failed}


class PeerClient:
    """Asks peers for blobs, each answer awaited at most ``timeout`` seconds; keeps idle connections."""

    def __init__(self, endpoints: list[tuple[str, int]], rank: int, secret: bytes, store_id: bytes,
                 timeout: float) -> None:
        self.endpoints = endpoints
        self.rank = rank
        self.timeout = timeout
        self._hello = HELLO.pack(MAGIC, secret, store_id, rank)
        self._idle: dict[int, queue.SimpleQueue] = {peer: queue.SimpleQueue() for peer in range(len(endpoints))}
        self._skip_until: dict[int, float] = {}
        self._lock = threading.Lock()
        self.requests = self.bytes = self.timeouts = self.failures = 0
        self.latency_total = self.latency_max = 0.0

    def _connect(self, peer: int) -> socket.socket:
        sock = socket.create_connection(self.endpoints[peer], timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(self._hello)
        if recv_exactly(sock, 1) != b"\0":
            raise OSError(errno.EACCES, "handshake refused")
        return sock

    def read(self, holder: int, blob: int) -> bytes:
        if time.monotonic() < self._skip_until.get(holder, 0.0):
            raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer lately; skipped")
        started = time.perf_counter()
        try:
            try:
                sock = self._idle[holder].get_nowait()
            except queue.Empty:
                sock = self._connect(holder)
            sock.settimeout(self.timeout)
            sock.sendall(REQUEST.pack(READ, blob))
            status, length = REPLY.unpack(recv_exactly(sock, REPLY.size))
            payload = recv_exactly(sock, length)
        except TimeoutError:
            self._give_up(holder, SILENT_SECONDS, timeout=True)
            log.warning("peer: rank %d did not answer within %g s (blob %d); asking the next holder",
                        holder, self.timeout, blob)
            raise TimeoutError(errno.ETIMEDOUT, f"rank {holder} did not answer within {self.timeout:g} s") from None
        except OSError as err:
            self._give_up(holder, DEAD_SECONDS, timeout=False)
            raise OSError(errno.EIO, f"rank {holder} is not serving ({err.strerror or err})") from None
        self._idle[holder].put(sock)
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
        return bytes(payload)

    def _give_up(self, holder: int, seconds: float, timeout: bool) -> None:
        with self._lock:
            self._skip_until[holder] = time.monotonic() + seconds
            if timeout:
                self.timeouts += 1
            else:
                self.failures += 1
        while True:  # its idle connections are as suspect as the one that failed
            try:
                self._idle[holder].get_nowait().close()
            except queue.Empty:
                break

    def say_bye(self) -> None:
        """Tell every peer this node is done (a dead or stopped peer costs at most a second, not a hang)."""
        for peer in range(len(self.endpoints)):
            if peer == self.rank:
                continue
            try:
                with socket.create_connection(self.endpoints[peer], timeout=1.0) as sock:
                    sock.settimeout(1.0)
                    sock.sendall(self._hello)
                    recv_exactly(sock, 1)
                    sock.sendall(REQUEST.pack(BYE, 0))
            except OSError:
                pass
        for idle in self._idle.values():
            while True:
                try:
                    idle.get_nowait().close()
                except queue.Empty:
                    break

    def stats(self) -> dict[str, float | int]:
        mean = self.latency_total / self.requests if self.requests else 0.0
        return {"remote_requests": self.requests, "remote_bytes_received": self.bytes, "remote_timeouts": self.timeouts,
                "remote_failures": self.failures, "remote_latency_mean_ms": round(mean * 1e3, 3),
                "remote_latency_max_ms": round(self.latency_max * 1e3, 3)}


class RemoteBlobs(ShardSource):
    """The ``choice``-th holder (in this reader's order) of a blob, other than this node.

    One source per choice, so that the store checks each holder's copy on its own and a bad or missing
    copy at one holder falls through to the next, like a bad local copy does.
    """

    def __init__(self, client: PeerClient, placement: Placement, staged: np.ndarray, choice: int) -> None:
        self.client = client
        self.placement = placement
        self.staged = staged
        self.choice = choice
        self.name = f"peer#{choice + 1}"

    def read(self, blob: int, shard: int, offset: int, length: int) -> bytes:
        if not self.staged[blob]:
            raise NotHeld(f"blob {blob} is in a layer no node staged")
        holders = self.placement.remote_holders(blob, self.client.rank)
        if self.choice >= len(holders):
            raise NotHeld(f"blob {blob} has no further holder")
        return self.client.read(holders[self.choice], blob)


def remote_sources(client: PeerClient, placement: Placement, staged: np.ndarray) -> list[RemoteBlobs]:
    """Sources for every other holder a blob can have (a node that holds none has ``replicas`` of them);
    ``staged``: the blobs the job staged (a bool per blob), the only ones a peer can have."""
    return [RemoteBlobs(client, placement, staged, choice) for choice in range(placement.replicas)]
