"""A source file's bytes as pack and verify read them: random access, its size, and where its data lies.

A file of a directory tree is an open descriptor; a member of an archive read as a stream is bytes already
in memory (its holes, for a sparse member, as a list of data regions).  Record kinds cut either the same way,
so a JPEG inside a tar is transcoded exactly as the same JPEG in a directory, without a temporary file.
"""

from __future__ import annotations

import bisect
import errno
import os
from collections.abc import Sequence


class SourceFile:
    """Read-only random access to one source file of ``size`` bytes."""

    size: int

    def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes at ``offset``: fewer only at the end of the file."""
        raise NotImplementedError

    def data_from(self, offset: int) -> int:
        """Where data begins at or after ``offset`` (``size`` if only a hole follows), as ``SEEK_DATA`` says."""
        return offset

    def read_all(self) -> bytes:
        """The whole file, from its start."""
        return self.pread(self.size + 1, 0)


class OpenFile(SourceFile):
    """A file open as a descriptor (the caller closes it): ``pread``, with ``SEEK_DATA`` for holes."""

    def __init__(self, fd: int, size: int | None = None) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size if size is None else size

    def pread(self, length: int, offset: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) == length or not data:
            return data
        parts = [data]
        got = len(data)
        while got < length and (more := os.pread(self.fd, length - got, offset + got)):
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def data_from(self, offset: int) -> int:
        try:
            return os.lseek(self.fd, offset, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # nothing but a hole up to the end
                return max(offset, self.size)
            return offset  # a file system that does not say where holes are: all data


class BytesFile(SourceFile):
    """A file whose bytes are in memory: ``data`` holds its data regions back to back.

    ``regions`` (sorted, disjoint ``(offset, length)``) says where they lie in a file of ``size`` bytes; the
    rest is holes.  Without it, ``data`` is the whole file.
    """

    def __init__(self, data: bytes | memoryview, size: int | None = None,
                 regions: Sequence[tuple[int, int]] | None = None) -> None:
        self.data = data
        self.size = len(data) if size is None else size
        self.regions = list(regions) if regions is not None else None
        if self.regions is not None:
            self._starts = [offset for offset, _ in self.regions]
            self._at = [0]  # where each region's bytes begin in ``data``
            for _, length in self.regions:
                self._at.append(self._at[-1] + length)

    def pread(self, length: int, offset: int) -> bytes:
        end = min(self.size, offset + length)
        if offset >= end:
            return b""
        if self.regions is None:
            if offset == 0 and end == len(self.data) and isinstance(self.data, bytes):
                return self.data  # the whole file, as it is: no copy
            return bytes(self.data[offset:end])
        out = bytearray(end - offset)  # zeros where holes are
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while i < len(self.regions) and self.regions[i][0] < end:
            start, n = self.regions[i]
            lo, hi = max(start, offset), min(start + n, end)
            if lo < hi:
                out[lo - offset:hi - offset] = self.data[self._at[i] + lo - start:self._at[i] + hi - start]
            i += 1
        return bytes(out)

    def data_from(self, offset: int) -> int:
        if self.regions is None:
            return min(offset, self.size)
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self.regions[i][0] + self.regions[i][1]:
            return offset
        nxt = next((start for start, n in self.regions[i + 1:] if n), None)
        return self.size if nxt is None else nxt
