"""How fast a loader decodes each presentation of an image: Pillow decoding the bytes in memory.

A progressive JPEG decodes slower than its baseline original (refinement scans, and libjpeg-turbo's
block smoothing at a partial K), so the bytes a fidelity saves can cost CPU in a decode-bound loader.
The variants of one image are timed interleaved: one untimed warm-up pass, then ``rounds`` rounds,
each over every variant in a fresh random order with the garbage collector off; a variant's time is
the median of its rounds. Noise from a busy machine then hits the variants alike, so the *ratios*
between them are fair where absolute times are not.
"""

from __future__ import annotations

import gc
import io
import statistics
import time
from collections.abc import Sequence

import numpy as np

ROUNDS = 3


def _decode_ns(data: bytes) -> int:
    from PIL import Image
    started = time.perf_counter_ns()
    with Image.open(io.BytesIO(data)) as im:
        im.load()
    return time.perf_counter_ns() - started


def decode_times(variants: Sequence[bytes], rng: np.random.Generator, rounds: int = ROUNDS) -> list[float]:
    """Seconds to decode each of ``variants`` (median of ``rounds`` interleaved rounds)."""
    times: list[list[int]] = [[] for _ in variants]
    for data in variants:
        _decode_ns(data)  # warm-up: code, tables and the allocator, untimed
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for i in rng.permutation(len(variants)).tolist():
                times[i].append(_decode_ns(variants[i]))
    finally:
        if was_enabled:
            gc.enable()
    return [statistics.median(t) / 1e9 for t in times]
