"""One node of a job mount: shards on local disk, the others read from peers over MPI.

Every node mounts the same store with ``--local-dir``; under mpiexec/srun (one rank per node) each
serves its own shards and asks holders for the rest (:mod:`fanfs.peer`).  Alone, it is one node
holding every shard locally and MPI is never initialised.

The FUSE loop stays single-threaded (the fastest choice measured) and runs in the foreground: the
process must never fork once MPI is initialised.  A remote read is made in the loop thread, so it
blocks the loop for up to the peer timeout when a holder is dead; reads of other files wait too.

Shutdown of the job: when this node's FUSE loop ends (``fanfs umount``, SIGTERM), it tells every
peer BYE; a peer's server thread, on the first BYE, lazily unmounts its own mount point so that its
loop ends too and it says BYE in turn.  Each server ends once all peers said BYE, then MPI is
finalised and mpiexec exits 0.  A peer that never says BYE aborts the job after a grace period.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import threading
from typing import Any

from ..errors import FanfsError, StoreError
from ..records import FULL, check_presentation
from ..serve.control import MountLock
from ..serve.daemon import MountOptions, check_mountpoint, setup_logging, start
from ..store import Store
from ..store.format import shard_name
from ..store.index import Index
from ..store.sources import LocalShards
from ..tune.fidelity import auto_fidelity
from .placement import Placement, place
from .stage import stage
from .world import World, launched_ranks, load_index

log = logging.getLogger("fanfs")

SHUTDOWN_GRACE = 60.0  # seconds for every peer to say BYE once this node is done


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


def missing_shards(directory: str, placement: Placement, rank: int, index: Index) -> list[int]:
    """This node's shards that are absent from its local directory or of the wrong size."""
    missing = []
    for shard in placement.shards_of(rank).tolist():
        try:
            if os.stat(os.path.join(directory, shard_name(shard))).st_size == int(index.shard_size[shard]):
                continue
        except FileNotFoundError:
            pass
        missing.append(shard)
    return missing


def job_fidelity(world: World, store_root: str, index: Index, min_ssim: float) -> int:
    """``auto:SSIM`` for the whole job: rank 0 measures the curve (in-process, reading the shared
    store), every rank gets the same K; no other rank reads the index or the shards for it."""
    k, error = FULL, None
    if world.rank == 0:
        try:
            k, note = auto_fidelity(Store(store_root, check_shards=False, index=index), min_ssim, jobs=1)
            log.info("%s", note)
        except (StoreError, OSError) as err:
            error = str(err)
    world.agree(error)
    return int(world.allgather(k)[0])


def mount_node(store_root: str, mountpoint: str, options: MountOptions) -> int:
    """Mount this node's view of the store (collective under MPI); returns the serving pid."""
    assert options.local_dir is not None
    if launched_ranks()[1] > 1 and not options.foreground:
        raise StoreError("under mpiexec/srun, mount with --foreground (a daemon must not fork once MPI runs)")
    if options.foreground:
        setup_logging(None, options.debug)
    world = World.detect()
    error, lock = None, None
    try:
        lock = MountLock(mountpoint)
        check_mountpoint(mountpoint)
        if not os.path.isdir(store_root):
            raise StoreError(f"{store_root}: no such store directory")
        if not world.threads_ok:
            raise StoreError("the MPI library does not provide MPI_THREAD_MULTIPLE")
    except FanfsError as err:
        error = str(err)
    try:
        world.agree(error)
        assert lock is not None
        index = load_index(store_root, world)
        if options.auto_ssim is not None:
            k = job_fidelity(world, store_root, index, options.auto_ssim)
            options = dataclasses.replace(options, presentation=options.presentation._replace(fidelity=k))
        problem = None
        try:
            check_presentation(index, options.presentation)
        except FanfsError as err:
            problem = str(err)
        world.agree(problem)
        if options.stage:
            report = stage(store_root, options.local_dir, options.replicas, world, index)
            if report is not None:
                print(report.format(), flush=True)
        placement = place(index.shard_size, world.size, options.replicas)
        missing = missing_shards(options.local_dir, placement, world.rank, index)
        if world.size == 1:
            if missing:
                raise StoreError(f"{options.local_dir}: {len(missing)} of the store's shards are missing or incomplete "
                                 f"(first: {shard_name(missing[0])}): run 'fanfs stage' or mount with --stage")
            local = LocalShards(options.local_dir, bytes.fromhex(index.meta["store_id"]))
            return start(Store(store_root, cache_size=options.cache_size, sources=[local], check_shards=False,
                               index=index), mountpoint, options, lock=lock)
        if missing:
            log.warning("%s: %d of this node's %d shards are missing or incomplete (first: %s); "
                        "their reads go to replicas", options.local_dir, len(missing),
                        placement.shards_of(world.rank).size, shard_name(missing[0]))
        serve_job(world, store_root, mountpoint, options, index, placement, lock)
        return os.getpid()
    finally:
        if lock is not None:
            lock.release()


def serve_job(world: World, store_root: str, mountpoint: str, options: MountOptions, index: Index,
              placement: Placement, lock: MountLock) -> None:
    """Serve under MPI until the job ends, then shut the peer protocol down and finalise MPI."""
    from .peer import Channels, HeldShards, PeerClient, PeerServer, remote_sources

    assert options.local_dir is not None
    store_id = bytes.fromhex(index.meta["store_id"])
    local = HeldShards(options.local_dir, store_id, placement, world.rank)
    channels = Channels.create(world.comm)
    client = PeerClient(channels, store_id, options.peer_timeout)
    remotes = remote_sources(client, placement)
    store = Store(store_root, cache_size=options.cache_size, sources=[local, *remotes], check_shards=False,
                  index=index)
    stopper = Stopper(mountpoint)
    server = PeerServer(channels, store_id, index.shard_size, placement, LocalShards(options.local_dir, store_id),
                        on_bye=lambda rank: stopper.stop(f"rank {rank} is done"))

    def stats() -> dict[str, Any]:
        by_source = store.stats.by_source
        return {"cluster": {"rank": world.rank, "nodes": world.size, "replicas": placement.replicas,
                            "local_shards": int(placement.shards_of(world.rank).size),
                            "local_bytes": by_source.get(local.name, 0),
                            "remote_bytes": sum(by_source.get(r.name, 0) for r in remotes),
                            **client.stats(), **server.stats()}}

    server.start()
    try:
        start(store, mountpoint, options, lock=lock, on_ready=stopper.serving, extra_stats=stats)
    finally:
        stopper.ended()
        client.say_bye()
        server.join(SHUTDOWN_GRACE)
        if server.is_alive():
            log.error("peers did not end within %.0f s of this node: aborting the job", SHUTDOWN_GRACE)
            world.abort(1)
        client.drain(timeout=5.0)
        server.local.close()
        channels.free()
        world.finalize()
