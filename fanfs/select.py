"""``fanfs select``: pick, per content class, the best-ratio codec whose decoding keeps up with training.

Measured on this node, per class (:mod:`fanfs.classify`), on a sample of the source tree; the result is
a plan (:mod:`fanfs.plan`) that ``fanfs pack --plan`` uses.

Sample
    Files are grouped by extension; from each group a fraction ``--sample`` (default 2%) is drawn at
    random (seeded), at least 32 files and at least as many as hold ~8 MiB at the group's mean file size
    (so a class of small files has enough data to measure and to train a dictionary on), or the whole
    group if it is smaller.  Each drawn file is classified by its first
    bytes.  Measurement units are what pack compresses: a file up to 1 MiB whole, a larger file as
    1 MiB chunks (up to 16 random chunks of it).  Per class at most ``--sample-cap`` bytes (default
    16 MiB) are read; for classes of small files (mean unit <= 128 KiB) half of them train a zstd
    dictionary and the other half are the measurement set, so a dictionary is never measured on the
    data it was trained on.  Every candidate of a class is measured on the same measurement set.

Candidates
    ``raw``; lz4 fast and HC 3, 9, 12; zstd levels 1..19; zstd + the class's trained dictionary at
    levels 1, 3, 9, 15, 19 (small-file classes); for float arrays byte planes (width of the arrays'
    dtype) + zstd at levels 1, 3, 9, 15, 19.

Per candidate (all speeds per thread, MB = 10^6 bytes, raw bytes per second)
    ratio     sum(raw bytes) / sum(stored bytes), a blob that does not shrink counted (and later
              stored) raw, as pack does.  A slow encoder encodes the units in order until it has spent
              ~0.15 s (and covered at least 256 KiB, 4 units and one unit that shrank); its ratio on that prefix is scaled by the ratio of a fast
              reference of the same family (zstd:1, zstd:1+dict, planes:1, lz4) over the whole set to
              the prefix: ratio = ratio_X(prefix) * ratio_ref(all) / ratio_ref(prefix).  A dictionary
              candidate's ratio includes the dictionary, stored once:
              ratio = B_c / (B_c / ratio_measured + dict_bytes), B_c = estimated bytes of the class.
    encode    raw bytes encoded / encode seconds (one pass over the encoded units).
    decode D  raw bytes / decode seconds: every encoded unit decoded with the same codec object the
              mount uses, repeated until >= 0.2 s have passed (``time.perf_counter``).  Units stored
              raw cost no decoding; ``raw`` does no decoding at all (D = infinity, shown as "-").

Demand
    R, the demanded byte rate (raw bytes per second the training job on this node consumes):
    ``--rate`` directly, or ``--samples-per-sec S`` x mean file size of the whole tree (one file is
    one sample).  T = ``--threads`` (reader/decoder threads, e.g. DataLoader workers).

Feasibility (D = per-thread decode speed of the candidate for this class)
    sync   Reads block training; the read budget of a step is the time its bytes b take at the
           demanded rate, b / R.  T readers decode in parallel, so the decode time the step adds is
           b / (T * D).  Feasible iff  b / (T * D) <= overhead * b / R,  i.e.
               D >= R / (T * overhead)                 (overhead = ``--overhead``, default 5%)
    async  Decoding overlaps compute; only throughput matters.  Feasible iff
               T * D >= R * (1 + headroom),  i.e.  D >= R * (1 + headroom) / T   (default 20%)
    Both conditions are per byte, so if every class meets its condition, any mix of classes in a
    step does too.  Without a rate every candidate is feasible.  ``raw`` is always feasible.

Choice
    Among the feasible candidates the best ratio; candidates within 0.5% of that ratio count as equal
    and the fastest decoder among them wins (a hair of ratio is not worth a slower decoder); decode
    speeds within 10% of that fastest count as equal too (timing noise), and among those the better
    ratio wins.

Capacity (``--capacity C`` per node, ``--nodes N``, ``--replicas K``)
    stored = sum over classes of B_c / ratio_c + dictionaries;  fits iff  K * stored <= N * C;
    headroom = N * C - K * stored (also as % of N * C).  If it does not fit the plan is infeasible:
    the report says what would fit: the ratio needed (K * bytes / (N * C)), the highest rate (or the
    fewest threads) at which the feasible codecs reach it, or the nodes / capacity per node /
    replicas that would hold the dataset at the chosen codecs.  An infeasible selection writes no
    plan and ``fanfs select`` exits 1.
"""

from __future__ import annotations

import datetime
import math
import os
import random
import re
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .classify import CLASSES, SNIFF, classify, float_width
from .codecs import BytePlanes, Codec, Lz4, Raw, Zstd
from .format import CHUNK_SIZE
from .plan import Plan
from .units import human_size
from .workers import process_pool

MB = 1e6
LZ4_LEVELS = (0, 3, 9, 12)
ZSTD_LEVELS = tuple(range(1, 20))
DICT_LEVELS = (1, 3, 9, 15, 19)
PLANES_LEVELS = (1, 3, 9, 15, 19)
DICT_MAX_MEAN_UNIT = 128 << 10  # dictionaries are tried for classes of small files
DICT_SIZE = 112_640  # zstd's default maximum dictionary size
ENCODE_BUDGET = 0.15  # seconds of encoding per candidate (at least MIN_ENCODE_BYTES)
MIN_ENCODE_BYTES = 256 << 10
MIN_ENCODE_UNITS = 4
DECODE_MIN_SECONDS = 0.2
TIE = 0.005
GROUP_FLOOR = 32
GROUP_FLOOR_BYTES = 8 << 20
CHUNKS_PER_FILE = 16


class SelectError(ValueError):
    """Bad arguments or an unreadable source (one-line reason)."""


# ---------------------------------------------------------------------------------------------------
# demand


@dataclass
class Demand:
    mode: str = "async"
    rate: float | None = None  # demanded bytes/s (--rate)
    samples_per_sec: float | None = None
    threads: int = 2
    overhead: float = 0.05
    headroom: float = 0.20
    capacity: int | None = None  # bytes per node
    nodes: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise SelectError(f"mode must be sync or async, not {self.mode!r}")
        if self.rate is not None and self.samples_per_sec is not None:
            raise SelectError("give --rate or --samples-per-sec, not both")
        for name in ("rate", "samples_per_sec"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SelectError(f"{name.replace('_', '-')} must be positive")
        if self.threads < 1:
            raise SelectError("--threads must be at least 1")
        if not 0 < self.overhead:
            raise SelectError("--overhead must be more than 0% (sync reads then allow no decoding at all)")
        if self.headroom < 0:
            raise SelectError("--headroom cannot be negative")
        if self.capacity is not None:
            if self.capacity <= 0 or self.nodes < 1 or self.replicas < 1:
                raise SelectError("--capacity, --nodes and --replicas must be positive")
            if self.replicas > self.nodes:
                raise SelectError(f"{self.replicas} replicas need at least {self.replicas} nodes, not {self.nodes}")

    def byte_rate(self, mean_file_size: float) -> float | None:
        """R: demanded raw bytes per second."""
        if self.rate is not None:
            return float(self.rate)
        if self.samples_per_sec is not None:
            return self.samples_per_sec * mean_file_size
        return None

    def required_decode(self, rate: float | None, threads: int | None = None) -> float:
        """Per-thread decode speed (bytes/s) a codec needs at byte rate ``rate``; 0 without a rate."""
        if not rate:
            return 0.0
        t = threads or self.threads
        if self.mode == "sync":
            return rate / (t * self.overhead)
        return rate * (1 + self.headroom) / t

    def rate_for(self, decode: float, threads: int | None = None) -> float:
        """The highest byte rate a per-thread decode speed ``decode`` keeps up with (inverse of the above)."""
        t = threads or self.threads
        if self.mode == "sync":
            return decode * t * self.overhead
        return decode * t / (1 + self.headroom)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "rate_Bps": self.rate, "samples_per_sec": self.samples_per_sec,
                "threads": self.threads, "overhead": self.overhead, "headroom": self.headroom,
                "capacity": self.capacity, "nodes": self.nodes, "replicas": self.replicas}


def parse_rate(text: str) -> float:
    """``800MB/s`` -> 8e8 bytes/s.  Decimal units (K, M, G, T = 10^3..10^12); ``MiB/s`` etc. are binary."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?(?:/s)?\s*$", str(text), re.IGNORECASE)
    if not match:
        raise SelectError(f"not a rate: {text!r} (use e.g. 800MB/s, 1.5GB/s, 200MiB/s)")
    number, prefix, binary = float(match.group(1)), match.group(2).upper(), bool(match.group(3))
    power = " KMGT".index(prefix) if prefix else 0
    return number * ((1024 if binary else 1000) ** power)


def parse_fraction(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise SelectError(f"not a fraction: {text!r} (use e.g. 5% or 0.05)") from None
    if value < 0:
        raise SelectError(f"not a fraction: {text!r}")
    return value


# ---------------------------------------------------------------------------------------------------
# sample


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


# ---------------------------------------------------------------------------------------------------
# measurement


@dataclass
class Candidate:
    codec: Codec
    family: str  # raw, lz4, zstd, zstd+dict, planes
    ratio: float = 1.0
    encode_Bps: float | None = None
    decode_Bps: float | None = None  # None: no decoding (raw)
    measured_units: int = 0
    measured_bytes: int = 0
    feasible: bool = True
    chosen: bool = False
    stored: list[int] = field(default_factory=list, repr=False)  # per unit stored size (prefix)

    @property
    def spec(self) -> str:
        return self.codec.spec

    def decode_speed(self) -> float:
        return math.inf if self.decode_Bps is None else self.decode_Bps

    def to_json(self) -> dict[str, Any]:
        return {"codec": self.codec.get_config(), "spec": self.spec, "ratio": round(self.ratio, 4),
                "encode_MBps": None if self.encode_Bps is None else round(self.encode_Bps / MB, 1),
                "decode_MBps": None if self.decode_Bps is None else round(self.decode_Bps / MB, 1),
                "feasible": self.feasible, "chosen": self.chosen,
                "measured_bytes": self.measured_bytes, "measured_units": self.measured_units}


def measure(codec: Codec, units: list[bytes], budget: float | None = ENCODE_BUDGET) -> Candidate:
    """Encode units in order (stopping after ``budget`` seconds and MIN_ENCODE_BYTES), then time decoding
    the encoded ones for at least DECODE_MIN_SECONDS."""
    cand = Candidate(codec, "")
    encoded: list[tuple[bytes, int]] = []
    spent = 0.0
    covered = 0
    perf = time.perf_counter
    for data in units:
        t0 = perf()
        packed = codec.encode(data)
        spent += perf() - t0
        n = len(data)
        if len(packed) < n:
            encoded.append((packed, n))
            cand.stored.append(len(packed))
        else:
            cand.stored.append(n)  # stored raw, never decoded
        covered += n
        # stop when the budget is spent, but only once a unit shrank (so decoding is timed on real work)
        if budget is not None and spent >= budget and covered >= MIN_ENCODE_BYTES and len(cand.stored) >= MIN_ENCODE_UNITS \
                and encoded:
            break
    cand.measured_units = len(cand.stored)
    cand.measured_bytes = covered
    cand.ratio = covered / max(1, sum(cand.stored))
    cand.encode_Bps = covered / spent if spent > 0 else None
    if isinstance(codec, Raw) or not encoded:
        cand.decode_Bps = None
        if isinstance(codec, Raw):
            cand.encode_Bps = None
        return cand
    decode = codec.decode
    reps = 0
    t0 = perf()
    while True:
        for packed, n in encoded:
            decode(packed, n)
        reps += 1
        elapsed = perf() - t0
        if elapsed >= DECODE_MIN_SECONDS:
            break
    cand.decode_Bps = covered * reps / elapsed
    return cand


def _train_dictionary(train: list[bytes]) -> bytes | None:
    import zstandard
    total = sum(map(len, train))
    if len(train) < 8 or total < 8 << 10:
        return None
    size = max(1024, min(DICT_SIZE, total // 10))
    try:
        return zstandard.train_dictionary(size, train).as_bytes()
    except zstandard.ZstdError:
        return None


@dataclass
class ClassResult:
    name: str
    files_sampled: int
    files_est: float
    bytes_est: float
    units: int = 0
    unit_bytes: int = 0
    train_bytes: int = 0
    dictionary: bytes | None = None
    candidates: list[Candidate] = field(default_factory=list)
    required_Bps: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate:
        return next(c for c in self.candidates if c.chosen)


def measure_class(name: str, files: list[SampledFile], cap: int, seed: int, bytes_est: float) -> ClassResult:
    """Measure every candidate of one class on its sample."""
    rng = random.Random(f"{seed}:{name}")
    result = ClassResult(name, len(files), sum(f.weight for f in files), bytes_est)
    units = class_units(files, cap, rng)
    mean_unit = sum(map(len, units)) / max(1, len(units))
    train: list[bytes] = []
    if mean_unit <= DICT_MAX_MEAN_UNIT and len(units) >= 16:
        units, train = units[0::2], units[1::2]
    result.units, result.unit_bytes, result.train_bytes = len(units), sum(map(len, units)), sum(map(len, train))
    if not units:
        return result
    dictionary = _train_dictionary(train) if train else None
    if train and dictionary is None:
        result.notes.append("too little data to train a dictionary")
    result.dictionary = dictionary

    def add(family: str, codec: Codec, ref: Candidate | None = None) -> Candidate:
        cand = measure(codec, units, None if ref is None else ENCODE_BUDGET)
        cand.family = family
        if ref is not None and cand.measured_units < len(units):
            k = cand.measured_units
            ref_prefix = sum(units_len[:k]) / max(1, sum(ref.stored[:k]))
            cand.ratio *= ref.ratio / ref_prefix
        result.candidates.append(cand)
        return cand

    units_len = [len(u) for u in units]
    add("raw", Raw())
    ref = add("lz4", Lz4(0))
    for level in LZ4_LEVELS[1:]:
        add("lz4", Lz4(level), ref)
    ref = add("zstd", Zstd(1))
    for level in ZSTD_LEVELS[1:]:
        add("zstd", Zstd(level), ref)
    if dictionary:
        ref = None
        for level in DICT_LEVELS:
            cand = add("zstd+dict", Zstd(level, dictionary, name), ref)
            ref = ref or cand
        for cand in result.candidates:
            if cand.family == "zstd+dict" and bytes_est > 0:  # the dictionary is stored once
                cand.ratio = bytes_est / (bytes_est / cand.ratio + len(dictionary))
    widths = sorted({f.width for f in files if f.width}, key=lambda w: -sum(1 for f in files if f.width == w))
    for width in widths[:2]:
        ref = None
        for level in PLANES_LEVELS:
            cand = add("planes", BytePlanes(width, level), ref)
            ref = ref or cand
    for cand in result.candidates:
        cand.stored = []
    return result


# ---------------------------------------------------------------------------------------------------
# choice


@dataclass
class Selection:
    sample: TreeSample
    demand: Demand
    rate: float | None
    required_Bps: float
    classes: list[ClassResult]
    seconds: float = 0.0
    stored_est: float = 0.0
    capacity: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def ratio_est(self) -> float:
        return self.sample.bytes / self.stored_est if self.stored_est else 1.0


def choose(candidates: list[Candidate], required: float) -> Candidate:
    """Best ratio among the feasible (raw always is); within TIE of it, the fastest decoder."""
    for c in candidates:
        c.feasible = c.decode_speed() >= required
        c.chosen = False
    feasible = [c for c in candidates if c.feasible]
    best = max(c.ratio for c in feasible)
    near = [c for c in feasible if c.ratio >= best * (1 - TIE)]
    fastest = max(c.decode_speed() for c in near)
    # decode speeds within 10% are measurement noise: among those, the better ratio, then no dictionary
    pick = max((c for c in near if c.decode_speed() >= fastest * 0.9),
               key=lambda c: (c.ratio, c.family != "zstd+dict", c.decode_speed()))
    pick.chosen = True
    return pick


def _stored_at(classes: list[ClassResult], required: float) -> float:
    """Estimated stored bytes if every class chose among candidates decoding at >= ``required``."""
    total = 0.0
    for cr in classes:
        feasible = [c for c in cr.candidates if c.decode_speed() >= required]
        best = max(c.ratio for c in feasible)
        total += cr.bytes_est / best  # a dictionary's bytes are inside its ratio
    return total


def decide(sample: TreeSample, demand: Demand, classes: list[ClassResult]) -> Selection:
    mean_size = sample.bytes / max(1, sample.files)
    rate = demand.byte_rate(mean_size)
    required = demand.required_decode(rate)
    sel = Selection(sample, demand, rate, required, classes)
    # unmeasured bytes (classes whose units could not be read) count as raw
    for cr in classes:
        cr.required_Bps = required
        if not cr.candidates:
            cr.notes.append("no readable data in the sample: the plan's default codec is used")
            continue
        pick = choose(cr.candidates, required)
        sel.stored_est += cr.bytes_est / pick.ratio
        compressing = [c for c in cr.candidates if c.ratio >= 1.01 and c.decode_Bps is not None]
        if pick.family == "raw" and compressing:
            fastest = max(compressing, key=lambda c: c.decode_speed())
            cr.notes.append(f"only raw keeps up; {fastest.spec} (ratio {fastest.ratio:.2f}) would at "
                            f"{_rate_text(demand.rate_for(fastest.decode_speed()))} or less")
        elif pick.family == "raw" and not compressing:
            cr.notes.append("nothing compresses this class: stored raw")
    measured_bytes = sum(cr.bytes_est for cr in classes if cr.candidates)
    sel.stored_est += sample.bytes - measured_bytes  # bytes of classes without measurements, as raw
    if demand.capacity is not None:
        sel.capacity = _capacity(sel)
    return sel


def _rate_text(bps: float) -> str:
    return f"{bps / MB:,.1f} MB/s"


def _capacity(sel: Selection) -> dict[str, Any]:
    d = sel.demand
    avail = d.capacity * d.nodes
    need = sel.stored_est * d.replicas
    out: dict[str, Any] = {
        "capacity_per_node": d.capacity, "nodes": d.nodes, "replicas": d.replicas, "available": avail,
        "stored_est": round(sel.stored_est), "needed": round(need), "fits": need <= avail,
        "headroom_bytes": round(avail - need), "headroom_pct": round(100 * (avail - need) / avail, 2),
        "per_node": round(need / d.nodes),
    }
    if need <= avail:
        return out
    ratio_needed = sel.sample.bytes * d.replicas / avail
    unmeasured = sel.sample.bytes - sum(cr.bytes_est for cr in sel.classes if cr.candidates)
    measured = [cr for cr in sel.classes if cr.candidates]
    speeds = sorted({c.decode_speed() for cr in measured for c in cr.candidates if c.decode_Bps is not None})
    best_any = _stored_at(measured, 0.0) + unmeasured
    fixes = [f"nodes >= {math.ceil(need / d.capacity)}",
             f"capacity >= {human_size(math.ceil(need / d.nodes))} per node"]
    if d.replicas > 1 and sel.stored_est <= avail:
        fixes.append(f"replicas <= {int(avail // sel.stored_est)}")
    hint = ""
    if best_any * d.replicas <= avail:
        # the highest per-thread speed bar at which the best feasible ratios still fit
        bar = max(s for s in [0.0, *speeds] if _stored_at(measured, s) + unmeasured <= avail / d.replicas)
        if bar > 0 and sel.rate:
            fixes.append(f"rate <= {_rate_text(d.rate_for(bar))}")
            fixes.append(f"threads >= {math.ceil(d.threads * sel.required_Bps / bar)}")
        hint = f"; the best ratio at any rate ({sel.sample.bytes / best_any:.2f}) would fit"
    else:
        hint = f"; even the best ratio at any rate ({sel.sample.bytes / best_any:.2f}) does not fit"
    out["ratio_needed"] = round(ratio_needed, 3)
    out["would_fit_with"] = fixes
    sel.problems.append(f"infeasible: the dataset does not fit: {human_size(need)} needed ({d.replicas} x "
                        f"{human_size(sel.stored_est)}) > {human_size(avail)} ({d.nodes} x {human_size(d.capacity)}); "
                        f"needs ratio {ratio_needed:.2f}, the chosen codecs give {sel.ratio_est:.2f}{hint}; "
                        f"would fit with: {', or '.join(fixes)}")
    return out


# ---------------------------------------------------------------------------------------------------
# the whole run


def select(src: str, demand: Demand, fraction: float = 0.02, cap: int = 16 << 20, seed: int = 0,
           jobs: int = 1) -> Selection:
    started = time.monotonic()
    sample = draw_sample(src, fraction, seed)
    if not sample.sampled:
        raise SelectError(f"{src} holds no non-empty readable files to measure")
    by_class: dict[str, list[SampledFile]] = {}
    for f in sample.sampled:
        by_class.setdefault(f.cls, []).append(f)
    # estimated bytes per class: sampled bytes weighted by how many files each stands for, scaled to the tree
    raw_est = {c: sum(f.size * f.weight for f in fs) for c, fs in by_class.items()}
    scale = sample.bytes / max(1.0, sum(raw_est.values()))
    names = [c for c in CLASSES if c in by_class]
    args = [(c, by_class[c], cap, seed, raw_est[c] * scale) for c in names]
    if jobs > 1 and len(args) > 1:
        with process_pool(min(jobs, len(args))) as pool:
            classes = list(pool.map(measure_class, *zip(*args)))
    else:
        classes = [measure_class(*a) for a in args]
    sel = decide(sample, demand, classes)
    sel.seconds = time.monotonic() - started
    return sel


def make_plan(sel: Selection) -> Plan:
    table: dict[str, dict[str, Any]] = {}
    dictionaries: dict[str, bytes] = {}
    for cr in sel.classes:
        if not cr.candidates:
            continue
        pick = cr.chosen
        table[cr.name] = {"codec": pick.codec.get_config(), "ratio": round(pick.ratio, 4),
                          "decode_MBps": None if pick.decode_Bps is None else round(pick.decode_Bps / MB, 1),
                          "measured": True}
        if pick.family == "zstd+dict" and cr.dictionary:
            dictionaries[cr.name] = cr.dictionary
    info = {"fanfs": __version__, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "source": os.path.abspath(sel.sample.root),
            "constraint": {**sel.demand.to_json(), "byte_rate_Bps": sel.rate,
                           "required_decode_MBps": round(sel.required_Bps / MB, 1)}}
    return Plan(table, dictionaries, info)


def selection_json(sel: Selection) -> dict[str, Any]:
    s = sel.sample
    return {
        "fanfs_select": 1, "source": s.root, "files": s.files, "bytes": s.bytes,
        "sample": {"fraction": s.fraction, "files": len(s.sampled), "unreadable": s.unreadable},
        "demand": {**sel.demand.to_json(), "byte_rate_Bps": sel.rate,
                   "required_decode_MBps": round(sel.required_Bps / MB, 1)},
        "classes": [{"class": cr.name, "files_est": round(cr.files_est), "bytes_est": round(cr.bytes_est),
                     "sample_files": cr.files_sampled, "measured_bytes": cr.unit_bytes, "measured_units": cr.units,
                     "dictionary_bytes": len(cr.dictionary) if cr.dictionary else 0,
                     "chosen": cr.chosen.codec.get_config() if cr.candidates else None,
                     "ratio": round(cr.chosen.ratio, 4) if cr.candidates else None,
                     "candidates": [c.to_json() for c in cr.candidates], "notes": cr.notes}
                    for cr in sel.classes],
        "stored_est": round(sel.stored_est), "ratio_est": round(sel.ratio_est, 4),
        "capacity": sel.capacity, "feasible": sel.feasible, "problems": sel.problems,
        "seconds": round(sel.seconds, 2),
    }


def format_report(sel: Selection) -> str:
    s, d = sel.sample, sel.demand
    lines = [f"source   {s.root}: {s.files:,} files, {human_size(s.bytes)}; sample {100 * s.fraction:g}% "
             f"({len(s.sampled):,} files, at least {GROUP_FLOOR} and ~8 MiB per extension), measured in {sel.seconds:.1f} s"]
    if sel.rate:
        how = f"{_rate_text(sel.rate)}" + (f" ({d.samples_per_sec:,.0f} samples/s x {human_size(s.bytes / max(1, s.files))})"
                                          if d.samples_per_sec else "")
        cond = (f"decode time <= {100 * d.overhead:g}% of the read budget" if d.mode == "sync"
                else f"{d.threads} x decode >= rate x {1 + d.headroom:g}")
        lines.append(f"demand   {d.mode}, {how}, {d.threads} threads: {cond} -> decode >= "
                     f"{sel.required_Bps / MB:,.1f} MB/s per thread")
    else:
        lines.append("demand   no rate given: every codec is fast enough, the best ratio wins")
    for cr in sel.classes:
        share = 100 * cr.bytes_est / max(1, s.bytes)
        lines.append("")
        lines.append(f"{cr.name}: ~{cr.files_est:,.0f} files, ~{human_size(cr.bytes_est)} ({share:.0f}% of bytes); "
                     f"measured on {human_size(cr.unit_bytes)} in {cr.units:,} units"
                     + (f", dictionary {human_size(len(cr.dictionary))} trained on {human_size(cr.train_bytes)}"
                        if cr.dictionary else ""))
        if cr.candidates:
            lines.append(f"  {'candidate':<20} {'ratio':>7} {'enc MB/s':>9} {'dec MB/s':>9}  {'feasible':<8}  chosen")
            for c in cr.candidates:
                enc = "-" if c.encode_Bps is None else f"{c.encode_Bps / MB:,.1f}"
                dec = "-" if c.decode_Bps is None else f"{c.decode_Bps / MB:,.1f}"
                lines.append(f"  {c.spec:<20} {c.ratio:>7.3f} {enc:>9} {dec:>9}  {'yes' if c.feasible else 'no':<8}  "
                             + ("<== chosen" if c.chosen else ""))
            lines.append(f"  chosen: {cr.chosen.spec} (ratio {cr.chosen.ratio:.3f})")
        for note in cr.notes:
            lines.append(f"  note: {note}")
    lines.append("")
    lines.append(f"dataset  {human_size(s.bytes)} -> ~{human_size(sel.stored_est)} stored (ratio {sel.ratio_est:.2f})")
    if sel.capacity:
        c = sel.capacity
        verdict = (f"fits, headroom {human_size(c['headroom_bytes'])} ({c['headroom_pct']:.1f}%)" if c["fits"]
                   else f"DOES NOT FIT (short by {human_size(-c['headroom_bytes'])})")
        lines.append(f"capacity {d.nodes} nodes x {human_size(d.capacity)}, {d.replicas} replicas: needs "
                     f"{human_size(c['needed'])} ({human_size(c['per_node'])} per node) of {human_size(c['available'])}: {verdict}")
    for p in sel.problems:
        lines.append(p.upper()[:11] + p[11:] if p.startswith("infeasible") else p)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# plot


def plot(sel: Selection, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [cr for cr in sel.classes if cr.candidates]
    n = max(1, len(measured))
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    colours = {"raw": "black", "lz4": "tab:orange", "zstd": "tab:blue", "zstd+dict": "tab:green", "planes": "tab:purple"}
    for ax, cr in zip(axes.flat, measured):
        speeds = [c.decode_Bps / MB for c in cr.candidates if c.decode_Bps]
        top = max(speeds + [sel.required_Bps / MB, 1.0]) * 3
        low = min(speeds + [sel.required_Bps / MB or top] + [top / 30]) / 2
        for fam, colour in colours.items():
            pts = [(top if c.decode_Bps is None else c.decode_Bps / MB, c.ratio) for c in cr.candidates if c.family == fam]
            if pts:
                ax.scatter(*zip(*pts), s=18, color=colour, label=fam, zorder=3)
        if sel.required_Bps:
            ax.axvspan(sel.required_Bps / MB, top * 1.5, color="tab:green", alpha=0.1, label="feasible")
            ax.axvline(sel.required_Bps / MB, color="tab:green", lw=1)
        else:
            ax.axvspan(low, top * 1.5, color="tab:green", alpha=0.1, label="feasible (no rate)")
        pick = cr.chosen
        x = top if pick.decode_Bps is None else pick.decode_Bps / MB
        ax.scatter([x], [pick.ratio], marker="*", s=260, facecolor="red", edgecolor="black", zorder=4, label="chosen")
        ax.annotate(pick.spec, (x, pick.ratio), textcoords="offset points", xytext=(-8, 9), ha="right", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(low, top * 1.5)
        ax.set_xlabel("decode MB/s per thread (raw: right edge, no decoding)")
        ax.set_ylabel("ratio")
        ax.set_title(f"{cr.name} (~{human_size(cr.bytes_est)})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(measured):]:
        ax.axis("off")
    d = sel.demand
    rate = f"{_rate_text(sel.rate)}" if sel.rate else "no rate"
    fig.suptitle(f"fanfs select: {d.mode}, {rate}, {d.threads} threads -> decode >= {sel.required_Bps / MB:,.0f} MB/s per thread")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
