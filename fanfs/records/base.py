"""The record-kind interface, its registry, and what kinds share (packed layers; presentations: :mod:`.settings`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from ..errors import UsageError
from ..util.source_file import SourceFile
from . import settings as _settings
from .settings import FULL, Presentation, Setting, register_setting, settings

AddOption = Callable[..., Any]
"""How a kind declares an option: argparse's ``add_argument`` (a ``type=`` raising ValueError: reported as is)."""


class Cache(Protocol):
    """The store's byte-bounded cache of decoded data (blob numbers; a kind may add keys of its own)."""

    def get(self, key: Any) -> bytes | None: ...

    def put(self, key: Any, data: bytes) -> None: ...


Span = tuple[bytes, int, int]
"""``(data, start, length)``: the bytes ``data[start:start + length]``, left unsliced."""


class Columns(Protocol):
    """The index columns a kind reads (:class:`fanfs.store.index.Index` has them, one value per entry or blob)."""

    meta: dict[str, Any]
    type: np.ndarray
    record: np.ndarray
    size: np.ndarray
    first: np.ndarray
    count: np.ndarray
    layers: np.ndarray
    blob_raw: np.ndarray
    blob_stored: np.ndarray
    items: Any  # the same columns as memoryviews, for one value at a time (:class:`fanfs.store.index.ColumnItems`)

    def path(self, entry: int) -> bytes: ...


class Reader(Protocol):
    """What a kind reads through (the store): decoded blobs, verified, cached, counted per layer."""

    index: Columns
    chunk_size: int
    cache: Cache

    def blob(self, entry: int, blob: int, layer: int = 0, keep: bool = True, stream: bool = False) -> bytes: ...

    def read(self, entry: int, offset: int, size: int, view: int = FULL) -> bytes: ...

    def fault(self, entry: int, blob: int, why: str) -> OSError:
        """The EIO to raise for a blob whose bytes cannot be used, logged once (file, shard, blob and why)."""
        ...


SIDE_LAYER = 64
"""What a reader counts side layer j as: layer ``SIDE_LAYER + j`` (every kind has fewer layers than that), so that
``fanfs stats`` tells a resolution tier's bytes from a scan's."""
SIDE_LAYERS = 8
"""Side layers a reader counts apart (a JPEG record has at most 4 tiers)."""


@dataclass
class Packed:
    """A file cut into layers by a kind at pack time.

    ``layers[i]`` yields the raw bytes of layer i's blobs in order (an ``int`` n: a hole of n zero
    bytes, stored as nothing).  ``size`` is the full presentation's size; its xxh3 is ``checksum``, or,
    when the layers are produced while reading (large files), ``digest`` once they have been consumed.
    ``compress``: whether blobs go through the file's codec (JPEG scans are entropy-coded already).

    ``side``: side layers, alternatives to the layers rather than refinements of them (a JPEG's resolution
    tiers).  A shard holds them after every file's layers, side layer j of all its files together, so that
    reading one side layer of a whole shard is one contiguous range and a prefix of layers never includes
    one.  Their blobs follow the file's layer blobs: the index's ``count`` has them, ``layers`` does not.

    ``align``: the first blob begins at a multiple of this in its shard (an extent's pages are the shard's pages).
    """

    layers: list[Iterable[bytes | int]]
    size: int
    checksum: int | None = None
    digest: Any = None
    compress: bool = True
    notes: list[str] = field(default_factory=list)
    side: list[Iterable[bytes | int]] = field(default_factory=list)
    align: int = 0

    def final_checksum(self) -> int:
        return self.checksum if self.checksum is not None else self.digest.intdigest()


class RecordKind:
    """One way of storing and presenting files; stateless apart from pack-time options."""

    kind_id: ClassVar[int]
    name: ClassVar[str]
    label: ClassVar[str]  # plural, for reports: "progressive JPEG records"
    setting: ClassVar[Setting | None] = None  # the presentation setting this kind's views follow
    setting_unit: ClassVar[int] = 1  # values of the setting are multiples of this
    since_format: ClassVar[int] = 1  # the first store format that may hold this kind
    fallback: ClassVar[str] = "kept as plain files"  # what pack and info call the files this kind let go
    adopted_as: ClassVar[str] = "adopted"  # what pack's list calls a file this kind adopted, saying why (:meth:`adopts`)
    in_place: ClassVar[bool] = False  # a file is one run of its shard, read where it lies (spliced by the mount)

    def setting_range(self, index: Columns, entries: np.ndarray) -> tuple[int, int]:
        """The values of ``setting`` that mean something for these files (FULL is always allowed)."""
        return (FULL, FULL)

    def offered(self, index: Columns, entries: np.ndarray) -> list[int]:
        """The values of ``setting`` below FULL that change some of ``entries`` (files of this kind): what a schedule
        or a choice may pick from.  By default every multiple of ``setting_unit`` in ``setting_range``."""
        low, high = self.setting_range(index, entries)
        return [] if (low, high) == (FULL, FULL) else list(range(low, high, self.setting_unit))

    def setting_problem(self, index: Columns, entries: np.ndarray, value: int) -> str | None:
        """Why ``entries`` (files of this kind) cannot be shown at ``value`` (not FULL) of the setting; None if
        they can.  By default: a multiple of ``setting_unit`` within ``setting_range``."""
        name = self.setting.name if self.setting else "?"
        if value % self.setting_unit:
            return f"{name} {value} is not a multiple of {self.setting_unit}"
        low, high = self.setting_range(index, entries)
        if (low, high) == (FULL, FULL):
            return f"this store holds no files whose {name} can be chosen: use {name} full"
        if not low <= value <= high:
            return f"{name} {value} is out of range: this store's files take {low}..{high} or full"
        return None

    # --- what a mount presents ----------------------------------------------------------------

    def views(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        """The view of each of ``entries`` under ``presentation`` (FULL where the file is shown whole)."""
        return np.full(entries.size, FULL, np.int64)

    def view(self, index: Columns, entry: int, presentation: Presentation) -> int:
        return FULL

    def size(self, reader: Reader, entry: int, view: int) -> int:
        """Bytes the file presents at ``view``."""
        return reader.index.items.size[entry]

    def read(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of the file as presented at ``view``."""
        raise NotImplementedError

    def whole_blob(self, index: Columns, entry: int, view: int) -> int:
        """The blob whose bytes are the whole file at ``view`` (read whole: no pieces to join), or -1: none."""
        return -1

    def spans(self, reader: Reader, entry: int, view: int, offset: int, size: int) -> list[Span]:
        """The same bytes as :meth:`read`, as pieces ``data[start:start + length]`` left unsliced, which a kind may
        give without copying (a FUSE reply is then sent from the pieces themselves)."""
        data = self.read(reader, entry, view, offset, size)
        return [(data, 0, len(data))]

    def blob_run(self, index: Columns, entry: int, view: int, offset: int, size: int) -> tuple[int, int]:
        """The blobs ``(first, count)`` that reading bytes ``[offset, offset + size)`` at ``view`` asks for one after
        another (a node that lacks them fetches them from a peer in one round trip); ``(0, 0)``: one at a time."""
        return (0, 0)

    def reads_within(self, view: int, other: int) -> bool:
        """Whether a file of this kind shown at ``view`` reads only blobs it reads when shown at ``other`` (a node
        serves a read from its staged layers alone).  Nested by default: a lower view reads a prefix of the layers."""
        return view <= other

    def presentation_notes(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> list[str]:
        """What a mount's ``stats`` says of ``entries`` under ``presentation`` (e.g. how many lack the view asked for)."""
        return []

    def side_names(self, index: Columns) -> list[str]:
        """What the store's side layers of this kind's files are, by position (``fanfs stats`` labels them)."""
        return []

    def blobs_read(self, index: Columns, entries: np.ndarray, presentation: Presentation) -> np.ndarray:
        """The blobs that presenting ``entries`` (files of this kind) at ``presentation`` reads: what a
        node stages for a job at that presentation.  By default all of them."""
        return expand(index.first[entries], index.count[entries])[0]

    def blob_ranks(self, index: Columns, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The blobs of ``entries`` (files of this kind) and how late each comes in its record: 0 for a blob every
        view reads, a layer's number for a refinement, more for a side layer.  A node short of room keeps a
        record's prefix before its tail.  By default every blob is 0."""
        blobs = expand(index.first[entries], index.count[entries])[0]
        return blobs, np.zeros(blobs.size, np.int64)

    # --- what an index must hold ---------------------------------------------------------------

    def check(self, index: Columns, entries: np.ndarray) -> str | None:
        """Whether the index columns of ``entries`` (all files of this kind) are consistent; a reason if not."""
        return None

    def describe(self, index: Columns, entries: np.ndarray) -> dict[str, Any]:
        """What ``fanfs info`` says about the files of this kind (JSON; ``notes``: lines shown under its line)."""
        return {}

    def summary(self, described: Mapping[str, Any]) -> str:
        """What ``fanfs info`` adds to this kind's line, from :meth:`describe`'s answer (`` (layers: 6: 10)``)."""
        return ""

    # --- pack ---------------------------------------------------------------------------------

    @classmethod
    def pack_options(cls, add: AddOption) -> None:
        """Declare this kind's ``fanfs pack`` options (none by default)."""

    @classmethod
    def select_options(cls, add: AddOption) -> None:
        """Declare this kind's ``fanfs select`` options (what select measures of it; none by default)."""

    @classmethod
    def for_pack(cls, options: Mapping[str, Any], plan_record: Mapping[str, Any] | None) -> RecordKind | None:
        """The instance pack tries files with, as ``options`` (the parsed pack options, by dest) and the record a
        selection plan names for one of its classes (``{"kind": name, ...}``, or None) ask; None: not used."""
        return None

    def pack_notes(self) -> list[str]:
        """What pack says once about a store this instance packed (e.g. that it is lossy)."""
        return []

    def kept_as(self, reason: str) -> str:
        """How pack's list of the files this kind let go says what became of one, given why: as is, by default."""
        return "kept as is"

    def plan_record_problem(self, class_name: str, record: Mapping[str, Any]) -> str | None:
        """Why a plan's content class ``class_name`` cannot name ``record`` (of this kind); None if it can."""
        return f"{self.label} are not chosen by a plan"

    def plan_label(self, record: Mapping[str, Any], codec: str) -> str:
        """A plan class's record and the codec of its blobs, for reports (``float+zstd:3``)."""
        return f"{self.name}+{codec}"

    def claims(self, head: bytes) -> bool:
        """Whether a file starting with ``head`` is one for this kind (content sniffing, not names)."""
        return False

    def pack(self, source: SourceFile, head: bytes) -> Packed | str:
        """Cut the file into layers, or give the reason it cannot be stored this way."""
        raise NotImplementedError

    def adopts(self, source: SourceFile, codec: Any, raw: bool, planned: bool) -> tuple[bool, str]:
        """For a file no kind claimed by its head, to be stored as a plain file with ``codec`` (``raw``: one that stores
        bytes as they are; ``planned``: chosen by a selection plan, which weighed its decode speed already): whether
        this kind stores it instead (:meth:`adopt`), and why or why not, for pack's list ("": nothing to say)."""
        return False, ""

    def adopt(self, packed: Packed) -> Packed:
        """A plain file's packed chunks, laid out as this kind stores them (after :meth:`adopts` said so)."""
        return packed

    def matches_source(self, reader: Reader, entry: int, source: SourceFile) -> str | None:
        """``fanfs verify --against``: None if the full presentation stands for the source file, else why not.

        By default the bytes must be the same, compared a few chunks at a time (a sparse 5 GiB file too).
        """
        offset, step = 0, 8 * reader.chunk_size
        while True:
            block = source.pread(step, offset)
            if block != reader.read(entry, offset, step):
                return f"bytes differ from the source near offset {offset}"
            if not block:
                return None
            offset += len(block)

    def pack_config(self) -> dict[str, Any] | None:
        """Pack-time options worth recording in the index (e.g. the scan script), or None."""
        return None


_REGISTRY: dict[int, RecordKind] = {}


def register(cls: type[RecordKind]) -> type[RecordKind]:
    if cls.kind_id in _REGISTRY or cls.name in (kind.name for kind in _REGISTRY.values()):
        raise ValueError(f"record kind {cls.kind_id} ({cls.name}) registered twice")
    _REGISTRY[cls.kind_id] = cls()
    if cls.setting is not None:
        register_setting(cls.setting, cls.kind_id)
    return cls


def kind_named(name: str) -> RecordKind:
    """The kind called ``name`` (as the index's header and plans name kinds); UsageError if none is."""
    for kind in _REGISTRY.values():
        if kind.name == name:
            return kind
    known = ", ".join(kind.name for kind in _REGISTRY.values())
    raise UsageError(f"no record kind is called {name!r}: this fanfs knows {known}")


def kinds() -> dict[int, RecordKind]:
    """Every registered kind by id, in id order (reading instances, default options)."""
    return dict(sorted(_REGISTRY.items()))


def kind_table() -> list[RecordKind | None]:
    """Kinds as a list indexed by id (a hot-path lookup); None where no kind has that id."""
    table: list[RecordKind | None] = [None] * (max(_REGISTRY) + 1)
    for kind_id, kind in _REGISTRY.items():
        table[kind_id] = kind
    return table


def check_presentation(index: Columns, presentation: Presentation) -> Presentation:
    """``presentation`` if every setting in it is one the store's files can take; UsageError naming why if not."""
    files = None
    for setting in settings():
        value = presentation[setting.name]
        if type(value) is not int:
            raise UsageError(f"{setting.name} must be a whole number or full, not {value!r}")
        if value == FULL:
            continue
        files = np.flatnonzero(index.type == 1) if files is None else files
        problems = [kind.setting_problem(index, files[index.record[files] == kind_id], value)
                    for kind_id, kind in _REGISTRY.items() if kind.setting is setting]
        if None not in problems:
            raise UsageError(problems[0])
    return presentation


def offered(index: Columns, name: str) -> list[int]:
    """Every value below FULL of the setting ``name`` that changes some file of the store, least data first (its
    ``rank``)."""
    files = np.flatnonzero(index.type == 1)
    values = {value for kind_id, kind in _REGISTRY.items() if kind.setting is not None and kind.setting.name == name
              for value in kind.offered(index, files[index.record[files] == kind_id])}
    return sorted(values, key=_settings.setting(name).rank)


def presentation_notes(index: Columns, presentation: Presentation) -> list[str]:
    """What every kind says of its files under ``presentation`` (``fanfs stats``)."""
    files = np.flatnonzero(index.type == 1)
    return [note for kind_id, kind in _REGISTRY.items()
            for note in kind.presentation_notes(index, files[index.record[files] == kind_id], presentation)]


def side_names(index: Columns) -> list[str]:
    """The store's side layers by position, as the kind whose files have them names them (``1/2``, ``1/4``)."""
    files = np.flatnonzero(index.type == 1)
    for kind_id, kind in _REGISTRY.items():
        mine = files[index.record[files] == kind_id]
        if mine.size and (names := kind.side_names(index)):
            return names
    return []


def pack_kinds(options: Mapping[str, Any], plan_records: Mapping[str, Mapping[str, Any]]) -> list[RecordKind]:
    """The kinds ``fanfs pack`` tries, in id order, as the parsed pack options and a plan's records (kind name ->
    record) ask."""
    chosen = (kind.for_pack(options, plan_records.get(kind.name)) for kind in kinds().values())
    return [kind for kind in chosen if kind is not None]


def blobs_read(index: Columns, presentation: Presentation) -> np.ndarray:
    """Whether each blob of the store is read when it is presented at ``presentation`` (a bool per blob)."""
    needed = np.zeros(index.blob_raw.size, bool)
    files = np.flatnonzero(index.type == 1)
    for kind_id, kind in _REGISTRY.items():
        entries = files[index.record[files] == kind_id]
        if entries.size:
            needed[kind.blobs_read(index, entries, presentation)] = True
    return needed


def blob_ranks(index: Columns) -> np.ndarray:
    """How late each blob of the store comes in its record (:meth:`RecordKind.blob_ranks`), one int per blob."""
    ranks = np.zeros(index.blob_raw.size, np.int64)
    files = np.flatnonzero(index.type == 1)
    for kind_id, kind in _REGISTRY.items():
        entries = files[index.record[files] == kind_id]
        if entries.size:
            blobs, rank = kind.blob_ranks(index, entries)
            ranks[blobs] = rank
    return ranks


def blob_shards(index: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Every blob of a regular file, ascending, and its shard: the one rule of where a blob lies (in the shard of the
    file whose range holds it; files that share blobs, hard links, share their shard: validated)."""
    files = np.flatnonzero((index.type == 1) & (index.count > 0))
    blobs, owner = expand(index.first[files], index.count[files])
    blobs, first = np.unique(blobs, return_index=True)
    return blobs, index.shard[files][owner[first]].astype(np.int64)


def expand(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All items of the ranges ``[first[i], first[i] + count[i])`` and, for each, the range ``i`` it is from."""
    count = np.asarray(count, np.int64)
    owner = np.repeat(np.arange(count.size), count)
    offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.asarray(first, np.int64)[owner] + offsets, owner

