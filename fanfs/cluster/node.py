"""One node of a job mount: its blobs on local disk, the others read from peers.

Every node mounts the same store with ``--local-dir``.  Alone, it is one node holding every blob and
MPI is never used.  Under mpiexec/srun (one rank per node) the rank first forks its serving daemon
(:mod:`.handoff`, :mod:`.serving`), then runs the job's collective start over MPI: every rank checks
its mount point and store and all agree (a failure anywhere is the same one-line error everywhere),
rank 0 reads the index and broadcasts it, ``auto`` settings are resolved once, the node's local copies are made
ready (staged if asked: :func:`fanfs.cache.share.ready_copies`), every daemon's peer address and public key are
gathered (:func:`fanfs.peers.peerend.exchange_cards`).  The daemons then
serve each other over TCP, independent processes: one node's death (kill -9, OOM) or stop takes
nothing else down, and the launcher, told not to clean up (``mpiexec -disable-auto-cleanup``;
``srun``'s default), lets the survivors serve on.  MPI is finalised right after the job's last collective
call (the peer addresses), or after an error every rank agreed on: there every rank is alive and calls
it, so nothing of MPI (its shared-memory segments in /dev/shm) outlives the start.  After any other
failure a rank may be dead and finalising could block: the rank then exits without it.

This module only sequences a node's start: how the node gets its blobs (stage or lazy, the capacity's plan, the
prefetcher) is decided in the cache (:mod:`fanfs.cache.share`), its peer client and server are set up by the peers
(:mod:`fanfs.peers.peerend`), and the daemon's side is :func:`.serving.serve_job`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping

from ..errors import FanfsError, StoreError
from .. import tune  # noqa: F401  (registers the resolvers of auto values)
from ..records import Presentation, Value, check_presentation, resolve, unresolved
from ..serve.listener import MountLock
from ..serve.daemon import check_fuse, check_mountpoint, start
from ..serve.logfile import setup_logging
from ..store import Store
from ..store.index import Index
from ..util.mounts import mounted, unmount
from ..cache.share import CacheHooks, ReadyCopies, check_local_dir, node_store, ready_copies
from ..peers.peerend import exchange_cards
from ..peers.world import AgreedError, World, launched_ranks, load_index
from .handoff import Handoff
from .nodeview import node_dir, withdraw
from .serving import NodeOptions, Plan, daemon_main

log = logging.getLogger("fanfs")


def check_node_paths(store_root: str, mountpoint: str, local_dir: str, serve_only: bool = False,
                     shared: str | None = None) -> None:
    """This user may mount with FUSE here (unless ``serve_only``), before anything is staged; a node's mount point
    (``serve_only``: its node directory, made if missing), its local directory if it exists (staging makes it), and the
    base of its shared copies (``shared``), are safe to use."""
    if serve_only:
        node_dir(mountpoint)
    else:
        check_fuse()
        check_mountpoint(mountpoint, store_root, local_dir, shared)
    check_local_dir(local_dir, shared)


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
    """A node alone: its paths, the index, the presentation, its local copies ready (:mod:`fanfs.cache.share`), its
    store and the cache's hooks, then the mount."""
    check_node_paths(store_root, mountpoint, options.local_dir, shared=options.shared)
    world = World.detect()
    index = load_index(store_root, world)
    options = _resolved(options, world, store_root, index)
    check_presentation(index, options.mount.presentation)
    copies = ready_copies(store_root, options.local_dir, options.stage, options.replicas, world, index,
                          options.mount.presentation, alone=True, shared=options.shared)
    try:
        node = node_store(store_root, index, 0, 1, 1, copies.local_dir, copies.presentation, None,
                          options.mount.cache_size, lazy=options.stage == "lazy", capacity=options.capacity, owner=True,
                          shared=copies.stage == "shared")
    finally:
        copies.release()  # a shared copy: the store's source holds a lease of its own, which its daemon keeps
    cache = CacheHooks(node.store, options.mount.presentation, mountpoint, options.mount.prefetch, node)
    try:
        return start(node.store, mountpoint, options.mount, lock=lock, hooks=cache.hooks())
    finally:
        cache.close()


def _mount_in_job(store_root: str, mountpoint: str, options: NodeOptions,
                  prepare: Callable[[], None] | None) -> int:
    locks: list[MountLock] = []

    def check_node() -> None:
        if prepare is not None:
            prepare()
        locks.append(MountLock(mountpoint))
        if not os.path.isdir(store_root):
            raise StoreError(f"{store_root}: no such store directory")
        check_node_paths(store_root, mountpoint, options.local_dir, options.serve_only, options.shared)

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
    """The job's collective start (the daemon's peer address, the index, the presentation, the local copies ready
    (:mod:`fanfs.cache.share`), every node's peer address (:mod:`fanfs.peers.peerend`), then the plan handed to
    the daemon), then wait for this node's daemon until the job ends; its pid."""
    kind, value = child.recv() or ("error", "the serving daemon did not start")
    copies: ReadyCopies | None = None
    try:
        world = World.detect()
        world.agree(value if kind == "error" else None)
        index = load_index(store_root, world)
        options = _resolved(options, world, store_root, index)
        if options.stage == "shared":  # every node holds the whole store
            options = dataclasses.replace(options, replicas=world.size)
        world.agree(_problem(lambda: check_presentation(index, options.mount.presentation)))
        copies = ready_copies(store_root, options.local_dir, options.stage, options.replicas, world, index,
                              options.mount.presentation, alone=False, shared=options.shared)
        options = dataclasses.replace(options, local_dir=copies.local_dir, stage=copies.stage)
        endpoints, publics = exchange_cards(world, value)
        child.send(Plan(store_root, bytes(index.data), world.rank, world.size, endpoints, publics, options,
                        copies.presentation))
    except BaseException:
        try:
            child.send(None)  # the daemon leaves without serving
        except OSError:
            pass  # it has left already
        child.wait()
        if copies is not None:
            copies.release()
        raise
    try:
        code = child.wait()
    finally:
        copies.release()  # the daemon has ended: the node reads its shared copy no more
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
