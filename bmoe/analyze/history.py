"""The same cells across archived sweeps: trends over engine versions and dates, and the
regressions between one sweep and the next, with their intervals.

Cells are lined up by their axis values (``cache_mb=8 io_threads=4``), not by their ids, so
two sweeps of the same grid match even when their base parameters or engine differ (those
are listed per sweep). Sweeps are ordered by when they started. A step from one sweep to
the next is a regression when the outcome got worse by more than a threshold and the 95 %
interval of the ratio of means (:func:`bmoe.analyze.verdict.ratio_interval`) lies on the
worse side of 1; with single runs there is no interval and the change itself decides.

Pure functions of results tables (``results.parquet``, one row per attempt), given as a
mapping of sweep label to table; reading the folders is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.sweep import LOWER_IS_BETTER, axes_of, check_outcome, ok_attempts
from bmoe.analyze.verdict import is_throughput, ratio_interval

#: Default regression threshold (% worse from one sweep to the next).
THRESHOLD_PCT = 5.0

SWEEP_COLUMNS = ["sweep", "name", "started", "engine", "cells", "runs", "failed"]
LINED_COLUMNS = ["cell", "sweep", "started", "engine", "n", "mean", "sd", "min", "max"]
STEP_COLUMNS = [
    "cell", "before", "after", "mean_before", "mean_after", "change_pct", "ratio", "ratio_low",
    "ratio_high", "regressed", "improved", "sentence",
]  # fmt: skip


def _engine(results: pd.DataFrame) -> str | None:
    """The engine and its version, as the runs recorded them."""
    parts = []
    for col in ("engine", "summary_engine", "machine_engine_build"):
        if col in results:
            values = results[col].dropna().astype(str).unique()
            parts += [v for v in values[:2] if v and v not in parts]
    return " ".join(parts) or None


def _started(results: pd.DataFrame) -> pd.Timestamp | None:
    if "started" not in results:
        return None
    when = pd.to_datetime(results["started"], errors="coerce", utc=True).dropna()
    return when.min() if len(when) else None


def sweeps_table(sweeps: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per sweep, oldest first: its label, name, when it started, the engine, cells,
    completed runs and attempts that failed."""
    rows = []
    for label, results in sweeps.items():
        ok = ok_attempts(results)
        rows.append({
            "sweep": label, "name": results.attrs.get("name"), "started": _started(results),
            "engine": _engine(ok if len(ok) else results),
            "cells": results["cell"].nunique() if "cell" in results else 0,
            "runs": len(ok), "failed": len(results) - len(ok),
        })  # fmt: skip
    table = pd.DataFrame(rows, columns=SWEEP_COLUMNS)
    order = table.assign(_t=table["started"]).sort_values(["_t", "sweep"], na_position="last",
                                                           kind="stable")  # fmt: skip
    return order.drop(columns="_t").reset_index(drop=True)


def cell_key(results: pd.DataFrame, axes: Sequence[str]) -> pd.Series:
    """Per attempt, the cell's name from its axis values (``cache_mb=8 io_threads=4``)."""
    present = [a for a in axes if a in results]
    if not present:
        return results["cell"].astype(str)
    parts = [results[a].astype(str).where(results[a].notna(), "—").radd(f"{a}=") for a in present]
    key = parts[0]
    for part in parts[1:]:
        key = key + " " + part
    return key


def line_up(sweeps: Mapping[str, pd.DataFrame], outcome: str = "tok_s_mean") -> pd.DataFrame:
    """One row per (cell, sweep), sweeps oldest first: the outcome's n, mean, sd, min and max
    over the cell's completed runs in that sweep. Cells are keyed by the union of the sweeps'
    axes."""
    order = sweeps_table(sweeps)
    axes: list[str] = []
    for results in sweeps.values():
        axes += [a for a in axes_of(results) if a not in axes]
    parts = []
    for row in order.itertuples(index=False):
        results = sweeps[row.sweep]
        check_outcome(results, outcome, row.sweep)
        ok = ok_attempts(results)
        if ok.empty or outcome not in ok:
            continue
        frame = pd.DataFrame(
            {"cell": cell_key(ok, axes).to_numpy(),
             "y": pd.to_numeric(ok[outcome], errors="coerce").to_numpy(float)}
        )  # fmt: skip
        stats = frame.groupby("cell", sort=True)["y"].agg(
            n="count", mean="mean", sd="std", min="min", max="max"
        )
        stats = stats.reset_index()
        stats.insert(1, "sweep", row.sweep)
        stats.insert(2, "started", row.started)
        stats.insert(3, "engine", row.engine)
        parts.append(stats)
    if not parts:
        return pd.DataFrame(columns=LINED_COLUMNS)
    lined = pd.concat(parts, ignore_index=True)
    lined["_pos"] = lined["sweep"].map({s: i for i, s in enumerate(order["sweep"])})
    lined = lined.sort_values(["cell", "_pos"], kind="stable").drop(columns="_pos")
    lined.attrs["sweeps"] = order["sweep"].tolist()
    lined.attrs["outcome"] = outcome
    return lined[LINED_COLUMNS].reset_index(drop=True)


def trend_table(lined: pd.DataFrame) -> pd.DataFrame:
    """Wide form of :func:`line_up`: one row per cell, one column of means per sweep (oldest
    first), and the change from the first sweep that has the cell to the last, in %."""
    if lined.empty:
        return pd.DataFrame(columns=["cell", "change_pct"])
    order = lined.attrs.get("sweeps") or list(dict.fromkeys(lined["sweep"]))
    wide = lined.pivot(index="cell", columns="sweep", values="mean")
    wide = wide[[s for s in order if s in wide.columns]]
    first = wide.bfill(axis=1).iloc[:, 0]
    last = wide.ffill(axis=1).iloc[:, -1]
    wide["change_pct"] = 100.0 * (last / first - 1.0)
    wide.columns.name = None
    return wide.reset_index()


def steps(
    lined: pd.DataFrame,
    outcome: str | None = None,
    threshold_pct: float = THRESHOLD_PCT,
) -> pd.DataFrame:
    """Every cell from each sweep to the next sweep that has it: the change of the mean in %,
    the ratio of means (after / before, in the better direction: above 1 is better) with its
    95 % interval, and whether the step is a regression (worse by more than `threshold_pct`
    and the interval on the worse side of 1, or beyond the threshold with no interval) or an
    improvement (the same the other way)."""
    outcome = outcome or lined.attrs.get("outcome", "tok_s_mean")
    if lined.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    lower = outcome in LOWER_IS_BETTER
    before = lined.groupby("cell", sort=False).shift(1)
    pairs = lined.assign(
        before=before["sweep"], mean_before=before["mean"], sd_before=before["sd"],
        n_before=before["n"],
    ).dropna(subset=["before"])  # fmt: skip
    if pairs.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    new = [pairs[c].to_numpy(float) for c in ("mean", "sd", "n")]
    old = [pairs[c].to_numpy(float) for c in ("mean_before", "sd_before", "n_before")]
    ratio, low, high = ratio_interval(*old, *new) if lower else ratio_interval(*new, *old)
    change = 100.0 * (new[0] / old[0] - 1.0)
    limit = 1.0 - threshold_pct / 100.0
    known = np.isfinite(low)
    regressed = (ratio < limit) & np.where(known, high < 1.0, True)
    improved = (ratio > 1.0 / limit) & np.where(known, low > 1.0, True)
    word = "faster" if is_throughput(outcome) and not lower else "better"
    sentences = [
        _step_sentence(cell, b, a, r, lo, hi, c, reg, imp, word, outcome)
        for cell, b, a, r, lo, hi, c, reg, imp in zip(
            pairs["cell"], pairs["before"], pairs["sweep"], ratio, low, high, change,
            regressed, improved, strict=True,
        )
    ]  # fmt: skip
    out = pd.DataFrame(
        {"cell": pairs["cell"].to_numpy(), "before": pairs["before"].to_numpy(),
         "after": pairs["sweep"].to_numpy(), "mean_before": old[0], "mean_after": new[0],
         "change_pct": change, "ratio": ratio, "ratio_low": low, "ratio_high": high,
         "regressed": regressed, "improved": improved, "sentence": sentences}
    )  # fmt: skip
    out.attrs["threshold_pct"] = threshold_pct
    return out[STEP_COLUMNS].reset_index(drop=True)


def _step_sentence(
    cell: str, before: str, after: str, ratio: float, low: float, high: float, change: float,
    regressed: bool, improved: bool, word: str, outcome: str,
) -> str:  # fmt: skip
    if np.isfinite(low):
        size = f"ratio {ratio:.3f} [{low:.3f}, {high:.3f}]"
    else:
        size = f"ratio {ratio:.3f}, single runs: no interval"
    what = "regression" if regressed else "improvement" if improved else "no change beyond noise"
    return (
        f"{cell}: {outcome} {change:+.1f} % from {before} to {after} ({size}; above 1 is "
        f"{word}): {what}"
    )


def regressions(step_table: pd.DataFrame, latest_only: bool = True) -> pd.DataFrame:
    """The steps that regressed; with `latest_only`, only those into each cell's newest
    sweep (what CI asks: did the last change make anything worse?)."""
    if step_table.empty:
        return step_table
    table = step_table
    if latest_only:
        table = table.groupby("cell", sort=False).tail(1)
    return table[table["regressed"]].reset_index(drop=True)


def history(
    sweeps: Mapping[str, pd.DataFrame],
    outcome: str = "tok_s_mean",
    threshold_pct: float = THRESHOLD_PCT,
) -> dict[str, Any]:
    """Every view of ``bmoe history``: the sweeps in order, the cells' means per sweep with
    the change first to last, every step between consecutive sweeps, and the regressions
    into the newest sweep (their sentences: :func:`steps`, :func:`regressions`)."""
    lined = line_up(sweeps, outcome)
    step_table = steps(lined, outcome, threshold_pct)
    found = regressions(step_table)
    verdict = np.select([step_table["regressed"], step_table["improved"]],
                        ["regression", "improvement"], "—")  # fmt: skip
    shown = ["cell", "before", "after", "change_pct", "ratio", "ratio_low", "ratio_high"]
    return {
        "sweeps": sweeps_table(sweeps),
        f"{outcome} per cell and sweep": trend_table(lined),
        "steps between sweeps": step_table[shown].assign(verdict=verdict),
        f"regressions beyond {threshold_pct:g} % into the newest sweep": found[shown],
    }


def parse_threshold(text: str) -> float:
    """``5%``, ``5`` or ``0.05`` as a percentage (5.0); ValueError otherwise."""
    raw = text.strip()
    value = float(raw.rstrip("%").strip())
    if not raw.endswith("%") and 0 < value < 1:
        value *= 100.0
    if not 0 < value < 100:
        raise ValueError(f"threshold {text!r} is not between 0 and 100 %")
    return value


__all__ = [
    "THRESHOLD_PCT",
    "cell_key",
    "history",
    "line_up",
    "parse_threshold",
    "regressions",
    "steps",
    "sweeps_table",
    "trend_table",
]
