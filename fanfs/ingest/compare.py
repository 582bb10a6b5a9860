"""``fanfs verify --against SRC...``: a store against the sources it was packed from, read again as pack read them.

Every entry must be there with the same type, mode, mtime (files and links) and symlink target, and every file
must stand for its source (the same bytes; the same pixels for a JPEG record; within the bound for a lossy float
record).  Archives are streamed once more, as the pack streamed them, with the archives inside them expanded if
the store says they were; a hard link must share its file's contents in the store.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence

from ..errors import FanfsError
from ..store.format import DIR, FILE
from ..store.reader import Store
from ..util.progress import Progress
from ..util.source_file import OpenFile, SourceFile
from ..util.files import open_regular
from .members import Member, Spool
from .names import join
from .sources import DEFAULT_MAX_EXPANSION, Ingest
from .tree import Tree

SPOOL_IN_MEMORY = 64 << 20


def against_sources(srcs: Sequence[str], *, expand_archives: bool | None = None,
                    max_expansion: float = DEFAULT_MAX_EXPANSION) -> Callable[[Store, Callable[[str], None], bool], None]:
    """The comparison ``fanfs.store.verify.verify`` runs: the store against ``srcs`` (``expand_archives``: as the
    store was packed, unless given)."""

    def compare(store: Store, problem: Callable[[str], None], progress: bool) -> None:
        expand = bool(store.meta.get("expand_archives")) if expand_archives is None else expand_archives
        ingest = Ingest(srcs, expand_archives=expand, max_expansion=max_expansion,
                        warn=lambda text: None)
        spool_dir = tempfile.mkdtemp(prefix="fanfs-verify-")
        try:
            total = ingest.walk() or 0
            with Progress(total, "verify against", enabled=progress, unit="B", count_total=ingest.files_known()) as bar:
                for n, (_, member) in enumerate(ingest.files(Spool(spool_dir, SPOOL_IN_MEMORY)), 1):
                    if n == 1:
                        _same_folders(store, member.path)  # before reading them all
                    _content(store, member, problem)
                    bar.update_to(ingest.position(), count=n)
            tree = ingest.finish()
            if len(tree.paths) > 1:
                _same_folders(store, tree.paths[1])  # sources without files
            _metadata(store, tree, problem)
        finally:
            ingest.close()
            shutil.rmtree(spool_dir, ignore_errors=True)

    return compare


def _same_folders(store: Store, path: bytes) -> None:
    """Stop at once, with one line, where the sources' ``path`` is not in the store but is under a folder the store put
    its sources in (``PREFIX=SRC`` at pack, not at verify): else every entry would be a difference."""
    recorded = store.meta.get("sources", [])
    folders = [os.fsencode(source["prefix"]) for source in recorded if source.get("prefix")]
    if store.index.lookup(path) >= 0 or not any(store.index.lookup(join(folder, path)) >= 0 for folder in folders):
        return
    shown = ", ".join(f"{os.fsdecode(folder)}/" for folder in folders)
    given = " ".join(f"{source['prefix']}={source['path']}" if source.get("prefix") else source["path"]
                     for source in recorded)
    raise FanfsError(f"the store puts its sources under PREFIX folders ({shown}) and the sources given do not: give "
                     f"--against PREFIX=SRC as pack had them (--against {given})")


def _content(store: Store, member: Member, problem: Callable[[str], None]) -> None:
    name = os.fsdecode(member.path)
    entry = store.index.lookup(member.path)
    if entry < 0 or int(store.index.type[entry]) != FILE:
        return  # said by _metadata, with the tree
    source: SourceFile
    try:
        if isinstance(member.data, bytes):
            source = OpenFile(open_regular(member.data, follow=False))
        else:
            assert member.data is not None
            source = member.data
        try:
            reason = store.kind(entry).matches_source(store, entry, source)
        finally:
            if isinstance(source, OpenFile):
                os.close(source.fd)
    except (OSError, FanfsError) as err:
        reason = getattr(err, "strerror", None) or str(err)
    finally:
        if member.spooled:
            os.unlink(member.data)  # type: ignore[arg-type]
    if reason:
        problem(f"{name}: {reason}")


def _metadata(store: Store, tree: Tree, problem: Callable[[str], None]) -> None:
    """Same paths, types, modes, mtimes and link targets; hard links the same contents as their files."""
    ix = store.index
    present = set()
    types, modes, mtimes = tree.type.tolist(), tree.mode.tolist(), tree.mtime.tolist()
    for n, path in enumerate(tree.paths):
        name = os.fsdecode(path) or "/"
        entry = ix.lookup(path)
        if entry < 0:
            problem(f"{name}: in the source, missing from the store")
            continue
        present.add(entry)
        if int(ix.type[entry]) != types[n] or int(ix.mode[entry]) != modes[n]:
            problem(f"{name}: type or mode differs ({oct(int(ix.mode[entry]))} vs {oct(modes[n])})")
            continue
        if int(ix.mtime[entry]) != mtimes[n] and types[n] != DIR:
            problem(f"{name}: mtime differs")
        if stat.S_ISLNK(modes[n]) and store.readlink(entry) != tree.targets[n]:
            problem(f"{name}: link target differs")
    for link, target in tree.links:
        a, b = ix.lookup(tree.paths[link]), ix.lookup(tree.paths[target])
        if a >= 0 and b >= 0 and (int(ix.checksum[a]), int(ix.size[a])) != (int(ix.checksum[b]), int(ix.size[b])):
            problem(f"{os.fsdecode(tree.paths[link])}: a hard link to {os.fsdecode(tree.paths[target])} "
                    "whose contents differ in the store")
    for entry in sorted(set(range(ix.entries)) - present):
        problem(f"{os.fsdecode(ix.path(entry))}: in the store, not in the source")
