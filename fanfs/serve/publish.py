"""What a mount hands an in-process reader of its files (``fanfs run``): enough to read the same store in the reader's
own process, as the mount reads it, with no request per file.

Asked once per reader process over the control socket (whose both ends check the other is the same user), the "view"
answer says which store and how this node reads it (its *recipe*: the store's own shards, or a job node's staged copy,
lazy cache and peers), and passes a descriptor of each memory it shares: the index the mount validated, in sealed memory
(:mod:`fanfs.store.trust`: one copy per node, which nobody can change), the shown memory (:mod:`.shown`: whether the
mount serves, and the presentation it shows now); where the mount reads ahead of a known order, its memory of reads
(:meth:`fanfs.store.Store.follow_reads`), in which the reader notes its own, as the serving processes do, so that the
read-ahead sees how far it got; and where the store holds extents, its record of the chunks verified in each copy
(:meth:`fanfs.store.extents.ExtentPlaces.adopt`), so that a chunk is verified once for the node, not once per reader.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..store import Store
from ..store.trust import SealedMemory, sealed_copy
from .control import FDS, Handler
from .shown import Shown

def store_recipe(store: Store) -> dict[str, Any]:
    """A mount of a store's own shards (and whether they lie on a network file system: the reader need not ask)."""
    return {"kind": "store", "network": any(getattr(source, "deadline", None) is not None for source in store.sources)}


def view_handler(store: Store, shown: Callable[[], Shown], mountpoint: str,
                 recipe: Callable[[], dict[str, Any]] | None = None) -> Handler:
    """The control socket's "view" request of the mount of ``store`` at ``mountpoint``; ``recipe()``: how a reader
    builds this node's store (default: the store's own shards)."""
    lock = threading.Lock()
    memory: list[SealedMemory] = []

    def index_fd() -> int:
        index = store.index
        if isinstance(index.memory, SealedMemory):
            return index.memory.fd
        with lock:  # an index broadcast to a job's nodes came as bytes: sealed once, at the first reader's request
            if not memory:
                memory.append(sealed_copy(index.memory))
        return memory[0].fd

    def view(message: dict[str, Any]) -> dict[str, Any]:
        shared = {"index": index_fd(), "shown": shown().fd}
        clock = store.read_clock
        if clock is not None and clock.fd is not None:
            shared["reads"] = clock.fd
        if store.extents is not None and store.extents.memory_fd is not None:
            shared["extents"] = store.extents.memory_fd
        return {"store": store.root, "store_id": store.meta["store_id"], "mountpoint": mountpoint,
                "index_bytes": len(store.index.memory), "recipe": recipe() if recipe is not None else store_recipe(store),
                "sources": [source.name for source in store.sources], "shared": list(shared), FDS: list(shared.values())}

    return view
