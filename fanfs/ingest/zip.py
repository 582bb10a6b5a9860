"""Zip archives: members in the order they lie in the file (one forward pass over their data).

A zip's directory is at its end, so a zip is read from a file (or, nested in another archive, from its bytes
in memory or spooled), never from a pipe; a program before it (a self-extracting zip) is passed over, as unzip
does.  Names keep their bytes (zip's UTF-8 flag, else the bytes as written, or the UTF-8 name of an Info-ZIP
Unicode Path field that matches them, as unzip takes it); Unix modes, symbolic links and exact mtimes (the ``UT`` extra field) are kept where the zip has
them.  A zip whose members' data overlap (the "quoted overlap" bomb, one compressed stream counted many
times) is refused before anything is read.
"""

from __future__ import annotations

import os
import stat
import struct
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from .members import IngestError
from .names import show

_LOCAL = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_UT = 0x5455  # extended timestamp extra field
_UNICODE_PATH = 0x7075  # Info-ZIP's Unicode Path extra field: version 1, the CRC-32 of the name, the name in UTF-8


@dataclass(slots=True)
class ZipEntry:
    name: bytes
    type: str  # "dir", "file", "symlink"
    mode: int  # permission bits
    mtime: int  # nanoseconds
    size: int
    info: zipfile.ZipInfo


def _extra(info: zipfile.ZipInfo, tag: int) -> bytes | None:
    """The data of the extra field ``tag`` of a member (the first one), or None."""
    extra = info.extra
    pos = 0
    while pos + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, pos)
        if kind == tag:
            return extra[pos + 4:pos + 4 + length]
        pos += 4 + length
    return None


def _mtime(info: zipfile.ZipInfo) -> int:
    stamp = _extra(info, _UT)
    if stamp is not None and len(stamp) >= 5 and stamp[0] & 1:
        return struct.unpack_from("<i", stamp, 1)[0] * 1_000_000_000
    try:
        return int(time.mktime((*info.date_time, 0, 0, -1))) * 1_000_000_000  # DOS time: local time, as unzip has it
    except (OverflowError, ValueError):
        return 0


def _raw_name(info: zipfile.ZipInfo) -> bytes:
    """The name's bytes: the UTF-8 of a Unicode Path field written for this very name (its CRC-32 says so), else
    as written: UTF-8 when the zip says so, else decoded as cp437 by zipfile (undone here)."""
    raw = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "surrogateescape")
    unicode = _extra(info, _UNICODE_PATH)
    if unicode is not None and len(unicode) > 5 and unicode[0] == 1 \
            and struct.unpack_from("<I", unicode, 1)[0] == zlib.crc32(raw):
        return unicode[5:]
    return raw


def has_zip_directory(fd: int) -> bool:
    """Whether the regular file open as ``fd`` ends with a zip's directory (a self-extracting zip: a program,
    then the archive); moves the file's offset."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return False
    with os.fdopen(os.dup(fd), "rb") as file:
        return zipfile.is_zipfile(file)


class ZipReader:
    """The entries of a zip open as ``file`` (seekable), with their data as ``data(entry)`` reads it."""

    def __init__(self, file: IO[bytes], where: str) -> None:
        self.where = where
        self.file = file
        try:
            self.zip = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
            raise IngestError(f"{where}: not a readable zip archive ({err})") from None
        self.infos = sorted(self.zip.infolist(), key=lambda info: info.header_offset)
        self._check_layout()

    def _check_layout(self) -> None:
        """Every member's data lies before the next member's header: none overlaps another (a zip bomb)."""
        end_of_data = self.zip.start_dir
        for info, following in zip(self.infos, [*self.infos[1:], None]):
            self.file.seek(info.header_offset)
            head = self.file.read(_LOCAL.size)
            if len(head) < _LOCAL.size or head[:4] != b"PK\x03\x04":
                raise IngestError(f"{self.where}: member {show(_raw_name(info))} has no local header where the "
                                  "zip's directory puts it: the archive is corrupt")
            _, name_length, extra_length = _LOCAL.unpack(head)
            end = info.header_offset + _LOCAL.size + name_length + extra_length + info.compress_size
            limit = following.header_offset if following is not None else end_of_data
            if end > limit:
                raise IngestError(f"{self.where}: member {show(_raw_name(info))}'s data overlaps the next member's "
                                  "(a zip bomb, or a corrupt archive): fanfs refuses it")

    def __iter__(self) -> Iterator[ZipEntry]:
        for info in self.infos:
            unix = info.external_attr >> 16 if info.create_system == 3 else 0
            name = _raw_name(info)
            if info.flag_bits & 0x1:
                raise IngestError(f"{self.where}: member {show(name)} is encrypted: fanfs cannot read it")
            if stat.S_ISLNK(unix):
                kind = "symlink"
            elif info.is_dir() or stat.S_ISDIR(unix):
                kind = "dir"
            else:
                kind = "file"
            mode = stat.S_IMODE(unix) if unix else (0o755 if kind == "dir" else 0o644)
            yield ZipEntry(name, kind, mode, _mtime(info), info.file_size, info)

    def data(self, entry: ZipEntry, step: int = 1 << 20) -> Iterator[bytes]:
        """The member's bytes, checked against its CRC by zipfile at the end; its declared size exactly."""
        got = 0
        try:
            with self.zip.open(entry.info) as f:
                while block := f.read(step):
                    got += len(block)
                    if got > entry.size:
                        break
                    yield block
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as err:
            raise IngestError(f"{self.where}: member {show(entry.name)} cannot be read ({err}): the archive is "
                              "corrupt or uses a method fanfs lacks") from None
        except Exception as err:  # noqa: BLE001 - a decompressor's own error on crafted data (zlib, bz2, lzma)
            raise IngestError(f"{self.where}: member {show(entry.name)} is corrupt ({type(err).__name__}: {err})") \
                from None
        if got != entry.size:
            raise IngestError(f"{self.where}: member {show(entry.name)} declares {entry.size:,} bytes but holds "
                              f"{'more' if got > entry.size else f'{got:,}'}: the archive is corrupt")

    def close(self) -> None:
        self.zip.close()
