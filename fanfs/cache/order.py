"""The order a node's readers will read in, as the mount is told it (``fanfs ctl --order FILE``): a file of paths.

One path per line, in the order one reader opens them; an empty line ends an epoch (the next one follows, and may
be given as far ahead as known).  A path is relative to the mount's root, or absolute under the mount point (or
the node directory of a node serving without a mount).  Paths not in the store, and directories, are counted and
left out: a dataset's list may hold a file the store was packed without.

An order may be long (two epochs of ImageNet-22k are 28 M paths, 2.4 GB), so it is never read whole: the mount
holds its file open and reads it a piece at a time (:class:`OrderFile`), once to count what it holds (on a thread of
its own: :class:`~fanfs.serve.control.Background`, the control socket answers ``stats`` and other orders meanwhile)
and again as the read-ahead follows the readers (:mod:`.follow`).  Its memory is a piece's, whatever the order's size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..serve.listener import Background
from ..store.format import FILE
from ..store.index import Index
from ..util.files import open_regular
from ..util.units import human_size

log = logging.getLogger("fanfs")

MAX_ORDER_BYTES = 4 << 30  # some epochs of ImageNet-22k's 14 M paths
PIECE = 1 << 18  # bytes of an order read at a time: ~4,000 paths of ImageNet under a mount point
EXAMPLE_CHARS = 200  # of the first path left out, in the answer: a line of any length must not swell it
BREAK, LEFT_OUT = -2, -1
"""What a line is when it is no file of the store: an empty line (an epoch's end), or a path left out."""
NOWHERE = b"\0"
"""The name an absolute path elsewhere than under the mount is looked up as: none (no name holds a NUL)."""


class OrderFile:
    """An order's file, open (a descriptor of its own: its path may be removed or replaced once told) and read a
    piece at a time, each piece's lines resolved to the store's entries at once (:meth:`~fanfs.store.index.Index.
    lookup_many`)."""

    def __init__(self, path: str, index: Index, mountpoint: str, fd: int | None = None) -> None:
        self.path, self.index, self.mountpoint = path, index, mountpoint
        if fd is None:
            try:
                fd = open_regular(path)
            except OSError as err:
                raise FanfsError(f"cannot read the order {path}: {err.strerror or err}") from None
        self.fd = fd
        self.size = os.fstat(fd).st_size  # what is read of it: a file that grows later is not followed further
        if self.size > MAX_ORDER_BYTES:
            self.close()
            raise FanfsError(f"the order {path} is {human_size(self.size)}, more than the {human_size(MAX_ORDER_BYTES)} "
                             "an order may be: give fewer epochs at a time")
        self._prefix = os.fsencode(os.path.abspath(mountpoint)).rstrip(b"/") + b"/"
        self._types = index.type

    def copy(self) -> OrderFile:
        """The same file on a descriptor of its own (each reader of it closes its own)."""
        return OrderFile(self.path, self.index, self.mountpoint, os.dup(self.fd))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def pieces(self) -> Iterator[tuple[np.ndarray, list[bytes]]]:
        """The order from its start, a piece at a time: each line's entry (or BREAK, LEFT_OUT), and the lines."""
        offset = 0
        while offset < self.size:
            lines, offset = self._lines(offset)
            yield self._entries(lines), lines

    def files(self) -> Iterator[np.ndarray]:
        """The order's files (entries), a piece at a time."""
        for entries, _ in self.pieces():
            yield entries[entries >= 0]

    def _lines(self, offset: int) -> tuple[list[bytes], int]:
        """The whole lines of the piece at ``offset`` (a Windows line without its ``\\r``), and the offset after them.
        A line longer than a piece (no path is) is one line of its first piece's bytes; the rest of it is skipped."""
        data = self._read(offset)
        if offset + len(data) >= self.size or len(data) < PIECE:  # the file's end (cut meanwhile, if short)
            end = self.size
        elif (cut := data.rfind(b"\n")) >= 0:
            data, end = data[:cut + 1], offset + cut + 1
        else:
            return [data], self._line_end(offset + PIECE)
        lines = data.split(b"\n")
        if not lines[-1]:
            lines.pop()
        return ([line.rstrip(b"\r") for line in lines] if b"\r" in data else lines), end

    def _line_end(self, offset: int) -> int:
        """Where the line running at ``offset`` ends: after its newline, or at the file's end."""
        while offset < self.size and (more := self._read(offset)):
            if (at := more.find(b"\n")) >= 0:
                return offset + at + 1
            offset += len(more)
        return self.size

    def _read(self, offset: int) -> bytes:
        try:
            return os.pread(self.fd, min(PIECE, self.size - offset), offset)
        except OSError as err:
            raise FanfsError(f"cannot read the order {self.path}: {err.strerror or err}") from None

    def _entries(self, lines: list[bytes]) -> np.ndarray:
        prefix, skip = self._prefix, len(self._prefix)
        names = [(line[skip:] if line.startswith(prefix) else NOWHERE if line.startswith(b"/") else line).strip(b"/")
                 for line in lines]
        entries = self.index.lookup_many(names)
        entries[(entries < 0) | (self._types[np.maximum(entries, 0)] != FILE)] = LEFT_OUT
        entries[np.fromiter(map(len, lines), np.int64, len(lines)) == 0] = BREAK
        return entries


class Stream:
    """One reader's order as the read-ahead follows it (:mod:`.follow`): its files, read from its file a piece at a
    time as the follower reaches them (by the follower's thread alone, never under its lock); ``position``: files
    looked at so far; ``files``: how many it holds, once counted (None until then)."""

    def __init__(self, source: OrderFile) -> None:
        self.source = source
        self._pieces = source.files()
        self._next: list[int] = []
        self._at = 0
        self.position = 0
        self.files: int | None = None
        self.ended = False

    def next(self) -> int | None:
        """The next file, reading the next piece if need be; None if the piece read held none (the next call reads
        on) or the order has ended (:attr:`ended`)."""
        if self._at == len(self._next) and not self.ended:
            try:
                self._next, self._at = next(self._pieces).tolist(), 0
            except StopIteration:
                self.end()
            except FanfsError as err:  # a file gone bad (a network file system's error): read nothing more ahead
                log.warning("%s; the read-ahead stops following it", err)
                self.end()
        return self._next[self._at] if self._at < len(self._next) else None

    def advance(self) -> None:
        """The next file was looked at."""
        self._at += 1
        self.position += 1

    def end(self) -> None:
        """Nothing more is read of it: its file is closed."""
        self.ended = True
        self._next, self._at = [], 0
        self.source.close()


@dataclass
class Order:
    """What an order holds, counted a piece at a time (:meth:`add`): its files, epochs, and the paths left out."""

    files: int = 0
    epochs: int = 0
    left_out: int = 0
    example: str | None = None  # the first path left out
    _in_epoch: bool = False

    def add(self, entries: np.ndarray, lines: list[bytes]) -> None:
        self.files += int(np.count_nonzero(entries >= 0))
        left_out = entries == LEFT_OUT
        if self.example is None and left_out.any():
            self.example = _shortened(lines[int(np.argmax(left_out))])
        self.left_out += int(np.count_nonzero(left_out))
        paths = entries != BREAK  # an epoch: a run of paths between empty lines
        before = np.concatenate(([self._in_epoch], paths[:-1]))
        self.epochs += int(np.count_nonzero(paths & ~before))
        if paths.size:
            self._in_epoch = bool(paths[-1])

    def describe(self) -> dict[str, Any]:
        return {"files": self.files, "epochs": self.epochs, "unknown": self.left_out, "example_unknown": self.example}


def _shortened(line: bytes) -> str:
    """A path as an example in one line: its start, and how long it is when it is longer (a line longer than a piece
    was read only that far)."""
    path = os.fsdecode(line)
    if len(path) <= EXAMPLE_CHARS:
        return path
    return f"{path[:EXAMPLE_CHARS]}... ({'more than ' if len(line) >= PIECE else ''}{len(path):,} characters)"


def order_command(follow: Callable[[str, Stream], None], index: Index, mountpoint: str,
                  how: str = "") -> Background:
    """The control socket's ``{"cmd": "order", "path": FILE, "stream": NAME}``: have ``follow`` take the order as
    stream NAME (default "ctl"; one per reader process that tells its own) once its first file is read, count what
    it holds, and say so and ``how`` the mount reads ahead.  An order with no file of the store in it is refused, in
    one line, and replaces nothing.  On a thread of its own: counting an order of millions of paths takes seconds."""
    store_files = int(np.count_nonzero(index.type == FILE))

    def order(message: dict[str, Any]) -> dict[str, Any]:
        path, name = message.get("path"), message.get("stream", "ctl")
        if not isinstance(path, str) or not isinstance(name, str) or not name:
            raise ValueError("an order names a file of paths: {\"cmd\": \"order\", \"path\": FILE, \"stream\": NAME}")
        opened = OrderFile(path, index, mountpoint)
        try:
            counted, stream = Order(), None
            for entries, lines in opened.pieces():
                counted.add(entries, lines)
                if stream is None and counted.files:
                    stream = Stream(opened.copy())
                    try:
                        follow(name, stream)
                    except BaseException:
                        stream.end()
                        raise
        finally:
            opened.close()
        if stream is None:
            if not counted.left_out:
                raise ValueError(f"the order {path} holds no paths: one path per line, an empty line between epochs")
            raise ValueError(f"none of the order's {counted.left_out:,} paths is a file of the store (e.g. "
                             f"{counted.example}): give paths relative to the mount, or under {mountpoint}")
        stream.files = counted.files
        return {"stream": name, **counted.describe(), "store_files": store_files, "how": how}
    return Background(order)
