"""The index schema, written down once: its columns and their types, and the header a writer writes.

The packer (and ``tools/bench/bench_index.py``'s synthetic stores) make their columns with :func:`new_columns`
and their header with :func:`header`; the reader checks a file's columns with :func:`check_schema`
(:class:`fanfs.store.index.Index`) and the validator its header's totals against :data:`TOTALS`
(:mod:`.validate`).  What a column means is in :mod:`.index`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import __version__
from ..errors import StoreError
from ..records import CHUNK_SIZE

# Column -> dtype; every one must be present with exactly this type.
ENTRY_COLUMNS = {
    "parent": np.uint32, "type": np.uint8, "record": np.uint8, "mode": np.uint32, "mtime": np.int64,
    "size": np.uint64, "first": np.uint64, "count": np.uint32, "layers": np.uint16, "codec": np.uint8,
    "shard": np.uint32, "checksum": np.uint64,
}
BLOB_COLUMNS = {"blob_offset": np.uint64, "blob_stored": np.uint32, "blob_raw": np.uint32,
                "blob_checksum": np.uint64}
SHARD_COLUMNS = {"shard_size": np.uint64, "shard_checksum": np.uint64}
PATH_COLUMNS = {"paths": np.uint8, "path_offset": np.uint64, "hash_sorted": np.uint64, "hash_entry": np.uint32,
                "targets": np.uint8}
TOTALS = ("entries", "files", "dirs", "symlinks", "bytes_in", "bytes_presented", "bytes_stored", "shards")
"""The header's ``totals``: counts every index carries."""


def new_columns(schema: Mapping[str, Any], length: int) -> dict[str, np.ndarray]:
    """Zeroed columns of ``schema`` (ENTRY_COLUMNS, BLOB_COLUMNS or SHARD_COLUMNS), ``length`` values each."""
    return {name: np.zeros(length, dtype) for name, dtype in schema.items()}


def header(*, store_id: bytes, source: str, codecs: Sequence[Mapping[str, Any]], totals: Mapping[str, int],
           codec_stats: Mapping[str, Mapping[str, int]], records: Mapping[str, Any] | None = None,
           plan: Mapping[str, Any] | None = None, format_version: int = 1,
           sources: Sequence[Mapping[str, str]] | None = None, expand_archives: bool = False) -> dict[str, Any]:
    """An index's JSON header: ``codecs`` (configs) as the ``codec`` column numbers them, ``totals`` (every one of
    :data:`TOTALS`), ``codec_stats`` (codec number -> files, raw, stored), ``records`` (kind name -> files,
    fallbacks and the kind's pack options), ``plan`` (fanfs.pack.plan's description, if packed with one), ``sources``
    (each source's path and kind: directory, tar, tar.gz..., zip) and whether archives inside them were expanded."""
    missing = [name for name in TOTALS if name not in totals]
    if missing:
        raise ValueError(f"index totals lack {', '.join(missing)}")
    return {
        "format": format_version, "store_id": store_id.hex(), "fanfs": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": source, "chunk_size": CHUNK_SIZE, "codecs": list(codecs), "codec_stats": dict(codec_stats),
        "records": dict(records or {}), "plan": plan, "totals": dict(totals),
        "sources": [dict(s) for s in sources or ({"path": source, "kind": "directory"},)],
        "expand_archives": expand_archives,
    }


def check_schema(columns: Mapping[str, np.ndarray]) -> None:
    """Every column present, of its type, and of the length the others imply (StoreError naming the first fault)."""
    expected = {**ENTRY_COLUMNS, **BLOB_COLUMNS, **SHARD_COLUMNS, **PATH_COLUMNS}
    for name, dtype in expected.items():
        if name not in columns:
            raise StoreError(f"index has no {name!r} column: the store is corrupt or of another fanfs; repack it")
        if columns[name].dtype != np.dtype(dtype):
            raise StoreError(f"index column {name!r} is {columns[name].dtype}, not {np.dtype(dtype)}: the store is corrupt")
    for name, column in columns.items():
        if name not in expected and not (name.startswith("dict:") and column.dtype == np.uint8):
            raise StoreError(f"index has an unknown column {name!r}: written by another fanfs; repack the store")
    entries = columns["parent"].size
    groups = (("entry", ENTRY_COLUMNS, entries), ("blob", BLOB_COLUMNS, columns["blob_offset"].size),
              ("shard", SHARD_COLUMNS, columns["shard_size"].size), ("hash", {"hash_sorted": 0, "hash_entry": 0}, entries))
    for what, names, length in groups:
        for name in names:
            if columns[name].size != length:
                raise StoreError(f"index column {name!r} has {columns[name].size} values for {length} {what}s: "
                                 "the store is corrupt; repack it")
    if entries < 1 or columns["path_offset"].size != entries + 1:
        raise StoreError("index path table does not match its entries: the store is corrupt; repack it")
