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
    dtype) + zstd at levels 1, 3, 9, 15, 19, and float records (:mod:`fanfs.records.floats`: planes as
    layers, the form a mount can present at a lower precision) with zstd 1, 3, 9, 19: lossless, and
    with ``select --float-error EPS`` ELF within EPS too (lossy); a plan that picks one makes pack
    store the float class's files as such records.

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

import time

from ...util.processes import process_pool
from ..classify import CLASSES
from .decide import Selection, decide, make_plan
from .demand import Demand, SelectError, parse_fraction, parse_rate
from .measure import DECODE_MIN_SECONDS, measure_class
from .report import format_report, plot, selection_json
from .sample import SampledFile, draw_sample

__all__ = ["Demand", "SelectError", "Selection", "format_report", "make_plan", "parse_fraction", "parse_rate",
           "plot", "select", "selection_json"]


def select(src: str, demand: Demand, fraction: float = 0.02, cap: int = 16 << 20, seed: int = 0,
           jobs: int = 1, float_error: float | None | bool = False, timing: float = DECODE_MIN_SECONDS) -> Selection:
    """``float_error``: also measure ELF float records for the float class (a bound; None: the dtype's limit).
    ``timing``: seconds each candidate's decoding is timed (about a hundred candidates in all)."""
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
    args = [(c, by_class[c], cap, seed, raw_est[c] * scale, float_error, timing) for c in names]
    if jobs > 1 and len(args) > 1:
        with process_pool(min(jobs, len(args))) as pool:
            classes = list(pool.map(measure_class, *zip(*args)))
    else:
        classes = [measure_class(*a) for a in args]
    sel = decide(sample, demand, classes)
    sel.seconds = time.monotonic() - started
    return sel
