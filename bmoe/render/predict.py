"""What ``bmoe profile`` and ``bmoe predict`` show: narrow views of their tables.

A prediction answers two questions, how fast and what the cache does, so the terminal gets
two tables (speed, cache) of a few columns each, keyed by a short label of each cell
(``64M 4L p1 ov``: cache budget, lanes, prefetch depth, overlap), readable at 80 columns and in
a pipe. The full tables (every column) are what JSON and CSV carry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from bmoe.analyze.predict.interval import DOUBLE, MIN_INSIDE, error_at_distance

#: Digits per column of the narrow views.
VIEW_DIGITS = {
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
    ``ov`` under overlap and the policy when it is not LRU (``64M 4L p1 ov``)."""
    cache = _number(row.get("cache_mb"))
    parts = [f"{cache:g}M" if cache is not None else "?M"]
    lanes = _number(row.get("io_threads"))
    parts.append(f"{int(lanes)}L" if lanes is not None else "?L")
    prefetch = _number(row.get("prefetch"))
    if prefetch:
        parts.append(f"p{int(prefetch)}")
    if _number(row.get("overlap")):
        parts.append("ov")
    policy = row.get("policy")
    if isinstance(policy, str) and policy and policy != "lru":
        parts.append(policy)
    return " ".join(parts)


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
            "steady": table["steady_tok_s"].to_numpy(),
            "compute": table["compute_ms"].to_numpy(),
            "flash": table["flash_ms"].to_numpy(),
            "mgmt": table["mgmt_ms"].to_numpy(),
        }
    )


def cache_view(table: pd.DataFrame) -> pd.DataFrame:
    """Per predicted cell: what the cache does (from the replay): MiB read per token, hit %
    (all lookups, and decode only), reads missed and prefetched per token."""
    return pd.DataFrame(
        {
            "cell": _labels(table),
            "MiB/tok": table["mib_per_token"].to_numpy(),
            "hit %": table["hit_pct"].to_numpy(),
            "decode hit %": table["hit_pct_decode"].to_numpy(),
            "misses": table["misses_per_token"].to_numpy(),
            "prefetch": table["prefetched_per_token"].to_numpy(),
        }
    )


def predict_views(
    table: pd.DataFrame, coverage: float, claimed: bool = True
) -> dict[str, pd.DataFrame]:
    """The terminal's views of a prediction: speed (ms per token) and cache. `claimed`: the
    interval claims its coverage (the model's own error was measured); else it is the terms'
    spread only and the heading says so."""
    interval = f"{100 * coverage:.0f} % interval" if claimed else "spread-only interval"
    return {
        f"speed (tok/s, {interval} low-high; ms per token)": speed_view(table),
        "cache (replayed)": cache_view(table),
    }


def unpriced_notes(table: pd.DataFrame) -> list[str]:
    """One line per reason some cells' time is not priced by the profile, naming the cells."""
    if "unpriced" not in table:
        return []
    groups: dict[str, list[str]] = {}
    for row in table.to_dict("records"):
        why = _text(row.get("unpriced"))
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
        stems = cells["cell"].astype(str)
        view.insert(0, "file", [c if len(c) <= 14 else c[:13] + "~" for c in stems])
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


def against_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a reader checks first: the headline error over firm cells, the coverage
    the interval achieved against the one it states, its median width."""
    compared = summary.get("compared", 0)
    return {
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
                "spread %": 100.0 * (term.get("sd_rel") or 0.0),
                "se %": term.get("se_pct"),
                "settled": bool(term.get("settled", True)),
                "runs": len(term.get("runs") or []),
            }
        )
    for name in profile.absent:
        rows.append(
            {"term": name, "value": None, "spread %": None, "se %": None, "settled": None,
             "runs": 0}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=["term", "value", "spread %", "se %", "settled", "runs"])


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
    """The flash table in short columns: lanes, latency per request wave (ms), the per-batch
    overhead (ms), throughput (MiB/s)."""
    f = profile.flash
    return pd.DataFrame(
        {
            "lanes": f["lanes"].to_numpy(),
            "req KiB": (f["req_bytes"] / 1024).round(0).astype(int).to_numpy(),
            "latency": f["latency_ms"].to_numpy(),
            "overhead": f["batch_overhead_ms"].to_numpy(),
            "MiB/s": f["mib_s"].to_numpy(),
            "from": f["source"].to_numpy() if "source" in f else None,
        }
    )


__all__ = [
    "VIEW_DIGITS",
    "against_summary",
    "against_view",
    "cache_view",
    "cell_label",
    "flash_view",
    "held_out_view",
    "left_out",
    "model_error_figure",
    "predict_views",
    "run_label",
    "runs_view",
    "speed_view",
    "terms_view",
    "unpriced_notes",
]
