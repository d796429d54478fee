"""What ``bmoe profile`` and ``bmoe predict`` show: narrow views of their tables.

A prediction answers two questions, how fast and what the cache does, so the terminal gets
two tables (speed, cache) of a few columns each, keyed by a short label of each cell
(``64M 4L p1 ov``: cache budget, lanes, prefetch depth, overlap), readable at 80 columns and in
a pipe. The full tables (every column) are what JSON and CSV carry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from bmoe.analyze.device.interval import DOUBLE, MIN_INSIDE, error_at_distance

#: Digits per column of the narrow views.
VIEW_DIGITS = {
    "steady tok/s": 2,
    "compute ms": 1,
    "flash ms": 1,
    "mgmt ms": 1,
    "MiB/token": 2,
    "MiB read/token": 3,
    "misses/token": 1,
    "prefetched/token": 1,
    "measured tok/s": 2,
    "predicted tok/s": 2,
    "latency ms": 3,
    "overhead ms": 3,
    "tok/s (mean)": 2,
    "compute/cpu": 2,
    "tok/s": 2,
    "low": 2,
    "high": 2,
    "steady": 2,
    "compute": 1,
    "flash": 1,
    "mgmt": 1,
    "MiB/tok": 1,
    "hit %": 1,
    "decode hit %": 1,
    "meas.": 2,
    "pred.": 2,
    "err %": 1,
    "misses": 1,
    "prefetch": 1,
    "measured": 2,
    "predicted": 2,
    "error %": 1,
    "width %": 0,
    "value": 3,
    "spread %": 0,
    "se %": 0,
    "cpu %": 0,
    "off-CPU %": 0,
    "latency": 3,
    "overhead": 3,
    "MiB/s": 0,
}


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _text(value: Any) -> str | None:
    """A label's text, or None for a missing one (None or NaN)."""
    return value if isinstance(value, str) and value else None


def cell_label(row: Mapping[str, Any]) -> str:
    """A short label of a configuration: ``<cache>M <lanes>L`` then ``p<k>`` with prefetch,
    ``d<F>`` with dropping, ``ov`` under overlap and the policy when it is not LRU
    (``64M 4L p1 ov``)."""
    cache = _number(row.get("cache_mb"))
    parts = [f"{cache:g}M" if cache is not None else "?M"]
    lanes = _number(row.get("io_threads"))
    parts.append(f"{int(lanes)}L" if lanes is not None else "?L")
    prefetch = _number(row.get("prefetch"))
    if prefetch:
        parts.append(f"p{int(prefetch)}")
    drop = _number(row.get("drop_cold_experts"))
    if drop:
        parts.append(f"d{drop:g}")
    if _number(row.get("overlap")):
        parts.append("ov")
    policy = row.get("policy")
    if isinstance(policy, str) and policy and policy != "lru":
        parts.append(policy)
    return " ".join(parts)


#: A cell folder's content hash (``cache_mb-4_io_threads-2-29ab4f81``), left out of its name.
_CELL_HASH = re.compile(r"-[0-9a-f]{8}$")
#: A number standing as a word (not a digit inside a name such as ``cache_mb-8_io``).
#: A ratio (``1.46x``) counts as a number too.
_NUMBER = re.compile(r"(?<![\w.])(?<!\w[-+])[-+]?\d+(?:\.\d+)?(?=x\b|(?!\w|\.\d|-\w))")
#: Runs a grouped caveat names before it counts the rest.
NAMED_RUNS = 2


def run_name(name: str) -> str:
    """A run as a reader knows it: a sweep's run by its cell and repeat
    (``cache_mb-4_io_threads-2/r3``, the folder's hash left out), a loose file by its stem
    (``gemma``; ``runs/run`` when the stem alone says nothing)."""
    parts = name.replace("\\", "/").split("/")
    if len(parts) >= 4 and parts[-4] == "cells":
        return f"{_CELL_HASH.sub('', parts[-3])}/{parts[-2]}"
    stem = parts[-1].split(".", 1)[0] if "." in parts[-1] else parts[-1]
    if stem == "run" and len(parts) >= 2:
        return f"{parts[-2]}/{stem}"
    return stem


def caveat_lines(texts: Sequence[str], names: Sequence[str]) -> list[str]:
    """`texts` (caveats, notes) with every run of `names` named by :func:`run_name`, and the
    per-run ones said once: pieces that start with a run's name (``<run>: why``; a text may
    join several with ``; ``) and read alike but for their numbers become one line, the
    numbers that differ as a range, with how many runs it stands for and the first of
    them. Order of first appearance; exact repeats drop."""
    short = {n: run_name(n) for n in names if n}
    pattern = (
        re.compile("|".join(re.escape(n) for n in sorted(short, key=len, reverse=True)))
        if short
        else None
    )
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for text in texts:
        marked = pattern.sub(lambda m: f"\x01{short[m.group()]}\x02", text) if pattern else text
        for piece in re.split(r"; (?=\x01)", marked):
            lead = re.match(r"\x01([^\x02]*)\x02: ", piece)
            run = lead.group(1) if lead else None
            body = (piece[lead.end() :] if lead else piece).replace("\x01", "").replace("\x02", "")
            key = _NUMBER.sub("#", body) if run else f"\x00{body}"
            if (body, run) not in groups.get(key, []):
                groups.setdefault(key, []).append((body, run))
    out = []
    for group in groups.values():
        body, run = group[0]
        if run is None:
            out.append(body)
        elif len(group) == 1:
            out.append(f"{run}: {body}")
        else:
            out.append(f"{_spans([b for b, _ in group])} ({_runs_named([r for _, r in group])})")
    return out


def _spans(bodies: Sequence[str]) -> str:
    """The first of `bodies` (alike but for their numbers) with each number that differs
    among them given as its range."""
    columns = zip(*(_NUMBER.findall(b) for b in bodies), strict=True)
    spans = iter(
        v[0] if len(set(v)) == 1 else f"{min(v, key=float)}-{max(v, key=float)}" for v in columns
    )
    return _NUMBER.sub(lambda _m: next(spans), bodies[0])


def _runs_named(runs: Sequence[str | None]) -> str:
    named = [r for r in dict.fromkeys(runs) if r]
    shown = ", ".join(named[:NAMED_RUNS]) + (", ..." if len(named) > NAMED_RUNS else "")
    return f"{len(named)} runs: {shown}"


def _labels(table: pd.DataFrame) -> list[str]:
    return [cell_label(row) for row in table.to_dict("records")]


def speed_view(table: pd.DataFrame) -> pd.DataFrame:
    """Per predicted cell: tok/s with its interval, steady-state tok/s, and where a token's
    time goes (ms of compute, flash wait, cache management)."""
    return pd.DataFrame(
        {
            "cell": _labels(table),
            "tok/s": table["tok_s"].to_numpy(),
            "low": table["tok_s_low"].to_numpy(),
            "high": table["tok_s_high"].to_numpy(),
            "steady tok/s": table["steady_tok_s"].to_numpy(),
            "compute ms": table["compute_ms"].to_numpy(),
            "flash ms": table["flash_ms"].to_numpy(),
            "mgmt ms": table["mgmt_ms"].to_numpy(),
        }
    )


def cache_view(table: pd.DataFrame) -> pd.DataFrame:
    """Per predicted cell: what the cache does (from the replay): MiB read per token, hit %
    (all lookups, and decode only), reads missed and prefetched per token."""
    return pd.DataFrame(
        {
            "cell": _labels(table),
            "MiB/token": table["mib_per_token"].to_numpy(),
            "hit %": table["hit_pct"].to_numpy(),
            "decode hit %": table["hit_pct_decode"].to_numpy(),
            "misses/token": table["misses_per_token"].to_numpy(),
            "prefetched/token": table["prefetched_per_token"].to_numpy(),
        }
    )


def interval_words(coverage: float, claimed: bool = True) -> str:
    """The interval a prediction states, in words: its coverage when it claims one (the
    model's own error was measured), else that it is the terms' spread only."""
    return f"{100 * coverage:.0f} % interval" if claimed else "spread-only interval"


def predict_views(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The terminal's views of a prediction by slug (:data:`bmoe.analyze.views.PREDICT`):
    speed (ms per token) and cache; the speed view's title names the interval
    (:func:`interval_words`)."""
    return {"speed": speed_view(table), "cache": cache_view(table)}


def predict_headline(table: pd.DataFrame, coverage: float, claimed: bool = True) -> list[str]:
    """The answer of a prediction in two lines: the configuration predicted fastest (of
    those the profile prices) with its interval, reads and hit rate; how many configurations
    its interval cannot tell it from, and the slowest."""
    speed = pd.to_numeric(table["tok_s"], errors="coerce")
    priced = speed.notna()
    if "unpriced" in table:
        priced &= table["unpriced"].map(_text).isna()
    if not priced.any():
        return ["no configuration could be priced by this profile (see the notes below)"]
    best = table.loc[speed[priced].idxmax()]
    worst = table.loc[speed[priced].idxmin()]
    interval = f"{100 * coverage:.0f} % interval" if claimed else "spread only"
    low, high = _number(best.get("tok_s_low")), _number(best.get("tok_s_high"))
    span = f" ({interval} {low:.2f}-{high:.2f})" if low is not None and high is not None else ""
    lines = [
        f"best predicted: {cell_label(best)}: {float(best['tok_s']):.2f} tok/s{span}, "
        f"{float(best['mib_per_token']):.3g} MiB/token, hit {float(best['hit_pct']):.1f} %"
    ]
    if low is not None:
        highs = pd.to_numeric(table.loc[priced, "tok_s_high"], errors="coerce")
        near = int((highs >= low).sum()) - 1
        if near > 0:
            lines.append(
                f"  {near} other configuration(s) reach its interval: not told apart from it"
            )
    if priced.sum() > 1:
        lines.append(
            f"  of {int(priced.sum())} configurations priced; the slowest: {cell_label(worst)} "
            f"at {float(worst['tok_s']):.2f} tok/s"
        )
    return lines


def unpriced_notes(table: pd.DataFrame, column: str = "unpriced") -> list[str]:
    """One line per reason some cells' time is not priced by the profile (or, with
    ``column="memory_note"``, per note on the memory they ask), naming the cells."""
    if column not in table:
        return []
    groups: dict[str, list[str]] = {}
    for row in table.to_dict("records"):
        why = _text(row.get(column))
        if why is not None:
            groups.setdefault(why, []).append(cell_label(row))
    return [f"{', '.join(cells)}: {why}" for why, cells in groups.items()]


def model_error_figure(profile: Any) -> str:
    """The profile's model error in a few words: its size and what it was measured from, or
    why it is unknown."""
    error = profile.model_error or {}
    sd = error.get("sd_rel")
    k = int(error.get("configurations") or 0)
    if sd is None or k < 1:
        return f"unknown ({error.get('why') or 'not measured'}): intervals are spread only"
    plural = "s" if k != 1 else ""
    at_zero = error_at_distance(error, 0.0)
    if at_zero is not None:
        at_double = error_at_distance(error, DOUBLE) or 0.0
        return (
            f"{100 * at_zero:.1f} % at the reads a token of the nearest measured "
            f"configuration, {100 * at_double:.1f} % at twice or half them "
            f"({k} held-out configuration{plural}; {100 * sd:.1f} % without distance)"
        )
    text = f"{100 * sd:.1f} % ({k} held-out configuration{plural})"
    inside = error.get("sd_rel_inside")
    k_inside = int(error.get("configurations_inside") or 0)
    if inside is not None and k_inside >= MIN_INSIDE:
        text += f"; {100 * inside:.1f} % inside the read range ({k_inside})"
    return text


def held_out_view(profile: Any) -> pd.DataFrame:
    """Per run held out when the profile measured its own error: measured and predicted
    tok/s (from the other configurations' runs), the error and the spread the prediction
    stated, its distance from the configurations left in (an older profile's: whether it
    was inside their read range), or why it could not be predicted."""
    rows = []
    configs = {str(r.get("name")): cell_label(r) for r in profile.runs}
    for record in (profile.model_error or {}).get("held_out") or []:
        name = str(record.get("run", ""))
        rows.append(
            {
                "run": run_label(name),
                "config": configs.get(name),
                "measured": record.get("measured_tok_s"),
                "predicted": record.get("predicted_tok_s"),
                "error %": record.get("error_pct"),
                "spread %": record.get("spread_pct"),
                "MiB/token": record.get("read_mib"),
                "distance": record.get("distance"),
                "inside": record.get("inside"),
                "why not": record.get("why"),
            }
        )
    columns = ["run", "config", "measured", "predicted", "error %", "spread %", "MiB/token"]
    frame = pd.DataFrame(rows, columns=[*columns, "distance", "inside", "why not"])
    # a profile has one or the other: distance since it was measured, inside before
    return frame.drop(columns=[c for c in ("distance", "inside") if frame[c].isna().all()])


def against_view(cells: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Per measured cell: the file (loose files) and its configuration's label, measured and
    predicted tok/s, the error, whether the interval covers the measurement, and a note
    number for why it is out of the headline; with the notes' texts (number -> why)."""
    notes: dict[str, str] = {}
    marks: list[str | None] = []
    for row in cells.to_dict("records"):
        why = left_out(row)
        if why is None:
            marks.append(None)
            continue
        key = next((k for k, v in notes.items() if v == why), None)
        if key is None:
            key = f"[{len(notes) + 1}]"
            notes[key] = why
        marks.append(key)
    view = pd.DataFrame({"config": _labels(cells)})
    if "file" in cells:
        names = [run_name(str(f)) for f in cells["file"]]
        if all("/" in n for n in names):  # runs of a sweep: the config says the cell
            names = [n.rsplit("/", 1)[1] for n in names]
        view.insert(0, "run", [n if len(n) <= 14 else n[:13] + "~" for n in names])
    view["meas."] = cells["tok_s"].to_numpy()
    view["pred."] = cells["tok_s_predicted"].to_numpy()
    view["err %"] = cells["tok_s_error_pct"].to_numpy()
    view["in"] = cells["inside_interval"].to_numpy()
    view["note"] = marks
    return view, notes


def left_out(row: Mapping[str, Any]) -> str | None:
    """Why a compared cell is out of the headline: not comparable, its measurement, or a
    prediction the profile does not price."""
    return (
        _text(row.get("comparable")) or _text(row.get("measurement")) or _text(row.get("unpriced"))
    )


def against_headline(summary: Mapping[str, Any]) -> list[str]:
    """The answer of a comparison first: how many cells, the median error over the firm
    ones (and over all predicted), and how many the interval held against its claim."""
    cells, compared = summary.get("cells", 0), summary.get("compared", 0)
    head = f"against {cells} measured cells: "
    error = _number(summary.get("median_abs_tok_s_error_pct"))
    every = _number(summary.get("median_abs_tok_s_error_pct_all"))
    if not compared:
        return [
            head + "no firm cell to compare (each is left out of the headline: the notes say "
            "why)" + (f"; median |error| {every:.1f} % over all predicted" if every else "")
        ]
    lines = [
        head
        + (f"median |error| {error:.1f} % over the {compared} firm" if error is not None else "")
        + (f" ({every:.1f} % over all predicted)" if every is not None else "")
    ]
    if summary.get("coverage_claimed", True):
        stated = summary.get("coverage_stated_pct")
        inside = f"  {summary.get('inside_interval', 0)} of {compared} inside the " + (
            f"{stated:.0f} % interval" if stated is not None else "interval"
        )
        check = summary.get("coverage_check")
        lines.append(inside + (f"; {check}" if check else ""))
    else:
        lines.append("  the intervals are the spread's only: they claim no coverage")
    return lines


def against_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a reader checks first: the headline error over firm cells, the coverage
    the interval achieved against the one it states, its median width."""
    compared = summary.get("compared", 0)
    out: dict[str, Any] = {"headline": summary["no_headline"]} if summary.get("no_headline") else {}
    return out | {
        "cells": summary.get("cells"),
        "compared (firm, predicted)": compared,
        "left out (labelled)": summary.get("labelled"),
        "not comparable": summary.get("not_predicted"),
        "median |error| % (compared)": summary.get("median_abs_tok_s_error_pct"),
        "median |error| % (all predicted)": summary.get("median_abs_tok_s_error_pct_all"),
        "interval": summary.get("interval"),
        "interval coverage stated %": summary.get("coverage_stated_pct")
        if summary.get("coverage_claimed", True)
        else "none (spread only)",
        "interval coverage achieved %": summary.get("coverage_pct"),
        "inside the interval": f"{summary.get('inside_interval', 0)} of {compared}",
        "within its bounds (too wide or not)": f"{summary.get('within_bounds', 0)} of {compared}",
        "stated coverage checked": summary.get("coverage_check"),
        "median interval width %": summary.get("median_interval_width_pct"),
        "intervals too wide to count": summary.get("intervals_too_wide"),
        "reads": summary.get("reads", "replay"),
        "profile settled": "yes" if summary.get("profile_settled") else "no",
    }


def terms_view(profile: Any) -> pd.DataFrame:
    """Per term of a profile: its value, how much a run's mean of it moves (the interval's
    width), the standard error of its mean, whether it is settled, and how many runs it
    came from."""
    rows = []
    for name, term in profile.terms.items():
        rows.append(
            {
                "term": name,
                "value": term.get("value"),
                "unit": TERM_UNITS.get(name, ""),
                "spread %": 100.0 * (term.get("sd_rel") or 0.0),
                "se %": term.get("se_pct"),
                "settled": bool(term.get("settled", True)),
                "runs": len(term.get("runs") or []),
            }
        )
    for name in profile.absent:
        rows.append(
            {"term": name, "value": None, "unit": TERM_UNITS.get(name, ""), "spread %": None,
             "se %": None, "settled": None, "runs": 0}
        )  # fmt: skip
    columns = ["term", "value", "unit", "spread %", "se %", "settled", "runs"]
    return pd.DataFrame(rows, columns=columns)


#: What each profile term's value is a mean of (a token's time unless said otherwise).
TERM_UNITS = {
    "compute": "ms/token",
    "flash": "ms/token",
    "mgmt": "ms/token",
    "stall": "ms/token",
    "memory": "faults/token",
    "expert_share": "of compute",
}


def _lanes(n: int) -> str:
    return f"{n} lane{'s' if n != 1 else ''}"


def profile_headline(profile: Any) -> list[str]:
    """What a profile says a token costs, first: how many runs of which model, whether it is
    settled, then compute, flash by lane count, management, memory, stall and prefill per
    token, the model's own error and the intervals' coverage."""
    terms = profile.terms
    unsettled = [n for n, t in terms.items() if not t.get("settled", True)]
    status = "settled" if profile.settled else (
        f"not settled ({', '.join(unsettled)}; below)" if unsettled else "not settled (below)"
    )  # fmt: skip
    model = profile.model.get("name") or "an unnamed model"
    lines = [f"profile: {len(profile.sources)} runs of {model}, {profile.mode}: {status}"]
    compute = profile.compute
    if "compute" in terms:
        by_read = compute.get("by_read") or []
        detail = ", ".join(f"{p['token_ms']:.3g} ms at {p['read_mib']:.3g}" for p in by_read)
        lines.append(
            f"  compute  {compute['token_ms']:.3g} ms/token"
            + (f" (by MiB read a token: {detail})" if detail else "")
        )
    flash = profile.flash
    if flash is not None and len(flash):
        rows = flash.sort_values("lanes").to_dict("records")
        rates = ", ".join(f"{r['mib_s']:,.0f} MiB/s at {_lanes(int(r['lanes']))}" for r in rows)
        sources = sorted({str(r["source"]) for r in rows if isinstance(r.get("source"), str)})
        lines.append(f"  flash    {rates}" + (f" (from {', '.join(sources)})" if sources else ""))
    if "mgmt" in terms:
        lines.append(
            f"  mgmt     {profile.mgmt['token_ms']:.3g} ms/token + "
            f"{profile.mgmt['per_admit_ms']:.3g} ms a read admitted"
        )
    if "memory" in terms and profile.memory:
        lines.append(f"  memory   {profile.memory.get('ms_per_fault', 0.0):.3g} ms a major fault")
    overlap = profile.overlap or {}
    if "stall" in terms and overlap:
        lines.append(
            f"  stall    {overlap.get('stall_ms', 0.0):.3g} ms/token + "
            f"{overlap.get('stall_ms_per_miss', 0.0):.3g} ms a read missed (--overlap)"
        )
    prefill = profile.prefill or {}
    if prefill.get("tok_s"):
        lines.append(f"  prefill  {prefill['tok_s']:.4g} tok/s")
    lines.append(f"  model error  {model_error_figure(profile)}")
    lines.append(f"  intervals    {100 * profile.coverage:.0f} % coverage stated")
    return lines


#: Terms whose note only restates the fit the headline gives.
RESTATED = ("mgmt", "stall")


def profile_caveats(profile: Any, flags: Sequence[str] = ()) -> list[tuple[str, str]]:
    """What a reader should weigh before trusting the profile, as (label, line), grouped
    (:func:`caveat_lines`): implausible fits (`flags`), caveats, unsettled and absent
    terms."""
    names = _run_names(profile)
    out: list[tuple[str, str]] = [("implausible:", f) for f in flags]
    out += [("caveat:", line) for line in caveat_lines(list(profile.caveats), names)]
    out += [("unsettled:", line) for line in caveat_lines(list(profile.unsettled), names)]
    out += [("absent:", f"{name}: {why}") for name, why in profile.absent.items()]
    return out


def profile_notes(profile: Any) -> list[tuple[str, str]]:
    """How the profile's figures were made, as (label, line): the terms' notes (but those the
    headline restates), where the expert sizes came from, how traced runs were used."""
    names = _run_names(profile)
    out: list[tuple[str, str]] = []
    for name, term in profile.terms.items():
        if term.get("note") and name not in RESTATED:
            out += [(f"{name}:", line) for line in caveat_lines([term["note"]], names)]
    sizes = profile.model.get("sizes_from") or "unknown: priced per MiB"
    out += [("sizes:", line) for line in caveat_lines([f"expert sizes from {sizes}"], names)]
    if profile.tracing.get("how"):
        out.append(("tracing:", str(profile.tracing["how"])))
    return out


def _run_names(profile: Any) -> list[str]:
    return [str(r.get("name")) for r in profile.runs] + list(profile.sources)


def run_label(name: str) -> str:
    """A run's short name: its file's stem, or a sweep run's repeat folder (``r2``), cut to
    14 characters."""
    from bmoe.formats.archive import RUN_CSV

    parts = name.replace("\\", "/").split("/")
    if parts[-1] == RUN_CSV and len(parts) >= 2:  # a sweep's run: its repeat (the
        text = parts[-2]  # config column says which cell)
    else:
        text = parts[-1].rsplit(".", 1)[0]
    return text if len(text) <= 14 else text[:13] + "~"


def runs_by_config(profile: Any) -> pd.DataFrame:
    """Per configuration the profile's runs measured: how many runs, their mean tok/s, CPU
    share, off-CPU share and compute over CPU time, and how many were traced, starved of a
    core or contended (the run-by-run figures are in the JSON)."""
    runs = runs_view(profile)
    if runs.empty:
        return runs
    grouped = runs.groupby("config", sort=False)
    return pd.DataFrame(
        {
            "config": list(grouped.groups),
            "runs": grouped.size().to_numpy(),
            "tok/s (mean)": grouped["tok/s"].mean().to_numpy(),
            "cpu %": grouped["cpu %"].mean().to_numpy(),
            "off-CPU %": grouped["off-CPU %"].mean().to_numpy(),
            "compute/cpu": grouped["compute/cpu"].mean().to_numpy(),
            "traced": grouped["traced"].sum().astype(int).to_numpy(),
            "contended": grouped["contended"].sum().astype(int).to_numpy(),
        }
    )


def held_out_by_config(profile: Any) -> pd.DataFrame:
    """:func:`held_out_view` per configuration: its runs, their mean measured tok/s, the
    prediction from the other configurations, the error of the mean, the stated spread, the
    MiB read a token and the distance (or why it could not be predicted)."""
    held = held_out_view(profile)
    if held.empty:
        return held
    held = held.assign(config=held["config"].fillna("?"))
    grouped = held.groupby("config", sort=False)
    measured = grouped["measured"].mean()
    predicted = grouped["predicted"].mean()
    out = pd.DataFrame(
        {
            "config": list(grouped.groups),
            "runs": grouped.size().to_numpy(),
            "measured tok/s": measured.to_numpy(),
            "predicted tok/s": predicted.to_numpy(),
            "error %": (100.0 * (predicted / measured - 1.0)).to_numpy(),
            "spread %": grouped["spread %"].mean().to_numpy(),
            "MiB read/token": grouped["MiB/token"].mean().to_numpy(),
        }
    )
    if "distance" in held:
        out["distance"] = grouped["distance"].mean().to_numpy()
    why = grouped["why not"].agg(lambda v: next((x for x in v if _text(x)), None))
    if why.notna().any():
        out["why not"] = why.to_numpy()
    return out


def runs_view(profile: Any) -> pd.DataFrame:
    """Per run of a profile: its configuration label, tok/s, the engine's CPU share, its
    off-CPU share, its compute over its CPU time per thread, whether it was traced, starved
    of a core or contended (its compute waited for a core)."""
    rows = []
    for run in profile.runs:
        rows.append(
            {
                "run": run_label(str(run.get("name", ""))),
                "config": cell_label(run),
                "tok/s": run.get("tok_s"),
                "cpu %": None if run.get("cpu_share") is None else 100.0 * run["cpu_share"],
                "off-CPU %": run.get("off_cpu_pct"),
                "traced": bool(run.get("traced")),
                "compute/cpu": run.get("compute_over_cpu"),
                "starved": bool(run.get("starved")),
                "contended": bool(run.get("contended", run.get("starved"))),
            }
        )
    return pd.DataFrame(rows)


def flash_view(profile: Any) -> pd.DataFrame:
    """The flash table in short columns: lanes, the request size (KiB), latency per request
    wave (ms), the per-batch overhead (ms), throughput (MiB/s), what it was measured from."""
    f = profile.flash
    return pd.DataFrame(
        {
            "lanes": f["lanes"].to_numpy(),
            "req KiB": (f["req_bytes"] / 1024).round(0).astype(int).to_numpy(),
            "latency ms": f["latency_ms"].to_numpy(),
            "overhead ms": f["batch_overhead_ms"].to_numpy(),
            "MiB/s": f["mib_s"].to_numpy(),
            "from": f["source"].to_numpy() if "source" in f else None,
        }
    )


def _by_distance(profile: Any) -> dict[str, float | None]:
    """The model error at a measured configuration's reads and at twice or half them (%)."""
    zero = error_at_distance(profile.model_error, 0.0)
    double = error_at_distance(profile.model_error, DOUBLE)
    return {
        "model_error_at_reads_pct": None if zero is None else 100.0 * zero,
        "model_error_at_twice_pct": None if double is None else 100.0 * double,
    }


def profile_views(profile: Any) -> dict[str, Any]:
    """Every figure of a profile by slug (:data:`bmoe.analyze.views.PROFILE`), as ``-f json``
    and ``-f csv`` carry them: its headline figures, the flash tables, each term with all its
    fields, the absent terms, each run and each run held out."""
    figures = {
        "mode": profile.mode,
        "model": profile.model.get("name"),
        "sizes_from": profile.model.get("sizes_from"),
        "moe_layers": len(profile.model["expert_bytes"]),
        "slices_per_expert": profile.model["slices_per_expert"],
        **{f"compute_{k}": v for k, v in profile.compute.items()},
        **{f"mgmt_{k}": v for k, v in profile.mgmt.items()},
        **{f"prefill_{k}": v for k, v in profile.prefill.items()},
        **{f"overlap_{k}": v for k, v in profile.overlap.items() if k != "lanes"},
        "coverage": profile.coverage,
        "model_error_pct": None
        if profile.model_error.get("sd_rel") is None
        else 100.0 * profile.model_error["sd_rel"],
        "model_error_configurations": profile.model_error.get("configurations"),
        **_by_distance(profile),
        "model_error_why_unknown": profile.model_error.get("why"),
        "runs": len(profile.sources),
        "settled": profile.settled,
        "unsettled": "; ".join(profile.unsettled) or None,
        "tracing": profile.tracing.get("how"),
    }
    data = profile.to_dict()
    terms = pd.DataFrame(
        [{"term": k, **{c: v for c, v in t.items() if not isinstance(v, dict)}}
         for k, t in data["terms"].items()]
    )  # fmt: skip
    runs = pd.DataFrame(
        [{k: ("; ".join(f"{a} {b}" for a, b in v.items()) if isinstance(v, dict) else
              "; ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()}
         for r in data["runs"]]
    )  # fmt: skip
    return {
        "profile": figures,
        "flash": profile.flash,
        "flash_by_read": pd.DataFrame(
            profile.flash_by_read, columns=["lanes", "read_mib", "excess_ms"]
        ),
        "terms": terms,
        "absent": dict(profile.absent),
        "runs": runs,
        "held_out": held_out_view(profile),
    }


def profile_tables(profile: Any) -> dict[str, pd.DataFrame]:
    """What the terminal and markdown show of a profile, by slug: the terms and the flash
    table in short columns, then the runs and the held-out predictions per configuration
    (the latter when the profile measured its own error)."""
    views = {
        "terms": terms_view(profile),
        "flash": flash_view(profile),
        "runs_by_config": runs_by_config(profile),
    }
    held = held_out_by_config(profile)
    if len(held):
        views["held_out_by_config"] = held
    return views


__all__ = [
    "TERM_UNITS",
    "VIEW_DIGITS",
    "against_headline",
    "against_summary",
    "against_view",
    "cache_view",
    "caveat_lines",
    "cell_label",
    "flash_view",
    "held_out_by_config",
    "held_out_view",
    "interval_words",
    "left_out",
    "model_error_figure",
    "predict_headline",
    "predict_views",
    "profile_caveats",
    "profile_headline",
    "profile_notes",
    "profile_tables",
    "profile_views",
    "run_label",
    "run_name",
    "runs_by_config",
    "runs_view",
    "speed_view",
    "terms_view",
    "unpriced_notes",
]
