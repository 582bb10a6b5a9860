"""What every source (a directory, a tar, a zip, an archive inside one) yields: members, one at a time.

A member is one entry of the tree being packed: its path in that tree, type, mode, mtime and size, a symlink's
target, and for a file the way to its bytes: a path to open (a file of a directory, or a large archive member
spooled to disk) or the bytes themselves (:class:`~fanfs.util.source_file.BytesFile`, an archive member read
from the stream).  Sources yield members in their own order; :mod:`.tree` puts them in the index's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import FanfsError
from ..store.format import DIR, FILE, SYMLINK
from ..util.source_file import BytesFile

HARDLINK = 3
"""A member that is another name for an earlier file (tar's hard links, a directory's second link to an inode):
it becomes that file in the index, sharing its blobs."""

__all__ = ["DIR", "FILE", "HARDLINK", "SYMLINK", "Data", "IngestError", "Member", "Spool"]

Data = bytes | BytesFile
"""A file member's bytes: a path (bytes) to open, or the bytes in memory."""


class IngestError(FanfsError):
    """A source that cannot be packed as it is (unreadable, corrupt, hostile): one line naming the member."""


@dataclass(slots=True)
class Member:
    path: bytes  # in the tree being built: "a/b", never absolute, never with "." or ".." components
    type: int  # DIR, FILE, SYMLINK or HARDLINK
    mode: int  # st_mode, type bits included (HARDLINK: the file's)
    mtime: int  # nanoseconds since the epoch
    size: int = 0  # FILE: bytes the file presents; SYMLINK: length of the target
    target: bytes = b""  # SYMLINK: its target; HARDLINK: the path, in the tree, of the file it names again
    data: Data | None = None  # FILE: where its bytes are
    where: str = ""  # for messages: "train.tar:n01440764/x.JPEG"
    origin: int = 0  # which source it came from (a number the tree builder's list of sources names)
    archived: bool = False  # from an archive: its symlinks (and hard links to symlinks) must stay inside the tree
    spooled: bool = False  # ``data`` is a temporary file the consumer removes once the file is packed


class Spool:
    """Where archive members too large to hold in memory wait, as temporary files, until they are packed.

    Members up to ``in_memory`` bytes travel as bytes; a larger one is written here (holes kept), one file per
    member, named by a counter: the consumer removes each once packed, and the whole directory goes with a
    failed pack.
    """

    def __init__(self, directory: str, in_memory: int) -> None:
        self.directory = directory
        self.in_memory = in_memory
        self._next = 0

    def new_path(self) -> bytes:
        os.makedirs(self.directory, exist_ok=True)
        self._next += 1
        return os.fsencode(os.path.join(self.directory, f"member-{os.getpid()}-{self._next}"))


def describe_type(kind: int) -> str:
    return {DIR: "directory", FILE: "file", SYMLINK: "symbolic link", HARDLINK: "hard link"}.get(kind, "entry")
