"""A lock per key, made while some thread wants it: the threads of one process taking turns on one blob of a node's
cache (its processes take turns through file locks on the blob's state byte, :mod:`.localcache`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import WouldWait


class KeyedLocks:
    """A lock per key (a blob), made while some thread wants it: threads of one process, which share its file locks."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[int, list[Any]] = {}

    @contextmanager
    def hold(self, key: int, wait: bool = True) -> Iterator[None]:
        """The key's lock for the block; ``wait=False``: WouldWait if another thread holds it (it fills the blob)."""
        with self._guard:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            if not entry[0].acquire(wait):
                raise WouldWait
            try:
                yield
            finally:
                entry[0].release()
        finally:
            with self._guard:
                entry[1] -= 1
                if not entry[1]:
                    del self._held[key]

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]  (what another thread held at the fork is no one's here)
