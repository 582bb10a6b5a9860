"""Measuring every candidate codec of a content class: ratio, encode and decode speed, on this node."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from ...codecs import BytePlanes, Codec, Lz4, Raw, Zstd
from .floatprobe import FloatRecordProbe
from .sample import SampledFile, class_units

MB = 1e6
LZ4_LEVELS = (0, 3, 9, 12)
ZSTD_LEVELS = tuple(range(1, 20))
DICT_LEVELS = (1, 3, 9, 15, 19)
PLANES_LEVELS = (1, 3, 9, 15, 19)
FLOAT_RECORD_LEVELS = (1, 3, 9, 19)
DICT_MAX_MEAN_UNIT = 128 << 10  # dictionaries are tried for classes of small files
DICT_SIZE = 112_640  # zstd's default maximum dictionary size
ENCODE_BUDGET = 0.15  # seconds of encoding per candidate (at least MIN_ENCODE_BYTES)
MIN_ENCODE_BYTES = 256 << 10
MIN_ENCODE_UNITS = 4
DECODE_MIN_SECONDS = 0.2


@dataclass
class Candidate:
    codec: Codec
    family: str  # raw, lz4, zstd, zstd+dict, planes, float (float records), elf (ELF float records)
    ratio: float = 1.0
    encode_Bps: float | None = None
    decode_Bps: float | None = None  # None: no decoding (raw)
    measured_units: int = 0
    measured_bytes: int = 0
    feasible: bool = True
    chosen: bool = False
    stored: list[int] = field(default_factory=list, repr=False)  # per unit stored size (prefix)
    record: dict[str, Any] | None = None  # float records: the form the files take (``codec`` compresses its blobs)
    label: str = ""  # what the candidate is called when ``codec`` alone does not say it

    @property
    def spec(self) -> str:
        return self.label or self.codec.spec

    def decode_speed(self) -> float:
        return math.inf if self.decode_Bps is None else self.decode_Bps

    def to_json(self) -> dict[str, Any]:
        return {"codec": self.codec.get_config(), "spec": self.spec, "record": self.record, "ratio": round(self.ratio, 4),
                "encode_MBps": None if self.encode_Bps is None else round(self.encode_Bps / MB, 1),
                "decode_MBps": None if self.decode_Bps is None else round(self.decode_Bps / MB, 1),
                "feasible": self.feasible, "chosen": self.chosen,
                "measured_bytes": self.measured_bytes, "measured_units": self.measured_units}


def measure(codec: Codec, units: list[bytes], budget: float | None = ENCODE_BUDGET,
            timing: float = DECODE_MIN_SECONDS) -> Candidate:
    """Encode units in order (stopping after ``budget`` seconds and MIN_ENCODE_BYTES), then time decoding
    the encoded ones for at least ``timing`` seconds."""
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
        if elapsed >= timing:
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


def measure_class(name: str, files: list[SampledFile], cap: int, seed: int, bytes_est: float,
                  float_error: float | None | bool = False, timing: float = DECODE_MIN_SECONDS) -> ClassResult:
    """Measure every candidate of one class on its sample.

    ``float_error``: also measure ELF float records within this bound (None: at the dtype's limit; False: not).
    ``timing``: seconds each candidate's decoding is timed.
    """
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

    def add(family: str, codec: Codec, ref: Candidate | None = None, over: list[bytes] | None = None) -> Candidate:
        over = units if over is None else over
        cand = measure(codec, over, None if ref is None else ENCODE_BUDGET, timing)
        cand.family = family
        if ref is not None and cand.measured_units < len(over):
            k = cand.measured_units
            ref_prefix = sum(map(len, over[:k])) / max(1, sum(ref.stored[:k]))
            cand.ratio *= ref.ratio / ref_prefix
        result.candidates.append(cand)
        return cand

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
    if widths:
        _add_float_records(result, files, widths[0], units, cap, f"{seed}:{name}", float_error, add)
    for cand in result.candidates:
        cand.stored = []
    return result


def _add_float_records(result: ClassResult, files: list[SampledFile], width: int, units: list[bytes], cap: int,
                       seed: str, float_error: float | None | bool, add: Any) -> None:
    """Float-record candidates, measured on the arrays of the class's most common width only (ELF on
    values read at another width would measure noise)."""
    same = [f for f in files if f.width == width]
    if len(same) < len(files):
        units = class_units(same, cap, random.Random(f"{seed}:{width}"))
        result.notes.append(f"float records measured on the {width}-byte arrays only")
    forms = [("float", False, None)] + ([("elf", True, float_error)] if float_error is not False else [])
    for family, elf, error in forms:
        ref = None
        for level in FLOAT_RECORD_LEVELS:
            probe = FloatRecordProbe(width, level, elf, error)  # type: ignore[arg-type]
            cand = add(family, probe, ref, units)
            cand.codec, cand.record, cand.label = probe.blob_codec, probe.record, probe.spec
            ref = ref or cand
