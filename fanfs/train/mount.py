"""What a training process learns of a running mount: that it is one, how far it reads ahead, and what its JPEG
records offer.

The daemon names its store (an absolute path) in its status answer; the index is opened here, read-only,
to read the records' layer counts and sizes.  Nothing is read from the shards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import StoreError, UsageError
from ..records import kind_named, offered
from ..serve.control import ControlError, request
from ..store import Store
from ..store.format import FILE


def mount_status(mountpoint: str | os.PathLike) -> dict[str, Any]:
    """The daemon's status (store, pid, presentation); one line saying what to do if none answers."""
    mnt = os.fspath(mountpoint)
    try:
        return request(mnt, {"cmd": "status"}, timeout=30, needs=("store",))
    except ControlError as err:
        raise UsageError(f"{err}: is {mnt} a fanfs mount? ('fanfs mount STORE {mnt}' first)") from None


def read_ahead_budget(mountpoint: str | os.PathLike) -> int:
    """The bytes the mount reads ahead of a known order, at most (``--prefetch``, a lazy cache's window; 0: none)."""
    return int(request(os.fspath(mountpoint), {"cmd": "read_ahead"}, timeout=30)["budget"])


@contextlib.contextmanager
def jpeg_records(mountpoint: str | os.PathLike) -> Iterator[tuple[Store, np.ndarray]]:
    """The mounted store and the entries of its JPEG records; refused if it holds none."""
    store = Store(mount_status(mountpoint)["store"], check_shards=False)
    try:
        index = store.index
        records = np.flatnonzero((index.record == kind_named("jpeg").kind_id) & (index.type == FILE))
        if records.size == 0:
            raise StoreError(f"the store mounted at {os.fspath(mountpoint)} holds no progressive JPEG records, "
                             "so its fidelity changes nothing: pack with --progressive-jpeg")
        yield store, records
    finally:
        store.close()


def fidelity_offered(mountpoint: str | os.PathLike) -> list[int]:
    """Every fidelity below full that changes some record, least data first: the resolution tiers (``pack
    --scales``), coarsest first, then K = 1, 2, ..."""
    with jpeg_records(mountpoint) as (store, _):
        return offered(store.index, "fidelity")


def fidelity_ks(mountpoint: str | os.PathLike) -> list[int]:
    """Every fidelity below full that changes some record: 1 .. (most layers of a record) - 1."""
    with jpeg_records(mountpoint) as (store, records):
        return list(range(1, int(store.index.layers[records].max())))
