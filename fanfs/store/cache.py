"""A byte-bounded LRU of decoded blobs, shared by every reader of a store."""

from __future__ import annotations

import threading
from collections import OrderedDict


class BlobCache:
    """Maps blob number -> decoded bytes; evicts least recently used past ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._items: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: int) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: int, data: bytes) -> None:
        if len(data) > self.capacity // 4:
            return  # one huge blob would flush everything else
        with self._lock:
            if key in self._items:
                return
            self._items[key] = data
            self.used += len(data)
            while self.used > self.capacity:
                _, old = self._items.popitem(last=False)
                self.used -= len(old)

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread of the parent may have held the old one at the fork)."""
        self._lock = threading.Lock()
