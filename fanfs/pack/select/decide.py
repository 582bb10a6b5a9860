"""Choosing per class the best ratio whose decode speed keeps up, and checking the capacity."""

from __future__ import annotations

import datetime
import math
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from ... import __version__
from ...util.units import human_size
from ..plan import Plan
from .demand import Demand
from .measure import MB, Candidate, ClassResult
from .sample import TreeSample

TIE = 0.005


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
                            f"{rate_text(demand.rate_for(fastest.decode_speed()))} or less")
        elif pick.family == "raw" and not compressing:
            cr.notes.append("nothing compresses this class: stored raw")
    measured_bytes = sum(cr.bytes_est for cr in classes if cr.candidates)
    sel.stored_est += sample.bytes - measured_bytes  # bytes of classes without measurements, as raw
    if demand.capacity is not None:
        sel.capacity = _capacity(sel)
    return sel


def rate_text(bps: float) -> str:
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
            fixes.append(f"rate <= {rate_text(d.rate_for(bar))}")
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
        if pick.record:
            table[cr.name]["record"] = pick.record
        if pick.family == "zstd+dict" and cr.dictionary:
            dictionaries[cr.name] = cr.dictionary
    info = {"fanfs": __version__, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "source": os.path.abspath(sel.sample.root),
            "constraint": {**sel.demand.to_json(), "byte_rate_Bps": sel.rate,
                           "required_decode_MBps": round(sel.required_Bps / MB, 1)}}
    return Plan(table, dictionaries, info)
