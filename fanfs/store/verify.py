"""``fanfs verify``: re-check every checksum of a store, and optionally every byte against its source."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import FanfsError
from ..records import FULL, kinds
from ..util.checksum import Digest
from ..util.files import open_regular
from ..util.progress import Progress
from .format import FILE, SAVED_NAMES, SHARD_DIR, SHARD_HEADER, check_shard_header, digest_file, shard_name
from .reader import Store
from .saved import read_saved


@dataclass
class VerifyReport:
    shards: int = 0
    files: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the kinds say of the files (e.g. a lossy bound)

    @property
    def ok(self) -> bool:
        return not self.problems


Against = Callable[["Store", Callable[[str], None], bool], None]
"""A comparison of an open store with something else (``fanfs.ingest.compare``: its sources), run after the checksums:
given the store, where to report a problem, and whether to show progress."""


def verify(store_path: str, against: Against | None = None, progress: bool = True,
           on_problem: Callable[[str], None] | None = None) -> VerifyReport:
    """Check shard checksums, every file's content checksum, and with ``against`` what it compares."""
    store = Store(store_path, check_shards=False)
    report = VerifyReport()

    def problem(text: str) -> None:
        report.problems.append(text)
        if on_problem:
            on_problem(text)

    for kind_id, kind in kinds().items():
        entries = np.flatnonzero((store.index.record == kind_id) & (store.index.type == FILE))
        if entries.size:
            report.notes += kind.describe(store.index, entries).get("notes", [])
    _verify_shards(store, report, problem, progress)
    _verify_files(store, report, problem, progress)
    for name in SAVED_NAMES:  # optional files saved with the store: bound to this index, intact
        try:
            if read_saved(store.root, name, store.index, "remove it, or measure and save it again") is not None:
                report.notes.append(f"{name}: a measurement saved with this index, intact")
        except FanfsError as err:
            problem(str(err))
    if against is not None:
        against(store, problem, progress)
    store.close()
    return report


def _verify_shards(store: Store, report: VerifyReport, problem: Callable[[str], None], progress: bool) -> None:
    ix = store.index
    directory = os.path.join(store.root, SHARD_DIR)
    with Progress(int(ix.shard_size.sum()), "verify shards", enabled=progress, unit="B") as bar:
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            bar.update_to(done)

        for shard in range(ix.shard_size.size):
            path = os.path.join(directory, shard_name(shard))
            report.shards += 1
            try:
                with open(open_regular(path), "rb", buffering=0) as f:
                    check_shard_header(f.read(SHARD_HEADER.size), shard, store.id, path)
                    f.seek(0)
                    size, digest = digest_file(f, advance)
            except (OSError, FanfsError) as err:
                problem(f"shard {shard_name(shard)}: {err}")
                continue
            if size != int(ix.shard_size[shard]) or digest != int(ix.shard_checksum[shard]):
                problem(f"shard {shard_name(shard)}: checksum mismatch (size {size}, index {int(ix.shard_size[shard])})")


def _file_digest(store: Store, entry: int, fidelity: int = FULL) -> int:
    digest = Digest()
    size = store.size_at(entry, fidelity)
    step = 8 * store.chunk_size
    for offset in range(0, size, step):
        digest.update(store.read(entry, offset, step, fidelity))
    return digest.intdigest()


def _verify_files(store: Store, report: VerifyReport, problem: Callable[[str], None], progress: bool) -> None:
    ix = store.index
    files = np.flatnonzero(ix.type == FILE).tolist()
    with Progress(len(files), "verify files", enabled=progress, unit="files") as bar:
        for n, entry in enumerate(files, 1):
            name = os.fsdecode(ix.path(entry))
            try:
                if _file_digest(store, entry) != int(ix.checksum[entry]):
                    problem(f"{name}: content checksum mismatch")
            except OSError as err:
                problem(f"{name}: {err.strerror or err}")
            report.files += 1
            report.bytes += int(ix.size[entry])
            bar.update_to(n)
