"""Issue 11: a node's peer server serves only whole blobs of its own store that placement gave it.

In-process: the server and its clients are plain sockets, no MPI, so this runs without a launcher.
"""

from __future__ import annotations

import errno
import os
import socket

import numpy as np
import pytest
from conftest import fanfs

from fanfs.cluster.peer import BYE, HELLO, MAGIC, REQUEST, PeerClient, PeerServer, listen
from fanfs.cluster.placement import place
from fanfs.store import Store
from fanfs.store.format import SHARD_DIR
from fanfs.store.sources import HeldShards

SECRET = b"s" * 32


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("peer")
    (base / "src").mkdir()
    for i in range(40):
        (base / "src" / f"f{i}.bin").write_bytes(os.urandom(2000 + 100 * i))
    fanfs("pack", base / "src", base / "store", "--quiet")
    store = Store(str(base / "store"))
    placement = place(store.index.blob_stored, 2, 1)
    byes = []
    held = HeldShards(str(base / "store" / SHARD_DIR), store.id, placement.held(1))
    server = PeerServer(listen("127.0.0.1"), store.index, held, SECRET, store.id, on_bye=byes.append)
    server.start()
    yield store, placement, server, byes
    server.close()
    store.close()


def client(server, secret=SECRET, store_id=None, store=None, timeout=5.0) -> PeerClient:
    return PeerClient([("127.0.0.1", 1), server.address], 0, secret, store_id or store.id, timeout)


def test_held_blobs_are_served_exactly(served):
    store, placement, server, _ = served
    mine = [b for b in range(store.index.blob_offset.size) if placement.holds(1, b)]
    c = client(server, store=store)
    for blob in mine:
        data = c.read(1, blob)
        assert len(data) == int(store.index.blob_stored[blob])
        assert int(store.index.blob_checksum[blob]) == __import__("xxhash").xxh3_64_intdigest(data)
    assert server.stats()["served_requests"] >= len(mine)


def test_what_must_not_be_served_is_refused(served):
    store, placement, server, _ = served
    c = client(server, store=store)
    theirs = next(b for b in range(store.index.blob_offset.size) if not placement.holds(1, b))
    for blob, why in ((theirs, "not held by this node"), (10**9, "no blob")):
        with pytest.raises(OSError, match=why):
            c.read(1, blob)
    refused_before = server.stats()["refused"]
    for bad in (client(server, secret=b"x" * 32, store=store), client(server, store_id=bytes(16), store=store)):
        with pytest.raises(OSError) as info:
            bad.read(1, 0)
        assert info.value.errno == errno.EIO
    with socket.create_connection(server.address) as sock:  # not even a hello: dropped
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(60))
        try:
            assert sock.recv(10) == b""
        except ConnectionResetError:
            pass  # dropped with our bytes unread: a reset, not an answer
    assert server.stats()["refused"] >= refused_before + 3


def test_bye_reaches_the_server(served):
    store, placement, server, byes = served
    with socket.create_connection(server.address) as sock:
        sock.sendall(HELLO.pack(MAGIC, SECRET, store.id, 7))
        assert sock.recv(1) == b"\0"
        sock.sendall(REQUEST.pack(BYE, 0))
        sock.recv(1)
    assert byes == [7]


def test_a_peer_that_is_not_serving_fails_at_once(served):
    store, _, server, _ = served
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    c = PeerClient([("127.0.0.1", port), server.address], 1, SECRET, store.id, timeout=5.0)
    with pytest.raises(OSError, match="not serving"):
        c.read(0, 0)
    assert c.stats()["remote_failures"] == 1
    assert np.isfinite(c.stats()["remote_latency_mean_ms"])
