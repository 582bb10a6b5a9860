"""What the file system presents and what it reads: its keyword arguments turned into a presentation and a store.

Both are here, each in one function, so that they change in one place: the presentation (whatever settings
the record kinds declare, by name, read from their registry), and the store: a store directory's own
shards, or a cluster node's view (its staged copy, its peers: :func:`fanfs.cluster.nodeview.open_node`,
the store the node's mount would serve).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import UsageError
from ..records import Presentation, check_presentation, parse_all, resolve, unresolved
from ..store import Store
from ..util.units import parse_size

log = logging.getLogger("fanfs")

Value = int | str
"""A setting's value as given to the file system: its kind's syntax, or an int."""


def open_store(root: str | os.PathLike | None, node: str | os.PathLike | None,
               cache_size: int | str) -> tuple[Store, Callable[[], dict[str, Any]]]:
    """The store a file system reads, and its counters beyond the store's own: ``root``'s own shards (checked
    at open, like a mount's), or the view of the cluster node serving in the directory ``node`` (its requests
    to peers counted too)."""
    try:
        size = parse_size(cache_size) if isinstance(cache_size, str) else int(cache_size)
    except (TypeError, ValueError):
        size = -1
    if size < 0:
        raise UsageError(f"bad cache_size {cache_size!r}: use bytes or a size such as 64M")
    if node is None:
        assert root is not None
        return Store(os.fspath(root), cache_size=size), dict
    from ..cluster.nodeview import open_node
    view = open_node(node, size)
    return view.store, view.client.counters


def presentation(store: Store, given: Mapping[str, Value]) -> Presentation:
    """The settings given (a record kind's setting by name: its value as the command line writes it, e.g.
    ``fidelity="auto:0.95"``, or an int) as the store's presentation, checked against its files as ``fanfs mount``
    checks it (UsageError naming the range).  ``auto`` values are looked up on the store's measured curve, as
    ``fanfs mount`` does (measured in this process if not cached yet: no pool is forked from a training process)."""
    from .. import tune  # noqa: F401  (registers the resolvers of auto values)
    values = parse_all(given)
    measured = store
    if unresolved(values):  # counted apart: the store's stats are the user's reads
        measured = Store(store.root, cache_size=0, sources=store.sources, check_shards=False, index=store.index)
    return check_presentation(store.index, resolve(measured, values, processes=1, note=lambda text: log.info("%s", text)))
