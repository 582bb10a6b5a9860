#!/usr/bin/env python3
"""A cache, not only a copy, on the emulated cluster: rows of ``tools/bench/bench_cluster.py --emulate`` (issue 30).

* **lazy against full staging**: from the job's launch (``mpiexec fanfs mount ... --stage`` or ``--stage lazy``),
  when every node has read its first batch (``--batch`` files per node; its readers start with the launch and
  wait for their mount), then images/s of epoch 1 (the rest of it) and of epoch 2 (a new shuffle), all nodes at
  once; for the store and for one ``--scale`` times larger (the same images again), to show what grows with the
  store and what does not.
* **a store twice the nodes' capacity** (1 replica, each node's ``--capacity`` half of its share): epochs 1 and 2
  with the order known (each node's readers' order given with ``fanfs ctl --order``, the next epoch's too) and
  without it, against reading the original tree from the shared file system directly.

Every read drops the file's pages from the kernel's cache afterwards (``POSIX_FADV_DONTNEED``), as a dataset
larger than the nodes' memory would: each epoch reads through the file systems, whichever the variant.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import numpy as np
from clusterjob import mpi_fanfs
from emucluster import Cluster

BATCH = 64


def _reader(mnt: str, epochs: list[list[str]], batch: int, decode: bool, wait: bool, barrier: Any, out: Any) -> None:
    """One reader process: wait for the mount (``wait``), then each epoch after every reader is ready for it; report
    when its first ``batch`` files were read and when each epoch began and ended."""
    from PIL import Image
    while wait and not os.path.ismount(mnt):
        time.sleep(0.005)
    marks: dict[str, float] = {}
    try:
        for e, paths in enumerate(epochs):
            if e:
                barrier.wait(timeout=600)
            marks[f"begin{e}"] = time.time()
            for i, path in enumerate(paths):
                with open(os.path.join(mnt, path), "rb") as f:
                    if decode:
                        Image.open(f).convert("RGB")
                    else:
                        f.read()
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                if e == 0 and i + 1 == min(batch, len(paths)):  # a reader with fewer files than a batch: all of them
                    marks["first_batch"] = time.time()
            marks[f"end{e}"] = time.time()
    finally:
        out.put(marks)


def run_epochs(mounts: list[Path], node_epochs: list[list[list[str]]], readers: int, batch: int, decode: bool,
               job: "LazyJob | None" = None) -> dict[str, Any]:
    """Readers (``readers`` per node) read each node's epochs; ``job``, if given, is launched once the readers are
    there (they wait for their mount).  Returns the time from the launch to the first batch of every node and
    images/s of each epoch, all nodes together."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(len(mounts) * readers), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(str(mnt), [paths[r::readers] for paths in epochs],
                                               max(1, batch // readers), decode, job is not None, barrier, out))
             for mnt, epochs in zip(mounts, node_epochs) for r in range(readers)]
    for p in procs:
        p.start()
    marks: list[dict[str, float]] = []
    try:
        started = job.launch() if job is not None else time.time()
        while len(marks) < len(procs):
            try:
                marks.append(out.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a reader died: the epoch is void") from None
                if job is not None and job.proc is not None and job.proc.poll() is not None:
                    raise RuntimeError(f"the job ended before its readers did: see {job.log.name}") from None
    finally:
        for p in procs:
            if len(marks) < len(procs):
                p.kill()
            p.join()
    if any("end0" not in m for m in marks):
        raise RuntimeError("a reader failed to read its epoch")
    result: dict[str, Any] = {"first_batch_s": max(m["first_batch"] for m in marks) - started}
    for e in range(len(node_epochs[0])):
        files = sum(len(epochs[e]) for epochs in node_epochs)
        result[f"epoch{e + 1}_img_s"] = files / (max(m[f"end{e}"] for m in marks) - min(m[f"begin{e}"] for m in marks))
    return result


def shuffled_epochs(rels: list[str], nodes: int, epochs: int, seed: int = 0) -> list[list[list[str]]]:
    """Per node, per epoch: its 1/N of a new shuffle of ``rels``."""
    orders = [list(np.random.default_rng(seed + e).permutation(rels)) for e in range(epochs)]
    return [[order[node::nodes] for order in orders] for node in range(nodes)]


class LazyJob:
    """``mpiexec fanfs mount`` on every node of the cluster, launched when asked; ended however the block ends."""

    def __init__(self, cluster: Cluster, store: str, name: str, options: list[str]) -> None:
        self.cluster, self.store, self.options = cluster, store, options
        self.mounts = [node.dir / f"mnt-{name}" for node in cluster.nodes]
        self.locals = [node.dir / f"local-{name}" for node in cluster.nodes]
        self.name = name
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LazyJob":
        for mnt, local in zip(self.mounts, self.locals):
            mnt.mkdir(exist_ok=True)
            shutil.rmtree(local, ignore_errors=True)
        return self

    def launch(self) -> float:
        started = time.time()
        self.log = open(self.cluster.workdir / f"job-{self.name}.log", "w")
        self.proc = subprocess.Popen(mpi_fanfs(len(self.mounts), "mount", self.store,
                                               self.cluster.rank_path(f"mnt-{self.name}"), "--local-dir",
                                               self.cluster.rank_path(f"local-{self.name}"), "--peer-timeout", "5",
                                               "--foreground", *self.options, launcher=self.cluster.mpiexec()),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return started

    def wait(self) -> None:
        for mnt in self.mounts:
            bl.run([*bl.FANFS, "wait", mnt, "--timeout", "600"], timeout=650)

    def __exit__(self, *exc: object) -> None:
        try:
            for mnt in self.mounts:
                if os.path.ismount(mnt):
                    subprocess.run([*bl.FANFS, "umount", mnt], capture_output=True, timeout=60)
                    break
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, 9)
                    self.proc.wait()
                self.log.close()
        finally:
            for mnt, local in zip(self.mounts, self.locals):
                bl.force_unmount(mnt)
                shutil.rmtree(local, ignore_errors=True)


def lazy_rows(cluster: Cluster, stores: dict[str, tuple[str, list[str]]], args: Any, repeat: int) -> dict[str, Any]:
    """Time to the first batch and epochs 1-2, full staging against lazy, for every store (name -> path, files)."""
    nodes = len(cluster.nodes)
    out: dict[str, Any] = {}
    for _ in range(repeat):
        for name, (store, rels) in stores.items():
            epochs = shuffled_epochs(rels, nodes, 2)
            for mode in ("full", "lazy"):
                with LazyJob(cluster, store, f"{name}-{mode}", ["--replicas", str(args.replicas), "--stage", mode]) as job:
                    before = cluster.counters()["storage"]["out"]
                    row = run_epochs(job.mounts, epochs, args.readers, args.batch, args.decode, job)
                    row["storage_MB"] = (cluster.counters()["storage"]["out"] - before) / 1e6
                out.setdefault(f"{name}_{mode}", []).append(row)
    return {key: {k: bl.median([r[k] for r in runs]) for k in runs[0]} | {"runs": runs} for key, runs in out.items()}


def capacity_rows(cluster: Cluster, store: Path, images: str, rels: list[str], args: Any, repeat: int) -> dict[str, Any]:
    """A store twice the nodes' capacity: the cache with and without the order against reading directly.  ``store``:
    the store in the export (the nodes see it as ``shared/NAME``), ``images``: the tree's name there."""
    from fanfs.peers.placement import place
    from fanfs.store.index import Index
    from fanfs.cache.localcache import state_file_bytes
    nodes = len(cluster.nodes)
    index = Index(str(store / "index"))
    share = int(place(index.blob_stored, nodes, 1).node_bytes.max())
    capacity = share // 2 + state_file_bytes(index.blob_stored.size)
    out: dict[str, Any] = {"capacity": capacity, "share": share}
    runs: dict[str, list] = {}
    for r in range(repeat):
        epochs = shuffled_epochs(rels, nodes, 2, seed=10 + r)
        cluster.remount_shared()
        before = cluster.counters()["storage"]["out"]
        row = run_epochs([n.shared / images for n in cluster.nodes], epochs, args.readers, 1, args.decode)
        row["storage_MB"] = (cluster.counters()["storage"]["out"] - before) / 1e6
        runs.setdefault("direct", []).append(row)
        for ordered in (False, True):
            name = "ordered" if ordered else "unordered"
            with LazyJob(cluster, cluster.rank_path(f"shared/{store.name}"), f"cap-{name}",
                         ["--replicas", "1", "--stage", "lazy", "--capacity", str(capacity)]) as job:
                job.launch()
                job.wait()
                if ordered:
                    for node, mnt in enumerate(job.mounts):
                        order = cluster.workdir / f"order-{node}"
                        order.write_text("\n\n".join("\n".join(paths) for paths in epochs[node]) + "\n")
                        bl.run([*bl.FANFS, "ctl", mnt, "--order", order])
                before = cluster.counters()["storage"]["out"]
                row = run_epochs(job.mounts, epochs, args.readers, 1, args.decode)
                row["storage_MB"] = (cluster.counters()["storage"]["out"] - before) / 1e6
                runs.setdefault(name, []).append(row)
    for name, rows in runs.items():
        out[name] = {k: bl.median([row[k] for row in rows]) for k in rows[0] if k != "first_batch_s"} | {"runs": rows}
    return out


def print_lazy(lazy: dict[str, Any], decode: bool) -> None:
    what = "read + decode" if decode else "read only"
    rows = [[key.rsplit("_", 1)[0], key.rsplit("_", 1)[1], r["first_batch_s"], r["epoch1_img_s"], r["epoch2_img_s"],
             r["storage_MB"]] for key, r in lazy.items()]
    print(f"\nlazy against full staging ({what}; from the launch of the job, all nodes' readers at once)")
    print(bl.table(["store", "stage", "first batch s", "epoch 1 img/s", "epoch 2 img/s", "MB over the storage link"],
                   rows))
    for name in {key.rsplit("_", 1)[0] for key in lazy}:
        full, lazy_row = lazy[f"{name}_full"], lazy[f"{name}_lazy"]
        print(f"{name}: first batch {lazy_row['first_batch_s']:.2f} s lazy, {full['first_batch_s']:.2f} s staged (goal: "
              f"lazy < 2 s); epoch 2 lazy {lazy_row['epoch2_img_s'] / full['epoch2_img_s']:.2f}x staged (goal >= 0.90)")


def print_capacity(capacity: dict[str, Any], decode: bool) -> None:
    what = "read + decode" if decode else "read only"
    direct = capacity["direct"]
    print(f"\na store twice the nodes' capacity ({what}; 1 replica, capacity {capacity['capacity'] / 1e6:.1f} MB per node "
          f"of a {capacity['share'] / 1e6:.1f} MB share)")
    print(bl.table(["variant", "epoch 1 img/s", "epoch 2 img/s", "epoch 2 x direct", "MB over the storage link"],
                   [[name, capacity[name]["epoch1_img_s"], capacity[name]["epoch2_img_s"],
                     capacity[name]["epoch2_img_s"] / direct["epoch2_img_s"], capacity[name].get("storage_MB", "")]
                    for name in ("direct", "unordered", "ordered")]))
    print(f"order known: {capacity['ordered']['epoch2_img_s'] / capacity['unordered']['epoch2_img_s']:.2f}x the same "
          f"cache without it (goal >= 1.3), {capacity['ordered']['epoch2_img_s'] / direct['epoch2_img_s']:.2f}x direct "
          "(goal >= 2)")
