"""Members, in whatever order their sources give them, merged into one tree in the index's entry order.

Entry order is breadth first with each directory's children contiguous and sorted by name: a directory walk
yields it already, an archive in its own order, several sources interleaved.  So each member gets a provisional
id as it comes (what pack's shard jobs refer to) and :meth:`TreeBuilder.finish` maps those to entries.

Merging: a directory named by two sources (or twice by one) is one directory; a file named twice, or a name
that is a file in one place and a directory in another, is a clash and refused.  Directories an archive only
implies (``a/b/c`` without ``a/``) are made, mode 0755, until the archive names them.  A hard link becomes the
file it names (:data:`~.members.HARDLINK`), through any chain of links to links, as GNU tar extracts them; a
symbolic link from an archive must resolve inside the tree, and so must a hard link to one (it is that link
again, at its own place in the tree).
"""

from __future__ import annotations

import stat
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..store.format import DIR, SYMLINK
from .members import HARDLINK, IngestError, Member, describe_type
from .names import PATH_MAX, show

MAX_LINK_HOPS = 40  # as the kernel follows symbolic links (ELOOP beyond)
IMPLIED_MODE = stat.S_IFDIR | 0o755
MTIME_MIN, MTIME_MAX = -(1 << 63), (1 << 63) - 1  # the index's mtimes: int64 nanoseconds, 1677 to 2262


@dataclass
class Tree:
    """The tree in entry order (entry 0 is the root), as the index stores it: columns, and each entry's path."""

    paths: list[bytes]
    parent: np.ndarray
    type: np.ndarray
    mode: np.ndarray
    mtime: np.ndarray
    size: np.ndarray
    first: np.ndarray  # child range for directories
    count: np.ndarray
    targets: dict[int, bytes] = field(default_factory=dict)
    links: list[tuple[int, int]] = field(default_factory=list)  # (entry, entry it is another name of: never a link)
    entry_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # provisional id -> entry (-1: left out)


class TreeBuilder:
    """Collects members (``add``) and puts them in entry order (``finish``)."""

    def __init__(self, origins: list[str], root_mode: int = IMPLIED_MODE, root_mtime: int = 0) -> None:
        """``origins``: what ``Member.origin`` numbers (the sources, as messages name them)."""
        self._origins = origins
        self._path: list[bytes] = [b""]
        self._parent = array("q", [0])
        self._type = array("b", [DIR])
        self._mode = array("Q", [root_mode])
        self._mtime = array("q", [root_mtime])
        self._size = array("Q", [0])
        self._ids: dict[bytes, int] = {b"": 0}
        self._children: dict[int, array] = {0: array("q")}  # directory -> its entries (no int object each)
        self._implied: set[int] = {0}
        self._targets: dict[int, bytes] = {}
        self._links: dict[int, int] = {}  # hard link -> the member it names again (never itself a hard link)
        self._archived_links: dict[int, str] = {}  # link -> where it came from
        self._origin = array("H", [0])  # the source each entry came from, for a clash's message
        self.path_bytes = 0  # of every entry's path: what the tree holds besides files' bytes

    def __len__(self) -> int:
        return len(self._path)

    def add(self, member: Member) -> int:
        """The provisional id of ``member`` (a directory named again keeps its first id).  An mtime past 2262 (or
        before 1677), which an archive may give, is held as the nearest the index holds, as GNU tar extracts it
        (with a warning) rather than refuse it."""
        member.mtime = min(max(member.mtime, MTIME_MIN), MTIME_MAX)
        path = member.path
        if len(path) > PATH_MAX:
            raise IngestError(f"{member.where}: a path of {len(path):,} bytes, more than the {PATH_MAX:,} a path may "
                              "have (File name too long): fanfs cannot present it")
        known = self._ids.get(path)
        if known is not None:
            return self._again(known, member)
        parent = self._directory(path.rpartition(b"/")[0], member)
        kind, mode, size = member.type, member.mode, member.size
        if kind == HARDLINK:
            target = self._ids.get(member.target)
            if target is None or self._type[target] == DIR:
                raise IngestError(f"{member.where}: hard link to {show(member.target)}, which is "
                                  f"{'a directory' if target is not None else 'not an earlier member'}: "
                                  "fanfs cannot make it the file it names")
            target = self._links.get(target, target)  # a link to a link: the member that one names (a chain)
            kind, mode, size = self._type[target], self._mode[target], self._size[target]
        new = self._new(path, parent, kind, mode, member.mtime, size)
        if kind == DIR:
            self._children[new] = array("q")
        elif member.type == HARDLINK:
            self._links[new] = target
            if kind == SYMLINK:
                self._targets[new] = self._targets[target]
                if member.archived:  # checked as the link it copies (hard links stay within their source)
                    self._archived_links[new] = member.where
        elif kind == SYMLINK:
            self._targets[new] = member.target
            if member.archived:
                self._archived_links[new] = member.where
        self._origin[new] = member.origin
        return new

    def _new(self, path: bytes, parent: int, kind: int, mode: int, mtime: int, size: int) -> int:
        new = len(self._path)
        self._path.append(path)
        self._parent.append(parent)
        self._type.append(kind)
        self._mode.append(mode)
        self._mtime.append(mtime)
        self._size.append(size)
        self._origin.append(0)
        self._ids[path] = new
        self._children[parent].append(new)
        self.path_bytes += len(path)
        return new

    def _again(self, known: int, member: Member) -> int:
        """A name seen before: a directory merges (an implied one takes the metadata now given); else a clash."""
        if member.type == DIR and self._type[known] == DIR:
            if known in self._implied:
                self._implied.discard(known)
                self._mode[known], self._mtime[known] = member.mode, member.mtime
            return known
        raise IngestError(f"name clash: {show(member.path)} is a {describe_type(self._type[known])} from "
                          f"{self._origins[self._origin[known]]} and a {describe_type(member.type)} from "
                          f"{member.where}: fanfs keeps one entry per name; pack the sources separately or rename one")

    def _directory(self, path: bytes, member: Member) -> int:
        """The id of directory ``path``, made (implied) with its missing parents if need be."""
        known = self._ids.get(path)
        if known is not None and self._type[known] == DIR:
            return known  # most members: their directory is known
        cuts = [i for i, byte in enumerate(path) if byte == 0x2F] + [len(path)]  # the ends of path's ancestors
        at = self._deepest_known(path, cuts)
        known = self._ids[path[:cuts[at]] if at >= 0 else b""]
        if self._type[known] != DIR:
            raise IngestError(f"name clash: {show(path[:cuts[at]])} is a {describe_type(self._type[known])} from "
                              f"{self._origins[self._origin[known]]}, but {member.where} puts {show(member.path)} "
                              "inside it")
        for end in cuts[at + 1:]:
            known = self._new(path[:end], known, DIR, IMPLIED_MODE, member.mtime, 0)
            self._children[known] = array("q")
            self._implied.add(known)
            self._origin[known] = member.origin
        return known

    def _deepest_known(self, path: bytes, cuts: list[int]) -> int:
        """Which of ``path``'s ancestors (ending at ``cuts``; -1: the root) is the deepest known one, found by
        bisection (every known path's ancestors are known), not one level at a time: a deep path costs its length."""
        known, missing = -1, len(cuts)
        while missing - known > 1:
            mid = (known + missing) // 2
            if path[:cuts[mid]] in self._ids:
                known = mid
            else:
                missing = mid
        return known

    def path_size_mtime(self, node: int) -> tuple[bytes, int, int]:
        return self._path[node], self._size[node], self._mtime[node]

    def root_implied(self) -> bool:
        return 0 in self._implied

    def set_root(self, mode: int, mtime: int) -> None:
        """The root's metadata, from the first source that has some (a directory, or an archive's ``./``)."""
        if 0 in self._implied:
            self._implied.discard(0)
            self._mode[0], self._mtime[0] = mode, mtime

    def finish(self, skip: Callable[[str], None] = lambda text: None) -> Tree:
        """The tree in entry order.  An archive's symbolic link that resolves outside the archive is left out (a
        reader following it would read outside the dataset), with a warning."""
        escaping = [link for link in self._archived_links if self._escapes(self._path[link])]
        for link in escaping:
            self._children[self._parent[link]].remove(link)
            skip(f"skipped symbolic link {self._archived_links[link]} -> {show(self._targets.pop(link))}: it points "
                 "outside the archive")
        n = len(self._path)
        order = array("q", [0])
        first, count = np.zeros(n, np.int64), np.zeros(n, np.int64)
        path = self._path
        at = 0
        while at < len(order):  # order grows while it is walked: breadth first
            node = order[at]
            at += 1
            if self._type[node] == DIR:
                kids = sorted(self._children[node], key=path.__getitem__)
                first[node], count[node] = len(order), len(kids)
                order.extend(kids)
        del self._children
        ids = np.frombuffer(order, np.int64)
        entry_of = np.full(n, -1, np.int64)  # -1: left out
        entry_of[ids] = np.arange(ids.size)
        column = {name: np.frombuffer(getattr(self, "_" + name), dtype)[ids]
                  for name, dtype in (("type", np.int8), ("mode", np.uint64), ("mtime", np.int64), ("size", np.uint64))}
        return Tree([path[p] for p in order], entry_of[np.frombuffer(self._parent, np.int64)[ids]], column["type"],
                    column["mode"], column["mtime"], column["size"], first[ids], count[ids],
                    {int(entry_of[p]): target for p, target in self._targets.items()},
                    [(int(entry_of[a]), int(entry_of[b])) for a, b in self._links.items()
                     if entry_of[a] >= 0 <= entry_of[b]],
                    entry_of)

    def _escapes(self, link_path: bytes) -> bool:
        """Whether following the symbolic link at ``link_path`` (and any it leads through) leaves the tree."""
        held = link_path.split(b"/")[:-1]
        pending = list(reversed(self._targets[self._ids[link_path]].split(b"/")))
        if self._targets[self._ids[link_path]].startswith(b"/"):
            return True
        hops = 0
        while pending:
            part = pending.pop()
            if part in (b"", b"."):
                continue
            if part == b"..":
                if not held:
                    return True
                held.pop()
                continue
            held.append(part)
            node = self._ids.get(b"/".join(held))
            if node is not None and self._type[node] == SYMLINK:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    return False  # a loop: it resolves nowhere
                target = self._targets[node]
                if target.startswith(b"/"):
                    return True
                held.pop()
                pending.extend(reversed(target.split(b"/")))
        return False
