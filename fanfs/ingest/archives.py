"""Archives streamed into members: tar (any compression) and zip, nested ones expanded, limits kept.

One forward pass per archive: each member's bytes are read once, into memory (up to the spool's limit) or a
spool file, and handed on with the member.  With ``expand``, a member whose name is an archive's (``.tar``,
``.tar.gz``, ``.zip``...) becomes a directory of its members, recursively, up to :data:`MAX_DEPTH` levels
(nested tars stream straight through; a nested zip is read from its bytes, as a zip needs).  Every byte that
comes out counts against ``max_expansion`` times the bytes read from the source (a decompression bomb is
stopped early, with one line): a nested archive by its own bytes, as in a directory (:class:`Budget`).  Devices and FIFOs are skipped with a warning, as in a directory.
"""

from __future__ import annotations

import errno
import io
import lzma
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

import zstandard

from ..util.source_file import BytesFile
from . import tar
from .members import DIR, FILE, HARDLINK, SYMLINK, IngestError, Member, Spool
from .names import expanded_name, join, member_path, show
from .streams import ByteStream, Counted, Readable, decompressing, kind_of, stream_error
from .tree import TreeBuilder
from .zip import ZipEntry, ZipReader

MAX_DEPTH = 16
"""Archives inside archives, at most (the source itself is level 1)."""
MAX_TARGET = 4095  # a symbolic link's target, at most (as the index holds them)
EXPANSION_FLOOR = 64 << 20  # below this much output no archive is called a bomb
_SPECIAL = {tar.CHARDEV: "character device", tar.BLOCKDEV: "block device", tar.FIFO: "FIFO"}


@dataclass
class Budget:
    """What comes out of a pack's archives (their files at their apparent sizes, their paths) against the bytes
    read of them: one budget for the whole pack, so that many small bombs add up as one big one does.  An archive
    nested in an uncompressed tar counts as it would in a directory: by its own bytes, not the tar's headers and
    padding around it; and an uncompressed tar by the bytes its reader took, not those read ahead of it."""

    max_expansion: float
    produced: int = 0
    _done: int = 0  # bytes read of the archives finished with
    _position: Callable[[], int] | None = None  # bytes read so far of the archive being read
    _framing: int = 0  # of those, bytes that only framed nested archives

    def read_from(self, raw: Counted) -> None:
        """Count the bytes read of ``raw`` from now on, besides those of the archives before it."""
        self._done, self._framing = self.consumed, 0
        self._position = lambda: raw.consumed

    def measured_by(self, position: Callable[[], int]) -> None:
        """The bytes read of the archive being read, from its start, are ``position()`` from now on (an uncompressed
        tar's: what its reader took)."""
        self._position = position

    def framing(self, n: int) -> None:
        """``n`` bytes read of an uncompressed tar framed a member that is an archive (its headers, its padding):
        not what its output comes from, which is that archive's own bytes."""
        self._framing += n

    @property
    def consumed(self) -> int:
        return self._done + (self._position() if self._position is not None else 0) - self._framing

    def spend(self, n: int, where: str) -> None:
        self.produced += n
        if self.max_expansion and self.produced > EXPANSION_FLOOR \
                and self.produced > self.max_expansion * max(self.consumed, 1):
            raise IngestError(f"{where}: the archives of this pack expand to more than {self.max_expansion:g} times "
                              f"the {self.consumed:,} bytes read of them so far (a decompression bomb?): if they are "
                              "genuine, pack with --max-expansion 0")


class _Pieces:
    """A reader over an iterator of byte pieces (a member's data), for an archive nested in it."""

    def __init__(self, pieces: Iterator[memoryview | bytes]) -> None:
        self._pieces = pieces
        self._rest = b""

    def read(self, size: int = -1) -> bytes:
        if not self._rest:
            self._rest = bytes(next(self._pieces, b""))
        n = len(self._rest) if size < 0 else size
        data, self._rest = self._rest[:n], self._rest[n:]
        return data

    def drain(self) -> None:
        for _ in self._pieces:
            pass


class Expander:
    """Adds the members of archives to ``builder``; yields ``(id, member)`` for each file, its bytes in hand."""

    def __init__(self, builder: TreeBuilder, spool: Spool, expand: bool, skip: Callable[[str], None]) -> None:
        self.builder = builder
        self.spool = spool
        self.expand = expand
        self.skip = skip  # an entry left out, said in one line

    def archive(self, reader: Readable, where: str, prefix: bytes, origin: int, budget: Budget,
                depth: int = 1, exact: bool = True) -> Iterator[tuple[int, Member]]:
        """The members of the archive read from ``reader`` (any compression), under ``prefix`` in the tree.
        ``exact``: ``reader``'s bytes are, one for one, the bytes the budget counts as read of the source (nothing
        decompressed them on the way)."""
        if depth > MAX_DEPTH:
            raise IngestError(f"{where}: archives nested more than {MAX_DEPTH} deep: fanfs stops there")
        compression = None
        try:
            head = reader.read(512)
            kind = kind_of(head)
            source: Readable = _Chained(head, reader)
            if kind in ("gzip", "bzip2", "xz", "zstd"):
                compression = kind
                source = decompressing(source, kind)
                head = source.read(512)
                kind, source = kind_of(head), _Chained(head, source)
                if kind != "tar":
                    raise IngestError(f"{where}: {compression}-compressed, but not a tar archive inside")
            if kind == "zip":
                yield from self._zip_bytes(source, where, prefix, origin, budget, depth)
            elif kind == "tar":
                stream = ByteStream(source)
                exact = exact and compression is None
                if exact and depth == 1:  # the source itself: counted as its reader takes it
                    budget.measured_by(lambda: stream.offset)
                yield from self._tar(stream, where, prefix, origin, budget, depth, exact)
            else:
                raise IngestError(f"{where}: not an archive fanfs reads (tar, tar.gz/bz2/xz/zst, zip)")
        except IngestError:
            raise
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # a spool file that could not be written: the caller's (a full disk)
            raise stream_error(err, where, compression) from None
        except (EOFError, ValueError, zlib.error, lzma.LZMAError, zstandard.ZstdError) as err:
            raise stream_error(err, where, compression) from None

    def _zip_bytes(self, source: Readable, where: str, prefix: bytes, origin: int, budget: Budget,
                   depth: int) -> Iterator[tuple[int, Member]]:
        """A zip read from a stream (nested in another archive): whole, in memory or spooled, as zips need."""
        holder = Member(b"", FILE, 0, 0, where=where)
        self._fill(holder, iter(lambda: source.read(1 << 20), b""), None, budget)
        try:
            if isinstance(holder.data, BytesFile):
                yield from self._zip(io.BytesIO(holder.data.data), where, prefix, origin, budget, depth)
            else:
                with open(holder.data, "rb") as file:
                    yield from self._zip(file, where, prefix, origin, budget, depth)
        finally:
            if holder.spooled:
                os.unlink(holder.data)

    def _tar(self, stream: ByteStream, where: str, prefix: bytes, origin: int, budget: Budget,
             depth: int, exact: bool) -> Iterator[tuple[int, Member]]:
        reader = tar.TarReader(stream, where)
        for entry in reader:
            name = member_path(entry.name, where)
            path, at = join(prefix, name), f"{where}:{show(entry.name)}"
            kind = entry.type
            if kind in _SPECIAL:
                self.skip(f"skipped {_SPECIAL[kind]} {at}")
            elif kind == tar.DIRECTORY:
                self._add(Member(path, DIR, stat.S_IFDIR | entry.mode, entry.mtime, where=at, origin=origin), budget)
            elif kind == tar.SYMLINK:
                self._add(self._symlink(path, entry.linkname, entry.mtime, at, origin), budget)
            elif kind == tar.HARDLINK:
                target = join(prefix, member_path(entry.linkname, where))
                self._add(Member(path, HARDLINK, 0, entry.mtime, target=target, where=at, origin=origin,
                                 archived=True), budget)
            elif self.expand and (inner := expanded_name(name)) is not None:
                if exact:
                    budget.framing(entry.header)
                yield from self._nested(_Pieces(reader.data(entry)), at, join(prefix, inner), entry.mtime, origin,
                                        budget, depth, exact)
                if exact:
                    budget.framing(-entry.size % tar.BLOCK)  # its padding, read with the next header
            else:
                member = Member(path, FILE, stat.S_IFREG | entry.mode, entry.mtime, entry.apparent_size, where=at,
                                origin=origin, archived=True)
                if entry.size <= self.spool.in_memory:  # most members: one read, no pieces
                    data = reader.read(entry)
                    budget.spend(len(data), at)
                    member.data = BytesFile(data, member.size, entry.regions)
                else:
                    self._fill(member, reader.data(entry), entry.regions, budget)
                if entry.regions is not None:  # its holes: what the tree holds is the apparent size
                    budget.spend(member.size - entry.size, at)
                yield self._add(member, budget), member

    def zip_file(self, file: IO[bytes], where: str, origin: int, budget: Budget,
                 prefix: bytes = b"") -> Iterator[tuple[int, Member]]:
        """The members of a zip file given as a source (read in place: a zip needs to seek), under ``prefix``."""
        try:
            yield from self._zip(file, where, prefix, origin, budget, 1)
        except IngestError:
            raise
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise stream_error(err, where, None) from None

    def _zip(self, file: IO[bytes], where: str, prefix: bytes, origin: int, budget: Budget,
             depth: int) -> Iterator[tuple[int, Member]]:
        reader = ZipReader(file, where)
        try:
            for entry in reader:
                name = member_path(entry.name, where)
                path, at = join(prefix, name), f"{where}:{show(entry.name)}"
                if entry.type == "dir":
                    self._add(Member(path, DIR, stat.S_IFDIR | entry.mode, entry.mtime, where=at, origin=origin),
                              budget)
                elif entry.type == "symlink":
                    target = self._small(reader, entry, at)
                    self._add(self._symlink(path, target, entry.mtime, at, origin), budget)
                elif self.expand and (inner := expanded_name(name)) is not None:
                    yield from self._nested(_Pieces(reader.data(entry)), at, join(prefix, inner), entry.mtime,
                                            origin, budget, depth, False)
                else:
                    member = Member(path, FILE, stat.S_IFREG | entry.mode, entry.mtime, entry.size, where=at,
                                    origin=origin, archived=True)
                    self._fill(member, reader.data(entry), None, budget)
                    yield self._add(member, budget), member
        finally:
            reader.close()

    def _nested(self, pieces: _Pieces, where: str, path: bytes, mtime: int, origin: int, budget: Budget,
                depth: int, exact: bool) -> Iterator[tuple[int, Member]]:
        self._add(Member(path, DIR, stat.S_IFDIR | 0o755, mtime, where=where, origin=origin), budget)
        yield from self.archive(pieces, where, path, origin, budget, depth + 1, exact)
        pieces.drain()  # what follows the archive's end inside the member (padding)

    def _small(self, reader: ZipReader, entry: ZipEntry, where: str) -> bytes:
        if entry.size > MAX_TARGET:
            raise IngestError(f"{where}: a symbolic link whose target is {entry.size:,} bytes long")
        return b"".join(reader.data(entry))

    def _symlink(self, path: bytes, target: bytes, mtime: int, where: str, origin: int) -> Member:
        if not target or len(target) > MAX_TARGET or b"\0" in target:
            raise IngestError(f"{where}: a symbolic link with an empty, NUL-holding or over-long target")
        return Member(path, SYMLINK, stat.S_IFLNK | 0o777, mtime, len(target), target, where=where, origin=origin,
                      archived=True)

    def _add(self, member: Member, budget: Budget) -> int:
        """Add ``member`` to the tree; the paths it adds (its own and any directories it implies) count against
        the budget: one deep name implies thousands of them."""
        before = self.builder.path_bytes
        added = self.builder.add(member)
        budget.spend(self.builder.path_bytes - before, member.where)
        return added

    def _fill(self, member: Member, pieces: Iterator[memoryview | bytes], regions: list[tuple[int, int]] | None,
              budget: Budget) -> None:
        """Give ``member`` its bytes: in memory up to the spool's limit, else in a spool file, holes kept
        (``regions``: where a sparse member's data lies in its ``size`` bytes)."""
        held: list[bytes] = []
        got = 0
        for piece in pieces:
            budget.spend(len(piece), member.where)
            held.append(bytes(piece))
            got += len(piece)
            if got > self.spool.in_memory:
                break
        else:
            member.data = BytesFile(b"".join(held), member.size if regions is not None else got, regions)
            member.size = member.data.size
            return
        path = self.spool.new_path()
        member.data, member.spooled = path, True
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            spans = iter(regions if regions is not None else [(0, 1 << 62)])
            offset, left = next(spans, (0, 0))
            for piece in _then(held, pieces, budget, member.where):
                view = memoryview(piece)
                while view:
                    while not left:
                        offset, left = next(spans)
                    n = min(left, len(view))
                    os.pwrite(fd, view[:n], offset)
                    view, offset, left = view[n:], offset + n, left - n
            if regions is None:
                member.size = offset
            os.ftruncate(fd, member.size)
        finally:
            os.close(fd)


def _then(held: list[bytes], rest: Iterator[memoryview | bytes], budget: Budget,
          where: str) -> Iterator[memoryview | bytes]:
    """The pieces already held, then the rest (counted against the budget as they come)."""
    yield from held
    held.clear()
    for piece in rest:
        budget.spend(len(piece), where)
        yield piece


class _Chained:
    """``head`` (bytes already read to tell the kind of a stream), then the rest of ``reader``."""

    def __init__(self, head: bytes, reader: Readable) -> None:
        self._head = head
        self._reader = reader

    def read(self, size: int = -1) -> bytes:
        if self._head:
            n = len(self._head) if size < 0 else size
            data, self._head = self._head[:n], self._head[n:]
            return data
        return self._reader.read(size)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)
