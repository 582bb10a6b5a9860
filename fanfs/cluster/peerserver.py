"""A node's blob server for its peers: what it serves, to whom, and with bounded resources.

It serves only whole blobs of its own store that it holds (placement gave them to it and the job
staged their layer), located by the index (a client names blobs, never a byte range), and only to a
member of the job (:mod:`.peerwire`).  Nothing another user on the node or the network does can make
it use more than a fixed amount of memory, descriptors and threads, or stop it serving:

* a fixed pool of ``THREADS`` threads serves every connection from one epoll set, each event whole by
  the thread that took it (``EPOLLONESHOT``: a connection belongs to one thread at a time, and a
  request is answered by the thread that read it: no hand-over between threads on the way);
* a handshake is read a message at a time as its bytes arrive, never by a thread waiting on it; the
  whole handshake has ``HANDSHAKE_SECONDS`` and a request once begun ``REQUEST_SECONDS``, however
  slowly its bytes trickle in;
* at most ``MAX_PENDING`` connections may be unauthenticated at once, fewer if the process may open few
  descriptors (an eighth of its limit): one more closes the oldest (a member's handshake takes one
  round trip, so a flood cannot keep one out), and the node's own files always find a descriptor;
* a member keeps at most ``MAX_PER_PEER`` connections (its oldest goes);
* ``accept`` failing for want of descriptors (EMFILE/ENFILE) is logged once a minute and retried after a
  back-off; it never stops the server.
Idle, every thread blocks in epoll: no polling.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import select
import socket
import struct
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..store.format import shard_name
from ..store.sources import HeldShards
from .peerwire import BYE, FAILED, MAX_REASON, MAX_RUN, MAX_RUN_BYTES, OK, READ, REFUSED, REPLY, REQUEST, \
    REQUEST_FRAME, Channel, NodeKey, ServerHandshake, Untrusted

log = logging.getLogger("fanfs")

HANDSHAKE_SECONDS = 5.0
REQUEST_SECONDS = 10.0
SEND_SECONDS = 30.0  # a reply the reader does not take within this long: the connection is dropped
MAX_PENDING = 64
MAX_PER_PEER = 64
THREADS = 4
SWEEP_SECONDS = 0.25  # how often deadlines are checked while any is running
REPORT_EVERY = 60.0
_ARMED = select.EPOLLIN | select.EPOLLONESHOT
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class BlobLocator:
    """Where each blob lies (its file's shard; offset and size from the index), for a server."""

    def __init__(self, index: Any) -> None:
        files = np.flatnonzero((index.type == 1) & (index.count > 0))
        files = files[np.argsort(index.first[files], kind="stable")]
        self._first = index.first[files].tolist()  # bisect on a list: ~1 us, numpy's searchsorted on a scalar ~5
        self._shard = index.shard[files].tolist()

    def shard(self, blob: int) -> int:
        return self._shard[bisect_right(self._first, blob) - 1]


class _Conn:
    """One connection: its handshake until it has a channel, then the request being read."""

    __slots__ = ("sock", "fd", "address", "handshake", "channel", "peer", "buf", "deadline", "owned", "doomed")

    def __init__(self, sock: socket.socket, address: str, handshake: ServerHandshake) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.address = address
        self.handshake: ServerHandshake | None = handshake
        self.channel: Channel | None = None
        self.peer = -1
        self.buf = bytearray()
        self.deadline = time.monotonic() + HANDSHAKE_SECONDS
        self.owned = False  # a thread is handling it (it is out of the epoll set until re-armed)
        self.doomed = False  # to be closed by the thread that owns it

    @property
    def need(self) -> int:
        return self.handshake.need if self.handshake is not None else REQUEST_FRAME


class _Limited:
    """A log line at most once a minute per kind of event; how many were not logged is said next time."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -REPORT_EVERY) < REPORT_EVERY:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return
        self._last[kind] = now
        quiet = self._quiet.pop(kind, 0)
        log.warning("peer: " + message + (f" ({quiet} more like it in the last minute)" if quiet else ""), *args)


class PeerServer:
    """Answers the job's peers from this node's staged share (``local``: only blobs it holds are served)."""

    def __init__(self, listener: socket.socket, index: Any, local: HeldShards, key: NodeKey, publics: list[bytes],
                 rank: int, store_id: bytes, on_bye: Callable[[int], None], threads: int = THREADS) -> None:
        self.index = index
        self.local = local
        self.on_bye = on_bye
        self.locate = BlobLocator(index)
        self._handshake = lambda: ServerHandshake(key, publics, store_id, rank)
        self._listener = listener
        listener.setblocking(False)
        self.address = listener.getsockname()[:2]
        self._max_pending = max(4, min(MAX_PENDING, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 8))
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()  # everything below, shared by the pool's threads
        self._conns: dict[int, _Conn] = {}
        self._pending: OrderedDict[int, _Conn] = OrderedDict()  # unauthenticated, oldest first
        self._members: dict[int, OrderedDict[int, _Conn]] = {}  # rank -> its connections, oldest first
        self._partial: set[_Conn] = set()  # member connections with a request begun
        self._closing = False
        self._listening_again = 0.0  # while out of descriptors: when to try accept again (0: listening)
        self._backoff = 0.05
        self._next_sweep = 0.0
        self._warn = _Limited()
        self._threads = [threading.Thread(target=self._serve, name="fanfs-peer", daemon=True) for _ in range(threads)]
        self.served_requests = self.served_bytes = self.refused = self.failed = 0

    def start(self) -> None:
        self._epoll.register(self._listener.fileno(), _ARMED)
        self._epoll.register(self._wake_r, select.EPOLLIN)  # level-triggered: wakes every thread at close
        for thread in self._threads:
            thread.start()

    # --- the pool: every thread takes the next event ---------------------------------------------

    def _serve(self) -> None:
        listener, wake = self._listener.fileno(), self._wake_r
        while not self._closing:
            with self._lock:
                idle = not self._pending and not self._partial and not self._listening_again
            for fd, _ in self._epoll.poll(None if idle else SWEEP_SECONDS, 1):
                if fd == listener:
                    self._accept()
                elif fd != wake:
                    self._event(fd)
            self._sweep()

    def _accept(self) -> None:
        """Accept what is waiting, then listen again (or rest a while when out of descriptors)."""
        while not self._closing:
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                self._backoff = 0.05
                break
            except OSError as err:
                if err.errno not in _OUT_OF_DESCRIPTORS:
                    continue  # ECONNABORTED and the like: that one connection is gone, not the listener
                with self._lock:
                    self._warn.warn("fds", "cannot accept connections (%s): %d waiting handshakes, %d member "
                                    "connections; retrying in %.2f s", os.strerror(err.errno), len(self._pending),
                                    len(self._conns) - len(self._pending), self._backoff)
                    self._listening_again = time.monotonic() + self._backoff
                self._backoff = min(1.0, self._backoff * 2)
                return  # not re-armed: the sweep re-arms the listener when the back-off is over
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, address[0], self._handshake())
            with self._lock:
                if len(self._pending) >= self._max_pending:
                    self._warn.warn("pending", "more than %d unfinished handshakes at once (latest from %s): "
                                    "dropping the oldest", self._max_pending, address[0])
                    self._discard(next(iter(self._pending.values())))
                self._pending[conn.fd] = conn
                self._conns[conn.fd] = conn
                self._epoll.register(conn.fd, _ARMED)
        try:
            self._epoll.modify(self._listener.fileno(), _ARMED)
        except OSError:
            pass  # closed meanwhile

    def _event(self, fd: int) -> None:
        with self._lock:
            conn = self._conns.get(fd)
            if conn is None or conn.owned:
                return  # gone, or a stale event for a number reused: its owner re-arms it
            conn.owned = True
        try:
            keep = self._step(conn)
        except Exception:
            log.exception("peer: failed to serve %s", conn.address)
            keep = False
        with self._lock:
            conn.owned = False
            if keep and not conn.doomed and not self._closing:
                self._epoll.modify(fd, _ARMED)
            else:
                self._discard(conn)

    def _step(self, conn: _Conn) -> bool:
        """Read what came, act on a whole message; whether to keep the connection."""
        try:
            data = conn.sock.recv(conn.need - len(conn.buf))
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        begun = not conn.buf
        conn.buf += data
        if len(conn.buf) < conn.need:
            if begun and conn.handshake is None:  # a request has begun: it must end in time
                conn.deadline = time.monotonic() + REQUEST_SECONDS
                with self._lock:
                    self._partial.add(conn)
            return True
        message, conn.buf = bytes(conn.buf), bytearray()
        try:
            if conn.handshake is None:
                if not begun:
                    with self._lock:
                        self._partial.discard(conn)
                return self._request(conn, message)
            if conn.handshake.peer < 0:
                conn.sock.send(conn.handshake.hello(message))  # 64 bytes into an empty buffer: whole or not at all
                return True
            self._authenticated(conn, conn.handshake.proof(message))
            return True
        except (Untrusted, ValueError, struct.error) as err:
            with self._lock:
                self.refused += 1
                self._warn.warn("refused", "refused a connection from %s: %s", conn.address, err)
            return False

    def _authenticated(self, conn: _Conn, channel: Channel) -> None:
        assert conn.handshake is not None
        conn.channel, conn.peer, conn.handshake = channel, conn.handshake.peer, None
        conn.deadline = float("inf")
        with self._lock:
            del self._pending[conn.fd]
            mine = self._members.setdefault(conn.peer, OrderedDict())
            if len(mine) >= MAX_PER_PEER:
                self._discard(next(iter(mine.values())))
            mine[conn.fd] = conn

    def _request(self, conn: _Conn, message: bytes) -> bool:
        """Answer one request: the blob's sealed bytes or a refusal; whether the connection stays."""
        assert conn.channel is not None
        kind, blob, count = REQUEST.unpack(conn.channel.open(message))
        if kind == BYE:
            self.on_bye(conn.peer)
            return False
        status, payload = self._answer(conn.peer, kind, blob, count)
        header, body = conn.channel.seal(REPLY.pack(status, len(payload))), conn.channel.seal(payload)
        try:
            try:
                sent = conn.sock.sendmsg([header, body])  # both frames in one call, without joining them
            except BlockingIOError:
                sent = 0
            if sent < len(header) + len(body):  # the socket buffer is full: wait for the reader, not for ever
                conn.sock.settimeout(SEND_SECONDS)
                if sent < len(header):
                    conn.sock.sendall(header[sent:])
                conn.sock.sendall(memoryview(body)[max(0, sent - len(header)):])
                conn.sock.setblocking(False)
        except OSError:
            return False  # the reader went away or stopped reading: its connection goes
        return True

    def _answer(self, rank: int, kind: int, first: int, count: int) -> tuple[int, bytes]:
        """The stored bytes of blobs ``first .. first + count - 1``, back to back, or a refusal with its reason."""
        reason = self._refusal(kind, first, count)
        if reason:
            with self._lock:
                self.refused += 1
                self._warn.warn("request", "refused a request from rank %d: %s", rank, reason)
            return REFUSED, reason.encode()[:MAX_REASON]
        ix = self.index
        shard = self.locate.shard(first)
        parts = []
        try:
            for blob in range(first, first + count):
                offset, length = int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
                data = self.local.read(blob, shard, offset, length)
                if len(data) != length:
                    raise OSError(errno.EIO, f"short read of blob {blob} ({len(data)} of {length} bytes)")
                parts.append(data)
        except (OSError, FanfsError) as err:
            with self._lock:
                self.failed += 1
                self._warn.warn("failed", "cannot serve blob %d (shard %s) to rank %d: %s", first, shard_name(shard),
                                rank, err)
            return FAILED, str(err).encode()[:MAX_REASON]
        payload = parts[0] if count == 1 else b"".join(parts)
        with self._lock:
            self.served_requests += 1
            self.served_bytes += len(payload)
        return OK, payload

    def _refusal(self, kind: int, first: int, count: int) -> str:
        if kind != READ:
            return f"unknown request kind {kind}"
        if not 1 <= count <= MAX_RUN:
            return f"a run of {count} blobs (1 to {MAX_RUN} may be asked at once)"
        if first + count > self.index.blob_offset.size:
            return f"no blob {first + count - 1} in this store"
        run, named = slice(first, first + count), f"blob {first}" if count == 1 else f"blobs {first}..{first + count - 1}"
        if not self.local.held[run].all():
            return f"{named}: not held by this node (placed elsewhere, or in a layer not staged)"
        if not self.index.blob_stored[run].all():
            return f"{named}: a hole, nothing to send"
        if count > 1 and (self.locate.shard(first) != self.locate.shard(first + count - 1)
                          or int(self.index.blob_stored[run].sum()) > MAX_RUN_BYTES):
            return f"{named}: span shards or more than {MAX_RUN_BYTES >> 20} MiB"
        return ""

    # --- deadlines and the end of connections (callers hold the lock) ------------------------------

    def _sweep(self) -> None:
        """Close handshakes and begun requests that ran out of time; listen again after a back-off."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_sweep:
                return
            self._next_sweep = now + SWEEP_SECONDS
            if self._listening_again and now >= self._listening_again and not self._closing:
                self._listening_again = 0.0
                self._epoll.modify(self._listener.fileno(), _ARMED)
            late = [c for c in (*self._pending.values(), *self._partial) if c.deadline < now and not c.owned]
            for conn in late:
                self._warn.warn("slow", "%s took too long to %s: closed", conn.address,
                                "finish its handshake" if conn.handshake is not None else "send a request")
                self._discard(conn)

    def _discard(self, conn: _Conn) -> None:
        """Forget a connection and close it (or, while a thread handles it, have that thread close it)."""
        self._conns.pop(conn.fd, None)
        self._pending.pop(conn.fd, None)
        self._members.get(conn.peer, {}).pop(conn.fd, None)
        self._partial.discard(conn)
        if conn.owned:
            conn.doomed = True
            return
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        conn.sock.close()

    def close(self) -> None:
        """Stop accepting and serving; returns once every thread of the server has ended."""
        with self._lock:
            self._closing = True
            for conn in self._conns.values():
                if conn.owned:  # a reply stuck on a reader that stopped reading ends now
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=SEND_SECONDS)
        if any(thread.is_alive() for thread in self._threads):
            return  # a thread stuck past every deadline: its descriptors go with the process
        for conn in list(self._conns.values()):
            self._discard(conn)
        self._epoll.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def stats(self) -> dict[str, int]:
        return {"served_requests": self.served_requests, "served_bytes": self.served_bytes,
                "refused": self.refused, "failed": self.failed}
