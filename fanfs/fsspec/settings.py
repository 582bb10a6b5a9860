"""What the file system presents and what it reads: its keyword arguments turned into a presentation and a store.

Both are here, each in one function, so that they change in one place: the presentation when record
kinds gain settings of their own, the store when a cluster node reads its staged copy and its peers
(:func:`open_store` is then the one thing to replace: a ``Store`` with other ``sources`` and
``is_local``, as :func:`fanfs.cluster.node._mount_alone` builds for a mount).
"""

from __future__ import annotations

import logging
import os

from ..errors import UsageError
from ..records import Presentation, check_presentation
from ..store import Store
from ..util.units import parse_size

log = logging.getLogger("fanfs")

Setting = int | str


def open_store(root: str | os.PathLike, cache_size: int | str) -> Store:
    """The store a file system reads: ``root``'s own shards (checked at open, like a mount's)."""
    try:
        size = parse_size(cache_size) if isinstance(cache_size, str) else int(cache_size)
    except (TypeError, ValueError):
        size = -1
    if size < 0:
        raise UsageError(f"bad cache_size {cache_size!r}: use bytes or a size such as 64M")
    return Store(os.fspath(root), cache_size=size)


def presentation(store: Store, fidelity: Setting = "full", precision: Setting = "full") -> Presentation:
    """``fidelity`` (K, ``"full"`` or ``"auto:SSIM"``) and ``precision`` (BITS or ``"full"``) as the store's
    presentation, checked against its files as ``fanfs mount`` checks them (UsageError naming the range)."""
    return check_presentation(store.index, Presentation(fidelity=_fidelity(store, fidelity),
                                                        precision=_precision(precision)))


def _fidelity(store: Store, value: Setting) -> int:
    """A layer count; ``auto:SSIM`` is looked up on the store's measured curve, as ``fanfs mount`` does (measured
    in this process if not cached yet: no pool is forked from a training process)."""
    if not isinstance(value, str):
        return value  # type: ignore[return-value]  (check_presentation refuses anything but an int)
    from ..tune.fidelity import auto_fidelity, parse_fidelity
    try:
        parsed = parse_fidelity(value)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if isinstance(parsed, int):
        return parsed
    measured = Store(store.root, cache_size=0, sources=store.sources, check_shards=False, index=store.index)
    k, note = auto_fidelity(measured, parsed, jobs=1)  # counted apart: the store's stats are the user's reads
    log.info("%s", note)
    return k


def _precision(value: Setting) -> int:
    if not isinstance(value, str):
        return value  # type: ignore[return-value]
    from ..records.floats import parse_precision
    try:
        return parse_precision(value)
    except ValueError as err:
        raise UsageError(str(err)) from None
