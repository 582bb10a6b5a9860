"""The job a node belongs to: its MPI world under mpiexec/srun, or a world of one node without them.

mpi4py is imported only when the environment says several ranks were launched, so a single node
never needs (or initialises) MPI.  ``{rank}`` in a path is replaced by this node's rank, which lets
several "nodes" share one host (as the tests do) with one command line.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Any

from ..errors import StoreError
from ..store.format import INDEX_NAME, read_index_file
from ..store.index import Index
from ..util.deadline import Stalled

log = logging.getLogger("fanfs")

# Launchers' variables, most specific first: MPICH/Hydra and Intel MPI (PMI), Open MPI, PMIx, srun steps.
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def launched_ranks() -> tuple[int, int]:
    """(rank, size) the launcher gave this process, from its environment; (0, 1) when run alone.

    ``SLURM_STEP_NUM_TASKS`` (set inside ``srun`` steps only) rather than ``SLURM_NTASKS``, which a
    batch script's own shell also has.
    """
    size = _first_int(_SIZE_VARS, 1)
    return (_first_int(_RANK_VARS, 0), size) if size > 1 else (0, 1)


def local_ranks() -> int:
    """How many ranks of this job the launcher started on this node (1 when run alone)."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(name, "").isdigit():
            return max(1, int(os.environ[name]))
    layout, node = os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""), os.environ.get("SLURM_NODEID", "")
    if layout and node.isdigit():  # srun: "2(x3),1" is 2 tasks on each of 3 nodes, then 1
        counts = []
        for part in layout.split(","):
            tasks, _, times = part.partition("(x")
            counts += [int(tasks)] * int(times.rstrip(")") or 1)
        if int(node) < len(counts):
            return max(1, counts[int(node)])
    return 1


def expand(path: str, rank: int | None = None) -> str:
    """``path`` with ``{rank}`` replaced by this node's rank."""
    return path.replace("{rank}", str(launched_ranks()[0] if rank is None else rank))


def _short_business_card(library_version: str) -> None:
    """Under ``srun --mpi=pmi2``, have an MPICH built with both netmods start on OFI rather than UCX.

    Slurm's pmi2 plugin reads a PMI-1 request with a single ``read()`` of at most 1024 bytes (its own
    "TODO: read until newline"), and MPICH cuts a business card into values of up to 1024 bytes, so a
    UCX card (a worker address of ~1 KB, hex-encoded) sometimes makes a ``put`` line just over the limit:
    Slurm rejects it ("value not properly terminated in client request") and UCX then aborts on a garbled
    address (MPICH issue 6924; MPICH's PMI-2 wire protocol, which carries lengths, does not start under
    Slurm 22.05 at all).  An OFI card is a socket address, far below the limit, and fanfs's MPI traffic is a
    few collective calls at start-up (peers talk over their own sockets), so nothing is lost.  Whatever
    the user set is kept.
    """
    if os.environ.get("SLURM_MPI_TYPE") != "pmi2" or "MPICH" not in library_version:
        return
    devices = next((line for line in library_version.splitlines() if "Device:" in line), "")
    if "ofi" in devices and "ucx" in devices:
        os.environ.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")


class AgreedError(StoreError):
    """A failure every rank of the job raises alike (:meth:`World.agree`): one rank reporting it is enough."""


class World:
    """The ranks of this job: ``comm`` is an mpi4py communicator, or None for a single node."""

    def __init__(self, comm: Any = None) -> None:
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1

    @classmethod
    def detect(cls) -> "World":
        """Initialise MPI if launched by it (used by the main thread only, for the job's collective steps)."""
        rank, size = launched_ranks()
        if size == 1:
            return cls()
        import mpi4py
        mpi4py.rc.initialize = False  # the library is asked first what it is (allowed before MPI_Init)
        mpi4py.rc.finalize = False  # finalising with a dead peer can block: only done where every rank is known alive
        from mpi4py import MPI
        if not MPI.Is_initialized():
            _short_business_card(MPI.Get_library_version())
            MPI.Init_thread(MPI.THREAD_SINGLE)
        MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)  # an MPI error is an exception here, never an abort
        world = cls(MPI.COMM_WORLD)
        if world.rank != rank or world.size != size:
            raise StoreError(f"the launcher says rank {rank} of {size}, MPI says {world.rank} of {world.size}: "
                             "use the MPI library fanfs was installed with (srun: --mpi=pmi2)")
        return world

    def dup(self) -> Any:
        """A private communicator (collective: every rank calls it in the same order)."""
        return self.comm.Dup()

    def bcast_bytes(self, data: bytes | bytearray | mmap.mmap | None) -> bytes | bytearray | mmap.mmap:
        """Rank 0's ``data`` on every rank, sent in place as one raw buffer (an index can be 100+ MB)."""
        if self.comm is None:
            assert data is not None
            return data
        from mpi4py import MPI
        size = self.comm.bcast(len(data) if self.rank == 0 else None)
        buf = data if self.rank == 0 else bytearray(size)
        self.comm.Bcast([buf, MPI.BYTE])
        return buf

    def allgather(self, value: Any) -> list[Any]:
        return [value] if self.comm is None else self.comm.allgather(value)

    def bcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return value if self.comm is None else self.comm.bcast(value)

    def agree(self, error: str | None) -> None:
        """Collective: raise the same StoreError on every rank if any rank failed, so none waits forever."""
        failed = [(rank, e) for rank, e in enumerate(self.allgather(error)) if e]
        if failed:
            agreed = AgreedError(failed[0][1] if self.size == 1 else "; ".join(f"rank {rank}: {e}" for rank, e in failed))
            agreed.said_elsewhere = self.rank != 0  # rank 0 prints it for the job
            raise agreed

    def finalize(self) -> None:
        """End MPI for this process (collective: only where every rank is alive and calls it too)."""
        if self.comm is not None:
            from mpi4py import MPI
            if not MPI.Is_finalized():
                MPI.Finalize()


MPI_SEGMENT_PREFIX = "/dev/shm/mpich_shm_"
"""MPICH's shared memory between the ranks of a host, removed by ``MPI_Finalize``: a rank killed outright leaves it."""


def mpi_segments_held() -> list[str]:
    """The MPI shared-memory segments this process holds open (after MPI's start)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(MPI_SEGMENT_PREFIX) and "/" not in target[len(MPI_SEGMENT_PREFIX):]:
            held.append(target)
    return held


def load_index(store_root: str, world: World) -> Index:
    """The store's index, read from the shared file system and validated once per job (rank 0) and broadcast:
    the other ranks check its checksum and trust rank 0's validation (the job's start-up is its root of trust)."""
    path = os.path.join(store_root, INDEX_NAME)
    data, error, index = None, None, None
    if world.rank == 0:
        try:
            data, identity = read_index_file(path)  # the buffer broadcast (each read waited on for --store-timeout)
            index = Index(path, data=data, file_id=identity)
        except (StoreError, Stalled) as err:
            error = str(err)
        except OSError as err:
            error = f"{store_root}: cannot read the index: {err.strerror or err}"
    world.agree(error)
    data = world.bcast_bytes(data)
    index = index or Index(path, data=data, validated=True)
    log.debug("index of %s: %d entries", store_root, index.entries)
    return index
