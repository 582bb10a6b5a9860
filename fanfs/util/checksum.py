"""The checksum of every blob, file, shard and index: xxh3-64 (tens of GB/s, non-cryptographic)."""

from __future__ import annotations

import xxhash

checksum = xxhash.xxh3_64_intdigest
"""xxh3-64 of a bytes-like object, as an int."""

Digest = xxhash.xxh3_64
"""An incremental xxh3-64 (``update``, ``intdigest``) for data that arrives in pieces."""
