"""Locks by key, for the threads of one process (:class:`fanfs.cache.localcache.DiskCache`'s blobs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class KeyedLocks:
    """A lock per key (a blob), made while some thread wants it: threads of one process, which share its file locks."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[int, list[Any]] = {}

    @contextmanager
    def hold(self, key: int) -> Iterator[None]:
        with self._guard:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [threading.Lock(), 0]
            entry[1] += 1
        entry[0].acquire()
        try:
            yield
        finally:
            entry[0].release()
            with self._guard:
                entry[1] -= 1
                if not entry[1]:
                    del self._held[key]

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]  (what another thread held at the fork is no one's here)
