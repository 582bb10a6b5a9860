"""The files of one shard job as the job carries them: paths to open, and archive members' bytes.

A job of archive members carries up to a shard of bytes, each member's as read (no copy to gather them), inside
a :class:`Payload` that gives them up when pickled, so the process that cut the shard holds no copy once the job
is on its way to a worker or a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ingest import Member
from ..util.source_file import BytesFile


@dataclass(slots=True)
class Held:
    """A member's bytes in a job's payload: item ``index``, the data of a file of ``size`` bytes (``regions``: where
    they lie in it, for a sparse member)."""

    index: int
    size: int
    regions: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class OnDisk:
    """A file of a directory to open at ``path``, as the walk saw it (``size``, ``mtime`` in ns): a file that no longer
    is, once packed, was written meanwhile and is refused rather than stored torn."""
    path: bytes
    size: int
    mtime: int


Ref = OnDisk | bytes | Held
"""Where a job's file is: a file of a directory, a path to open (an archive member spooled to a temporary file), or
its bytes in the job's payload."""


class Payload:
    """Members' bytes, pickled at most once: pickling hands them over and drops this object's references to them."""

    __slots__ = ("data",)

    def __init__(self, data: list[bytes | memoryview]) -> None:
        self.data: list[bytes | memoryview] | None = data

    def __reduce__(self) -> tuple[type, tuple[list[bytes | memoryview] | None]]:
        data, self.data = self.data, None
        return (Payload, (data,))


@dataclass
class Batch:
    """The shard being cut: its files in order, its members' bytes, the spool files it reads."""

    files: list[tuple[int, Ref, str]] = field(default_factory=list)
    held: list[bytes | memoryview] = field(default_factory=list)
    bytes: int = 0  # source bytes, as the cut counts them
    spooled: list[bytes] = field(default_factory=list)

    def add(self, file_id: int, member: Member) -> None:
        data = member.data
        if isinstance(data, BytesFile):
            ref: Ref = Held(len(self.held), data.size, data.regions)
            self.held.append(data.data)
        else:
            assert isinstance(data, bytes)
            ref = data if member.spooled else OnDisk(data, member.size, member.mtime)
            if member.spooled:
                self.spooled.append(data)
        self.files.append((file_id, ref, member.where))
        self.bytes += member.size


def source_of(ref: Ref, payload: Payload | None) -> bytes | BytesFile:
    """A job's file as a worker reads it: the path, or the member's bytes (a view of the job's buffer)."""
    if isinstance(ref, Held):
        assert payload is not None and payload.data is not None
        return BytesFile(payload.data[ref.index], ref.size, ref.regions)
    return ref.path if isinstance(ref, OnDisk) else ref
