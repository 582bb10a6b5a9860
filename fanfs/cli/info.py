"""``fanfs info``: what a store holds and how well it compressed, as text or JSON."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import codec_from_config
from ..records import kind_named, kinds
from ..util.units import human_size
from ..store.format import FILE
from ..store.reader import Store


def store_info(store: Store) -> dict[str, Any]:
    meta = store.meta
    totals = dict(meta["totals"])
    sizes = store.index.shard_size
    codecs = []
    for ix, stats in meta["codec_stats"].items():
        codec = codec_from_config(meta["codecs"][int(ix)], store.index.dictionaries)
        codecs.append({"codec": codec.spec, "files": stats["files"], "raw": stats["raw"], "stored": stats["stored"],
                       "ratio": round(stats["raw"] / stats["stored"], 3) if stats["stored"] else None})
    return {
        "store": store.root, "store_id": meta["store_id"], "format": meta["format"], "created": meta["created"],
        "source": meta["source"], "sources": meta.get("sources", [{"path": meta["source"], "kind": "directory"}]),
        "expand_archives": bool(meta.get("expand_archives")), **totals,
        "ratio": round(totals["bytes_in"] / totals["bytes_stored"], 3) if totals["bytes_stored"] else None,
        "codecs": codecs,
        "shard_bytes": {"min": int(sizes.min()) if sizes.size else 0, "max": int(sizes.max()) if sizes.size else 0,
                        "total": int(sizes.sum())},
        "index_bytes": store.index.nbytes,
        "records": _records(store),
        "classes": _plan_classes(store),
    }


def _records(store: Store) -> dict[str, dict[str, Any]]:
    """Per record kind other than plain: how many files, what its kind says of them, how many fell back."""
    ix = store.index
    recorded = store.meta.get("records") or {}
    out = {}
    for kind_id, kind in sorted(kinds().items()):
        entries = np.flatnonzero((ix.record == kind_id) & (ix.type == FILE))
        packed = recorded.get(kind.name) or {}
        fallbacks = packed.get("fallbacks", store.meta["totals"].get(f"{kind.name}_fallbacks", 0))  # format 1 totals
        if kind_id and (entries.size or fallbacks):
            out[kind.name] = {"label": kind.label, "files": int(entries.size), "fallbacks": int(fallbacks),
                              **kind.describe(ix, entries)}
    return out


def _plan_classes(store: Store) -> list[dict[str, Any]]:
    """Packed with ``--plan``: per content class the codec it got and the ratio it reached (fanfs.plan)."""
    plan = store.meta.get("plan")
    if not plan:
        return []
    out = []
    for name, entry in sorted(plan["classes"].items(), key=lambda item: item[1]["codec_index"]):
        ix = entry["codec_index"]
        stats = store.meta["codec_stats"].get(str(ix), {"files": 0, "raw": 0, "stored": 0})
        codec = codec_from_config(store.meta["codecs"][ix], store.index.dictionaries)
        record = entry.get("record")
        label = kind_named(record["kind"]).plan_label(record, codec.spec) if record else codec.spec
        out.append({"class": name, "codec": label, "files": stats["files"], "raw": stats["raw"],
                    "stored": stats["stored"], "measured": entry.get("measured", True),
                    "ratio": round(stats["raw"] / stats["stored"], 3) if stats["stored"] else None,
                    "predicted_ratio": entry.get("predicted_ratio")})
    return out


def _codec_note(info: dict[str, Any]) -> str:
    """What the codec table's columns mean: a source file, its full presentation and its stored bytes differ."""
    jpeg, tiers = "jpeg" in info["records"], any("tiers" in r for r in info["records"].values())
    return ("full size: the files as presented at full fidelity" + (" (a JPEG record: its progressive file, a few % "
                                                                    "smaller than the source's)" if jpeg else "")
            + "\nstored: their bytes in the shards" + (", resolution tiers included (a ratio can fall below 1)" if tiers
                                                         else "")
            + ("; raw: stored as they are (compression would not pay" + ("; JPEG scans are compressed already"
                                                                          if jpeg else "") + ")"
               if any(c["codec"] == "raw" for c in info["codecs"]) else ""))


def format_info(info: dict[str, Any]) -> str:
    lines = [
        f"store      {info['store']}  (id {info['store_id'][:12]}, format {info['format']}, created {info['created']})",
        *(f"{'source' if i == 0 else '':<10} {s['path'] if s['path'] != '-' else 'standard input'} ({s['kind']})"
          + (f" under {s['prefix']}/" if s.get("prefix") else "")
          for i, s in enumerate(info["sources"])),
        *(["           (archives inside them expanded into directories)"] if info["expand_archives"] else []),
        f"entries    {info['files']:,} files, {info['dirs']:,} dirs, {info['symlinks']:,} symlinks",
        f"bytes      {human_size(info['bytes_in'])} in source -> {human_size(info['bytes_stored'])} stored"
        + (f"  (ratio {info['ratio']:.2f})" if info["ratio"] else ""),
        f"shards     {info['shards']:,} ({human_size(info['shard_bytes']['total'])}; "
        f"{human_size(info['shard_bytes']['min'])} .. {human_size(info['shard_bytes']['max'])} each), "
        f"index {human_size(info['index_bytes'])}",
    ]
    for name, r in info["records"].items():
        lines.append(f"{name:<10} {r['files']:,} {r['label']}{kind_named(name).summary(r)}, "
                     f"{r['fallbacks']:,} {kind_named(name).fallback}")
        lines.extend(f"{'':<10} {note}" for note in r.get("notes", []))
    width = max([len("codec"), *(len(c["codec"]) for c in info["codecs"])])
    lines.append(f"{'codec':<{width}}   files  full size     stored   ratio")
    for c in info["codecs"]:
        ratio = f"{c['ratio']:.2f}" if c["ratio"] else "-"
        lines.append(f"{c['codec']:<{width}} {c['files']:>7,} {human_size(c['raw']):>10} "
                     f"{human_size(c['stored']):>10} {ratio:>7}")
    lines += _codec_note(info).splitlines()
    if info.get("classes"):
        lines.append("class (plan)  codec                  files        raw     stored   ratio  predicted")
        for c in info["classes"]:
            if not c["files"]:
                continue
            ratio = f"{c['ratio']:.2f}" if c["ratio"] else "-"
            predicted = f"{c['predicted_ratio']:.2f}" if c["predicted_ratio"] else "(default)"
            lines.append(f"{c['class']:<13} {c['codec']:<20} {c['files']:>7,} {human_size(c['raw']):>10} "
                         f"{human_size(c['stored']):>10} {ratio:>7}  {predicted:>9}")
    return "\n".join(lines)
