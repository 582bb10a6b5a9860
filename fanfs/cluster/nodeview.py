"""A job node's store, as its mount serves it and as an in-process reader on the node opens it.

:func:`fanfs.cache.share.node_store` builds it (the node's staged shards first, then the peers holding the other
blobs, then the shared store for layers no node staged), for the serving daemon and for a reader alike.

A node that serves without a mount (``fanfs mount --no-mount``; ``FANFS_MOUNT=0`` in a Slurm job)
publishes in its *node directory* what a reader needs to build the same store: ``NODE_FILE`` (the
store, this node's rank, the placement's shape, the staged layers, every peer's address and public
key, the daemon's pid) and ``KEY_FILE``, the daemon's private key, with which the reader speaks to the
peers as this node through the same authenticated client (:mod:`fanfs.peers.peer`).  The directory is private
(0700: this user's, closed to everyone else, :func:`fanfs.util.runtime.private_dir`, which the reader
checks too, so another user's reader is refused with one line before anything is opened; the kernel
would refuse it the files anyway).  No secret is ever in the environment.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import FanfsError
from ..records import Presentation
from ..store.format import INDEX_NAME
from ..store.index import Index
from ..util.files import read_regular
from ..util.runtime import create_private, private_dir
from ..util.processes import pid_alive
from ..cache.share import NodeStore, node_store
from ..peers.peer import PeerClient
from ..peers.peerwire import NodeKey

NODE_FILE = "fanfs-node.json"
KEY_FILE = "fanfs-node.key"
REMEDY = "use a directory of your own that only you can write (mkdir -m 700)"
MAX_NODE_FILE = 16 << 20  # a job of thousands of nodes: an address and a key per node


def node_dir(path: str) -> str:
    """``path`` as a node directory: created 0700 if missing, refused with one line unless private (0700: it will
    hold the node's private key)."""
    return private_dir(path, "node directory", REMEDY, closed=True)


def publish(directory: str, key: NodeKey, facts: dict[str, Any]) -> None:
    """Write the node's key and ``facts`` (see :func:`open_node`) into its node directory; the facts last,
    each file whole under its name (a reader finds both or neither)."""
    _write(os.path.join(directory, KEY_FILE), key.private)
    _write(os.path.join(directory, NODE_FILE), json.dumps({**facts, "pid": os.getpid()}).encode())


def withdraw(directory: str) -> None:
    """Remove what :func:`publish` wrote (the node no longer serves)."""
    for name in (NODE_FILE, KEY_FILE):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def serving(directory: str) -> bool:
    """Whether a node publishes its view in ``directory`` now (its daemon alive)."""
    try:
        return pid_alive(int(json.loads(read_regular(os.path.join(directory, NODE_FILE), MAX_NODE_FILE))["pid"]))
    except (OSError, ValueError, KeyError, TypeError, FanfsError):
        return False


def open_node(directory: str | os.PathLike, cache_size: int) -> NodeStore:
    """The store of the node serving in ``directory``, opened in this process (an fsspec file system's)."""
    directory = os.path.abspath(os.fspath(directory))
    private_dir(directory, "node directory", REMEDY, create=False, closed=True)
    try:
        facts = json.loads(read_regular(os.path.join(directory, NODE_FILE), MAX_NODE_FILE))
        private = read_regular(os.path.join(directory, KEY_FILE), 64)
    except FileNotFoundError:
        raise FanfsError(f"no fanfs node serves in {directory}: start one there with 'fanfs mount STORE "
                         f"{directory} --local-dir DIR --no-mount' (a Slurm job: FANFS_MOUNT=0)") from None
    except (OSError, ValueError) as err:
        raise FanfsError(f"{directory}: cannot read the node's view: {getattr(err, 'strerror', None) or err}") from None
    try:
        pid = int(facts["pid"])
    except (KeyError, TypeError, ValueError) as err:
        raise FanfsError(f"{directory}: a malformed node view ({err})") from None
    if not pid_alive(pid):
        raise FanfsError(f"the fanfs node that served in {directory} (pid {pid}) has ended")
    index = Index(os.path.join(str(facts.get("store")), INDEX_NAME))
    return node_reader(facts, private, index, cache_size, directory)


def node_reader(facts: dict[str, Any], private: bytes | None, index: Index, cache_size: int, where: str) -> NodeStore:
    """The store of the node that published ``facts`` (:attr:`fanfs.cache.share.NodeStore.facts`, and for a job's
    node its peers' addresses and public keys, with its own key ``private``), opened in this process with ``index``
    (the store's, as the node validated it); ``where`` names the node in errors."""
    try:
        store_root, rank, nodes = str(facts["store"]), int(facts["rank"]), int(facts.get("nodes", 1))
        lazy, capacity = facts.get("stage") == "lazy", facts.get("capacity")
        capacity = None if capacity is None else int(capacity)
        replicas, local_dir, staged = int(facts["replicas"]), str(facts["local_dir"]), Presentation(facts["staged"])
        client = _client(facts, private, index, where) if facts.get("endpoints") else None
    except (KeyError, TypeError, ValueError) as err:
        raise FanfsError(f"{where}: a malformed node view ({err})") from None
    if index.meta["store_id"] != facts["store_id"]:
        raise FanfsError(f"{store_root} is not the store the node in {where} serves (packed again since?)")
    return node_store(store_root, index, rank, len(facts["endpoints"]) if client else nodes, replicas, local_dir,
                      staged, client, cache_size, lazy=lazy, capacity=capacity, shared=facts.get("stage") == "shared")


def _client(facts: dict[str, Any], private: bytes | None, index: Index, where: str) -> PeerClient:
    """The node's client of its peers, speaking as the node (its key)."""
    rank = int(facts["rank"])
    publics = [bytes.fromhex(public) for public in facts["publics"]]
    endpoints = [(str(host), int(port)) for host, port in facts["endpoints"]]
    key = NodeKey(private or b"")
    if not 0 <= rank < len(publics) or key.public != publics[rank]:
        raise FanfsError(f"{where}: the node's key is not rank {rank}'s of its job")
    return PeerClient(endpoints, publics, rank, key, bytes.fromhex(facts["store_id"]), index.blob_stored,
                      float(facts["peer_timeout"]))


def _write(path: str, data: bytes) -> None:
    fd = create_private(path + ".new")
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(path + ".new", path)
