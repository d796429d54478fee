"""What a sweep found: cells ranked, each outcome against each axis, contaminated cells and
order effects. Pure functions over the sweep's results table (one row per attempt, as in
``results.parquet``); nothing here reads files or prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

#: Outcomes shown against the axes when present (first one ranks the cells by default).
OUTCOMES = (
    "tok_s_mean", "tok_s_median", "ttft_s", "prefill_tps", "cache_hit_pct",
    "read_mib_per_token", "stall_ms_per_token", "compute_s_per_token", "majflt_per_token",
    "peak_rss_gb", "mem_floor_gb", "cpu_temp_max_c",
)  # fmt: skip

#: Outcomes the axis view of :func:`analyze_sweep` shows (besides the ranking outcome).
AXIS_VIEW_OUTCOMES = ("tok_s_mean", "ttft_s", "cache_hit_pct", "read_mib_per_token", "peak_rss_gb")

#: Outcomes where less is better (the rest: more is better).
LOWER_IS_BETTER = frozenset(
    {"ttft_s", "read_mib_per_token", "stall_ms_per_token", "mgmt_ms_per_token",
     "compute_s_per_token", "majflt_per_token", "peak_rss_gb", "cpu_temp_max_c",
     "io_s_per_token", "cpu_s_per_token"}
)  # fmt: skip

PERMUTATIONS = 2000


def ok_attempts(results: pd.DataFrame) -> pd.DataFrame:
    """The attempts that completed (one per run once retries are done)."""
    if "status" not in results:
        return results
    return results[results["status"] == "ok"]


def axes_of(results: pd.DataFrame) -> list[str]:
    """The sweep's axes: from the table's attrs, else the parameters that vary."""
    axes = [a for a in results.attrs.get("axes", []) if a in results.columns]
    if axes:
        return axes
    params = [p for p in results.attrs.get("params", []) if p in results.columns]
    return [p for p in params if results[p].astype(str).nunique(dropna=False) > 1]


def _numeric(frame: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(frame[col], errors="coerce").astype(float)


def attempts_by_status(results: pd.DataFrame) -> pd.DataFrame:
    """Attempts per target and status, and runs still without a completed attempt."""
    if results.empty or "status" not in results:
        return pd.DataFrame(columns=["target", "status", "attempts"])
    keys = [c for c in ("target", "status") if c in results]
    table = results.groupby(keys, dropna=False, sort=True).size().rename("attempts").reset_index()
    return table


def rank_cells(results: pd.DataFrame, outcome: str = "tok_s_mean") -> pd.DataFrame:
    """One row per cell over its completed attempts: the axes, n, mean, sd, min, max and
    coefficient of variation of `outcome`, best first (direction from the outcome's name)."""
    ok = ok_attempts(results)
    axes = axes_of(results)
    cols = ["rank", "cell", *axes, "n", "mean", "sd", "min", "max", "cv_pct"]
    if ok.empty or outcome not in ok:
        return pd.DataFrame(columns=cols)
    frame = ok.assign(_y=_numeric(ok, outcome))
    grouped = frame.groupby("cell", sort=False)
    table = grouped["_y"].agg(n="count", mean="mean", sd="std", min="min", max="max")
    table["cv_pct"] = 100.0 * table["sd"] / table["mean"]
    first = grouped[axes].first() if axes else pd.DataFrame(index=table.index)
    table = first.join(table).reset_index()
    ascending = outcome in LOWER_IS_BETTER
    table = table.sort_values("mean", ascending=ascending, na_position="last", kind="stable")
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    table = table.rename(columns={"mean": "mean", "sd": "sd"})
    return table[cols].reset_index(drop=True)


def axis_effects(results: pd.DataFrame, outcomes: Sequence[str] | None = None) -> pd.DataFrame:
    """Each outcome against each axis: per axis value, the attempts' n, mean, sd, min, max
    (long form: axis, value, outcome, ...)."""
    ok = ok_attempts(results)
    axes = axes_of(results)
    outcomes = [o for o in (outcomes or OUTCOMES) if o in ok.columns]
    cols = ["axis", "value", "outcome", "n", "mean", "sd", "min", "max"]
    parts = []
    for axis in axes:
        for outcome in outcomes:
            y = _numeric(ok, outcome)
            if y.notna().sum() == 0:
                continue
            frame = pd.DataFrame({"value": ok[axis].astype(str), "y": y})
            stats = frame.groupby("value", sort=False)["y"].agg(
                n="count", mean="mean", sd="std", min="min", max="max"
            )
            stats = stats.reset_index()
            stats.insert(0, "axis", axis)
            stats.insert(2, "outcome", outcome)
            parts.append(stats)
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True)
    # Numeric axis values in numeric order.
    out["_num"] = pd.to_numeric(out["value"], errors="coerce")
    out = out.sort_values(["axis", "outcome", "_num", "value"], kind="stable")
    return out.drop(columns="_num")[cols].reset_index(drop=True)


def axis_table(results: pd.DataFrame, outcomes: Sequence[str] | None = None) -> pd.DataFrame:
    """Wide form of :func:`axis_effects`: per axis value, n and the mean of each outcome."""
    effects = axis_effects(results, outcomes)
    if effects.empty:
        return pd.DataFrame(columns=["axis", "value", "n"])
    order = list(dict.fromkeys(effects["outcome"]))
    wide = effects.pivot_table(
        index=["axis", "value"], columns="outcome", values="mean", sort=False
    ).reset_index()
    n = effects.groupby(["axis", "value"], sort=False)["n"].max().reset_index()
    wide = n.merge(wide, on=["axis", "value"])
    wide.columns.name = None
    return wide[["axis", "value", "n", *[o for o in order if o in wide]]]


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx = pd.Series(x).rank().to_numpy()
    ry = pd.Series(y).rank().to_numpy()
    if np.std(rx) == 0 or np.std(ry) == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _permutation_p(x: np.ndarray, y: np.ndarray, rho: float, seed: int = 0) -> float:
    """Two-sided p-value of `rho` under random reorderings of `x` (vectorised)."""
    if np.isnan(rho):
        return float("nan")
    rng = np.random.default_rng(seed)
    rx = pd.Series(x).rank().to_numpy()
    ry = pd.Series(y).rank().to_numpy()
    perms = rng.permuted(np.tile(rx, (PERMUTATIONS, 1)), axis=1)
    px = perms - perms.mean(axis=1, keepdims=True)
    py = ry - ry.mean()
    rhos = (px @ py) / (np.sqrt((px**2).sum(axis=1)) * np.sqrt((py**2).sum()))
    return float((np.sum(np.abs(rhos) >= abs(rho) - 1e-12) + 1) / (PERMUTATIONS + 1))


def order_effect(results: pd.DataFrame, outcome: str = "tok_s_mean") -> dict[str, Any]:
    """Does the outcome follow the execution position once each cell's own level is taken out?

    Each completed attempt's outcome is divided by its cell's mean; the Spearman correlation
    of that ratio with the position (``order``) and a permutation p-value say whether later
    runs did systematically better or worse (a device heating up, a page cache filling).
    """
    ok = ok_attempts(results)
    out: dict[str, Any] = {"outcome": outcome, "attempts": 0, "spearman_rho": None,
                           "p_value": None, "change_pct_first_to_last": None}  # fmt: skip
    if ok.empty or outcome not in ok or "order" not in ok:
        return out
    frame = pd.DataFrame(
        {"cell": ok["cell"].astype(str), "order": _numeric(ok, "order"),
         "y": _numeric(ok, outcome)}
    ).dropna()  # fmt: skip
    frame = frame[frame.groupby("cell")["y"].transform("count") > 1]
    if len(frame) < 4:
        out["attempts"] = len(frame)
        return out
    ratio = frame["y"] / frame.groupby("cell")["y"].transform("mean")
    x, y = frame["order"].to_numpy(), ratio.to_numpy()
    rho = _spearman(x, y)
    slope = np.polyfit(x, y, 1)[0] if np.std(x) > 0 else float("nan")
    span = float(x.max() - x.min())
    out.update(
        attempts=len(frame),
        spearman_rho=None if np.isnan(rho) else round(rho, 4),
        p_value=None if np.isnan(rho) else round(_permutation_p(x, y, rho), 4),
        change_pct_first_to_last=None if np.isnan(slope) else round(100.0 * slope * span, 2),
    )
    return out


def reversed_rounds(results: pd.DataFrame, outcome: str = "tok_s_mean") -> pd.DataFrame:
    """Per cell, the outcome in forward rounds against reversed rounds (where the sweep ran
    both), and the difference in percent. An order effect shows as differences that track the
    cell's position; a clean sweep's differences scatter around zero."""
    ok = ok_attempts(results)
    cols = ["cell", "forward", "reversed", "diff_pct", "position_forward"]
    if ok.empty or outcome not in ok or "reversed" not in ok:
        return pd.DataFrame(columns=cols)
    rev = ok["reversed"].astype("boolean").fillna(False).astype(bool)
    if rev.all() or not rev.any():
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame(
        {"cell": ok["cell"].astype(str), "rev": rev, "y": _numeric(ok, outcome),
         "order": _numeric(ok, "order") if "order" in ok else np.nan}
    )  # fmt: skip
    fwd = (
        frame[~frame["rev"]]
        .groupby("cell")
        .agg(forward=("y", "mean"), position_forward=("order", "mean"))
    )
    bwd = frame[frame["rev"]].groupby("cell").agg(reversed=("y", "mean"))
    table = fwd.join(bwd, how="inner").reset_index()
    table["diff_pct"] = 100.0 * (table["reversed"] / table["forward"] - 1.0)
    return table.sort_values("position_forward", kind="stable")[cols].reset_index(drop=True)


def contamination(results: pd.DataFrame) -> pd.DataFrame:
    """The contamination tells (:func:`bmoe.analyze.contamination.contamination_flags`) over
    the completed attempts."""
    from bmoe.analyze.contamination import contamination_flags

    ok = ok_attempts(results)
    if ok.empty:
        return pd.DataFrame(columns=["tell", "cells", "evidence"])
    flags = contamination_flags(ok.reset_index(drop=True))
    if "cells" in flags:
        flags = flags.assign(
            cells=flags["cells"].map(lambda c: ", ".join(map(str, c)) if isinstance(
                c, list | tuple | np.ndarray) else c)
        )  # fmt: skip
    return flags


def per_cell(results: pd.DataFrame, by_run: pd.DataFrame, on: str = "run") -> pd.DataFrame:
    """A per-run table (e.g. :func:`bmoe.analyze.stall.stall_by_run`) averaged per cell over
    its completed repeats: the cell, its axes, ``n`` and the mean of every numeric column
    (rows of `by_run` are matched to the sweep's attempts on `on`)."""
    ok = ok_attempts(results)
    axes = axes_of(results)
    keys = ok[[on, "cell", *axes]].drop_duplicates(on)
    numeric = [
        c for c in by_run.columns
        if c != on and c not in keys and pd.api.types.is_numeric_dtype(by_run[c])
        and not pd.api.types.is_bool_dtype(by_run[c])
    ]  # fmt: skip
    joined = keys.merge(by_run[[on, *numeric]], on=on, how="inner")
    if joined.empty:
        return pd.DataFrame(columns=["cell", *axes, "n", *numeric])
    grouped = joined.groupby("cell", sort=False)
    table = grouped[numeric].mean()
    table.insert(0, "n", grouped.size())
    first = grouped[axes].first() if axes else pd.DataFrame(index=table.index)
    return first.join(table).reset_index()


def analyze_sweep(results: pd.DataFrame, outcome: str = "tok_s_mean") -> dict[str, Any]:
    """Every view of ``bmoe analyze sweep``: attempts, ranking, axes, order, contamination."""
    views: dict[str, Any] = {
        "attempts": attempts_by_status(results),
        f"cells ranked by {outcome}": rank_cells(results, outcome),
    }
    shown = [outcome, *[o for o in AXIS_VIEW_OUTCOMES if o != outcome]]
    effects = axis_table(results, shown)
    if len(effects):
        views["outcomes by axis value (means)"] = effects
    views["order effect"] = order_effect(results, outcome)
    rounds = reversed_rounds(results, outcome)
    if not rounds.empty:
        views["forward vs reversed rounds"] = rounds
    with contextlib.suppress(ImportError):
        views["contamination"] = contamination(results)
    return views


def predicted_vs_measured(results: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the tok/s the sweep's profile predicted (``predictions.csv``) next to the
    median measured over its completed repeats (tokens over decode time), and the error."""
    ok = ok_attempts(results)
    rate = "tok_s_reported" if "tok_s_reported" in ok else "tok_s_mean"
    measured = ok.groupby("cell")[rate].median().rename("tok_s_measured")
    predicted = predictions.groupby("cell")["tok_s"].first().rename("tok_s_predicted")
    table = pd.concat([predicted, measured], axis=1, join="inner").reset_index()
    table["error_pct"] = 100.0 * (table["tok_s_predicted"] / table["tok_s_measured"] - 1.0)
    return table
