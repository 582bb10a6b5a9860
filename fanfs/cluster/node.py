"""One node of a job mount: its blobs on local disk, the others read from peers.

Every node mounts the same store with ``--local-dir``.  Alone, it is one node holding every blob and
MPI is never used.  Under mpiexec/srun (one rank per node) the rank first forks its serving daemon
(:mod:`.handoff`, :mod:`.serving`), then runs the job's collective start over MPI: every rank checks
its mount point and store and all agree (a failure anywhere is the same one-line error everywhere),
rank 0 reads the index and broadcasts it, ``auto`` settings are resolved once, the blobs are staged if
asked, every daemon's peer address and public key are gathered (:mod:`fanfs.peers.peerwire`).  The daemons then
serve each other over TCP, independent processes: one node's death (kill -9, OOM) or stop takes
nothing else down, and the launcher, told not to clean up (``mpiexec -disable-auto-cleanup``;
``srun``'s default), lets the survivors serve on.  MPI is finalised right after the job's last collective
call (the peer addresses), or after an error every rank agreed on: there every rank is alive and calls
it, so nothing of MPI (its shared-memory segments in /dev/shm) outlives the start.  After any other
failure a rank may be dead and finalising could block: the rank then exits without it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import FanfsError, StoreError
from .. import tune  # noqa: F401  (registers the resolvers of auto values)
from ..records import Presentation, Value, blobs_read, check_presentation, resolve, unresolved
from ..serve.control import MountLock
from ..serve.daemon import Hooks, check_mountpoint, opened_paths, setup_logging, start
from ..store import Store
from ..store.format import shard_name
from ..store.index import Index
from ..util.mounts import mounted, unmount
from ..util.runtime import private_dir
from .handoff import Handoff
from ..cache.lazy import LazyShare, lazy_stats
from .nodeview import node_dir, node_store, withdraw
from ..cache.prefetch import follow_orders
from ..peers.placement import Placement, place
from .serving import NodeOptions, Plan, daemon_main
from ..cache.stage import LOCAL_DIR_REMEDY, held_parts, stage, staged_presentation, staged_share, staged_stats
from ..peers.world import AgreedError, World, launched_ranks, load_index

log = logging.getLogger("fanfs")


def missing_shards(directory: str, placement: Placement, rank: int, index: Index, staged: np.ndarray) -> list[int]:
    """Shards of which this node holds staged blobs but has no local copy of full size."""
    missing = []
    for part in held_parts(index, placement, rank, staged):
        try:
            if os.stat(os.path.join(directory, shard_name(part.shard))).st_size == int(index.shard_size[part.shard]):
                continue
        except FileNotFoundError:
            pass
        missing.append(part.shard)
    return missing


def check_node_paths(store_root: str, mountpoint: str, local_dir: str, serve_only: bool = False) -> None:
    """A node's mount point (``serve_only``: its node directory, made if missing), and its local directory if it
    exists (staging makes it), are safe to use."""
    if serve_only:
        node_dir(mountpoint)
    else:
        check_mountpoint(mountpoint, opened_paths(store_root, local_dir))
    if os.path.lexists(local_dir):
        private_dir(local_dir, "local directory", LOCAL_DIR_REMEDY, create=False)


def job_presentation(world: World, store_root: str, index: Index, values: Mapping[str, Value]) -> Presentation:
    """The presentation ``values`` ask for, the same on every rank: ``auto`` values (``auto:SSIM``) are resolved
    once for the whole job, by rank 0 (in-process, reading the shared store); no other rank reads the index or
    the shards for it."""
    if not unresolved(values):
        return Presentation(values)
    presentation, error = None, None
    if world.rank == 0:
        try:
            store = Store(store_root, check_shards=False, index=index)
            presentation = resolve(store, values, processes=1, note=lambda text: log.info("%s", text))
        except (FanfsError, OSError) as err:
            error = str(err)
    world.agree(error)
    return Presentation(world.bcast(presentation and dict(presentation)))


def mount_node(store_root: str, mountpoint: str, options: NodeOptions,
               prepare: Callable[[], None] | None = None) -> int:
    """Mount this node's view of the store (collective under a launcher); returns the serving pid.

    ``prepare`` runs first, on this node (e.g. making its directories): under a launcher its failure is
    agreed on like any other, so no node waits for one that will never join.
    """
    if launched_ranks()[1] > 1 and not options.mount.foreground:
        raise StoreError("under mpiexec/srun, mount with --foreground (the launcher must see the node's daemon)")
    if options.mount.foreground:
        setup_logging(options.mount.debug, options.job_node)
    # A Slurm job's node, even alone: its signals reach this task, which passes them on.  A node serving without
    # a mount is a job's node too (of one node if alone): the same daemon, peer server and end.
    if launched_ranks()[1] > 1 or options.job_node is not None or options.serve_only:
        return _mount_in_job(store_root, mountpoint, options, prepare)
    if prepare is not None:
        prepare()
    lock = MountLock(mountpoint)
    try:
        return _mount_alone(store_root, mountpoint, options, lock)
    finally:
        lock.remove()  # unless the daemon took it over: the mount was refused before


def _mount_alone(store_root: str, mountpoint: str, options: NodeOptions, lock: MountLock) -> int:
    check_node_paths(store_root, mountpoint, options.local_dir)
    world = World.detect()
    index = load_index(store_root, world)
    options = _resolved(options, world, store_root, index)
    check_presentation(index, options.mount.presentation)
    staged = _stage_if_asked(store_root, options, world, index)
    if options.stage == "lazy":
        node = node_store(store_root, index, 0, 1, 1, options.local_dir, staged, None, options.mount.cache_size,
                          lazy=True, capacity=options.capacity, owner=True)
        share = node.share
        assert isinstance(share, LazyShare)
        prefetcher, commands = follow_orders(node.store, share, [], staged, mountpoint)
        hooks = Hooks(counters=share.local.counters, commands=commands,
                      extra_stats=lambda counters: {**staged_stats(share, counters["by_source"]),
                                                    **lazy_stats(share, counters, prefetcher)},
                      on_present=lambda presentation: setattr(prefetcher, "presentation", presentation))
        try:
            return start(node.store, mountpoint, options.mount, lock=lock, hooks=hooks)
        finally:
            prefetcher.close()
    placement = place(index.blob_stored, 1, 1)
    share = staged_share(store_root, options.local_dir, index, staged, placement.held(0))
    missing = missing_shards(options.local_dir, placement, 0, index, share.staged)
    if missing:
        raise StoreError(f"{options.local_dir}: {len(missing)} of the store's shards are missing or incomplete "
                         f"(first: {shard_name(missing[0])}): run 'fanfs stage' or mount with --stage")

    def is_local(entry: int, view: int) -> bool:  # the staged layers serve it
        return store.kind(entry).reads_within(view, store.view(entry, staged))

    store = Store(store_root, cache_size=options.mount.cache_size, sources=[share.local, share.shared],
                  check_shards=False, index=index, is_local=is_local)
    hooks = Hooks(extra_stats=lambda counters: staged_stats(share, counters["by_source"]))
    return start(store, mountpoint, options.mount, lock=lock, hooks=hooks)


def _stage_if_asked(store_root: str, options: NodeOptions, world: World, index: Index) -> Presentation:
    """Stage at the mount's presentation if asked (collective); the presentation the local copies hold (lazily: the
    one whose blobs the cache keeps first)."""
    if options.stage == "lazy":
        return options.mount.presentation
    if options.stage:
        report = stage(store_root, options.local_dir, options.replicas, world, index,
                       presentation=options.mount.presentation)
        if report is not None:
            print(report.format(), flush=True)
        return options.mount.presentation
    return staged_presentation(options.local_dir, index.meta["store_id"]) or Presentation()


def _mount_in_job(store_root: str, mountpoint: str, options: NodeOptions,
                  prepare: Callable[[], None] | None) -> int:
    locks: list[MountLock] = []

    def check_node() -> None:
        if prepare is not None:
            prepare()
        locks.append(MountLock(mountpoint))
        if not os.path.isdir(store_root):
            raise StoreError(f"{store_root}: no such store directory")
        check_node_paths(store_root, mountpoint, options.local_dir, options.serve_only)

    try:
        error = _problem(check_node)
        if error is not None:  # this node will not serve: every rank learns why at the first agreement
            World.detect().agree(error)
        child = Handoff.spawn(lambda sock: daemon_main(sock, mountpoint, locks[0]),  # before MPI: see .handoff
                              end_with_rank=options.job_node is not None, keep=[locks[0].fd])
        return _start_job(child, store_root, mountpoint, options)
    except AgreedError:
        World.detect().finalize()  # every rank raised it at the same agreement: all alive, all end MPI
        raise
    finally:
        for lock in locks:
            lock.remove()  # the daemon has ended (or never started)


def _start_job(child: Handoff, store_root: str, mountpoint: str, options: NodeOptions) -> int:
    """The job's collective start, then wait for this node's daemon until the job ends; its pid."""
    kind, value = child.recv() or ("error", "the serving daemon did not start")
    try:
        world = World.detect()
        world.agree(value if kind == "error" else None)
        index = load_index(store_root, world)
        options = _resolved(options, world, store_root, index)
        world.agree(_problem(lambda: check_presentation(index, options.mount.presentation)))
        staged = _stage_if_asked(store_root, options, world, index)
        placement = place(index.blob_stored, world.size, options.replicas)
        missing = [] if options.stage == "lazy" else \
            missing_shards(options.local_dir, placement, world.rank, index, blobs_read(index, staged))
        if missing:
            log.warning("%s: %d shard copies of this node are missing or incomplete (first: %s); their reads go "
                        "to replicas", options.local_dir, len(missing), shard_name(missing[0]))
        address, public = value
        gathered = world.allgather((tuple(address), public))  # the job's last MPI call: from here on, sockets
        world.finalize()  # every rank is here and alive: MPI leaves nothing behind (/dev/shm segments)
        endpoints, publics = [a for a, _ in gathered], [p for _, p in gathered]
        child.send(Plan(store_root, bytes(index.data), world.rank, world.size, endpoints, publics, options, staged))
    except BaseException:
        try:
            child.send(None)  # the daemon leaves without serving
        except OSError:
            pass  # it has left already
        child.wait()
        raise
    code = child.wait()
    if code and options.serve_only:  # killed (-9, OOM) while serving: its view must not outlive it
        withdraw(mountpoint)
    elif code and mounted(mountpoint):  # killed (-9, OOM) while serving: a dead mount answers ENOTCONN to all
        unmount(mountpoint, lazy=True)
    if code:
        raise FanfsError(f"this node's daemon (pid {child.pid}) ended with "
                         + (f"signal {-code}" if code < 0 else f"status {code}"))
    return child.pid


def _resolved(options: NodeOptions, world: World, store_root: str, index: Index) -> NodeOptions:
    """``options`` with the job's ``auto`` settings resolved (collective when there are some)."""
    if not options.auto:
        return options
    presentation = job_presentation(world, store_root, index, {**options.mount.presentation, **options.auto})
    return dataclasses.replace(options, auto={}, mount=dataclasses.replace(options.mount, presentation=presentation))


def _problem(check: Callable[[], object]) -> str | None:
    try:
        check()
    except FanfsError as err:
        return str(err)
    except OSError as err:
        return f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
    return None
