"""The index a pack writes: the tree in entry order, each file's blobs as its shard job returned them.

Shard jobs name files by the id the tree builder gave them as they were read; here those become entries.  A
hard link becomes the file it names again: it shares that file's blobs (format 4, which older fanfs refuse with
one line rather than read wrongly).
"""

from __future__ import annotations

import errno
import os
from typing import Any

import numpy as np

from ..codecs import Codec
from ..ingest import Ingest, Tree
from ..store.format import DIR, FILE, INDEX_NAME, SHARED_BLOBS_FORMAT
from ..store.index import build_index
from ..store.schema import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, header, new_columns
from .shards import NoSpace, ShardResult

_FILE_COLUMNS = ("record", "layers", "codec", "size", "checksum", "count", "first", "shard")


def write_store_index(tmp: str, tree: Tree, ingest: Ingest, opts: Any, store_id: bytes, codecs: list[Codec],
                      results: list[ShardResult]) -> dict[str, Any]:
    """Write ``tmp/index``; returns what the pack reports (totals, records, fallbacks, adopted)."""
    n = len(tree.paths)
    cols = new_columns(ENTRY_COLUMNS, n)
    for key in ("parent", "type", "mode", "mtime", "size", "first", "count"):  # what the tree holds
        cols[key][:] = getattr(tree, key)
    targets = bytearray()
    for entry, target in sorted(tree.targets.items()):
        cols["first"][entry], cols["count"][entry] = len(targets), len(target)
        targets += target
    blob_parts: dict[str, list[np.ndarray]] = {}
    base = 0
    stats: dict[int, list[int]] = {}
    fallbacks: list[tuple[str, str, str]] = []
    adopted: list[tuple[str, str, str]] = []
    for result in results:
        f = result.files
        entries = tree.entry_of[f["entry"]]
        for key in ("record", "layers", "codec", "size", "checksum", "count"):
            cols[key][entries] = f[key]
        cols["first"][entries] = f["first"] + base
        cols["shard"][entries] = result.shard
        for key, column in result.blobs.items():
            blob_parts.setdefault(key, []).append(column)
        base += result.blobs["blob_raw"].size
        fallbacks += result.fallbacks
        adopted += result.adopted
        for codec, (files, raw, stored) in result.stored_by_codec.items():
            acc = stats.setdefault(codec, [0, 0, 0])
            acc[0] += files
            acc[1] += raw
            acc[2] += stored
    if tree.links:
        link, target = (np.array(side, np.int64) for side in zip(*tree.links))
        for key in _FILE_COLUMNS:
            cols[key][link] = cols[key][target]
    cols.update(new_columns(BLOB_COLUMNS, 0))
    for key, parts in blob_parts.items():
        cols[key] = np.concatenate(parts)
    cols.update(new_columns(SHARD_COLUMNS, len(results)))
    cols["shard_size"][:] = [r.size for r in results]
    cols["shard_checksum"][:] = [r.checksum for r in results]
    file_rows = cols["type"] == FILE
    linked = np.zeros(n, bool)
    if tree.links:
        linked[[a for a, _ in tree.links]] = True
    files = int(file_rows.sum())
    bytes_in = int(cols["size"][file_rows & ~linked].sum())
    records = {kind.name: {"files": int(((cols["record"] == kind.kind_id) & file_rows).sum()),
                           "fallbacks": sum(1 for k, _, _ in fallbacks if k == kind.name), **(kind.pack_config() or {})}
               for kind in opts.kinds}
    held = [kind for kind in opts.kinds if records[kind.name]["files"]]
    shared = [SHARED_BLOBS_FORMAT] if linked[file_rows].any() else []
    sources = ingest.describe()
    meta = header(
        format_version=max([1, *shared, *(kind.since_format for kind in held)]),  # older fanfs keep reading what they can
        store_id=store_id, source="; ".join(s["path"] for s in sources), sources=sources,
        expand_archives=opts.expand_archives, codecs=[c.get_config() for c in codecs],
        codec_stats={str(c): {"files": v[0], "raw": v[1], "stored": v[2]} for c, v in sorted(stats.items())},
        records=records, plan=opts.plan.describe() if opts.plan else None,  # class -> codec index (fanfs.pack.plan)
        totals={"entries": n, "files": files, "dirs": int((tree.type == DIR).sum()), "symlinks": len(tree.targets),
                "bytes_in": bytes_in, "bytes_presented": int(cols["size"][file_rows].sum()),
                "bytes_stored": int(cols["blob_stored"].sum()), "shards": len(results)})
    dictionaries = opts.plan.dictionaries() if opts.plan else {}
    try:
        build_index(os.path.join(tmp, INDEX_NAME), meta, tree.paths, cols, bytes(targets), dictionaries)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(tmp) from None
        raise
    return {"totals": meta["totals"], "fallbacks": fallbacks, "adopted": adopted,
            "records": {k: v["files"] for k, v in records.items()}}
