"""What a node's peer server answers a member's READ (:mod:`.peerserver` moves the bytes): the stored bytes of
blobs it holds, located by the index (a client names blobs, never a byte range), or a refusal with its reason.

It serves only whole blobs of its own store that it holds (placement gave them to it and the job staged
their layer), a run of them only within one shard and up to ``MAX_RUN_BYTES``.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from bisect import bisect_right
from typing import Any

import numpy as np

from ..errors import FanfsError
from ..records import blob_shards
from ..store.format import shard_name
from ..store.sources import HeldShards
from .peerwire import FAILED, MAX_REASON, MAX_RUN, MAX_RUN_BYTES, OK, READ, REFUSED

log = logging.getLogger("fanfs")

REPORT_EVERY = 60.0


class OncePerMinute:
    """A log line at most once a minute per kind of event; how many were not logged is said next time
    (thread-safe: the server's threads and its replies share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -REPORT_EVERY) < REPORT_EVERY:
                self._quiet[kind] = self._quiet.get(kind, 0) + 1
                return
            self._last[kind] = now
            quiet = self._quiet.pop(kind, 0)
        log.warning("peer: " + message + (f" ({quiet} more like it in the last minute)" if quiet else ""), *args)


class BlobLocator:
    """Which shard each blob lies in (offset and size from the index), for a server: the first blob of each run of
    blobs in one shard, bisected (a list: ~1 us, numpy's searchsorted on a scalar ~5; a list a blob would be large)."""

    def __init__(self, index: Any) -> None:
        blobs, shards = blob_shards(index)
        runs = np.concatenate([[0], np.flatnonzero(np.diff(shards)) + 1]) if blobs.size else blobs
        self._first = blobs[runs].tolist()
        self._shard = shards[runs].tolist()

    def shard(self, blob: int) -> int:
        return self._shard[bisect_right(self._first, blob) - 1]


class Replies:
    """The answers to READ requests from this node's staged share (``local``: only blobs it holds), and their counts."""

    def __init__(self, index: Any, local: HeldShards, warn: OncePerMinute) -> None:
        self.index = index
        self.local = local
        self.locate = BlobLocator(index)
        self._warn = warn
        self._lock = threading.Lock()
        self.served_requests = self.served_bytes = self.refused = self.failed = 0

    def count_refused(self) -> None:
        """A connection refused before any request (its handshake failed)."""
        with self._lock:
            self.refused += 1

    def answer(self, rank: int, kind: int, first: int, count: int) -> tuple[int, bytes]:
        """The stored bytes of blobs ``first .. first + count - 1``, back to back, or a refusal with its reason."""
        reason = self._refusal(kind, first, count)
        if reason:
            self.count_refused()
            self._warn.warn("request", "refused a request from rank %d: %s", rank, reason)
            return REFUSED, reason.encode()[:MAX_REASON]
        ix = self.index
        shard = self.locate.shard(first)
        parts = []
        try:
            for blob in range(first, first + count):
                offset, length = int(ix.blob_offset[blob]), int(ix.blob_stored[blob])
                data = self.local.read(blob, shard, offset, length)
                if len(data) != length:
                    raise OSError(errno.EIO, f"short read of blob {blob} ({len(data)} of {length} bytes)")
                parts.append(data)
        except (OSError, FanfsError) as err:
            with self._lock:
                self.failed += 1
            self._warn.warn("failed", "cannot serve blob %d (shard %s) to rank %d: %s", first, shard_name(shard),
                            rank, err)
            return FAILED, str(err).encode()[:MAX_REASON]
        payload = parts[0] if count == 1 else b"".join(parts)
        with self._lock:
            self.served_requests += 1
            self.served_bytes += len(payload)
        return OK, payload

    def _refusal(self, kind: int, first: int, count: int) -> str:
        if kind != READ:
            return f"unknown request kind {kind}"
        if not 1 <= count <= MAX_RUN:
            return f"a run of {count} blobs (1 to {MAX_RUN} may be asked at once)"
        if first + count > self.index.blob_offset.size:
            return f"no blob {first + count - 1} in this store"
        run, named = slice(first, first + count), f"blob {first}" if count == 1 else f"blobs {first}..{first + count - 1}"
        if not self.local.held[run].all():
            return f"{named}: not held by this node (placed elsewhere, or in a layer not staged)"
        if not self.index.blob_stored[run].all():
            return f"{named}: a hole, nothing to send"
        if count > 1 and (self.locate.shard(first) != self.locate.shard(first + count - 1)
                          or int(self.index.blob_stored[run].sum()) > MAX_RUN_BYTES):
            return f"{named}: span shards or more than {MAX_RUN_BYTES >> 20} MiB"
        return ""

    def stats(self) -> dict[str, int]:
        return {"served_requests": self.served_requests, "served_bytes": self.served_bytes,
                "refused": self.refused, "failed": self.failed}
