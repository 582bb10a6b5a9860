"""Crafted stores: a store's bytes changed behind its back, with every checksum made valid again, so only
validation and the reader's own checks stand between the change and a reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fanfs.store.format import INDEX_NAME, SHARD_DIR, read_index, shard_name, write_index
from fanfs.util.checksum import checksum


def rewrite(store: Path, edit) -> None:
    """Rewrite STORE/index through ``edit(meta, columns)`` with a valid checksum."""
    path = str(store / INDEX_NAME)
    meta, columns, *_ = read_index(path)
    columns = {name: np.array(column) for name, column in columns.items()}  # writable copies
    edit(meta, columns)
    write_index(path, meta, columns)


def plant_blob(store: Path, blob: int, shard: int, data: bytes, raw: int | None = None) -> None:
    """Make ``data`` blob ``blob``'s stored bytes: appended to its shard ``shard``, the index pointing at them with
    their checksum (and ``raw`` as the size they decode to; None: as stored), the shard's size and checksum
    updated."""
    shard_file = store / SHARD_DIR / shard_name(shard)
    offset = shard_file.stat().st_size
    with open(shard_file, "ab") as f:
        f.write(data)

    def edit(meta, columns):
        columns["blob_offset"][blob], columns["blob_stored"][blob] = offset, len(data)
        columns["blob_raw"][blob] = len(data) if raw is None else raw
        columns["blob_checksum"][blob] = checksum(data)
        columns["shard_size"][shard] = offset + len(data)
        columns["shard_checksum"][shard] = checksum(shard_file.read_bytes())
    rewrite(store, edit)
