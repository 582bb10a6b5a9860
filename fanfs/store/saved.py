"""Measurements saved with a store: small JSON files beside its index, each bound to that index.

A store is read-only once packed, but what is measured on it once (the fidelity curve ``auto:SSIM``
looks up) is worth keeping with it, so that no node, job or reader measures it again.  Such a file is
optional (a store without it is whole, and an older fanfs never opens it), written atomically (temp
name, fsync, rename), and holds the store id and the index checksum it was measured on and a checksum
of its whole content.  Like the index, it is trusted only after checks: read as a regular file (never
through a symbolic link) of at most :data:`MAX_SAVED` bytes, JSON, of a known format, of this store's
index as it is now, with a matching checksum.  Anything else is refused with one line; what the content
means is checked by whoever saved it (:mod:`fanfs.tune.curve` for the fidelity curve).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from typing import Any

import xxhash

from ..errors import FanfsError, StoreError
from ..util.files import read_regular
from ..util.privacy import file_mode, read_bits_in
from .format import INDEX_NAME, SAVED_NAMES
from .index import Index

SAVED_FORMAT = 1
MAX_SAVED = 1 << 20
"""A fidelity curve is a few KiB; a larger file is refused before it is parsed."""


def _sealed(body: dict[str, Any]) -> int:
    """The checksum of a saved file's body (every key but ``checksum``), over its canonical JSON."""
    return xxhash.xxh3_64_intdigest(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a number a measurement holds")


def saved_path(root: str, name: str) -> str:
    if name not in SAVED_NAMES:
        raise ValueError(f"{name!r} is not a file a store holds")
    return os.path.join(root, name)


def write_saved(root: str, name: str, index: Index, content: dict[str, Any], remedy: str) -> str:
    """Save ``content`` with the store at ``root`` (whose index is ``index``) atomically; returns the path.
    ``remedy``: what to do when the store's directory is not writable by this user."""
    path = saved_path(root, name)
    body = {"format": SAVED_FORMAT, "store_id": index.meta["store_id"], "index_checksum": f"{index.digest:016x}",
            "content": content}
    data = json.dumps({**body, "checksum": f"{_sealed(body):016x}"}, allow_nan=False).encode() + b"\n"
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     file_mode(read_bits_in(os.path.join(root, INDEX_NAME), root)))  # as private as the store
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as err:
        if err.errno != errno.EEXIST:  # not another's file of that name: ours, half written
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise StoreError(f"cannot save {path}: {err.strerror}; {remedy}") from None
    return path


def read_saved(root: str, name: str, index: Index, remedy: str) -> dict[str, Any] | None:
    """The content saved as ``name`` with the store at ``root`` (whose index is ``index``); None if there is
    none.  A file that fails a check is refused with one StoreError naming it, the fault and ``remedy``."""
    path = saved_path(root, name)

    def refuse(problem: str) -> StoreError:
        return StoreError(f"{path}: {problem}: {remedy}")

    try:
        data = read_regular(path, limit=MAX_SAVED, follow=False)
    except FileNotFoundError:
        return None
    except FanfsError as err:
        raise refuse(str(err).replace(path, "it")) from None
    except OSError as err:
        raise refuse(f"cannot read it ({err.strerror})") from None
    try:
        saved = json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise refuse("not a saved measurement (not JSON)") from None
    if not isinstance(saved, dict) or set(saved) != {"format", "store_id", "index_checksum", "content", "checksum"}:
        raise refuse("not a saved measurement (unexpected keys)")
    if saved["format"] != SAVED_FORMAT or type(saved["format"]) is not int:
        raise refuse(f"format {saved['format']!r}, this fanfs reads format {SAVED_FORMAT}")
    if saved["store_id"] != index.meta["store_id"]:
        raise refuse(f"measured on another store (id {str(saved['store_id'])[:32]!r}, not {index.meta['store_id']})")
    if saved["index_checksum"] != f"{index.digest:016x}":
        raise refuse("measured on another index of this store (the index changed since it was saved)")
    body = {key: value for key, value in saved.items() if key != "checksum"}
    if saved["checksum"] != f"{_sealed(body):016x}":
        raise refuse("checksum mismatch: the file is corrupt or was edited")
    if not isinstance(saved["content"], dict):
        raise refuse("no content")
    return saved["content"]


def finite(value: Any) -> bool:
    """A JSON number (not a bool) that is finite: what a measurement's values are."""
    return type(value) in (int, float) and math.isfinite(value)
