"""A fanfs store as an fsspec file system (protocol ``fanfs``), read in-process: no FUSE, no daemon.

Where a job may not mount FUSE, or a kernel round trip per request costs too much, each DataLoader
worker reads the store itself: a whole-file read is one index lookup and one :meth:`Store.read` (a
``pread`` of the blob, its checksum checked, decoded unless stored raw).  What a file presents
(fidelity, precision, and so its size) follows the record kinds' rules, as on the mount; a failed read
is an OSError with errno EIO and the store's one-line message (logged once); a write is refused.
Forked workers may share a file system made before the fork (shards are read with ``pread``, and the
store renews its locks in the child); under ``spawn`` it is pickled by its arguments and opens the
store again.
"""

from __future__ import annotations

import datetime
import errno
import os
from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.utils import stringify_path

from ..errors import UsageError
from ..records import Presentation
from ..store.format import DIR, FILE, SYMLINK
from .file import FanfsFile
from .paths import resolve
from .settings import open_store, presentation

PROTOCOL = "fanfs"
DEFAULT_CACHE = "64M"
"""Decoded blobs kept per process (only blobs read in parts: a blob read whole is not kept)."""
TYPES = {FILE: "file", DIR: "directory", SYMLINK: "other"}
_PREFIXES = (PROTOCOL + "://", PROTOCOL + "::")
_FSSPEC_OPTIONS = {"use_listings_cache", "listings_expiry_time", "max_paths"}  # fsspec's own; nothing to cache here


class ReadOnlyError(OSError, NotImplementedError):
    """A write to a store: EROFS, as the mount answers, and a NotImplementedError, as fsspec's read-only file
    systems (HTTP, libarchive, GitHub) raise."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.EROFS, f"fanfs stores are read-only: cannot {what}")


def _refuse(operation: str) -> Callable[..., None]:
    def refuse(self: Any, path: Any = None, *args: Any, **kwargs: Any) -> None:
        raise ReadOnlyError(f"{operation} {path!r}")

    refuse.__doc__ = f"Refused: {operation} (a fanfs store is read-only)."
    return refuse


def _source(store: str | os.PathLike | None, node: str | os.PathLike | None, job: bool, fo: str | None,
            target_protocol: str | None) -> tuple[str | os.PathLike | None, str | os.PathLike | None]:
    """(store directory, node directory), one of them None: ``store=`` or the target of a chained URL
    ``fanfs://PATH::STORE``; or ``node=``, or with ``job=True`` a Slurm job's node (``$FANFS_MNT``)."""
    if job:
        from ..cluster.job import MNT_VARIABLE  # only here: a job's parts are not a plain store reader's
        if node is not None:
            raise UsageError("name the node once: node=DIR or job=True, not both")
        node = os.environ.get(MNT_VARIABLE) or None
        if node is None:
            raise UsageError(f"job=True reads the node of a Slurm job's task (${MNT_VARIABLE}, set by 'fanfs job "
                             "exec'), and it is not set here: start the job with FANFS_MOUNT=0, or pass node=DIR")
    named = [what for what, value in (("store=PATH", store), ("a chained URL 'fanfs://PATH::STORE'", fo),
                                      ("node=DIR or job=True", node)) if value is not None]
    if len(named) > 1:
        raise UsageError(f"name the store once: {' or '.join(named)}, not both")
    if fo is not None and target_protocol not in (None, "file", "local"):
        raise UsageError(f"a fanfs store is a local directory, not {target_protocol}://{fo}")
    if not named:
        raise UsageError("say which store to read: fsspec.filesystem('fanfs', store=PATH), 'fanfs://PATH::STORE', "
                         "or a cluster node's view: node=DIR (job=True in a Slurm job)")
    return (store if store is not None else fo), node


class FanfsFileSystem(AbstractFileSystem):
    """``fsspec.filesystem("fanfs", store=PATH, fidelity=K|"full"|"auto:SSIM", precision=BITS|"full")``.

    On a cluster node serving without a mount, ``node=DIR`` (its node directory) or ``job=True`` (in a Slurm
    job's task: ``$FANFS_MNT``) instead of ``store``: the node's staged shards read here, the blobs it lacks
    from the peers holding them.  Paths are relative to the store's root (``train/cat/1.jpg``; a leading
    ``/`` or ``fanfs://`` is dropped).  ``cache_size``: decoded blobs kept per process for reads of parts of
    files.
    """

    protocol = PROTOCOL
    root_marker = ""

    def __init__(self, store: str | os.PathLike | None = None, *, node: str | os.PathLike | None = None,
                 job: bool = False, cache_size: int | str = DEFAULT_CACHE, fo: str | None = None,
                 target_protocol: str | None = None, target_options: dict | None = None, **options: Any) -> None:
        """``options``: the record kinds' presentation settings by name (``fidelity``, ``precision``), and fsspec's."""
        settings = {name: options.pop(name) for name in Presentation.NAMES if name in options}
        unknown = sorted(set(options) - _FSSPEC_OPTIONS)
        if unknown:
            raise UsageError(f"unknown option {unknown[0]!r} for the fanfs file system (it takes store, node, job, "
                             f"{', '.join(Presentation.NAMES)} and cache_size)")
        super().__init__(**options)
        self.store, self._counters = open_store(*_source(store, node, job, fo, target_protocol), cache_size)
        self.presentation = presentation(self.store, settings)
        ix = self.store.index
        self._index, self._lookup, self._mode, self._mtime = ix, ix.lookup, ix.mode, ix.mtime
        self._type = memoryview(ix.type)  # Python ints, not numpy scalars: read on every call

    @property
    def fsid(self) -> str:
        return f"fanfs_{self.store.meta['store_id']}"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for prefix in _PREFIXES:
            if path.startswith(prefix):
                path = path[len(prefix):]
                break
        return path.strip("/")

    # --- entries ------------------------------------------------------------------------------

    def _entry(self, path: str, follow: bool = True) -> int:
        """Entry of ``path`` (its symbolic link followed if ``follow``); FileNotFoundError if none."""
        if type(path) is not str or path.startswith(_PREFIXES):
            path = self._strip_protocol(path)
        rel = path.strip("/").encode("utf-8", "surrogateescape")  # os.fsencode, without its call
        entry = self._lookup(rel)
        if entry < 0 or (follow and self._type[entry] == SYMLINK):
            entry = resolve(self._index, rel, follow)
        return entry

    def _file(self, path: str) -> tuple[int, int]:
        """(entry, view) of the file at ``path``."""
        entry = self._entry(path)
        if self._type[entry] != FILE:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return entry, self.store.view(entry, self.presentation)

    def _info(self, entry: int, name: str) -> dict[str, Any]:
        kind = int(self._type[entry])
        view = self.store.view(entry, self.presentation)
        out = {"name": name, "size": self.store.size_at(entry, view), "type": TYPES[kind],
               "mode": int(self._mode[entry]), "mtime": int(self._mtime[entry]) / 1e9, "islink": kind == SYMLINK}
        if kind == SYMLINK:
            out["destination"] = os.fsdecode(self._index.target(entry))
        return out

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """What ``path`` is; a symbolic link is followed (``islink`` and ``destination`` say it was one)."""
        path = self._strip_protocol(path)
        link = self._entry(path, follow=False)
        if self._type[link] != SYMLINK:
            return self._info(link, path)
        return {**self._info(self._entry(path), path), "islink": True,
                "destination": os.fsdecode(self._index.target(link))}

    def modified(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """A directory's entries, sorted by name, as they are (a symbolic link is ``other``, as in fsspec's
        local file system, so ``walk`` and ``find`` do not descend into linked directories)."""
        path = self._strip_protocol(path)
        entry = self._entry(path)
        if self._type[entry] != DIR:
            return [self.info(path)] if detail else [path]
        prefix = path + "/" if path else ""
        children = self.store.listdir(entry)
        if detail:
            return [self._info(ino - 1, prefix + os.fsdecode(name)) for name, ino, _ in children]
        return [prefix + os.fsdecode(name) for name, _, _ in children]

    # --- data ---------------------------------------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """The file's bytes as presented, or ``[start:end]`` of them (negative: from the end, as a slice)."""
        entry, view = self._file(path)
        store = self.store
        size = store.size_at(entry, view)
        if start is None and end is None:
            return store.read(entry, 0, size, view)
        begin, stop = _span(start, end, size)
        return store.read(entry, begin, stop - begin, view) if stop > begin else b""

    def open(self, path: str, mode: str = "rb", block_size: int | None = None, cache_options: dict | None = None,
             compression: str | None = None, **kwargs: Any) -> Any:
        """A file opened for reading (``rb``: a :class:`FanfsFile`; text and compression as fsspec gives them).
        ``block_size``: the window a read of a part fetches (default: the whole file up to 1 MiB)."""
        if mode != "rb" or compression is not None:
            return super().open(path, mode, block_size, cache_options, compression, **kwargs)
        entry, view = self._file(path)  # the loader's case, without fsspec's generic steps
        name = path.strip("/") if type(path) is str and not path.startswith(_PREFIXES) else self._strip_protocol(path)
        store = self.store
        return FanfsFile(self, store, entry, view, store.size_at(entry, view), name, block_size)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict | None = None, **kwargs: Any) -> FanfsFile:
        if mode != "rb":
            raise ReadOnlyError(f"open {path!r} in mode {mode!r}")
        return self.open(path, mode, block_size)

    def stats(self) -> dict[str, Any]:
        """What this process has read (as ``fanfs stats`` shows for a mount; on a node, its requests to peers)."""
        return {**self.store.stats.as_dict(), **self._counters()}

    # --- writes: refused ------------------------------------------------------------------------

    mkdir = makedirs = _refuse("make directory")
    rmdir = rm = rm_file = _rm = _refuse("remove")
    pipe_file = touch = put_file = put = _refuse("write")
    cp_file = copy = _refuse("copy within")
    mv = _refuse("move")


def _span(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """``[start:end]`` of ``size`` bytes as offsets, clipped like a slice."""
    begin = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
    stop = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
    return begin, stop
