"""Which files ``fanfs select`` measures: a seeded sample per extension group, classified by content."""

from __future__ import annotations

import math
import os
import random
import stat
from dataclasses import dataclass

from ...records import CHUNK_SIZE
from ..classify import SNIFF, classify, float_width
from .demand import SelectError

GROUP_FLOOR = 32
GROUP_FLOOR_BYTES = 8 << 20
CHUNKS_PER_FILE = 16


@dataclass
class SampledFile:
    path: bytes
    size: int
    weight: float  # files of the tree this sampled file stands for
    cls: str = ""
    width: int = 0  # float arrays: bytes per value


@dataclass
class TreeSample:
    root: str
    files: int
    bytes: int
    fraction: float
    sampled: list[SampledFile]
    unreadable: int = 0


def _walk_files(root: str) -> list[tuple[bytes, int]]:
    if not os.path.isdir(root):
        raise SelectError(f"{root} is not a directory")
    out: list[tuple[bytes, int]] = []
    stack = [os.fsencode(root)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as err:
            if top == os.fsencode(root):
                raise SelectError(f"cannot read {root}: {err.strerror}") from None
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(e.path)
            elif stat.S_ISREG(st.st_mode):
                out.append((e.path, st.st_size))
    out.sort()
    return out


def _read(path: bytes, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        parts = []
        while n > 0:
            chunk = os.pread(fd, min(n, 8 << 20), offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
            n -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def draw_sample(root: str, fraction: float, seed: int = 0) -> TreeSample:
    files = _walk_files(root)
    rng = random.Random(seed)
    groups: dict[bytes, list[tuple[bytes, int]]] = {}
    for path, size in files:
        if size == 0:
            continue  # empty files store nothing
        ext = os.path.splitext(os.path.basename(path))[1].lower()
        groups.setdefault(ext, []).append((path, size))
    sampled: list[SampledFile] = []
    for ext in sorted(groups):
        group = groups[ext]
        mean = sum(size for _, size in group) / len(group)
        floor = max(GROUP_FLOOR, math.ceil(GROUP_FLOOR_BYTES / mean))  # small files: enough bytes to measure
        n = min(len(group), max(math.ceil(fraction * len(group)), floor))
        for path, size in rng.sample(group, n):
            sampled.append(SampledFile(path, size, len(group) / n))
    unreadable = 0
    kept = []
    for f in sampled:
        try:
            head = _read(f.path, 0, SNIFF)
        except OSError:
            unreadable += 1
            continue
        f.cls = classify(head)
        f.width = float_width(head) if f.cls == "float" else 0
        kept.append(f)
    return TreeSample(root, len(files), sum(s for _, s in files), fraction, kept, unreadable)


def class_units(files: list[SampledFile], cap: int, rng: random.Random) -> list[bytes]:
    """Measurement units of one class, in random order, at most ``cap`` bytes: files up to a chunk whole,
    larger files as (up to CHUNKS_PER_FILE random) chunks, as pack compresses them."""
    units: list[tuple[bytes, int, int]] = []
    for f in files:
        if f.size <= CHUNK_SIZE:
            units.append((f.path, 0, f.size))
        else:
            chunks = -(-f.size // CHUNK_SIZE)
            for c in rng.sample(range(chunks), min(chunks, CHUNKS_PER_FILE)):
                units.append((f.path, c * CHUNK_SIZE, min(CHUNK_SIZE, f.size - c * CHUNK_SIZE)))
    rng.shuffle(units)
    out: list[bytes] = []
    total = 0
    for path, offset, n in units:
        if total >= cap:
            break
        try:
            data = _read(path, offset, n)
        except OSError:
            continue
        if data:
            out.append(data)
            total += len(data)
    return out
