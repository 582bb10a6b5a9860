"""A node's blob server for its peers: to whom it serves, and with bounded resources (what it serves: :mod:`.peerreplies`).

It serves only to a member of the job (:mod:`.peerwire`).  Nothing another user on the node or the
network does can make it use more than a fixed amount of memory, descriptors and threads, or stop it
serving, and a member (even one gone wrong) cannot stop it serving the others:

* a fixed pool of ``THREADS`` threads serves every connection from one epoll set, each event whole by
  the thread that took it (``EPOLLONESHOT``: a connection belongs to one thread at a time);
* no thread ever waits on a connection.  A handshake is read a message at a time as its bytes arrive; a
  reply goes out as far as the socket takes it, and the rest waits in its connection's buffer, sent on as
  the reader takes it (``EPOLLOUT``).  The whole handshake has ``HANDSHAKE_SECONDS``, a request once begun
  (and a new channel's first request) ``REQUEST_SECONDS``, a reply ``SEND_SECONDS`` to be taken, however
  slowly the bytes trickle: past that the connection is closed.  (Replies used to be sent blocking: a
  member that asked for 28 MiB runs on four connections and read nothing pinned every thread for
  ``SEND_SECONDS``, and the node answered nobody.  Non-blocking sends hold for any number of such
  members, where a bound on blocked threads per member would not);
* a member's replies waiting to be taken hold at most ``MAX_WAITING_BYTES`` (and up to ``THREADS`` replies
  being made meanwhile, ``MAX_RUN_BYTES`` each): past it, that member's next requests wait until its
  replies are taken or dropped, so one that never reads costs a bounded amount of memory and only its
  own reads wait;
* at most ``MAX_PENDING`` connections may be unauthenticated at once, fewer if the process may open few
  descriptors (an eighth of its limit): one more closes the oldest (a member's handshake takes one
  round trip, so a flood cannot keep one out), and the node's own files always find a descriptor;
* a member keeps at most ``MAX_PER_PEER`` connections: past it, its least recently used idle channel is
  closed (its client opens another).  A channel not yet served, or busy, is never closed for it (more than
  ``MAX_PER_PEER`` processes of a node connecting at once lost fresh channels before their first request:
  a spurious EIO); with none idle, up to twice as many are kept, then a new one is refused;
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
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..store.sources import HeldShards
from .peerreplies import OncePerMinute, Replies
from .peerwire import BYE, MAX_RUN_BYTES, REPLY, REQUEST, REQUEST_FRAME, Channel, NodeKey, ServerHandshake, Untrusted

log = logging.getLogger("fanfs")

HANDSHAKE_SECONDS = 5.0
REQUEST_SECONDS = 10.0
SEND_SECONDS = 30.0  # a reply the reader does not take within this long: the connection is dropped
MAX_PENDING = 64
MAX_PER_PEER = 64
MAX_WAITING_BYTES = 2 * MAX_RUN_BYTES  # one member's replies not yet taken (a stalled reader's largest fits)
THREADS = 4
SWEEP_SECONDS = 0.25  # how often deadlines are checked while any is running
_READ = select.EPOLLIN | select.EPOLLONESHOT
_WRITE = select.EPOLLOUT | select.EPOLLONESHOT
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Conn:
    """One connection: its handshake until it has a channel, then the request being read or the reply being sent."""

    __slots__ = ("sock", "fd", "address", "handshake", "channel", "peer", "buf", "deadline", "owned", "doomed", "out",
                 "waiting", "served", "parked")

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
        self.out: list[bytes | memoryview] = []  # the frames of a reply the reader has not taken yet
        self.waiting = 0  # their bytes
        self.served = 0  # requests answered on it
        self.parked = False  # its next request waits for its member's replies to be taken

    @property
    def need(self) -> int:
        return self.handshake.need if self.handshake is not None else REQUEST_FRAME

    @property
    def idle(self) -> bool:
        """A channel that was served and waits for its client's next request (which may open another)."""
        return bool(self.served) and not (self.owned or self.out or self.buf or self.parked)


class PeerServer:
    """Answers the job's peers from this node's staged share (``local``: only blobs it holds are served)."""

    def __init__(self, listener: socket.socket, index: Any, local: HeldShards, key: NodeKey, publics: list[bytes],
                 rank: int, store_id: bytes, on_bye: Callable[[int], None], threads: int = THREADS) -> None:
        self.on_bye = on_bye
        self._warn = OncePerMinute()
        self.replies = Replies(index, local, self._warn)
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
        self._members: dict[int, OrderedDict[int, _Conn]] = {}  # rank -> its channels, least recently used first
        self._timed: set[_Conn] = set()  # channels owing something by their deadline: a request, or taking a reply
        self._waiting: dict[int, int] = {}  # rank -> bytes of its replies not yet taken
        self._parked: dict[int, set[_Conn]] = {}  # rank -> its channels whose next request waits for that to shrink
        self._closing = False
        self._listening_again = 0.0  # while out of descriptors: when to try accept again (0: listening)
        self._backoff = 0.05
        self._next_sweep = 0.0
        self._threads = [threading.Thread(target=self._serve, name="fanfs-peer", daemon=True) for _ in range(threads)]

    def start(self) -> None:
        self._epoll.register(self._listener.fileno(), _READ)
        self._epoll.register(self._wake_r, select.EPOLLIN)  # level-triggered: wakes every thread at close
        for thread in self._threads:
            thread.start()

    # --- the pool: every thread takes the next event ---------------------------------------------

    def _serve(self) -> None:
        listener, wake = self._listener.fileno(), self._wake_r
        while not self._closing:
            with self._lock:
                idle = not self._pending and not self._timed and not self._listening_again
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
                self._epoll.register(conn.fd, _READ)
        try:
            self._epoll.modify(self._listener.fileno(), _READ)
        except OSError:
            pass  # closed meanwhile

    def _event(self, fd: int) -> None:
        with self._lock:
            conn = self._conns.get(fd)
            if conn is None or conn.owned:
                return  # gone, or a stale event for a number reused: its owner re-arms it
            conn.owned = True
        try:
            keep = self._send(conn) if conn.out else self._step(conn)
        except Exception:
            log.exception("peer: failed to serve %s", conn.address)
            keep = False
        with self._lock:
            conn.owned = False
            if not keep or conn.doomed or self._closing:
                self._discard(conn)
            elif not conn.parked:
                self._epoll.modify(fd, _WRITE if conn.out else _READ)

    def _step(self, conn: _Conn) -> bool:
        """Read what came, act on a whole message; whether to keep the connection."""
        if conn.channel is not None and not conn.buf and self._park(conn):
            return True
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
                with self._lock:
                    conn.deadline = time.monotonic() + REQUEST_SECONDS
                    self._timed.add(conn)
            return True
        message, conn.buf = bytes(conn.buf), bytearray()
        try:
            if conn.handshake is None:
                return self._request(conn, message)
            if conn.handshake.peer < 0:
                conn.sock.send(conn.handshake.hello(message))  # 64 bytes into an empty buffer: whole or not at all
                return True
            return self._authenticated(conn, conn.handshake.proof(message))
        except (Untrusted, ValueError, struct.error) as err:
            self.replies.count_refused()
            self._warn.warn("refused", "refused a connection from %s: %s", conn.address, err)
            return False

    def _authenticated(self, conn: _Conn, channel: Channel) -> bool:
        """Make ``conn`` one of its member's channels (its first request due in REQUEST_SECONDS); False: refused,
        the member has too many busy ones."""
        assert conn.handshake is not None
        conn.channel, conn.peer, conn.handshake = channel, conn.handshake.peer, None
        with self._lock:
            del self._pending[conn.fd]
            mine = self._members.setdefault(conn.peer, OrderedDict())
            if len(mine) >= MAX_PER_PEER:  # back to the bound: close idle channels, least recently used first
                for idle in [c for c in mine.values() if c.idle][:len(mine) - MAX_PER_PEER + 1]:
                    self._discard(idle)
                if len(mine) >= 2 * MAX_PER_PEER:
                    self._warn.warn("busy", "rank %d has %d channels, none idle: refusing one more", conn.peer, len(mine))
                    return False
            mine[conn.fd] = conn
            conn.deadline = time.monotonic() + REQUEST_SECONDS
            self._timed.add(conn)
        return True

    def _request(self, conn: _Conn, message: bytes) -> bool:
        """Answer one request: the blob's sealed bytes or a refusal; whether the connection stays."""
        assert conn.channel is not None
        kind, blob, count = REQUEST.unpack(conn.channel.open(message))
        if kind == BYE:
            self.on_bye(conn.peer)
            return False
        status, payload = self.replies.answer(conn.peer, kind, blob, count)
        conn.out = [conn.channel.seal(REPLY.pack(status, len(payload))), conn.channel.seal(payload)]
        with self._lock:
            conn.served += 1
            conn.waiting = len(conn.out[0]) + len(conn.out[1])
            self._waiting[conn.peer] = self._waiting.get(conn.peer, 0) + conn.waiting
            conn.deadline = time.monotonic() + SEND_SECONDS
            self._timed.add(conn)
            mine = self._members.get(conn.peer, {})
            if conn.fd in mine:
                mine.move_to_end(conn.fd)  # the least recently used idle channel is the next to close
        return self._send(conn)

    def _send(self, conn: _Conn) -> bool:
        """Send as much of the reply as the socket takes now, never waiting for the reader; whether the connection
        stays (the rest goes when the socket is writable again: ``_event`` arms EPOLLOUT)."""
        try:
            sent = conn.sock.sendmsg(conn.out, (), socket.MSG_NOSIGNAL)  # both frames in one call, not joined
        except BlockingIOError:
            sent = 0
        except OSError:
            return False  # the reader went away
        taken = sent
        while conn.out and taken >= len(conn.out[0]):
            taken -= len(conn.out.pop(0))
        if taken:
            conn.out[0] = memoryview(conn.out[0])[taken:]
        with self._lock:
            self._release(conn, sent)
            if not conn.out:
                self._timed.discard(conn)
        return True

    # --- what a member holds (callers hold the lock, but _park) --------------------------------------

    def _park(self, conn: _Conn) -> bool:
        """Whether ``conn``'s next request must wait: its member's replies not yet taken are too many bytes."""
        with self._lock:
            if self._waiting.get(conn.peer, 0) < MAX_WAITING_BYTES:
                return False
            conn.parked = True
            self._parked.setdefault(conn.peer, set()).add(conn)
            return True

    def _release(self, conn: _Conn, sent: int) -> None:
        """``sent`` bytes of ``conn``'s reply were taken (or dropped): below the bound, its member's requests go on."""
        sent = min(sent, conn.waiting)
        conn.waiting -= sent
        left = self._waiting.get(conn.peer, 0) - sent
        if left > 0:
            self._waiting[conn.peer] = left
        else:
            self._waiting.pop(conn.peer, None)
        if left < MAX_WAITING_BYTES:
            for parked in self._parked.pop(conn.peer, ()):
                parked.parked = False
                if not parked.owned:  # else the thread that owns it arms it
                    self._epoll.modify(parked.fd, _READ)

    # --- deadlines and the end of connections (callers hold the lock) ------------------------------

    def _sweep(self) -> None:
        """Close what ran out of time (handshakes, requests, replies not taken); listen again after a back-off."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_sweep:
                return
            self._next_sweep = now + SWEEP_SECONDS
            if self._listening_again and now >= self._listening_again and not self._closing:
                self._listening_again = 0.0
                self._epoll.modify(self._listener.fileno(), _READ)
            late = [c for c in (*self._pending.values(), *self._timed)
                    if c.deadline < now and not c.owned and not c.parked]  # a parked one waits on its member, not late
            for conn in late:
                what = ("finish its handshake" if conn.handshake is not None else
                        "take its reply" if conn.out else "send a request")
                self._warn.warn(what, "%s took too long to %s: closed", conn.address, what)
                self._discard(conn)

    def _discard(self, conn: _Conn) -> None:
        """Forget a connection and close it (or, while a thread handles it, have that thread close it)."""
        self._conns.pop(conn.fd, None)
        self._pending.pop(conn.fd, None)
        self._members.get(conn.peer, {}).pop(conn.fd, None)
        self._timed.discard(conn)
        self._parked.get(conn.peer, set()).discard(conn)
        self._release(conn, conn.waiting)  # what it held no longer counts against its member
        if conn.owned:
            conn.doomed = True
            return
        conn.out = []
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        conn.sock.close()

    def close(self) -> None:
        """Stop accepting and serving; returns once every thread of the server has ended."""
        with self._lock:
            self._closing = True
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=REQUEST_SECONDS)
        if any(thread.is_alive() for thread in self._threads):
            return  # a thread stuck past every deadline (a local read?): its descriptors go with the process
        for conn in list(self._conns.values()):
            self._discard(conn)
        self._epoll.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def stats(self) -> dict[str, int]:
        return self.replies.stats()
