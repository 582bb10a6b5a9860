"""Walk a source tree into the index's entry order (breadth first, children contiguous and sorted).

Works on bytes paths throughout so that any legal file name (non-UTF-8, 255 bytes) survives.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from dataclasses import dataclass, field

from ..errors import FanfsError
from .format import DIR, FILE, SYMLINK


class SourceError(FanfsError):
    """The source tree cannot be read as asked."""


@dataclass
class Tree:
    """The walked tree as parallel lists, one item per entry (entry 0 is the root)."""

    root: bytes
    paths: list[bytes] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    type: list[int] = field(default_factory=list)
    mode: list[int] = field(default_factory=list)
    mtime: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    first: list[int] = field(default_factory=list)  # child range for directories
    count: list[int] = field(default_factory=list)
    targets: dict[int, bytes] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def add(self, path: bytes, parent: int, kind: int, st: os.stat_result, size: int) -> int:
        self.paths.append(path)
        self.parent.append(parent)
        self.type.append(kind)
        self.mode.append(st.st_mode)
        self.mtime.append(st.st_mtime_ns)
        self.size.append(size)
        self.first.append(0)
        self.count.append(0)
        return len(self.paths) - 1

    def files(self) -> list[int]:
        return [e for e, kind in enumerate(self.type) if kind == FILE]

    def abspath(self, entry: int) -> bytes:
        return os.path.join(self.root, self.paths[entry]) if self.paths[entry] else self.root


_SPECIAL = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device",
            stat.S_IFBLK: "block device"}


def walk(src: str) -> Tree:
    """Walk ``src`` without following symlinks; special files are skipped and noted in ``skipped``."""
    root = os.fsencode(os.path.abspath(src))
    try:
        st = os.stat(root)
    except OSError as err:
        raise SourceError(f"cannot read source {src}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SourceError(f"source {src} is not a directory")
    tree = Tree(root)
    tree.add(b"", 0, DIR, st, 0)
    queue = deque([0])
    while queue:
        d = queue.popleft()
        where = tree.abspath(d)
        try:
            with os.scandir(where) as it:
                items = sorted(it, key=lambda item: item.name)
        except OSError as err:
            raise SourceError(f"cannot read directory {os.fsdecode(where)}: {err.strerror}") from None
        tree.first[d] = len(tree.paths)
        base = tree.paths[d]
        for item in items:
            rel = base + b"/" + item.name if base else item.name
            try:
                st = item.stat(follow_symlinks=False)
            except OSError as err:
                raise SourceError(f"cannot stat {os.fsdecode(item.path)}: {err.strerror}") from None
            fmt = stat.S_IFMT(st.st_mode)
            if fmt == stat.S_IFDIR:
                queue.append(tree.add(rel, d, DIR, st, 0))
            elif fmt == stat.S_IFREG:
                tree.add(rel, d, FILE, st, st.st_size)
            elif fmt == stat.S_IFLNK:
                target = os.readlink(item.path)
                tree.targets[tree.add(rel, d, SYMLINK, st, len(target))] = target
            else:
                tree.skipped.append(f"{_SPECIAL.get(fmt, 'special file')} {os.fsdecode(rel)}")
                continue
            tree.count[d] += 1
    return tree
