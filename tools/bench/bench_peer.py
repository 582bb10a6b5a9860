#!/usr/bin/env python3
"""Peer round trip: what authenticating and sealing the blobs between nodes costs.

A client asks a server in another process for one blob at a time on a kept connection over loopback,
the way a node's reader asks a peer:

* ``plain TCP``: the same request (9 bytes) and reply (5-byte header + the blob), a thread per
  connection, no check at all: the transport's floor, and what the protocol before issue 17 did once
  its hello was through (it sent the job's secret in clear and trusted any length it was told);
* ``fanfs``: fanfs's real ``PeerServer`` and ``PeerClient`` (X25519 keys, HMAC handshake, AES-256-GCM
  frames, the fixed pool of serving threads), reading the blobs from a real store's shard.

Per blob size: wall time per round trip and CPU per request on each side (medians of ``--rounds``
runs, the two servers interleaved), and the cost of opening a connection (TCP connect; connect +
handshake).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time

import benchlib as bl
from fanfs.peers.peer import PeerClient
from fanfs.peers.peerwire import NodeKey, connect
from fanfs.store import Store
from fanfs.util.server import configure_server
from fanfs.util.sockets import recv_exactly

REQUEST, REPLY = struct.Struct("<BQ"), struct.Struct("<BI")

SERVER = r"""
import os, socket, struct, sys, threading
from fanfs.peers.peer import listen
kind, store_path, client_public = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
listener = listen("127.0.0.1")
if kind == "plain":
    REQUEST, REPLY = struct.Struct("<BQ"), struct.Struct("<BI")
    from fanfs.util.sockets import recv_exactly
    payloads = {}
    def serve(conn):
        with conn:
            while True:
                try:
                    _, size = REQUEST.unpack(recv_exactly(conn, REQUEST.size))
                except ConnectionError:
                    return
                data = payloads.get(size) or payloads.setdefault(size, os.urandom(size))
                conn.sendall(REPLY.pack(0, size) + data)
    def accept():
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    public = b""
else:
    from fanfs.peers.peerserver import PeerServer
    from fanfs.peers.peerwire import NodeKey
    from fanfs.peers.placement import place
    from fanfs.store import Store
    from fanfs.store.sources import HeldShards
    store = Store(store_path)
    key = NodeKey()
    everything = place(store.index.blob_stored, 1, 1).held(0)
    from fanfs.util.server import configure_server
    configure_server()  # as a job node's daemon does
    server = PeerServer(listener, store.index, HeldShards(os.path.join(store_path, "shards"), store.id, everything),
                        key, [client_public, key.public], 1, store.id, on_bye=lambda rank: None)
    server.start()
    public = key.public
print(listener.getsockname()[1], public.hex(), flush=True)
sys.stdin.read()
"""


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A plain or fanfs server in a process of its own."""

    def __init__(self, kind: str, store: str, client: NodeKey) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, store, client.public.hex()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        port, *public = self.proc.stdout.readline().split()
        self.address = ("127.0.0.1", int(port))
        self.public = bytes.fromhex(public[0]) if public else b""

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def measure(call, n: int, pid: int) -> tuple[float, float, float]:
    """Per call: wall microseconds, this process's CPU microseconds, the server's CPU microseconds."""
    wall, mine, theirs = time.perf_counter(), time.process_time(), cpu_seconds(pid)
    for _ in range(n):
        call()
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - mine) / n * 1e6,
            (cpu_seconds(pid) - theirs) / n * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4096,110000,1048576", help="blob sizes in bytes (default 4 KB, 110 KB, 1 MB)")
    parser.add_argument("--requests", type=int, default=2000, help="round trips per run and size (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per row; the median is shown (default 5)")
    bl.common_args(parser)
    args = parser.parse_args()
    configure_server()  # the client is a job node's daemon too
    sizes = [int(s) for s in args.sizes.split(",")]
    with bl.temp_dir(args.workdir, "fanfs-bench-peer-") as tmp:
        src = tmp / "src"
        src.mkdir()
        for size in sizes:  # incompressible: stored as is, so a blob's stored size is the file's size
            (src / f"{size}.bin").write_bytes(os.urandom(size))
        bl.fanfs("pack", src, tmp / "store", "--quiet")
        store = Store(str(tmp / "store"))
        blob_of = {size: int(store.index.first[store.lookup(f"{size}.bin".encode())]) for size in sizes}
        key = NodeKey()
        plain, secure = Server("plain", str(tmp / "store"), key), Server("fanfs", str(tmp / "store"), key)
        try:
            client = PeerClient([("127.0.0.1", 1), secure.address], [key.public, secure.public], 0, key, store.id,
                                store.index.blob_stored, timeout=10)
            sock = socket.create_connection(plain.address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def plain_read(size: int) -> None:
                sock.sendall(REQUEST.pack(1, size))
                _, length = REPLY.unpack(recv_exactly(sock, REPLY.size))
                recv_exactly(sock, length)

            def fanfs_connect() -> None:
                connect(secure.address, key, secure.public, store.id, 0, 1, time.monotonic() + 10)[0].close()

            print(f"load before: {bl.load_average()}")
            rows, results = [], {}
            cases = [(f"{size:,} B", lambda size=size: plain_read(size),
                      lambda size=size: client.read(1, blob_of[size]), args.requests) for size in sizes]
            cases.append(("new connection", lambda: socket.create_connection(plain.address).close(), fanfs_connect,
                          max(50, args.requests // 10)))
            for label, plain_call, fanfs_call, n in cases:
                runs: dict[str, list] = {"plain": [], "fanfs": []}
                for _ in range(args.rounds):  # interleaved, so a change of load hits both alike
                    runs["plain"].append(measure(plain_call, n, plain.proc.pid))
                    runs["fanfs"].append(measure(fanfs_call, n, secure.proc.pid))
                p, f = ([bl.median([r[i] for r in runs[k]]) for i in range(3)] for k in ("plain", "fanfs"))
                results[label] = {"plain_us": p[0], "fanfs_us": f[0], "plain_client_cpu_us": p[1],
                                  "fanfs_client_cpu_us": f[1], "plain_server_cpu_us": p[2], "fanfs_server_cpu_us": f[2]}
                rows.append([label, f"{p[0]:.0f}", f"{f[0]:.0f}", f"{f[0] / p[0]:.2f}",
                             f"{p[1]:.0f} / {p[2]:.0f}", f"{f[1]:.0f} / {f[2]:.0f}"])
            print(bl.table(["round trip", "plain us", "fanfs us", "fanfs/plain", "plain CPU us (client/server)",
                            "fanfs CPU us (client/server)"], rows))
            print(f"load after: {bl.load_average()}")
            bl.write_json(args.json, {"results": results, "load": bl.load_average()})
            client.close()
            sock.close()
        finally:
            plain.close()
            secure.close()
            store.close()


if __name__ == "__main__":
    main()
