#!/usr/bin/env python3
"""What a shard-aware shuffle (fanfs.train.shard_aware_order) gives up in randomness, by window, on ImageNet's layout.

A store packed from a tree keeps the tree's order, so a shard holds a few classes.  Modelled here: ImageNet-1k's
train set (1,281,167 files in 1,000 class directories, 732-1,300 files each, ~110 KB JPEGs, log-normal sizes) packed
into 256 MiB shards in directory order.  For each window, over one epoch cut into batches: the mean number of distinct
classes and of distinct shards per batch, against a full shuffle; and the bytes a mount must read ahead to read a
window in sequence.  Pure arithmetic on the order (no store, no disk): the figures docs/clusters.rst and the sampler's
docstring quote (``--shard-mib S --windows W,...``: the windows a read-ahead budget holds of shards of S MiB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's fanfs
from fanfs.train.shards import shard_aware_order  # noqa: E402

import benchlib as bl  # noqa: E402


def imagenet_layout(rng: np.random.Generator, shard_bytes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(class, shard) of every file of a model of ImageNet-1k's train set packed in directory order; the shard count."""
    per_class = np.full(1000, 1300)
    per_class[:104] = rng.integers(732, 1300, 104)  # 104 classes have fewer than 1,300 images
    per_class[0] += 1_281_167 - per_class.sum()
    classes = np.repeat(np.arange(1000), per_class)
    sizes = rng.lognormal(np.log(110e3) - 0.18, 0.6, classes.size)
    shards = (np.cumsum(sizes) // shard_bytes).astype(np.int64)
    return classes, shards, int(shards[-1]) + 1


def per_batch(order: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """Mean distinct labels per batch of ``order``."""
    full = order.size // batch * batch
    rows = np.sort(labels[order[:full]].reshape(-1, batch), axis=1)
    return float(((np.diff(rows, axis=1) != 0).sum(axis=1) + 1).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default="1,4,8,16,32,64,128", help="windows of shards to measure")
    parser.add_argument("--batch", type=int, default=256, help="files per batch (default 256)")
    parser.add_argument("--shard-mib", type=int, default=256, help="shard size in MiB (default 256, pack's)")
    args = parser.parse_args()
    rng = np.random.default_rng(2020)
    classes, shards, count = imagenet_layout(rng, args.shard_mib << 20)
    print(f"{classes.size:,} files, 1,000 classes, {count} shards of {args.shard_mib} MiB "
          f"({classes.size / count:,.0f} files and {1000 / count:.2f} classes per shard)")
    full = rng.permutation(classes.size)
    base = per_batch(full, classes, args.batch)
    rows = [["full shuffle", "-", base, per_batch(full, shards, args.batch), 1.0, "-"]]
    mixed = classes[rng.permutation(classes.size)]  # the same files packed in a shuffled order: shards mix classes
    for window in map(int, args.windows.split(",")):
        order = shard_aware_order(shards, window, rng)
        assert np.array_equal(np.sort(order), np.arange(classes.size))  # every file once
        for layout, labels in (("tree order", classes), ("shuffled", mixed)):
            cls = per_batch(order, labels, args.batch)
            rows.append([f"window {window}", layout, cls, per_batch(order, shards, args.batch), cls / base,
                         f"{window * args.shard_mib / 1024:.1f} GiB"])
    print(bl.table(["order", "packed in", f"classes per batch of {args.batch}", "shards per batch", "classes vs full",
                    "a window's bytes"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
