#!/usr/bin/env python3
"""Index at ImageNet scale: how fast a fanfs mount of 1.28 M files serves its first stat, and in how much memory.

Writes a valid store directly with ``build_index`` (no data is packed): ImageNet-like paths
``train/n0XXXXXXX/n0XXXXXXX_NNNNN.JPEG``, ~110 KB sizes, raw codec, blobs laid out back to back in
sparse shard files that carry a real header and the size the index states (what ``Store.check_shards``
verifies).  File contents are holes, so reading a file fails its checksum: this measures metadata only.
Measured: index size; ``Store()`` open time in-process (checksum pass + whole-index validation, and again
once this node has validated the file: checksum only, :mod:`fanfs.store.trust`); launching ``fanfs mount`` to the first successful
``os.stat`` of a deep file, ``ls -R`` of one class directory, then 1,000 random stats, with the daemon's
VmRSS/VmHWM after each (RssShmem is the index mapped from tmpfs: shared page cache, not private
memory).  Goal: first stat <= 1 s after launch, daemon <= 150 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

import benchlib as bl
from fanfs.codecs import Raw
from fanfs.records.plain import CHUNK_SIZE
from fanfs.store import Store
from fanfs.store.format import DIR, FILE, INDEX_NAME, SHARD_DIR, SHARD_HEADER, shard_header, shard_name
from fanfs.store.index import build_index
from fanfs.store.schema import BLOB_COLUMNS, ENTRY_COLUMNS, SHARD_COLUMNS, header, new_columns
from fanfs.store.trust import RECORD_NAME

GOAL_SECONDS, GOAL_BYTES = 1.0, 150 * 2**20


def synthesise(store: Path, files: int, dirs: int, shards: int, seed: int = 0) -> list[str]:
    """Write index + sparse shards of an ImageNet-like tree; returns the file paths (relative)."""
    rng = np.random.default_rng(seed)
    wnids = [f"n0{x:07d}" for x in np.sort(rng.choice(9_000_000, dirs, replace=False) + 1_000_000)]
    per_dir = np.full(dirs, files // dirs)
    per_dir[: files % dirs] += 1
    names: list[str] = []
    for wnid, n in zip(wnids, per_dir.tolist()):
        numbers = rng.choice(np.arange(1, 60_000), n, replace=False)
        names += sorted(f"train/{wnid}/{wnid}_{k}.JPEG" for k in numbers.tolist())
    paths = [b"", b"train", *(f"train/{w}".encode() for w in wnids), *(n.encode() for n in names)]
    n_entries, base = len(paths), 2 + dirs  # entries: root, train, class dirs, then every file
    sizes = np.clip(rng.lognormal(np.log(100_000), 0.45, files), 2_000, CHUNK_SIZE).astype(np.uint64)

    cols = new_columns(ENTRY_COLUMNS, n_entries)
    cols["type"][:base], cols["type"][base:] = DIR, FILE
    cols["mode"][:base], cols["mode"][base:] = 0o40755, 0o100644
    cols["mtime"][:] = 1_300_000_000 * 10**9 + rng.integers(0, 10**16, n_entries)
    cols["parent"][2:base] = 1
    cols["parent"][base:] = np.repeat(np.arange(2, base), per_dir)
    cols["first"][:2], cols["count"][:2] = (1, 2), (1, dirs)
    cols["first"][2:base] = base + np.concatenate([[0], np.cumsum(per_dir)[:-1]])
    cols["count"][2:base] = per_dir
    cols["size"][base:] = sizes
    cols["first"][base:] = np.arange(files)  # file i is blob i
    cols["count"][base:] = cols["layers"][base:] = 1
    shard_of = (np.arange(files) * shards // files).astype(np.uint32)
    cols["shard"][base:] = shard_of

    # Blobs back to back after each shard's header.
    starts = np.searchsorted(shard_of, np.arange(shards))
    ends = np.cumsum(sizes)
    before = np.concatenate([[0], ends[:-1]])
    offsets = before - np.concatenate([[0], ends])[starts][shard_of] + SHARD_HEADER.size
    shard_size = np.add.reduceat(sizes, starts) + SHARD_HEADER.size
    blob = new_columns(BLOB_COLUMNS, files)
    blob["blob_offset"][:], blob["blob_stored"][:], blob["blob_raw"][:] = offsets, sizes, sizes
    shard_columns = new_columns(SHARD_COLUMNS, shards)
    shard_columns["shard_size"][:] = shard_size
    store_id = uuid.uuid4().bytes
    (store / SHARD_DIR).mkdir(parents=True)
    for shard in range(shards):
        with open(store / SHARD_DIR / shard_name(shard), "wb") as f:
            f.write(shard_header(shard, store_id))
            f.truncate(int(shard_size[shard]))
    total = int(sizes.sum())
    meta = header(store_id=store_id, source="synthetic ImageNet-like tree (tools/bench/bench_index.py)",
                  codecs=[Raw().get_config()], codec_stats={"0": {"files": files, "raw": total, "stored": total}},
                  totals={"entries": n_entries, "files": files, "dirs": base, "symlinks": 0, "bytes_in": total,
                          "bytes_presented": total, "bytes_stored": total, "shards": shards})
    build_index(str(store / INDEX_NAME), meta, paths, {**cols, **blob, **shard_columns}, b"", {})
    return names


def mount_once(store: Path, mnt: Path, deep: str, sample: list[str], ls_dir: str) -> dict[str, float]:
    """One fresh mount: launch -> first stat, ls -R of one dir, 1,000 random stats; daemon memory after each."""
    out: dict[str, float] = {}
    mnt.mkdir(exist_ok=True)
    started = time.perf_counter()
    with bl.fanfs_mount(store, mnt) as pid:
        out["mount_returned_s"] = time.perf_counter() - started
        os.stat(mnt / deep)
        out["first_stat_s"] = time.perf_counter() - started
        out |= {f"{k}_stat": v for k, v in bl.proc_memory(pid).items()}
        t = time.perf_counter()
        subprocess.run(["ls", "-R", str(mnt / ls_dir)], stdout=subprocess.DEVNULL, check=True)
        out["ls_s"] = time.perf_counter() - t
        out |= {f"{k}_ls": v for k, v in bl.proc_memory(pid).items()}
        t = time.perf_counter()
        for rel in sample:
            os.stat(mnt / rel)
        out["stat_us"] = (time.perf_counter() - t) / len(sample) * 1e6
        out |= {f"{k}_1000": v for k, v in bl.proc_memory(pid).items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bl.common_args(parser)
    parser.add_argument("--files", type=int, default=1_281_167, help="files (default 1,281,167, ImageNet train)")
    parser.add_argument("--dirs", type=int, default=1000, help="class directories (default 1000)")
    parser.add_argument("--shards", type=int, default=500, help="sparse shard files (default 500)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh mounts measured, medians reported (default 3)")
    args = parser.parse_args()

    print(f"load average before: {bl.load_average()}")
    with bl.temp_dir(args.workdir, "fanfs-bench-index-") as work:
        store = work / "store"
        t = time.perf_counter()
        names = synthesise(store, args.files, args.dirs, args.shards)
        index_bytes = (store / INDEX_NAME).stat().st_size
        print(f"synthesised {len(names):,} files in {args.dirs:,} dirs, {args.shards} shards in "
              f"{time.perf_counter() - t:.1f} s; index {index_bytes / 2**20:,.1f} MiB "
              f"({index_bytes / len(names):.0f} B/file)")
        rng = np.random.default_rng(1)
        sample = [names[i] for i in rng.choice(len(names), 1000, replace=False)]
        deep, ls_dir = names[len(names) // 2], os.path.dirname(names[-1])

        runtime = work / "runtime"  # a runtime dir of its own: its record of validated indexes starts empty
        runtime.mkdir(mode=0o700)
        os.environ["FANFS_RUNTIME_DIR"] = str(runtime)
        record = runtime / RECORD_NAME
        opens, trusted_opens = [], []
        for _ in range(args.repeat):
            record.unlink(missing_ok=True)
            t = time.perf_counter()
            Store(str(store)).close()  # validated, and recorded
            opens.append(time.perf_counter() - t)
            t = time.perf_counter()
            Store(str(store)).close()  # the same file again: trusted
            trusted_opens.append(time.perf_counter() - t)
        s = Store(str(store))
        t = time.perf_counter()
        for rel in sample:
            s.size_at(s.lookup(rel.encode()))
        lookup_us = (time.perf_counter() - t) / len(sample) * 1e6
        s.close()

        bl.wait_for_quiet()
        runs = []
        for _ in range(args.repeat):
            record.unlink(missing_ok=True)
            first = mount_once(store, work / "mnt", deep, sample, ls_dir)  # validates at launch
            again = mount_once(store, work / "mnt", deep, sample, ls_dir)  # validated before on this node
            runs.append({**first, "again_first_stat_s": again["first_stat_s"],
                         "again_mount_returned_s": again["mount_returned_s"]})
        print(f"load average after: {bl.load_average()}")

    med = {k: bl.median([r[k] for r in runs]) for k in runs[0]}
    mib = 2**20
    def memory(when: str, key: str) -> list[list[str]]:
        return [[f"daemon VmRSS / VmHWM after {when}",
                 f"{med['VmRSS_' + key] / mib:.1f} / {med['VmHWM_' + key] / mib:.1f} MiB",
                 "met" if med["VmHWM_" + key] <= GOAL_BYTES else "MISSED"],
                ["  RssAnon (private) / RssFile / RssShmem (index mapped from tmpfs)",
                 f"{med['RssAnon_' + key] / mib:.1f} / {med['RssFile_' + key] / mib:.1f} / "
                 f"{med['RssShmem_' + key] / mib:.1f} MiB", ""]]

    rows = [
        ["index file", f"{index_bytes / mib:,.1f} MiB", ""],
        ["Store() open, in-process (checksum + validation)", f"{bl.median(opens):.3f} s", ""],
        ["  again: validated before on this node (checksum only)", f"{bl.median(trusted_opens):.3f} s", ""],
        ["lookup + getattr of 1,000 random files, in-process", f"{lookup_us:.1f} us each", ""],
        ["fanfs mount returned (from launch)", f"{med['mount_returned_s']:.3f} s", ""],
        ["first os.stat of a deep file (from launch)", f"{med['first_stat_s']:.3f} s",
         "met" if med["first_stat_s"] <= GOAL_SECONDS else "MISSED"],
        ["  again: a mount of the same store on this node", f"{med['again_first_stat_s']:.3f} s",
         "met" if med["again_first_stat_s"] <= GOAL_SECONDS else "MISSED"],
        *memory("first stat", "stat"),
        [f"ls -R {ls_dir} ({args.files // args.dirs:,} files)", f"{med['ls_s']:.3f} s", ""],
        *memory("ls -R", "ls"),
        ["os.stat of 1,000 random files", f"{med['stat_us']:.0f} us each", ""],
        *memory("1,000 stats", "1000"),
    ]
    print(f"\n{len(names):,} files, {args.dirs:,} dirs; medians of {args.repeat} fresh mounts "
          f"(goal: first stat <= {GOAL_SECONDS:.0f} s, daemon <= {GOAL_BYTES // mib} MiB)")
    print(bl.table(["measure", "value", "goal"], rows))
    bl.write_json(args.json, {"files": len(names), "dirs": args.dirs, "shards": args.shards, "index_bytes": index_bytes,
                              "store_open_s": opens, "store_open_trusted_s": trusted_opens, "lookup_getattr_us": lookup_us, "mounts": runs, "medians": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
