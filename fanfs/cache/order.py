"""The order a node's readers will read in, as the mount is told it (``fanfs ctl --order FILE``): a file of paths.

One path per line, in the order one reader opens them; an empty line ends an epoch (the next one follows, and may
be given as far ahead as known).  A path is relative to the mount's root, or absolute under the mount point (or
the node directory of a node serving without a mount).  Paths not in the store, and directories, are counted and
left out: a dataset's list may hold a file the store was packed without.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..store.format import FILE
from ..store.index import Index
from ..util.files import read_regular

MAX_ORDER_BYTES = 4 << 30  # some epochs of ImageNet-22k's 14 M paths
EXAMPLE_CHARS = 200  # of the first path left out, in the answer: a line of any length must not swell it


@dataclass
class Order:
    """Files (entries) in the order one reader reads them, epochs back to back."""

    entries: np.ndarray
    epochs: int
    unknown: int  # paths left out: not in the store, or not files
    example: str | None  # the first of them

    def describe(self) -> dict[str, Any]:
        return {"files": int(self.entries.size), "epochs": self.epochs, "unknown": self.unknown,
                "example_unknown": self.example}


def read_order(path: str, index: Index, mountpoint: str) -> Order:
    """The order in the file at ``path`` (:mod:`this module <.order>` says what it holds) for the store of ``index``
    mounted at ``mountpoint``."""
    try:
        data = read_regular(path, MAX_ORDER_BYTES)
    except OSError as err:
        raise FanfsError(f"cannot read the order {path}: {err.strerror or err}") from None
    prefix = os.fsencode(os.path.abspath(mountpoint)).rstrip(b"/") + b"/"
    entries: list[int] = []
    epochs, unknown, example, in_epoch = 0, 0, None, False
    types = memoryview(index.type)
    for line in data.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            epochs += in_epoch
            in_epoch = False
            continue
        in_epoch = True
        if line.startswith(prefix):
            name: bytes | None = line[len(prefix):]
        else:
            name = None if line.startswith(b"/") else line  # absolute elsewhere: not in this mount
        entry = index.lookup(name.strip(b"/")) if name is not None else -1
        if entry < 0 or types[entry] != FILE:
            unknown += 1
            example = example or _shortened(os.fsdecode(line))
            continue
        entries.append(entry)
    epochs += in_epoch
    return Order(np.array(entries, np.int64), epochs, unknown, example)


def _shortened(path: str) -> str:
    """A path as an example in one line: its start, and how long it is when it is longer."""
    return path if len(path) <= EXAMPLE_CHARS else f"{path[:EXAMPLE_CHARS]}... ({len(path):,} characters)"


def order_command(follow: Callable[[str, np.ndarray], None], index: Index, mountpoint: str,
                  how: str = "") -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The control socket's ``{"cmd": "order", "path": FILE, "stream": NAME}``: read the order, have ``follow`` take
    it as stream NAME (default "ctl"; one per reader process that tells its own), say what was in it and ``how`` the
    mount reads ahead.  An order with no file of the store in it is refused, in one line."""
    def order(message: dict[str, Any]) -> dict[str, Any]:
        path, stream = message.get("path"), message.get("stream", "ctl")
        if not isinstance(path, str) or not isinstance(stream, str) or not stream:
            raise ValueError("an order names a file of paths: {\"cmd\": \"order\", \"path\": FILE, \"stream\": NAME}")
        order = read_order(path, index, mountpoint)
        if not order.entries.size:
            raise ValueError(f"none of the order's {order.unknown:,} paths is a file of the store (e.g. "
                             f"{order.example}): give paths relative to the mount, or under {mountpoint}")
        follow(stream, order.entries)
        files = int(np.count_nonzero(index.type == FILE))
        return {"stream": stream, **order.describe(), "store_files": files, "how": how}
    return order
