"""A tar parser for one forward pass: POSIX ustar and pax, GNU (long names, sparse files), and v7 headers.

Python's ``tarfile`` reads the same formats but spends ~70 us a member in stream mode, as long as packing a
small file takes: this parser takes ~5 us, so reading an archive is never what limits a pack.  It yields one
:class:`TarEntry` per member; the caller reads the member's bytes (:meth:`TarReader.data`) or not, and the
next entry skips whatever is left.  Every header's checksum is checked; a stream that ends inside a header or
inside a member's declared bytes is refused as truncated, never padded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .members import IngestError
from .names import show
from .streams import ByteStream, Truncated

BLOCK = 512
ZERO = bytes(BLOCK)
MAX_EXTENDED = 1 << 20  # a pax header, GNU long name or sparse map larger than this is not an honest one
REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO = b"0", b"1", b"2", b"3", b"4", b"5", b"6"
_KNOWN = {HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO}
"""Other type flags name regular files: old ones (NUL), contiguous files (7), and, as POSIX asks, any unknown."""


@dataclass(slots=True)
class TarEntry:
    name: bytes  # as the archive names it
    type: bytes  # one of the type flags above (regular for every kind tar treats as one)
    mode: int  # permission bits (and set-id / sticky bits)
    mtime: int  # nanoseconds
    size: int  # bytes of data that follow the header (a sparse file: its data regions only)
    linkname: bytes = b""
    realsize: int = -1  # a sparse file's apparent size
    regions: list[tuple[int, int]] | None = None  # a sparse file's data regions (offset, length)
    header: int = 0  # bytes of its headers in the stream (pax, GNU long names and sparse maps included)

    @property
    def apparent_size(self) -> int:
        return self.realsize if self.regions is not None else self.size


def _number(field: bytes, what: str, where: str) -> int:
    """An octal number, or GNU's base-256 form (high bit set) for values that do not fit."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
        return value - (1 << (8 * len(field) - 1)) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise IngestError(f"{where}: a tar header with a bad {what} field {show(field)}: the archive is corrupt") \
            from None


def _nts(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


def _pax(data: bytes, where: str) -> dict[bytes, bytes]:
    """The records of a pax header (``LENGTH key=value\\n``); GNU's repeated sparse keys keep every value."""
    records: dict[bytes, bytes] = {}
    sparse: list[bytes] = []
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise IngestError(f"{where}: a malformed pax header: the archive is corrupt") from None
        record = data[space + 1:pos + length]
        if length <= 0 or space < 0 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise IngestError(f"{where}: a malformed pax header: the archive is corrupt")
        key, _, value = record[:-1].partition(b"=")
        if key in (b"GNU.sparse.offset", b"GNU.sparse.numbytes"):  # sparse 0.0: pairs in order
            sparse.append(value)
        else:
            records[key] = value
        pos += length
    if sparse:
        records[b"GNU.sparse.map"] = b",".join(sparse)
    return records

def _pax_time(value: bytes, where: str) -> int:
    """Seconds with an optional fraction (``1700000000.5``, ``-1.25``) as nanoseconds, exactly."""
    text = value.decode("ascii", "replace")
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("-").partition(".")
    try:
        ns = int(whole or "0") * 1_000_000_000 + int((fraction + "000000000")[:9])
    except ValueError:
        raise IngestError(f"{where}: a pax header with a bad mtime {text!r}: the archive is corrupt") from None
    return -ns if negative else ns


def _pairs(numbers: list[int], where: str) -> list[tuple[int, int]]:
    if len(numbers) % 2:
        raise IngestError(f"{where}: a sparse file's map is malformed: the archive is corrupt")
    regions = list(zip(numbers[::2], numbers[1::2]))
    end = 0
    for offset, length in regions:
        if offset < end or length < 0:
            raise IngestError(f"{where}: a sparse file's map has overlapping regions: the archive is corrupt")
        end = offset + length
    return regions


class TarReader:
    """The entries of a tar stream, in order; ``where`` names the archive in messages."""

    def __init__(self, stream: ByteStream, where: str) -> None:
        self.stream = stream
        self.where = where
        self._unread = 0  # bytes of the current entry's data (and padding) not yet taken
        self._global_mtime: int | None = None

    def _block(self) -> bytes | None:
        return self.stream.take(BLOCK)

    def _extended(self, size: int, what: str) -> bytes:
        if size > MAX_EXTENDED:
            raise IngestError(f"{self.where}: a {what} of {size:,} bytes: the archive is corrupt or hostile")
        data = self.stream.take(size + (-size % BLOCK))
        if data is None:
            raise Truncated(f"{self.where}: the archive ends inside a {what} (truncated)")
        return data[:size]

    def __iter__(self) -> Iterator[TarEntry]:
        while True:
            if self._unread:
                self._skip_rest()
            entry = self._next()
            if entry is None:
                return
            self._unread = entry.size + (-entry.size % BLOCK)
            yield entry

    def _skip_rest(self) -> None:
        try:
            self.stream.skip(self._unread)
        except Truncated:
            raise Truncated(f"{self.where}: the archive ends inside a member's data (truncated)") from None
        self._unread = 0

    def read(self, entry: TarEntry) -> bytes:
        """The entry's ``size`` bytes at once (a small member); its padding is skipped with the next entry."""
        start = self.stream.offset
        data = self.stream.take(entry.size)
        if data is None:
            raise Truncated(f"{self.where}: member {show(entry.name)} declares {entry.size:,} bytes but only "
                            f"{self.stream.offset - start:,} follow: the archive is truncated")
        self._unread = -entry.size % BLOCK
        return data

    def data(self, entry: TarEntry) -> Iterator[memoryview]:
        """The entry's ``size`` bytes, in pieces; its padding is skipped with the next entry."""
        declared, self._unread = entry.size, entry.size + (-entry.size % BLOCK)
        got = 0
        try:
            for piece in self.stream.pieces(declared):
                got += len(piece)
                self._unread -= len(piece)
                yield piece
        except Truncated:
            raise Truncated(f"{self.where}: member {show(entry.name)} declares {declared:,} bytes but only {got:,} "
                            "follow: the archive is truncated") from None

    def _next(self) -> TarEntry | None:
        pax: dict[bytes, bytes] = {}
        long_name = long_link = None
        start = self.stream.offset
        while True:
            at = self.stream.offset
            block = self._block()
            if block is None:
                if at == 0:
                    raise IngestError(f"{self.where}: empty, not a tar archive")
                return None  # the end without end-of-archive blocks: tar accepts it too
            if block == ZERO:
                return None  # end of archive (what follows is padding)
            if len(block) < BLOCK:
                raise Truncated(f"{self.where}: the archive ends inside a header (truncated)")
            self._check_sum(block, at)
            kind = block[156:157]
            size = _number(block[124:136], "size", self.where)
            if size < 0:
                raise IngestError(f"{self.where}: a tar header with a negative size: the archive is corrupt")
            if kind == b"x":
                pax.update(_pax(self._extended(size, "pax header"), self.where))
            elif kind == b"g":
                records = _pax(self._extended(size, "pax global header"), self.where)
                if b"mtime" in records:
                    self._global_mtime = _pax_time(records[b"mtime"], self.where)
            elif kind == b"L":
                long_name = _nts(self._extended(size, "long name"))
            elif kind == b"K":
                long_link = _nts(self._extended(size, "long link name"))
            elif kind == b"V":  # a volume label names no file
                self._unread = size + (-size % BLOCK)
                self._skip_rest()
            elif kind in (b"M", b"N"):
                raise IngestError(f"{self.where}: a GNU multi-volume or old long-name member: fanfs reads "
                                  "single-volume archives only")
            else:
                entry = self._entry(block, kind, size, pax, long_name, long_link)
                entry.header = self.stream.offset - start
                return entry

    def _check_sum(self, block: bytes, at: int) -> None:
        """The header's checksum: the sum of its bytes (the field itself as spaces), or of them signed (old tars)."""
        field = block[148:156]
        try:
            stored = int(field.replace(b"\0", b" ").strip() or b"-1", 8)
        except ValueError:
            stored = -1
        unsigned = sum(block) - sum(field) + 256
        if stored == unsigned:
            return
        high = sum(1 for b in block if b >= 128) - sum(1 for b in field if b >= 128)
        if stored != unsigned - 256 * high:
            raise IngestError(f"{self.where}: a tar header at byte {at:,} has a bad checksum: the archive is "
                              "corrupt, or this is not a tar archive")

    def _entry(self, block: bytes, kind: bytes, size: int, pax: dict[bytes, bytes], long_name: bytes | None,
               long_link: bytes | None) -> TarEntry:
        name = _nts(block[0:100])
        if block[257:263] == b"ustar\x00" and block[345] != 0:  # POSIX: a prefix before the name
            name = _nts(block[345:500]) + b"/" + name
        mtime = _number(block[136:148], "mtime", self.where) * 1_000_000_000
        if self._global_mtime is not None:
            mtime = self._global_mtime
        entry = TarEntry(long_name if long_name is not None else name,
                         kind if kind in _KNOWN else REGULAR,
                         _number(block[100:108], "mode", self.where) & 0o7777, mtime, size,
                         long_link if long_link is not None else _nts(block[157:257]))
        if kind == b"D":  # a GNU dump directory: a directory whose data lists names
            entry.type = DIRECTORY
        if kind == b"S":
            self._old_gnu_sparse(block, entry)
        if pax:
            self._apply_pax(entry, pax)
        if entry.regions is not None:
            self._check_regions(entry)
        return entry

    def _check_regions(self, entry: TarEntry) -> None:
        end = entry.regions[-1][0] + entry.regions[-1][1] if entry.regions else 0
        if sum(length for _, length in entry.regions or ()) != entry.size or end > entry.realsize:
            raise IngestError(f"{self.where}: sparse member {show(entry.name)} has a map that does not match its "
                              "data: the archive is corrupt")

    def _apply_pax(self, entry: TarEntry, pax: dict[bytes, bytes]) -> None:
        if b"path" in pax:
            entry.name = pax[b"path"]
        if b"linkpath" in pax:
            entry.linkname = pax[b"linkpath"]
        if b"mtime" in pax:
            entry.mtime = _pax_time(pax[b"mtime"], self.where)
        if b"size" in pax:
            try:
                entry.size = int(pax[b"size"])
            except ValueError:
                entry.size = -1
            if entry.size < 0:
                raise IngestError(f"{self.where}: member {show(entry.name)} has a pax header with a bad size "
                                  f"{show(pax[b'size'])}: the archive is corrupt")
        major = pax.get(b"GNU.sparse.major")
        if major == b"1":  # sparse 1.0: the map opens the member's data
            entry.name = pax.get(b"GNU.sparse.name", entry.name)
            entry.realsize = self._pax_int(pax, b"GNU.sparse.realsize")
            self._sparse_map_in_data(entry)
        elif b"GNU.sparse.map" in pax or b"GNU.sparse.numblocks" in pax:  # sparse 0.0 and 0.1
            entry.name = pax.get(b"GNU.sparse.name", entry.name)
            entry.realsize = self._pax_int(pax, b"GNU.sparse.size")
            numbers = [n for n in pax.get(b"GNU.sparse.map", b"").split(b",") if n]
            entry.regions = _pairs([self._int(n) for n in numbers], self.where)

    def _int(self, text: bytes) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise IngestError(f"{self.where}: a sparse file's map is malformed: the archive is corrupt")
        return value

    def _pax_int(self, pax: dict[bytes, bytes], key: bytes) -> int:
        if key not in pax:
            raise IngestError(f"{self.where}: a sparse file without {key.decode()}: the archive is corrupt")
        return self._int(pax[key])

    def _sparse_map_in_data(self, entry: TarEntry) -> None:
        """Sparse 1.0: decimal numbers, one a line (a count, then offset/length pairs), in whole blocks; each
        block's lines are parsed once (the map is read in one pass)."""
        partial = b""  # a line the last block cut
        numbers: list[int] = []
        used = 0
        while not numbers or len(numbers) < 1 + 2 * numbers[0]:
            if used >= MAX_EXTENDED:
                raise IngestError(f"{self.where}: sparse member {show(entry.name)} has a map larger than "
                                  f"{MAX_EXTENDED:,} bytes: the archive is corrupt or hostile")
            block = self._block()
            if block is None or len(block) < BLOCK:
                raise Truncated(f"{self.where}: the archive ends inside a sparse file's map (truncated)")
            used += BLOCK
            *lines, partial = (partial + block).split(b"\n")
            numbers += [self._int(n) for n in lines]
        entry.regions = _pairs(numbers[1:1 + 2 * numbers[0]], self.where)
        entry.size -= used
        if entry.size < 0:
            raise IngestError(f"{self.where}: a sparse file's map is larger than the member: the archive is corrupt")

    def _old_gnu_sparse(self, block: bytes, entry: TarEntry) -> None:
        """GNU's old sparse format: four regions in the header, more in extension blocks, then the data."""
        numbers = self._slots(block[386:482], 4)
        extended = block[482]
        entry.realsize = _number(block[483:495], "real size", self.where)
        blocks = 0
        while extended:
            blocks += 1
            if blocks * BLOCK > MAX_EXTENDED:
                raise IngestError(f"{self.where}: sparse member {show(entry.name)} has a map of more than "
                                  f"{MAX_EXTENDED // BLOCK:,} extension blocks: the archive is corrupt or hostile")
            more = self._block()
            if more is None or len(more) < BLOCK:
                raise Truncated(f"{self.where}: the archive ends inside a sparse file's map (truncated)")
            numbers += self._slots(more, 21)
            extended = more[504]
        entry.regions = _pairs(numbers, self.where)
        entry.type = REGULAR

    def _slots(self, area: bytes, slots: int) -> list[int]:
        """The (offset, length) slots of an old GNU sparse map area that are used (an unused one is all NUL)."""
        numbers = []
        for i in range(slots):
            slot = area[24 * i:24 * i + 24]
            if slot[0] == 0:
                break
            numbers += [_number(slot[:12], "sparse", self.where), _number(slot[12:], "sparse", self.where)]
        return numbers

