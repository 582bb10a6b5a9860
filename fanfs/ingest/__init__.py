"""What pack reads: directory trees and archives (tar in any compression, zip, nested), as one tree of members.

Sources are read once, forward (an archive may be a pipe), and merged into the index's entry order
(:mod:`.tree`); a file member carries its bytes, or the path to open where it is packed.
"""

from .members import DIR, FILE, HARDLINK, SYMLINK, Data, IngestError, Member, Spool
from .sources import DEFAULT_MAX_EXPANSION, Ingest
from .tree import Tree

__all__ = ["DEFAULT_MAX_EXPANSION", "DIR", "Data", "FILE", "HARDLINK", "SYMLINK", "Ingest", "IngestError", "Member", "Spool",
           "Tree"]
