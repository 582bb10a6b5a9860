"""What ``fanfs pack SRC... STORE`` reads: directories and archives, merged into one tree.

Each SRC is a directory, an archive file (tar, plain or gzip/bzip2/xz/zstd-compressed, or zip), ``-``: a tar
stream on standard input, or any other regular file: a tree of that one file (a labels file beside the images).
Their contents merge at the tree's root (a WebDataset shard set becomes one directory of samples), or under a
folder: ``PREFIX=SRC`` (``train=ILSVRC2012_img_train.tar val=ILSVRC2012_img_val.tar``: one store, its two splits
side by side).  An argument that names an existing path is that path, ``=`` or not.  Directories and single files
are walked first, so the bytes to pack are known before the first shard is cut; archives are streamed after, one
pass each, their members handed on as they come.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .archives import Budget, Expander
from .directory import WalkedDirectory, walk_file, walk_into
from .members import DIR, IngestError, Member, Spool
from .names import NAME_MAX, expanded_name, show
from .streams import Counted, kind_of
from .tree import Tree, TreeBuilder
from .zip import has_zip_directory

DEFAULT_MAX_EXPANSION = 1000.0
"""An archive's members may hold this many times the archive's bytes (deflate's limit is ~1,030x: a bigger ratio
is a bomb, or a file of nothing but zeros)."""
_SUFFIX = {"gzip": "tar.gz", "bzip2": "tar.bz2", "xz": "tar.xz", "zstd": "tar.zst", "tar": "tar", "zip": "zip"}


@dataclass
class Source:
    label: str  # as the user gave it ("-" is "standard input")
    path: str  # absolute, or "-"
    kind: str  # "directory", "file" (one regular file), "tar", "tar.gz", "tar.bz2", "tar.xz", "tar.zst" or "zip"
    size: int | None  # bytes to pack (a directory's files, a file's) or the archive's bytes; None for a pipe
    raw: Counted | None = None  # an archive's bytes, as read
    mtime: int = 0
    walked: WalkedDirectory | None = None
    prefix: bytes = b""  # the folder its contents go under (PREFIX=SRC); b"": the tree's root

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, **({"prefix": os.fsdecode(self.prefix)} if self.prefix else {})}


def split_source(arg: str) -> tuple[bytes, str]:
    """``PREFIX=SRC`` as (PREFIX, SRC); anything else, and any argument naming an existing path, as (b"", arg).
    PREFIX is a relative folder of the tree: no empty, ``.`` or ``..`` part, nothing absolute."""
    if arg == "-" or "=" not in arg or os.path.lexists(arg):
        return b"", arg
    text, _, src = arg.partition("=")
    prefix = os.fsencode(text)
    parts = prefix.split(b"/")
    long = next((part for part in parts if len(part) > NAME_MAX), None)
    if long is not None:
        raise IngestError(f"source {show(prefix)}=...: its PREFIX has a part of {len(long):,} bytes, longer than the "
                          f"{NAME_MAX} a file name may have: give a shorter folder")
    if not text or any(part in (b"", b".", b"..") for part in parts):
        raise IngestError(f"source {arg}: PREFIX=SRC needs a relative folder as PREFIX (like train or a/b: no empty, "
                          "'.' or '..' part, no leading '/'), or name an existing path")
    if not src:
        raise IngestError(f"source {arg}: nothing after '=' (PREFIX=SRC puts SRC under the folder PREFIX)")
    return prefix, src


class Ingest:
    """The sources of one pack: ``walk()``, then ``files()`` to pack, then ``finish()`` for the tree."""

    def __init__(self, srcs: Sequence[str], *, expand_archives: bool = False,
                 max_expansion: float = DEFAULT_MAX_EXPANSION, warn: Callable[[str], None] = lambda text: None) -> None:
        if not srcs:
            raise IngestError("no source given")
        split = [split_source(src) for src in srcs]
        if [src for _, src in split].count("-") > 1:
            raise IngestError("standard input (-) can be read once only")
        self.expand = expand_archives
        self.skipped = 0
        self._handed = 0  # bytes of directory files handed on (progress)
        self._warn = warn
        self.sources: list[Source] = []
        try:
            for prefix, src in split:
                self.sources.append(self._open(src))
                self.sources[-1].prefix = prefix
        except BaseException:
            self.close()
            raise
        self.builder = TreeBuilder([s.label for s in self.sources])
        self.budget = Budget(max_expansion)  # one for every archive of the pack

    def skip(self, text: str) -> None:
        """An entry left out (a special file, a link pointing out of an archive): counted and said."""
        self.skipped += 1
        self._warn(text)

    def _open(self, src: str) -> Source:
        if src == "-":
            return self._archive("standard input", "-", 0)
        try:
            st = os.stat(src)
        except OSError as err:
            raise IngestError(f"cannot read source {src}: {err.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            return Source(src, os.path.abspath(src), "directory", None, mtime=st.st_mtime_ns)
        try:
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise IngestError(f"cannot read source {src}: {err.strerror}") from None
        source = self._archive(src, os.path.abspath(src), fd, regular=stat.S_ISREG(st.st_mode))
        source.size = st.st_size if stat.S_ISREG(st.st_mode) else None
        source.mtime = st.st_mtime_ns
        return source

    def _archive(self, label: str, path: str, fd: int, regular: bool = False) -> Source:
        """An archive source read from ``fd`` (0: standard input), its kind told by its first bytes.  A ``regular``
        file that is no archive is a tree of that one file (``fd`` is then closed), unless its name says archive:
        a damaged or partial one is an error, never packed as a file."""
        raw = Counted(fd)
        try:
            try:
                head = raw.peek(512)
            except OSError as err:
                raise IngestError(f"cannot read source {label}: {err.strerror}") from None
            kind = kind_of(head)
            if kind is None and fd and has_zip_directory(fd):  # a self-extracting zip, as unzip reads it
                kind = "zip"
            named = regular and expanded_name(os.fsencode(os.path.basename(path))) is not None
            if kind is None and regular and not named:
                os.close(fd)
                return Source(label, path, "file", None)
            if kind is None:
                what = "empty" if not head else "neither a directory nor an archive fanfs reads (tar, tar.gz/bz2/xz/zst, zip)"
                raise IngestError(f"source {label} is {what}" + (": its name says archive (a damaged or partial copy?), "
                                                                 "so it is not packed as a single file" if named else ""))
            if kind == "zip" and not (fd and stat.S_ISREG(os.fstat(fd).st_mode)):
                raise IngestError(f"source {label} is a zip archive on a pipe: a zip's directory is at its end, so "
                                  "fanfs reads zips from files; give the file's path (or pipe a tar)")
        except BaseException:
            if fd:
                os.close(fd)
            raise
        return Source(label, path, _SUFFIX[kind], None, raw)

    def walk(self) -> int | None:
        """Walk the directory and file sources into the tree; the bytes to pack, or None where a pipe's size is
        unknown."""
        total: int | None = 0
        for origin, source in enumerate(self.sources):
            if source.kind == "directory":
                source.walked = walk_into(self.builder, source.path, origin, self.expand, self.skip, source.prefix)
                source.size = source.walked.bytes + sum(os.path.getsize(os.path.join(source.walked.root, rel))
                                                        for rel, _, _ in source.walked.archives)
            elif source.kind == "file":
                source.walked = walk_file(self.builder, source.label, origin, source.prefix)
                source.size = source.walked.bytes
            total = None if total is None or source.size is None else total + source.size
        return total

    def files_known(self) -> int | None:
        """How many files the sources hold, when all are directories (walked); None while archives are unread."""
        if any(s.walked is None or s.walked.archives for s in self.sources):
            return None
        return sum(len(s.walked.ids) for s in self.sources if s.walked is not None)

    def position(self) -> int:
        """Source bytes read so far (a directory's files as handed on, an archive's bytes as read)."""
        return self._handed + sum(s.raw.consumed for s in self.sources if s.raw is not None)

    def files(self, spool: Spool) -> Iterator[tuple[int, Member]]:
        """Every file to pack, as ``(id, member)`` (the member's bytes in hand), in source order."""
        expander = Expander(self.builder, spool, self.expand, self.skip)
        for origin, source in enumerate(self.sources):
            if source.prefix and source.walked is None:  # an archive's folder, as a directory source makes its own
                self.builder.add(Member(source.prefix, DIR, stat.S_IFDIR | 0o755, source.mtime, where=source.label,
                                        origin=origin))
            if source.walked is not None:
                for file_id, member in source.walked.files(self.builder, origin, source.label):
                    self._handed += member.size
                    yield file_id, member
                for rel, inner, mtime in source.walked.archives:
                    yield from self._nested_file(expander, source, origin, rel, inner, mtime)
            elif source.kind == "zip":
                source.raw.consumed = source.size or 0  # a zip is read where it lies, all of it counted
                self.budget.read_from(source.raw)
                with os.fdopen(os.dup(source.raw.fd), "rb") as file:
                    yield from expander.zip_file(file, source.label, origin, self.budget, source.prefix)
            else:
                self.budget.read_from(source.raw)
                yield from expander.archive(source.raw, source.label, source.prefix, origin, self.budget)
        if self.builder.root_implied():
            self.builder.set_root(stat.S_IFDIR | 0o755, self.sources[0].mtime)

    def _nested_file(self, expander: Expander, source: Source, origin: int, rel: bytes, inner: bytes,
                     mtime: int) -> Iterator[tuple[int, Member]]:
        """An archive file inside a directory source, expanded (``--expand-archives``)."""
        assert source.walked is not None
        path = os.path.join(source.walked.root, rel)
        label = os.fsdecode(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            raise IngestError(f"cannot read {label}: {err.strerror}") from None
        try:
            raw = Counted(fd)
            self.builder.add(Member(inner, DIR, stat.S_IFDIR | 0o755, mtime, where=label, origin=origin))
            self.budget.read_from(raw)
            yield from expander.archive(raw, label, inner, origin, self.budget)
            self._handed += raw.consumed
        finally:
            os.close(fd)

    def finish(self) -> Tree:
        return self.builder.finish(self.skip)

    def describe(self) -> list[dict[str, Any]]:
        return [source.describe() for source in self.sources]

    def close(self) -> None:
        for source in self.sources:
            if source.raw is not None and source.raw.fd > 0:
                os.close(source.raw.fd)
                source.raw.fd = -1
