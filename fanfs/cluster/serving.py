"""The serving side of a job node: the daemon (forked by the rank, :mod:`.handoff`) that mounts the store
and serves its blobs to peers over TCP, once the rank has handed it the job's plan.

Shutdown of the job: when this node's FUSE loop ends (``fanfs umount``, SIGTERM), it tells every peer
BYE; a peer receiving BYE lazily unmounts its own mount point, so its loop ends and it says BYE in turn.
A dead peer refuses the BYE at once and a stopped one costs a second: nobody waits for them.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import FanfsError
from ..serve.control import MountLock
from ..records import Presentation
from ..serve.daemon import Hooks, MountOptions, start
from ..store import Store
from ..store.format import INDEX_NAME
from ..store.index import Index
from ..util.server import configure_server
from . import handoff
from .peer import PeerClient, listen, peer_host, remote_sources
from .peerserver import PeerServer
from .peerwire import NodeKey
from .placement import place
from .stage import staged_share, staged_stats

log = logging.getLogger("fanfs")


@dataclass
class NodeOptions:
    """A cluster node's mount: the mount itself, and where and how this node holds its share of the store."""

    mount: MountOptions
    local_dir: str
    replicas: int = 1
    stage: bool = False  # stage the node's share into local_dir first
    auto_ssim: float | None = None  # fidelity auto:SSIM, measured once for the job (rank 0)
    peer_timeout: float = 5.0
    job_node: str | None = None  # a Slurm job's node name (fanfs.cluster.job): the daemon ends with its task


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
    """Ends this node's FUSE loop from another thread, once the loop serves (lazy unmount)."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self._lock = threading.Lock()
        self._serving = self._requested = False

    def serving(self) -> None:
        with self._lock:
            self._serving = True
            if self._requested:
                self._unmount()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self._requested:
                return
            self._requested = True
            log.info("job ending (%s): unmounting %s", reason, self.mountpoint)
            if self._serving:
                self._unmount()

    def ended(self) -> None:
        with self._lock:
            self._serving = False
            self._requested = True  # nothing left to stop

    def _unmount(self) -> None:
        # In a thread of its own: the caller may be the FUSE loop itself, which fusermount may query.
        tool = shutil.which("fusermount3") or shutil.which("fusermount") or "umount"
        command = [tool, "-u", "-z", self.mountpoint] if "fusermount" in tool else [tool, "-l", self.mountpoint]
        threading.Thread(target=subprocess.run, args=(command,), kwargs={"capture_output": True},
                         name="fanfs-unmount", daemon=True).start()


def daemon_main(sock: socket.socket, mountpoint: str, lock: MountLock) -> int:
    """The forked daemon: open the peer listener, report its address, wait for the plan, serve."""
    # The serving loop takes the stop signals over while it runs (fanfs.serve.lowlevel); before it, the
    # rank ends this process through the socket, and after it a late stop must not cut the goodbyes
    # short.  USR1/USR2 are a job's notices for its tasks: the rank passes on what is meant for us.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    configure_server()  # descriptors for peers and shards alike; megabyte buffers without page faults
    try:
        listener = listen(peer_host())
    except (OSError, FanfsError) as err:
        handoff.send(sock, ("error", f"cannot serve peers: {getattr(err, 'strerror', None) or err}"))
        return 1
    key = NodeKey()  # this job's private key: never leaves this process
    handoff.send(sock, ("address", (listener.getsockname()[:2], key.public)))
    plan: Plan | None = handoff.recv(sock)
    if plan is None:  # the job failed before serving (the rank says why)
        return 1
    serve_job(plan, mountpoint, listener, key, lock)
    return 0


def serve_job(plan: Plan, mountpoint: str, listener: socket.socket, key: NodeKey, lock: MountLock) -> None:
    """Serve this node's mount, and its blobs to peers, until the job ends."""
    options = plan.options
    index = Index(f"{plan.store_root}/{INDEX_NAME}", data=plan.index, validated=True)  # by this node's rank
    placement = place(index.blob_stored, plan.nodes, options.replicas)
    store_id = bytes.fromhex(index.meta["store_id"])
    rank = plan.rank
    stopper = Stopper(mountpoint)
    share = staged_share(plan.store_root, options.local_dir, index, plan.staged, placement.held(rank))
    server = PeerServer(listener, index, share.local, key, plan.publics, rank, store_id,
                        on_bye=lambda peer: stopper.stop(f"rank {peer} is done"))
    client = PeerClient(plan.endpoints, plan.publics, rank, key, store_id, index.blob_stored, options.peer_timeout)
    remotes = remote_sources(client, placement, share.staged)
    first, count = index.first, index.count

    def is_local(entry: int, view: int) -> bool:
        return placement.holds_range(rank, int(first[entry]), int(count[entry])) \
            and view <= store.view(entry, plan.staged)

    store = Store(plan.store_root, cache_size=options.mount.cache_size,
                  sources=[share.local, *remotes, share.shared], check_shards=False, index=index, is_local=is_local)

    def ready() -> None:
        stopper.serving()
        if options.job_node is not None:  # what 'fanfs job run' waits for, one line per node
            try:
                print(READY_LINE.format(node=options.job_node, mountpoint=mountpoint), flush=True)
            except OSError:  # nobody listens any more: the job is ending anyway
                pass

    def stats(counters: dict[str, Any]) -> dict[str, Any]:
        by_source = counters["by_source"]
        requests = counters["remote_requests"]
        return {**staged_stats(share, by_source),
                "cluster": {"rank": rank, "nodes": placement.nodes, "replicas": placement.replicas,
                            "peer_address": list(server.address),
                            "local_blobs": int(placement.node_blobs[rank]),
                            "local_bytes": by_source.get(share.local.name, 0),
                            "remote_bytes": sum(by_source.get(r.name, 0) for r in remotes),
                            **{k: v for k, v in counters.items() if k.startswith("remote_")},
                            "remote_latency_mean_ms": round(counters["remote_latency_total_ms"] / max(1, requests), 3),
                            **server.stats()}}

    hooks = Hooks(on_ready=ready, serving=server.start, counters=client.counters, extra_stats=stats)
    try:
        start(store, mountpoint, options.mount, lock=lock, hooks=hooks)
    finally:
        stopper.ended()
        client.say_bye()
        server.close()
