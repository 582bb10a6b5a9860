"""A directory tree walked into the tree builder: breadth first, children sorted, no symlink followed; and a single
file given as a source, walked as a tree of that one file.

Works on bytes paths throughout so that any legal file name (non-UTF-8, 255 bytes) survives.  Special files
are skipped and noted.  A second name of a file already walked (a hard link) becomes that file in the index,
sharing its blobs.  With ``expand``, files named like archives are set aside, to be streamed as directories.
"""

from __future__ import annotations

import os
import stat
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .members import DIR, FILE, HARDLINK, SYMLINK, IngestError, Member
from .names import expanded_name, join
from .tree import TreeBuilder

_SPECIAL = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device",
            stat.S_IFBLK: "block device"}


@dataclass
class WalkedDirectory:
    """What a walk leaves for the pack: its files (ids in the builder, in walk order) and its archives."""

    root: bytes
    prefix: bytes = b""  # where its entries go in the tree (PREFIX=SRC); b"": the tree's root
    ids: array = field(default_factory=lambda: array("q"))
    bytes: int = 0
    archives: list[tuple[bytes, bytes, int]] = field(default_factory=list)  # (path under root, expands to, mtime)

    def files(self, builder: TreeBuilder, origin: int, label: str) -> Iterator[tuple[int, Member]]:
        """Each file as a member whose data is its path (opened where it is packed), with its size and mtime as walked."""
        for file_id in self.ids:
            path, size, mtime = builder.path_size_mtime(file_id)
            rel = path[len(self.prefix) + 1:] if self.prefix else path
            yield file_id, Member(path, FILE, 0, mtime, size, data=os.path.join(self.root, rel),
                                  where=f"{label}/{os.fsdecode(rel)}", origin=origin)


@dataclass
class WalkedFile(WalkedDirectory):
    """A regular file given as a source: its name as given, its bytes read where it lies (through a symlink given)."""

    data: bytes = b""

    def files(self, builder: TreeBuilder, origin: int, label: str) -> Iterator[tuple[int, Member]]:
        for file_id in self.ids:
            path, size, mtime = builder.path_size_mtime(file_id)
            yield file_id, Member(path, FILE, 0, mtime, size, data=self.data, where=label, origin=origin)


def walk_file(builder: TreeBuilder, src: str, origin: int, prefix: bytes = b"") -> WalkedFile:
    """Regular file ``src`` into ``builder``: at the tree's root, or in folder ``prefix`` (made as an archive's is)."""
    real = os.fsencode(os.path.realpath(src))
    try:
        st = os.stat(real)
    except OSError as err:
        raise IngestError(f"cannot read source {src}: {err.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise IngestError(f"source {src} is no longer a regular file: pack again once nothing changes it")
    if prefix:
        builder.add(Member(prefix, DIR, stat.S_IFDIR | 0o755, st.st_mtime_ns, where=src, origin=origin))
    name = join(prefix, os.fsencode(os.path.basename(os.path.abspath(src))))
    walked = WalkedFile(os.path.dirname(real), prefix, data=real, bytes=st.st_size)
    walked.ids.append(builder.add(Member(name, FILE, st.st_mode, st.st_mtime_ns, st.st_size, where=src, origin=origin)))
    return walked


def walk_into(builder: TreeBuilder, src: str, origin: int, expand: bool,
              skip: Callable[[str], None], prefix: bytes = b"") -> WalkedDirectory:
    """Walk directory ``src`` into ``builder``: its entries at the tree's root, or in folder ``prefix``."""
    root = os.fsencode(os.path.abspath(src))
    try:
        st = os.stat(root)
    except OSError as err:
        raise IngestError(f"cannot read source {src}: {err.strerror}") from None
    label = src.rstrip("/") or "/"
    if prefix:
        builder.add(Member(prefix, DIR, st.st_mode, st.st_mtime_ns, where=label, origin=origin))
    else:
        builder.set_root(st.st_mode, st.st_mtime_ns)
    walked = WalkedDirectory(root, prefix)
    first_name: dict[tuple[int, int], bytes] = {}  # (device, inode) -> first path, for files with several names
    queue = deque([b""])
    while queue:
        base = queue.popleft()
        where = os.path.join(root, base) if base else root
        try:
            with os.scandir(where) as it:
                items = sorted(it, key=lambda item: item.name)
        except OSError as err:
            raise IngestError(f"cannot read directory {os.fsdecode(where)}: {err.strerror}") from None
        for item in items:
            rel = join(base, item.name)  # under root
            name = join(prefix, rel)  # in the tree
            try:
                st = item.stat(follow_symlinks=False)
            except OSError as err:
                raise IngestError(f"cannot stat {os.fsdecode(item.path)}: {err.strerror}") from None
            fmt = stat.S_IFMT(st.st_mode)
            at = f"{label}/{os.fsdecode(rel)}"
            if fmt == stat.S_IFDIR:
                builder.add(Member(name, DIR, st.st_mode, st.st_mtime_ns, where=at, origin=origin))
                queue.append(rel)
            elif fmt == stat.S_IFREG:
                inner = expanded_name(name) if expand else None
                if inner is not None:
                    walked.archives.append((rel, inner, st.st_mtime_ns))
                    continue
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in first_name:
                    builder.add(Member(name, HARDLINK, st.st_mode, st.st_mtime_ns, target=first_name[key], where=at,
                                       origin=origin))
                    continue
                if st.st_nlink > 1:
                    first_name[key] = name
                walked.ids.append(builder.add(Member(name, FILE, st.st_mode, st.st_mtime_ns, st.st_size, where=at,
                                                     origin=origin)))
                walked.bytes += st.st_size
            elif fmt == stat.S_IFLNK:
                target = os.readlink(item.path)
                builder.add(Member(name, SYMLINK, st.st_mode, st.st_mtime_ns, len(target), target, where=at,
                                   origin=origin))
            else:
                skip(f"skipped {_SPECIAL.get(fmt, 'special file')} {at}")
    return walked
