"""Replay and drop replay as text: the reference's header lines, its budget x policy table,
the reference CSV, and display precision for everything else.

The curve and the validation table come as DataFrames or as columns (name -> values, what
:func:`bmoe.analyze.replay.replay` gives with ``frames=False``): the text needs no pandas."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


from bmoe.cache.policies import POLICIES

#: Display precision per column (the DataFrames keep full precision).
DIGITS = {
    "hit_pct_cum": 3,
    "hit_pct_decode": 3,
    "miss_pct_cum": 3,
    "read_mib": 1,
    "read_mib_base": 1,
    "minus_replay_cum": 2,
    "prefetched_mib": 1,
    "used_pct": 1,
    "demand_miss_change_pct": 2,
    "hit_pct_decode_base": 2,
    "thr_pct": 2,
    "io_saved_pct": 1,
    "mass_lost_pct": 2,
    "frac": 2,
    "pf MiB": 1,
    "used %": 1,
    "dec hit %": 1,
    "with pf": 1,
}


def fmt_mib(value: float) -> str:
    return f"{value:g}"


def t_text(t_mib: float) -> str:
    """T (one token cycle, MiB) as every output writes it (the header, the table's rule, the
    plots): three significant figures, at most two decimals (1.5, 120, 676)."""
    places = 0 if t_mib >= 100 else 1 if t_mib >= 10 else 2
    text = f"{t_mib:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


#: Policies that keep each layer's current batch whatever the budget: the per-layer ones.
BATCH_HOLDERS = tuple(name for name, cls in POLICIES.items() if cls.per_layer)


def table_rows(table: pd.DataFrame | Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a DataFrame or of columns (name -> values), as dicts."""
    if hasattr(table, "to_dict") and not isinstance(table, Mapping):
        return table.to_dict("records")
    names = list(table)
    return [dict(zip(names, values, strict=True)) for values in zip(*table.values(), strict=True)]


def _pivot(rows: list[dict[str, Any]], value: str) -> dict[float, dict[str, Any]]:
    """budget -> policy -> `value`, budgets ascending."""
    table: dict[float, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["budget_mib"]):
        table.setdefault(row["budget_mib"], {})[row["policy"]] = row[value]
    return table


def budget_notes(curve: pd.DataFrame | Mapping[str, Any], t_mib: float | None) -> list[str]:
    """What a reader must know to compare the policies at the budgets of `curve`: below T,
    ``layer`` and ``layerlfu`` hold more than the budget (each layer keeps its current
    batch: T in all), which is how they can beat ``belady`` there."""
    if t_mib is None or not t_mib > 0:
        return []
    rows = table_rows(curve)
    policies = {r["policy"] for r in rows}
    holders = [p for p in BATCH_HOLDERS if p in policies]
    below = sorted({r["budget_mib"] for r in rows if r["budget_mib"] < t_mib})
    if not holders or not below:
        return []
    names = " and ".join(holders)
    budgets = _listed(fmt_mib(b) for b in below)
    note = (
        f"{names} keep each layer's current batch whatever the budget: at {budgets} MiB "
        f"(below T = {t_text(t_mib)} MiB) they hold at least T, more than the budget"
    )
    if "belady" in policies:
        pivot = _pivot(rows, "hit_pct_decode")
        beat = [b for b in below if any(pivot[b][p] > pivot[b]["belady"] for p in holders)]
        if beat:
            note += f", which is how they beat belady at {_listed(fmt_mib(b) for b in beat)} MiB"
    return [note]


def _listed(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def shape_lines(shape: Mapping[str, Any]) -> list[str]:
    """The four lines the reference prints above its curve."""
    per = shape.get("mib_per_expert")
    per_text = f"{per:.2f} MiB/expert" if per is not None else "? MiB/expert"
    lo = shape.get("mib_per_expert_min")
    if per is not None and lo is not None and f"{lo:.2f}" != f"{per:.2f}":
        per_text += f" (largest; smallest {lo:.2f})"
    return [
        f"model   {shape.get('model') or '?'}",
        f"shape   {shape.get('n_layer')} layers ({shape.get('moe_layers')} MoE), "
        f"{shape.get('n_expert') or '?'} experts, top-{shape.get('k')}, {per_text}",
        f"batches {shape['batches']} ({shape['prefill_batches']} prefill + "
        f"{shape['decode_batches']} decode)",
        f"T       {t_text(shape['t_mib'])} MiB touched per token cycle "
        "(all layers x top-k, worst case)",
    ]


def validation_lines(validation: pd.DataFrame | Mapping[str, Any], budget_mib: float) -> list[str]:
    rows = table_rows(validation)
    lru = rows[0]
    lines = [
        f"validation @ {fmt_mib(budget_mib)} MiB: LRU replay = {lru['hit_pct_cum']:.1f}% "
        f"cumulative ({lru['hit_pct_decode']:.1f}% decode-only)"
    ]
    for row in rows[1:]:
        dec = row["hit_pct_decode"]
        decode = "" if dec is None or dec != dec else f" ({dec:.1f}% decode-only)"
        lines.append(f"  recorded, {row['source']}: {row['hit_pct_cum']:.1f}% cumulative{decode}")
    if len(rows) == 1:
        lines.append("compare against cache_hit_pct in the run's .metrics summary (--metrics)")
    return lines


def curve_table_text(
    curve: pd.DataFrame | Mapping[str, Any], t_mib: float | None = None, width: int = 80
) -> str:
    """The reference's table: budgets down, policies across, decode-only hit % (1 decimal),
    with a rule where the budgets cross T (one token cycle), and the notes of
    :func:`budget_notes` wrapped to `width`. Policies that do not fit `width` go on to a
    second table (and a third ...) with the budgets again."""
    rows = table_rows(curve)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    pivot = _pivot(rows, "hit_pct_decode")
    cols = {p: max(10, len(p) + 2) for p in policies}
    groups: list[list[str]] = [[]]
    for p in policies:
        if groups[-1] and 8 + sum(cols[q] for q in groups[-1]) + cols[p] > width:
            groups.append([])
        groups[-1].append(p)
    lines: list[str] = []
    for group in groups:
        if lines:
            lines.append("")
        head1 = "budget  " + "".join(f"{p:>{cols[p]}}" for p in group)
        lines += [head1, "(MiB)   " + "".join(f"{'hit%':>{cols[p]}}" for p in group)]
        below = False
        for budget, row in pivot.items():
            if t_mib is not None and below and budget >= t_mib:
                lines.append(f"{'-- T = ' + t_text(t_mib) + ' MiB --':-<{len(head1)}}")
            below = t_mib is not None and budget < t_mib
            lines.append(
                f"{fmt_mib(budget):<8}" + "".join(f"{row[p]:>{cols[p]}.1f}" for p in group)
            )
    lines.append("")
    lines.append("(decode-only hit%; C=T boundary is where a budget stops holding one token cycle)")
    for note in budget_notes(curve, t_mib):
        lines += textwrap.wrap(f"note: {note}", max(width, 40), subsequent_indent="      ")
    return "\n".join(lines) + "\n"


def replay_text(
    views: Mapping[str, Any], validate_mib: float | None = None, width: int = 80
) -> str:
    """Shape, validation and the budget x policy table, laid out as the reference prints
    them, notes wrapped to `width`."""
    shape = views["shape"]
    parts = ["\n".join(shape_lines(shape)) + "\n\n"]
    if "validation" in views and validate_mib is not None:
        parts.append("\n".join(validation_lines(views["validation"], validate_mib)) + "\n\n")
    parts.append(curve_table_text(views["curve"], shape["t_mib"], width))
    return "".join(parts)


PREFETCH_COLUMNS = {
    "budget_mib": "MiB",
    "policy": "policy",
    "prefetched": "prefetched",
    "prefetched_mib": "pf MiB",
    "used_pct": "used %",
    "demand_misses_base": "misses",
    "demand_miss_change": "Δ misses",
    "hit_pct_decode_base": "dec hit %",
    "hit_pct_decode": "with pf",
}


def prefetch_display(prefetch: pd.DataFrame) -> pd.DataFrame:
    """The prefetch table's key columns under short headers (for a terminal)."""
    return prefetch[list(PREFETCH_COLUMNS)].rename(columns=PREFETCH_COLUMNS)


def curve_csv(curve: pd.DataFrame | Mapping[str, Any]) -> str:
    """The reference CSV: budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib with its
    precision (3 decimals for hit %, 1 for MiB)."""
    lines = ["budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib"]
    for row in table_rows(curve):
        lines.append(
            f"{fmt_mib(row['budget_mib'])},{row['policy']},{row['hit_pct_cum']:.3f},"
            f"{row['hit_pct_decode']:.3f},{row['read_mib']:.1f}"
        )
    return "\n".join(lines) + "\n"


def drop_phase_lines(result: Mapping[str, Any]) -> list[str]:
    """The reference's lines above a phase's tables."""
    s = result["summary"]
    lines = [
        f"[{s['phase'].upper()}] {s['cells']} routing cells, {s['routed']} routed experts, "
        f"{s['miss_pct']:.1f}% misses"
    ]
    if "recorded_dropped" in s:
        lines.append(
            f"  recorded: dropping was ON for this run -- {s['recorded_dropped']} routings "
            f"dropped ({s['recorded_dropped_pct']:.1f}%), {s['recorded_mass_pct']:.2f}% of "
            "the weight mass"
        )
    if s.get("cells_with_weights", s["cells"]) != s["cells"]:
        lines.append(
            f"  {s['cells'] - s['cells_with_weights']} cells without gate weights are left out"
        )
    lines.append("")
    lines.append(
        "  cache-aware threshold, as a fraction of the uniform share 1/k = "
        f"{s['uniform_share_pct']:.2f}%"
    )
    return lines


def drop_header(trace_name: str, meta: Mapping[str, Any], k: int | None) -> list[str]:
    rule = "=" * 78
    return [
        rule,
        f"{trace_name}   arch={meta.get('arch')}  n_expert={meta.get('n_expert')}  k={k}",
        rule,
    ]


def drop_views(result: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Flat views for the csv/json/markdown renderers, by their slugs in
    :data:`bmoe.analyze.views.DROP` (a phase's summary, then its tables)."""
    from bmoe.analyze.views import DROP

    views: dict[str, Any] = {}
    for phase, part in result.items():
        views[DROP[phase].slug] = dict(part["summary"])
        for table in ("threshold", "static_k", "survivors"):
            views[DROP[f"{phase}_{table}"].slug] = part[table]
    return views


def drop_phase_text(result: Mapping[str, Any], width: int = 80) -> str:
    """One phase of the drop replay in the reference's layout; the surviving-experts lists
    and the longer lines wrapped to `width`."""
    lines = []
    for line in drop_phase_lines(result):
        indent = " " * (len(line) - len(line.lstrip()))
        if len(line) <= width:
            lines.append(line)
            continue
        lines += textwrap.wrap(
            line.lstrip(), max(width, 40), initial_indent=indent, subsequent_indent=indent + "  "
        )
    head = "    frac       thr   io_saved   mass_lost   "
    lines.append(head + "surviving experts per cell")
    for row in result["threshold"].itertuples(index=False):
        first = (
            f"    {row.frac:4.2f}  {row.thr_pct:7.2f}%  {row.io_saved_pct:8.1f}%  "
            f"{row.mass_lost_pct:9.2f}%   "
        )
        lines += textwrap.wrap(
            str(row.surviving), max(width, len(head) + 20), initial_indent=first,
            subsequent_indent=" " * len(first), break_on_hyphens=False,
        ) or [first.rstrip()]  # fmt: skip
    lines.append("")
    lines += textwrap.wrap(
        "static-k baseline (--n-expert-used), same rows, for comparison at equal io_saved",
        max(width, 40), initial_indent="  ", subsequent_indent="    ",
    )  # fmt: skip
    lines.append("  keep_k   io_saved   mass_lost")
    for row in result["static_k"].itertuples(index=False):
        lines.append(f"  {row.keep_k:6d}  {row.io_saved_pct:8.1f}%  {row.mass_lost_pct:9.2f}%")
    lines.append("")
    return "\n".join(lines) + "\n"
