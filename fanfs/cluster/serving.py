"""The serving side of a job node: the daemon (forked by the rank, :mod:`.handoff`) that mounts the store
and serves its blobs to peers over TCP, once the rank has handed it the job's plan.

Shutdown of the job: when this node's FUSE loop ends (``fanfs umount``, SIGTERM), it tells every peer
BYE; a peer receiving BYE lazily unmounts its own mount point, so its loop ends and it says BYE in turn.
A dead peer refuses the BYE at once and a stopped one costs a second: nobody waits for them.

A node serving without a mount (``serve_only``: where FUSE is not allowed) is the same daemon with the
same peer server, client, handshake and end; instead of a FUSE loop it publishes its view in its node
directory for in-process readers (:mod:`.nodeview`) and waits for a stop signal or a peer's BYE.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import FanfsError
from ..serve.listener import ControlServer, MountLock
from ..records import Auto, Presentation
from ..serve.daemon import Counters, Hooks, MountOptions, start
from ..store.format import INDEX_NAME
from ..store.index import Index
from ..util.mounts import unmount
from ..util.server import configure_server
from . import handoff
from .nodeview import publish, withdraw
from ..peers.peerend import PeerEnd
from ..peers.peerserver import PeerServer
from ..cache.share import CacheHooks, NodeStore, node_store

log = logging.getLogger("fanfs")


@dataclass
class NodeOptions:
    """A cluster node's mount: the mount itself, and where and how this node holds its share of the store."""

    mount: MountOptions
    local_dir: str
    replicas: int = 1
    stage: str = ""  # "full": stage the node's share into local_dir first; "lazy": a cache filled as the node reads;
    # "shared": lease the node's shared copy of the whole store in ``shared``, staged by the first job that wants it
    capacity: int | None = None  # lazy: bytes of local_dir the node's cache may take (None: all it holds)
    auto: dict[str, Auto] = field(default_factory=dict)  # settings the store decides (auto:SSIM): once, by rank 0
    peer_timeout: float = 5.0
    job_node: str | None = None  # a Slurm job's node name (fanfs.cluster.job): the daemon ends with its task
    serve_only: bool = False  # mount nothing: serve peers, and in-process readers through a node directory
    shared: str | None = None  # stage "shared": the node-local base of the node's shared copies (FANFS_SHARED_LOCAL)


READY_LINE = "fanfs: ready: {node} serves {mountpoint}"  # what 'fanfs job run' waits for, one per node


@dataclass
class Plan:
    """What the rank hands its daemon once the job's collective start is done."""

    store_root: str
    index: bytes
    rank: int
    nodes: int
    endpoints: list[tuple[str, int]]
    publics: list[bytes]  # every daemon's public key, by rank (peerwire)
    options: NodeOptions
    staged: Presentation  # what every node staged: other layers come from the shared store


class Stopper:
    """Ends this node's serving from another thread, once it serves: the FUSE loop by a lazy unmount, or
    ``end()`` for a node serving without a mount."""

    def __init__(self, mountpoint: str, end: Callable[[], object] | None = None) -> None:
        self.mountpoint = mountpoint
        self._end = end or self._unmount
        self._lock = threading.Lock()
        self._serving = self._requested = False

    def serving(self) -> None:
        with self._lock:
            self._serving = True
            if self._requested:
                self._end()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self._requested:
                return
            self._requested = True
            log.info("job ending (%s): %s %s", reason, "unmounting" if self._end == self._unmount else "ending",
                     self.mountpoint)
            if self._serving:
                self._end()

    def ended(self) -> None:
        with self._lock:
            self._serving = False
            self._requested = True  # nothing left to stop

    def _unmount(self) -> None:
        # In a thread of its own: the caller may be the FUSE loop itself, which fusermount may query.
        threading.Thread(target=unmount, args=(self.mountpoint,), kwargs={"lazy": True}, name="fanfs-unmount",
                         daemon=True).start()


def daemon_main(sock: socket.socket, mountpoint: str, lock: MountLock) -> int:
    """The forked daemon: open the peer listener, report its address, wait for the plan, serve."""
    # The serving loop takes the stop signals over while it runs (fanfs.serve.lowlevel); before it, the
    # rank ends this process through the socket, and after it a late stop must not cut the goodbyes
    # short.  USR1/USR2 are a job's notices for its tasks: the rank passes on what is meant for us.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    configure_server()  # descriptors for peers and shards alike; megabyte buffers without page faults
    try:
        end = PeerEnd()
    except (OSError, FanfsError) as err:
        handoff.send(sock, ("error", f"cannot serve peers: {getattr(err, 'strerror', None) or err}"))
        return 1
    handoff.send(sock, ("address", end.card))
    plan: Plan | None = handoff.recv(sock)
    if plan is None:  # the job failed before serving (the rank says why)
        return 1
    serve_job(plan, mountpoint, end, lock)
    return 0


def serve_job(plan: Plan, mountpoint: str, end: PeerEnd, lock: MountLock) -> None:
    """Serve this node's mount (or, ``serve_only``, its view for in-process readers), and its blobs to peers,
    until the job ends: the peers' client, the node's store (:mod:`fanfs.cache.share`), the peers' server, the
    cache's hooks, then the mount."""
    options = plan.options
    index = Index(f"{plan.store_root}/{INDEX_NAME}", data=plan.index, validated=True)  # by this node's rank
    rank = plan.rank
    client = end.join(plan.endpoints, plan.publics, rank, index, options.peer_timeout)
    node = node_store(plan.store_root, index, rank, plan.nodes, options.replicas, options.local_dir, plan.staged,
                      client, options.mount.cache_size, lazy=options.stage == "lazy", capacity=options.capacity,
                      owner=True, shared=options.stage == "shared")
    share, remotes, placement = node.share, node.remotes, node.placement
    wake = os.pipe() if options.serve_only else None  # a node serving without a mount waits on it for its end
    stopper = Stopper(mountpoint, (lambda: os.write(wake[1], b"e")) if wake else None)
    server = end.answer(index, share.local, plan.publics, rank, on_bye=lambda peer: stopper.stop(f"rank {peer} is done"))
    cache = CacheHooks(node.store, options.mount.presentation, mountpoint, options.mount.prefetch, node)

    def ready() -> None:
        stopper.serving()
        if options.job_node is not None:  # what 'fanfs job run' waits for, one line per node
            try:
                print(READY_LINE.format(node=options.job_node, mountpoint=mountpoint), flush=True)
            except OSError:  # nobody listens any more: the job is ending anyway
                pass

    def stats(counters: Counters) -> dict[str, Any]:
        by_source = counters["by_source"]
        requests = counters["remote_requests"]
        return {**cache.stats(counters),
                "cluster": {"rank": rank, "nodes": placement.nodes, "replicas": placement.replicas,
                            "peer_address": list(server.address),
                            "local_blobs": int(placement.node_blobs[rank]),
                            "local_bytes": by_source.get(share.local.name, 0),
                            "remote_bytes": sum(by_source.get(r.name, 0) for r in remotes),
                            **{k: v for k, v in counters.items() if k.startswith("remote_")},
                            "remote_latency_mean_ms": round(counters["remote_latency_total_ms"] / max(1, requests), 3),
                            **server.stats()}}

    def recipe() -> dict[str, Any]:  # what an in-process reader of the node's mount builds the same store from
        return {"kind": "node", "facts": node_facts(plan, node), "key": end.key.private.hex()}

    hooks = Hooks(on_ready=ready, serving=server.start, counters=node.counters, extra_stats=stats, commands=cache.commands,
                  on_present=cache.present, recipe=recipe, close=cache.close)
    try:
        if wake is not None:
            _serve_without_mount(plan, node, mountpoint, end, hooks, wake)
        else:
            start(node.store, mountpoint, options.mount, lock=lock, hooks=hooks)
    finally:
        cache.close()
        stopper.ended()
        end.close()
        for fd in wake or ():
            os.close(fd)


def node_facts(plan: Plan, node: NodeStore) -> dict[str, Any]:
    """What a reader needs, beside the node's key, to build this node's store in its own process
    (:func:`.nodeview.node_reader`): the node's own facts, and its peers'."""
    return {**node.facts, "endpoints": plan.endpoints, "publics": [public.hex() for public in plan.publics],
            "peer_timeout": plan.options.peer_timeout}


def _serve_without_mount(plan: Plan, node: NodeStore, directory: str, end: PeerEnd, hooks: Hooks,
                         wake: tuple[int, int]) -> None:
    """Serve peers, and publish the node's view in ``directory``, until a stop signal or a peer's BYE (either
    writes to the pipe ``wake``); ``fanfs stats DIRECTORY`` answers meanwhile (with the node's own reads:
    none, its in-process readers count theirs), and the hooks' commands (a lazily staged node's orders)."""
    assert hooks.on_ready is not None and hooks.extra_stats is not None and hooks.counters is not None
    server: PeerServer | None = end.server
    assert server is not None
    wake_r, wake_w = wake
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.write(wake_w, b"s"))  # a write only: no lock in a handler
    store = node.store

    def answer_stats(message: dict[str, Any]) -> dict[str, Any]:
        summed = {**store.stats.as_dict(), **hooks.counters()}  # type: ignore[misc]
        return {"store": store.root, "node_dir": directory, **plan.options.mount.presentation, "workers": 1,
                "reads_by_process": [summed["reads"]], **summed, **hooks.extra_stats(summed)}  # type: ignore[misc]

    control = ControlServer(directory, {
        "status": lambda m: {"pid": os.getpid(), "store": store.root, "node": directory,
                             **plan.options.mount.presentation},
        "stats": answer_stats, **hooks.commands})
    try:
        server.start()
        control.start()
        publish(directory, end.key, node_facts(plan, node))
        log.info("serving %s to peers and to in-process readers through %s (pid %d, no mount)", store.root,
                 directory, os.getpid())
        hooks.on_ready()
        reason = os.read(wake_r, 1)
        log.info("stopped by %s", "a signal" if reason == b"s" else "the job's end")
    finally:
        withdraw(directory)
        control.close()
        hooks.close()  # its read-ahead, before the store it reads
        store.close()
