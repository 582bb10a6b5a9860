"""Issues 11 and 17: a node's peer server serves only whole blobs of its own store that placement gave it,
and only to members of its job, with bounded resources whatever anyone else on the node or network does.

In-process or in a subprocess: the server and its clients are plain sockets, no MPI, so this runs without
a launcher (tests/test_cluster.py runs the same protocol between real mpiexec ranks).
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import xxhash
from fanfs_command import fanfs

from fanfs.peers import peerserver
from fanfs.peers.peer import PeerClient, listen
from fanfs.peers.peerserver import PeerServer
from fanfs.peers.peerwire import (BYE, CLIENT_PROOF, HELLO, MAGIC, MAX_RUN, OK, REPLY, REQUEST, SERVER_PROOF,
                                    NodeKey, ServerHandshake, connect)
from fanfs.peers.placement import place
from fanfs.store import Store
from fanfs.store.format import SHARD_DIR
from fanfs.store.sources import HeldShards
from fanfs.util.files import readable

KEYS = [NodeKey(), NodeKey()]  # rank 0: the client; rank 1: the server
PUBLICS = [k.public for k in KEYS]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("peer")
    (base / "src").mkdir()
    for i in range(40):
        (base / "src" / f"f{i}.bin").write_bytes(os.urandom(2000 + 100 * i))
    fanfs("pack", base / "src", base / "store", "--quiet")
    return base / "store"


@pytest.fixture(scope="module")
def served(packed):
    store = Store(str(packed))
    placement = place(store.index.blob_stored, 2, 1)
    byes = []
    held = HeldShards(str(packed / SHARD_DIR), store.id, placement.held(1))
    server = PeerServer(listen("127.0.0.1"), store.index, held, KEYS[1], PUBLICS, 1, store.id, on_bye=byes.append)
    server.start()
    yield store, placement, server, byes
    server.close()
    store.close()


def client(server, store, key=KEYS[0], timeout=5.0) -> PeerClient:
    return PeerClient([("127.0.0.1", 1), server.address], PUBLICS, 0, key, store.id, store.index.blob_stored, timeout)


def mine(store, placement, node=1) -> list[int]:
    return [b for b in range(store.index.blob_offset.size) if placement.holds(node, b)]


def test_held_blobs_are_served_exactly(served):
    store, placement, server, _ = served
    c = client(server, store)
    for blob in mine(store, placement):
        data = c.read(1, blob)
        assert len(data) == int(store.index.blob_stored[blob])
        assert int(store.index.blob_checksum[blob]) == xxhash.xxh3_64_intdigest(data)
    assert server.stats()["served_requests"] >= len(mine(store, placement))
    counters = c.counters()
    assert counters["remote_requests"] == len(mine(store, placement)) and np.isfinite(counters["remote_latency_total_ms"])


def test_a_channel_the_holder_closed_while_idle_is_replaced_not_failed(served, monkeypatch):
    """A holder keeps a member's newest MAX_PER_PEER connections and closes the oldest, and every serving process
    and in-process reader of a node speaks as that node: a reader whose idle channel went so reads on through a
    new one (it was an EIO, and the holder skipped for seconds)."""
    store, placement, server, _ = served
    monkeypatch.setattr(peerserver, "MAX_PER_PEER", 2)
    blob = mine(store, placement)[0]
    readers = [client(server, store) for _ in range(3)]
    for reader in readers:  # the third's connection makes the holder close the first's
        assert len(reader.read(1, blob)) == int(store.index.blob_stored[blob])
    assert len(readers[0].read(1, blob)) == int(store.index.blob_stored[blob])
    assert readers[0].counters()["remote_failures"] == 0
    for reader in readers:
        reader.close()


def test_what_must_not_be_served_is_refused(served):
    store, placement, server, _ = served
    c = client(server, store)
    theirs = next(b for b in range(store.index.blob_offset.size) if not placement.holds(1, b))
    for blob, why in ((theirs, "not held by this node"), (10**9, "no blob")):
        with pytest.raises(OSError, match=why):
            c.read(1, blob)


def test_a_run_of_blobs_is_one_round_trip_and_checked_whole(served):
    store, placement, server, _ = served
    held = mine(store, placement)
    first, count = held[0], min(MAX_RUN, len(held))
    c = client(server, store)
    before = server.stats()["served_requests"]
    run = c.read(1, first, count)
    assert run == b"".join(c.read(1, blob) for blob in range(first, first + count))
    assert server.stats()["served_requests"] == before + 1 + count
    assert first > 0 and not placement.holds(1, first - 1)
    for blob, n, why in ((first, 0, "a run of 0 blobs"), (first, MAX_RUN + 1, f"a run of {MAX_RUN + 1} blobs"),
                         (first - 1, 2, "not held"), (store.index.blob_offset.size - 1, 2, "no blob")):
        with pytest.raises(OSError, match=why):
            c.read(1, blob, n)
    short = PeerClient([("127.0.0.1", 1), server.address], PUBLICS, 0, KEYS[0], store.id,
                       store.index.blob_stored + 1, 5.0)  # a client that expects one byte more per blob
    with pytest.raises(OSError, match="announced"):
        short.read(1, first, 2)


def raw_hello(store, rank=0, server=1, magic=MAGIC) -> bytes:
    return HELLO.pack(magic, store.id, rank, server, os.urandom(32))


def closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the other end closes the connection (without sending anything more) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_outsiders_are_refused_and_learn_nothing(served, monkeypatch):
    store, placement, server, byes = served
    monkeypatch.setattr(peerserver, "REQUEST_SECONDS", 3600.0)  # a channel made would wait for its request: for long
    refused = server.stats()["refused"]
    blob = mine(store, placement)[0]
    with pytest.raises(OSError) as info:  # a key not of the job, claiming to be rank 0
        client(server, store, key=NodeKey()).read(1, blob)
    assert info.value.errno == errno.EIO and "is not rank 1 of this job" in str(info.value)
    for hello in (raw_hello(store, magic=b"FANFSPR1"), raw_hello(store, rank=7), raw_hello(store, server=0),
                  b"GET / HTTP/1.0\r\n\r\n" + bytes(64)):
        with socket.create_connection(server.address) as sock:
            sock.sendall(hello[:HELLO.size])
            assert closed(sock), hello  # not a single byte back
    with socket.create_connection(server.address) as sock:  # a member's hello, then a made-up proof: closed then
        sock.sendall(raw_hello(store))
        sock.recv(SERVER_PROOF.size, socket.MSG_WAITALL)
        sock.sendall(os.urandom(CLIENT_PROOF.size))
        assert closed(sock)
    with socket.create_connection(server.address) as sock:  # the old protocol's BYE: nothing happens
        sock.sendall(b"FANFSPR1" + bytes(32) + store.id + bytes(4) + bytes([BYE]) + bytes(8))
        assert closed(sock)
    assert byes == []
    assert server.stats()["refused"] >= refused + 6  # the outsider client gave up itself: no proof sent


def test_a_squatter_on_a_peers_port_gets_no_secret(served):
    """A process that took over a dead daemon's port sees only a hello: no secret, no proof, no request."""
    store, placement, server, _ = served
    squatter = listen("127.0.0.1")
    heard = bytearray()

    def answer():
        conn, _ = squatter.accept()
        with conn:
            conn.settimeout(5)
            heard.extend(conn.recv(4096))
            conn.sendall(os.urandom(SERVER_PROOF.size))  # a guess at the proof
            try:
                while data := conn.recv(4096):
                    heard.extend(data)
            except OSError:
                pass

    thread = threading.Thread(target=answer)
    thread.start()
    c = PeerClient([("127.0.0.1", 1), squatter.getsockname()[:2]], PUBLICS, 0, KEYS[0], store.id,
                   store.index.blob_stored, 5.0)
    with pytest.raises(OSError, match="is not rank 1"):
        c.read(1, mine(store, placement)[0])
    thread.join(10)
    squatter.close()
    assert len(heard) == HELLO.size  # the hello alone: magic, store id, ranks, a fresh nonce
    assert KEYS[0].pair_secret(PUBLICS[1]) not in heard


class Recorder:
    """A TCP relay between a client and the server that records what the client sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.listener = listen("127.0.0.1")
        self.address = self.listener.getsockname()[:2]
        self.sent = bytearray()
        self.target = target
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        conn, _ = self.listener.accept()
        upstream = socket.create_connection(self.target)

        def back():
            while data := upstream.recv(1 << 16):
                conn.sendall(data)
        replies = threading.Thread(target=back, daemon=True)
        replies.start()
        while data := conn.recv(1 << 16):
            self.sent.extend(data)
            upstream.sendall(data)
        upstream.shutdown(socket.SHUT_RDWR)  # ends back()'s recv; closing under it raised EBADF in its thread
        replies.join(10)
        upstream.close()


def test_a_recorded_session_replays_nowhere(served):
    store, placement, server, _ = served
    blob = mine(store, placement)[0]
    recorder = Recorder(server.address)
    c = PeerClient([("127.0.0.1", 1), recorder.address], PUBLICS, 0, KEYS[0], store.id, store.index.blob_stored, 5.0)
    assert len(c.read(1, blob)) == int(store.index.blob_stored[blob])
    c.close()  # the recorded session ends
    recorder.thread.join(10)
    recording = bytes(recorder.sent)
    assert len(recording) == HELLO.size + CLIENT_PROOF.size + REQUEST.size + 16
    served_before = server.stats()["served_requests"]
    with socket.create_connection(server.address) as sock:
        sock.sendall(recording[:HELLO.size])
        fresh = sock.recv(SERVER_PROOF.size, socket.MSG_WAITALL)  # the server's nonce is new: the proof differs
        sock.sendall(recording[HELLO.size:])
        assert closed(sock)
    assert len(fresh) == SERVER_PROOF.size
    assert server.stats()["served_requests"] == served_before


def fake_member_server(store, reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """A server holding rank 1's real key that answers every request with ``reply`` (status, length) and nothing
    more: a member gone wrong, or an attacker who stole a key."""
    listener = listen("127.0.0.1")

    def run():
        conn, _ = listener.accept()
        with conn:
            shake = ServerHandshake(KEYS[1], PUBLICS, store.id, 1)
            conn.sendall(shake.hello(conn.recv(HELLO.size, socket.MSG_WAITALL)))
            channel = shake.proof(conn.recv(CLIENT_PROOF.size, socket.MSG_WAITALL))
            channel.open(conn.recv(REQUEST.size + 16, socket.MSG_WAITALL))
            conn.sendall(channel.seal(reply))
            time.sleep(3)  # keep the connection open: a client waiting for the payload would time out

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.slow
@pytest.mark.parametrize("status,length", [(OK, 1 << 30), (OK, 1), (2, 1 << 20)])
def test_a_reply_longer_than_the_blob_is_refused_before_it_is_read(served, status, length):
    store, placement, _, _ = served
    listener, thread = fake_member_server(store, REPLY.pack(status, length))
    c = PeerClient([("127.0.0.1", 1), listener.getsockname()[:2]], PUBLICS, 0, KEYS[0], store.id,
                   store.index.blob_stored, timeout=2.0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(OSError) as info:
        c.read(1, mine(store, placement)[0])
    assert info.value.errno == errno.EIO and "announced" in str(info.value)  # not a timeout: refused at once
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100_000  # KiB: nothing of 1 GiB allocated
    thread.join(10)
    listener.close()


def test_bye_only_from_a_member(served):
    store, _, server, byes = served
    sock, channel = connect(server.address, KEYS[0], PUBLICS[1], store.id, 0, 1, time.monotonic() + 5)
    with sock:
        sock.sendall(channel.seal(REQUEST.pack(BYE, 0, 0)))
        assert closed(sock)
    assert byes == [0]
    byes.clear()


@pytest.mark.slow
def test_slow_and_idle_connections_cost_no_threads_and_end(served, monkeypatch):
    """300 connections trickling a byte at a time: no thread each, the oldest dropped past the cap (with a handshake
    deadline of an hour, nothing else closes them), a member served all the while; and connections trickling still
    are closed at their handshake deadline."""
    store, placement, server, _ = served

    def server_threads() -> int:  # the server's own (other tests' helper threads come and go meanwhile)
        return sum(thread.name.startswith("fanfs-peer") for thread in threading.enumerate())

    threads = server_threads()
    slow: list[socket.socket] = []
    try:
        with monkeypatch.context() as patched:
            patched.setattr(peerserver, "HANDSHAKE_SECONDS", 3600.0)
            slow += [socket.create_connection(server.address) for _ in range(300)]
            for sock in slow:
                sock.sendall(b"F")
            c = client(server, store)
            for blob in mine(store, placement)[:5]:
                assert len(c.read(1, blob)) == int(store.index.blob_stored[blob])
            assert all(closed(sock, timeout=60) for sock in slow[:300 - peerserver.MAX_PENDING])  # past the cap
            assert server_threads() == threads == peerserver.THREADS
        late = [socket.create_connection(server.address) for _ in range(8)]  # the real deadline
        slow += late
        for sock in late:
            sock.sendall(b"F")
        for sock in late:
            sock.sendall(b"A")  # still trickling
        assert all(closed(sock, timeout=peerserver.HANDSHAKE_SECONDS + 60) for sock in late)
    finally:
        for sock in slow:
            sock.close()


SERVER_SCRIPT = """
import os, resource, sys
from fanfs.peers.peer import listen
from fanfs.peers.peerserver import PeerServer
from fanfs.peers.peerwire import NodeKey
from fanfs.peers.placement import place
from fanfs.store import Store
from fanfs.store.sources import HeldShards
from fanfs.util.files import readable
store_path, limit, client_public = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
store = Store(store_path)
key = NodeKey()
placement = place(store.index.blob_stored, 2, 1)
held = HeldShards(os.path.join(store_path, "shards"), store.id, placement.held(1))
server = PeerServer(listen("127.0.0.1"), store.index, held, key, [client_public, key.public], 1, store.id,
                    on_bye=print)
server.start()
print(server.address[1], key.public.hex(), flush=True)
hoard = []
for line in sys.stdin:
    if line.strip() == "read":  # this node's own reads of its shards, through fresh descriptors
        try:
            for name in sorted(os.listdir(os.path.join(store_path, "shards"))):
                with open(os.path.join(store_path, "shards", name), "rb") as f:
                    f.read(64)
            print("local reads ok", flush=True)
        except OSError as err:
            print("local read failed:", err.strerror, flush=True)
    elif line.strip() == "exhaust":  # the node's other files take every descriptor left
        try:
            while True:
                hoard.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            print("exhausted", len(hoard), flush=True)
    elif line.strip() == "release":
        for fd in hoard:
            os.close(fd)
        hoard.clear()
        print("released", flush=True)
server.close()
"""


class ServerProcess:
    """A peer server (rank 1) in a process of its own, with ``limit`` descriptors, driven through its stdin."""

    def __init__(self, packed, limit: int, log) -> None:
        self.store = Store(str(packed))
        self.blobs = mine(self.store, place(self.store.index.blob_stored, 2, 1))
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(packed), str(limit), PUBLICS[0].hex()],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        port, public = self.proc.stdout.readline().split()
        self.address = ("127.0.0.1", int(port))
        self.client = PeerClient([("127.0.0.1", 1), self.address], [PUBLICS[0], bytes.fromhex(public)], 0, KEYS[0],
                                 self.store.id, self.store.index.blob_stored, timeout=peerserver.HANDSHAKE_SECONDS + 5)

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def serves(self) -> bool:
        return all(len(self.client.read(1, b)) == int(self.store.index.blob_stored[b]) for b in self.blobs)

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def close(self) -> None:
        self.client.close()
        self.proc.stdin.close()
        self.proc.wait(30)
        self.store.close()


def flood(address, count: int = 2000, patience: int = 5) -> list[socket.socket]:
    """Connections held open and silent, as many as the server's listen backlog lets in: a connect that times
    out (the backlog is full) is tried again until ``patience`` of them in a row did (a loaded box drains the
    backlog slowly; stopping at the first left too few connections to flood anything)."""
    socks: list[socket.socket] = []
    failed = 0
    while len(socks) < count and failed < patience:
        try:
            socks.append(socket.create_connection(address, timeout=1))
            failed = 0
        except OSError:
            failed += 1
    return socks


@pytest.mark.slow  # the quick subset's time (its promise keeps a quicker test)
def test_a_flood_of_connections_cannot_stop_a_node_serving(packed, tmp_path):
    """A local user holds thousands of silent connections to a node that may open 256 descriptors (as in the
    audit): the node keeps serving its members, its own reads find descriptors, its threads stay few."""
    server = ServerProcess(packed, 256, tmp_path / "server.log")
    held: list[socket.socket] = []
    try:
        threads = server.threads()
        held = flood(server.address)
        time.sleep(1)
        assert len(held) > 256
        assert server.ask("read") == "local reads ok", server.log.read_text()
        assert server.descriptors() < 256 // 4
        assert server.threads() <= threads  # no thread per connection (one that was starting may have ended)
        assert server.serves()  # during the flood
        for sock in held:
            sock.close()
        held = []
        assert server.serves()
        assert server.log.read_text().count("unfinished handshakes") == 1  # said once, not once a connection
    finally:
        for sock in held:
            sock.close()
        server.close()


def test_accept_survives_running_out_of_descriptors(packed, tmp_path):
    """EMFILE on accept (the node's own files took every descriptor) is logged once and waited out: the
    server serves again as soon as descriptors are free (it used to stop accepting for good)."""
    server = ServerProcess(packed, 64, tmp_path / "server.log")
    try:
        assert server.serves()
        assert server.ask("exhaust").startswith("exhausted")
        knocking = [socket.create_connection(server.address, timeout=1) for _ in range(5)]
        time.sleep(1.5)  # accept fails, backs off, fails again...
        assert server.ask("release") == "released"
        server.client.close()
        assert server.serves()
        for sock in knocking:
            sock.close()
        text = server.log.read_text()
        assert text.count("cannot accept connections (Too many open files)") == 1, text
    finally:
        server.close()


THREE = [NodeKey(), NodeKey(), NodeKey()]  # rank 0: a member gone hostile; rank 1: the server; rank 2: a reader


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A store with a 28 MiB file (28 blobs of 1 MiB in one shard: one READ of them all is a 28 MiB reply)."""
    base = tmp_path_factory.mktemp("large")
    (base / "src").mkdir()
    (base / "src" / "big.bin").write_bytes(os.urandom(28 << 20))
    (base / "src" / "small.bin").write_bytes(os.urandom(5000))
    fanfs("pack", base / "src", base / "store", "--quiet")
    store = Store(str(base / "store"))
    yield store, base / "store"
    store.close()


def _run_of(store, name: bytes) -> tuple[int, int]:
    entry = store.lookup(name)
    return int(store.index.first[entry]), int(store.index.count[entry])


def _large_server(large, publics) -> PeerServer:
    store, path = large
    held = HeldShards(str(path / SHARD_DIR), store.id, np.ones(store.index.blob_offset.size, bool))
    server = PeerServer(listen("127.0.0.1"), store.index, held, THREE[1], publics, 1, store.id, on_bye=print)
    server.start()
    return server


def _ask_and_never_read(server, store, first: int, count: int, rank: int = 0) -> socket.socket:
    """A member's connection (rank 0's, or ``rank``'s) that asks for a run of blobs and never reads the reply."""
    sock, channel = connect(server.address, THREE[rank], THREE[1].public, store.id, rank, 1, time.monotonic() + 60)
    sock.sendall(channel.seal(REQUEST.pack(1, first, count)))
    return sock


@pytest.mark.slow
def test_replies_nobody_takes_never_stop_the_server(large, monkeypatch, caplog):
    """Issue 29.1: a member asked for 28 MiB runs on twice as many connections as the server has threads and read
    nothing: every thread was pinned in a blocking send for SEND_SECONDS, no handshake was answered, and another
    member's reads timed out.  Replies wait in the connection's buffer instead (bounded per member), a thread never
    waits on a reader, and a reply not taken in time drops its connection.  With SEND_SECONDS an hour, a pinned
    thread would hold out the other member's reads for that hour (their wait is bounded as a hang)."""
    store, _ = large
    threads = sum(thread.name.startswith("fanfs-peer") for thread in threading.enumerate())  # other servers'
    server = _large_server(large, [key.public for key in THREE])
    hostile: list[socket.socket] = []
    try:
        first, count = _run_of(store, b"big.bin")
        with monkeypatch.context() as patched:
            patched.setattr(peerserver, "SEND_SECONDS", 3600.0)
            hostile += [_ask_and_never_read(server, store, first, count) for _ in range(2 * peerserver.THREADS)]
            # until as many replies are under way as the server has threads: each would pin one if it waited on its
            # reader (the wait bounded as a hang)
            deadline = time.monotonic() + 60
            while sum(_has_data(sock, 0) for sock in hostile) < peerserver.THREADS:
                assert time.monotonic() < deadline, "the server answers too few of them"
                time.sleep(0.05)
            reader = PeerClient([("127.0.0.1", 1), server.address, ("127.0.0.1", 1)], [key.public for key in THREE], 2,
                                THREE[2], store.id, store.index.blob_stored, timeout=60.0)
            small, _ = _run_of(store, b"small.bin")
            for _ in range(3):
                assert len(reader.read(1, small)) == int(store.index.blob_stored[small])
                reader.close()  # a new handshake each time: the server still answers them
            assert len(reader.read(1, first, count)) == int(store.index.blob_stored[first:first + count].sum())
            reader.close()
            assert sum(thread.name.startswith("fanfs-peer") for thread in threading.enumerate()) == \
                threads + peerserver.THREADS
        monkeypatch.setattr(peerserver, "SEND_SECONDS", 1.0)
        late = _ask_and_never_read(server, store, first, count, rank=2)  # a member not over its bound: answered
        hostile.append(late)
        deadline = time.monotonic() + 60  # a bound on a hang; reading before the drop would take the reply
        while "took too long to take its reply" not in caplog.text:
            assert time.monotonic() < deadline, "a reply nobody takes never dropped its connection"
            time.sleep(0.05)
        assert closed_unread(late, 60)  # dropped: what was sent is still there, then its end
    finally:
        for sock in hostile:
            sock.close()
        server.close()


def closed_unread(sock: socket.socket, timeout: float) -> bool:
    """Whether the server has closed a connection: its end comes within ``timeout`` once the bytes sent are read."""
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            sock.settimeout(max(0.01, end - time.monotonic()))
            if not sock.recv(1 << 20):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


LOW_ORDER = (bytes(32), (1).to_bytes(32, "little"))  # X25519 points whose every shared secret is zero


@pytest.mark.parametrize("public", LOW_ORDER, ids=["zero", "one"])
def test_a_low_order_key_is_a_bad_peer_not_a_crash(served, caplog, public):
    """Issue 29.4: a member that published a low-order X25519 key made ``pair_secret`` raise ValueError in a reader
    (through the FUSE front: a traceback in the log).  It is a peer that cannot be trusted: EIO and one line; and
    the server refuses a hello from a rank whose published key is one."""
    store, placement, server, _ = served
    blob = mine(store, placement)[0]
    c = PeerClient([("127.0.0.1", 1), server.address], [PUBLICS[0], public], 0, KEYS[0], store.id,
                   store.index.blob_stored, 5.0)
    with caplog.at_level("WARNING", logger="fanfs"), pytest.raises(OSError) as info:
        c.read(1, blob)
    assert info.value.errno == errno.EIO and "rank 1" in str(info.value), info.value
    assert any("low-order" in r.getMessage() or "rank 1" in r.getMessage() for r in caplog.records), caplog.text
    refused = server.stats()["refused"]
    shake = ServerHandshake(KEYS[1], [public, PUBLICS[1]], store.id, 1)
    with pytest.raises(ConnectionError):
        shake.hello(raw_hello(store))
    assert server.stats()["refused"] == refused


def test_a_fresh_connection_is_never_evicted_before_its_request(served, monkeypatch):
    """Issue 29.4: a member's connections past MAX_PER_PEER closed its oldest, which could be one just made whose
    request was on its way (more than 64 processes of a node connecting at once: a spurious EIO).  Only a channel
    that was served and lies idle is closed (its client opens another); a fresh one is always served."""
    store, placement, server, _ = served
    monkeypatch.setattr(peerserver, "MAX_PER_PEER", 2)
    blob = mine(store, placement)[0]
    fresh = [connect(server.address, KEYS[0], PUBLICS[1], store.id, 0, 1, time.monotonic() + 5) for _ in range(4)]
    time.sleep(0.3)  # every proof has reached the server
    try:
        for sock, channel in fresh:
            sock.sendall(channel.seal(REQUEST.pack(1, blob, 1)))
            status, length = REPLY.unpack(channel.open(sock.recv(REPLY.size + 16, socket.MSG_WAITALL)))
            assert status == OK and length == int(store.index.blob_stored[blob])
            assert len(channel.open(sock.recv(length + 16, socket.MSG_WAITALL))) == length
        later = client(server, store)  # now they are served and idle: the oldest make room for a new one
        assert len(later.read(1, blob)) == int(store.index.blob_stored[blob])
        assert [closed_unread(sock, 1) for sock, _ in fresh] == [True, True, True, False]  # back to 2: the newest kept
        later.close()
    finally:
        for sock, _ in fresh:
            sock.close()


def _has_data(sock: socket.socket, wait: float) -> bool:
    return readable(sock.fileno(), wait)


def test_a_members_untaken_replies_are_bounded_and_only_its_own_requests_wait(large, monkeypatch):
    """A member's replies not yet taken hold at most MAX_WAITING_BYTES: past it that member's next request waits
    (nothing read, nothing allocated for it) until its replies are taken, while another member is served at once."""
    monkeypatch.setattr(peerserver, "MAX_WAITING_BYTES", 1)  # any reply still waiting is the bound
    store, _ = large
    server = _large_server(large, [key.public for key in THREE])
    try:
        first, count = _run_of(store, b"big.bin")
        size = int(store.index.blob_stored[first:first + count].sum())
        stalled = _ask_and_never_read(server, store, first, count)  # 28 MiB: more than the socket buffers hold
        assert _has_data(stalled, 60)
        small, _ = _run_of(store, b"small.bin")
        waiting = _ask_and_never_read(server, store, small, 1)
        reader = PeerClient([("127.0.0.1", 1), server.address, ("127.0.0.1", 1)], [key.public for key in THREE], 2,
                            THREE[2], store.id, store.index.blob_stored, timeout=60.0)  # a hang's bound
        assert len(reader.read(1, small)) == int(store.index.blob_stored[small])  # another member: served meanwhile
        assert not _has_data(waiting, 0.5)  # rank 0's second request waits for its first reply to be taken
        got = 0
        while got < size + 2 * 16 + REPLY.size:  # rank 0 takes its reply: its next request is answered
            got += len(stalled.recv(1 << 20))
        assert _has_data(waiting, 60)
        reader.close()
        stalled.close()
        waiting.close()
    finally:
        server.close()
