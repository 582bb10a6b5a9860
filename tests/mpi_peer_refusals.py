"""Run by test_cluster under ``mpiexec -n 2``: rank 1 serves its shards, rank 0 asks for what it must not get."""

from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's fanfs, not another
from fanfs.cluster.world import World, expand, load_index  # noqa: E402
from fanfs.cluster.placement import place  # noqa: E402
from fanfs.cluster.stage import stage  # noqa: E402
from fanfs.store.sources import LocalShards  # noqa: E402

logging.basicConfig(level=logging.WARNING, format="%(message)s")
world = World.detect()
store, local = sys.argv[1], expand(sys.argv[2])
index = load_index(store, world)
stage(store, local, 1, world, index, progress=False)
from fanfs.cluster.peer import REQUEST_TAG, Channels, PeerClient, PeerServer  # noqa: E402  (MPI runs by now)

store_id = bytes.fromhex(index.meta["store_id"])
placement = place(index.shard_size, world.size, 1)
channels = Channels.create(world.comm)
if world.rank == 1:
    server = PeerServer(channels, store_id, index.shard_size, placement, LocalShards(local, store_id), lambda rank: None)
    server.start()
    server.join(60)
    assert not server.is_alive()
else:
    client = PeerClient(channels, store_id, timeout=10)
    mine, theirs = int(placement.shards_of(0)[0]), int(placement.shards_of(1)[0])
    size = int(index.shard_size[theirs])
    with open(os.path.join(store, "shards", f"{theirs:06d}"), "rb") as f:
        assert client.read(1, theirs, size - 100, 100) == f.read()[-100:]
    print("served ok")
    foreign = PeerClient(channels, bytes(16), timeout=10)
    for who, shard, offset, length in ((client, mine, 0, 100), (client, theirs, size - 10, 100),
                                       (client, index.shard_size.size + 5, 0, 1), (client, theirs, 0, 0),
                                       (foreign, theirs, 0, 100)):
        try:
            who.read(1, shard, offset, length)
        except OSError as err:
            assert "refused" in str(err), err
            print("refused ok", flush=True)
    channels.requests.Send([b"bogus!!", 0, 7, __import__("mpi4py").MPI.BYTE], 1, REQUEST_TAG)
    client.say_bye()
    client.drain(1)
channels.free()
world.finalize()
