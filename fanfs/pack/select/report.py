"""What ``fanfs select`` shows: the report as text or JSON, and the plot of ratio against decode speed."""

from __future__ import annotations

from typing import Any

from ...util.images import pyplot
from ...util.units import human_size
from .decide import Selection, rate_text
from .measure import MB
from .sample import GROUP_FLOOR


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


def speed(bytes_per_s: float | None) -> str:
    """A decode or encode speed with 3 significant digits in a unit that suits it; ``-`` for no decoding (raw)."""
    if bytes_per_s is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s / 1e3:.3g} kB/s"


def shown(candidates: list[Any]) -> list[Any]:
    """The candidates worth a row: those no other beats in both ratio and decode speed (the trade-off's front),
    and the chosen one."""
    return [c for c in candidates if c.chosen or not any(
        o.ratio >= c.ratio and o.decode_speed() >= c.decode_speed() and (o.ratio, o.decode_speed()) != (c.ratio, c.decode_speed())
        for o in candidates)]


def format_report(sel: Selection, every: bool = False) -> str:
    """The report as text; per class the candidates on the ratio/speed front and the chosen one (``every``: all)."""
    s, d = sel.sample, sel.demand
    lines = [f"source   {s.root}: {s.files:,} files, {human_size(s.bytes)}; sample {100 * s.fraction:g}% "
             f"({len(s.sampled):,} files, at least {GROUP_FLOOR} and ~8 MiB per extension), measured in {sel.seconds:.1f} s"]
    if sel.rate:
        how = f"{rate_text(sel.rate)}" + (f" ({d.samples_per_sec:,.0f} samples/s x {human_size(s.bytes / max(1, s.files))})"
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
            rows = cr.candidates if every else shown(cr.candidates)
            lines.append(f"  {'candidate':<24} {'ratio':>7} {'encode':>10} {'decode':>10}  {'feasible':<8}  chosen")
            for c in rows:
                lines.append(f"  {c.spec:<24} {c.ratio:>7.3f} {speed(c.encode_Bps):>10} {speed(c.decode_Bps):>10}  "
                             f"{'yes' if c.feasible else 'no':<8}  " + ("<== chosen" if c.chosen else ""))
            hidden = len(cr.candidates) - len(rows)
            lines.append(f"  chosen: {cr.chosen.spec} (ratio {cr.chosen.ratio:.3f})"
                         + (f"; {hidden} more candidates both slower and smaller in ratio than a row above (--all "
                            "shows them)" if hidden else ""))
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


def plot(sel: Selection, path: str) -> None:
    plt = pyplot()
    measured = [cr for cr in sel.classes if cr.candidates]
    n = max(1, len(measured))
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    colours = {"raw": "black", "lz4": "tab:orange", "zstd": "tab:blue", "zstd+dict": "tab:green", "planes": "tab:purple",
               "float": "tab:red", "elf": "tab:brown"}
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
    rate = f"{rate_text(sel.rate)}" if sel.rate else "no rate"
    fig.suptitle(f"fanfs select: {d.mode}, {rate}, {d.threads} threads -> decode >= {sel.required_Bps / MB:,.0f} MB/s per thread")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
