"""What a store served (:class:`Stats`: ``fanfs stats`` shows it), and when each of its files was last read
(:class:`ReadClock`: how a read-ahead of a known order sees how far its readers got, :mod:`fanfs.cache.follow`)."""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass, field

from ..errors import FanfsError
from ..util.files import closed_with
from ..records import SIDE_LAYER, SIDE_LAYERS


@dataclass
class Stats:
    """What a store served; ``fanfs stats`` shows it."""

    reads: int = 0
    bytes_presented: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    decode_seconds: float = 0.0
    errors: int = 0
    bytes_spliced: int = 0  # presented from a copy's pages by the kernel (extents), never through this process
    bytes_verified: int = 0  # of those copies, read here once to be checked before they were first spliced
    stored_by_layer: list[int] = field(default_factory=lambda: [0] * (SIDE_LAYER + SIDE_LAYERS))  # += on a list is cheap
    by_source: dict[str, int] = field(default_factory=dict)

    def stored(self, layer: int, source: str, length: int) -> None:
        """``length`` stored bytes of ``layer`` were read from ``source`` (a verified copy)."""
        self.stored_by_layer[min(layer, SIDE_LAYER + SIDE_LAYERS - 1)] += length
        self.by_source[source] = self.by_source.get(source, 0) + length

    def as_dict(self) -> dict:
        layers, side = self.stored_by_layer[:SIDE_LAYER], self.stored_by_layer[SIDE_LAYER:]
        used = max((i + 1 for i, stored in enumerate(layers) if stored), default=0)
        used_side = max((i + 1 for i, stored in enumerate(side) if stored), default=0)
        return {"reads": self.reads, "bytes_presented": self.bytes_presented,
                "bytes_stored_read": sum(self.stored_by_layer), "stored_by_layer": layers[:used],
                "stored_by_side_layer": side[:used_side],
                "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "decode_seconds": round(self.decode_seconds, 6), "errors": self.errors,
                "bytes_spliced": self.bytes_spliced, "bytes_verified": self.bytes_verified,
                "by_source": dict(self.by_source)}


TICKS_PER_SECOND = 100


def tick() -> int:
    """Now, in the unit of the readers' clock: 1/100 s since boot, a uint32 (a year's worth)."""
    return int(time.monotonic() * TICKS_PER_SECOND) & 0xFFFFFFFF


class ReadClock:
    """When each file was last read: a uint32 per entry, the :func:`tick` of its last read, in memory that every
    reader writes: a mount's serving processes (forked after it was made) and ``fanfs run``'s readers (handed its
    memfd).  For ``entries`` entries: made here (a memfd, :attr:`fd`, for the mount to hand its readers), or
    ``shared``, a reader's mapping of the mount's."""

    def __init__(self, entries: int, shared: mmap.mmap | None = None) -> None:
        size = 4 * max(1, entries)
        self.fd: int | None = None
        if shared is None:
            self.fd = os.memfd_create("fanfs-reads", os.MFD_CLOEXEC)
            self._release = closed_with(self, [self.fd])
            os.ftruncate(self.fd, size)
            shared = mmap.mmap(self.fd, size)
        elif len(shared) != size:
            raise FanfsError(f"the mount's memory of reads holds {len(shared)} bytes, not {size}")
        self.ticks = memoryview(shared).cast("I")

    def close(self) -> None:
        if self.fd is not None:
            self._release()
            self.fd = None
