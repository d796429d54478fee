"""What a sweep found: cells ranked, each outcome against each axis, contaminated cells, drift
with execution order, and the verdict on the ranking (:mod:`bmoe.analyze.verdict`). Pure
functions over the sweep's results table (one row per attempt, as in ``results.parquet``);
nothing here reads files or prints.

Two order checks look at different things. :func:`within_cell_drift` (here) asks whether the
repeats *of the same cell* get better or worse as the sweep goes on: it needs repeats and
assumes nothing about how the configuration acts. The contamination tell ``execution_order``
(:func:`bmoe.analyze.contamination.position_beyond_config`) asks whether the outcome follows
the execution position *across cells* once an additive model of the configuration is taken
out: it works with one run per cell but trusts that model. A sweep with repeats gets both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.verdict import Verdict, judge, outcome_columns
from bmoe.errors import BmoeError

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


def main_axes(
    results: pd.DataFrame, axes: Sequence[str] | None = None
) -> tuple[str, str | None] | None:
    """The axes a plot of the outcome answers the sweep's question with: on x the numeric
    axis with the most values, one line per value of the other axis with the fewest values
    (None when no axis is numeric)."""
    axes = list(axes) if axes is not None else axes_of(results)
    numeric = [a for a in axes if pd.to_numeric(results[a], errors="coerce").notna().all()]
    if not numeric:
        return None
    x = max(numeric, key=lambda a: results[a].nunique())
    others = [a for a in axes if a != x]
    by = min(others, key=lambda a: results[a].nunique()) if others else None
    return x, by


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


def axis_influence(results: pd.DataFrame, outcome: str = "tok_s_mean") -> pd.DataFrame:
    """Which axis moves `outcome` most: per axis, how many values it took, its best and worst
    value by the mean of their completed attempts (direction from the outcome's name) and
    the gap between the two as a percentage of the overall mean, largest gap first.

    Each value's mean is over every attempt that had it, whatever the other axes were (the
    axis's main effect): in a full grid that compares like with like; where some cells are
    missing, an axis can borrow the effect of another that moved with it."""
    cols = ["axis", "values", "best", "best_mean", "worst", "worst_mean", "range_pct"]
    effects = axis_effects(results, [outcome])
    if effects.empty:
        return pd.DataFrame(columns=cols)
    ordered = effects.sort_values(
        ["axis", "mean"], ascending=[True, outcome in LOWER_IS_BETTER], kind="stable"
    )
    grouped = ordered.groupby("axis", sort=False)
    best, worst = grouped.first(), grouped.last()
    overall = abs(_numeric(ok_attempts(results), outcome).mean())
    table = pd.DataFrame({
        "values": grouped.size(), "best": best["value"], "best_mean": best["mean"],
        "worst": worst["value"], "worst_mean": worst["mean"],
        "range_pct": 100.0 * (best["mean"] - worst["mean"]).abs() / overall if overall else np.nan,
    })  # fmt: skip
    table = table.reset_index().sort_values("range_pct", ascending=False, kind="stable")
    return table[cols].reset_index(drop=True)


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


def within_cell_drift(results: pd.DataFrame, outcome: str = "tok_s_mean") -> dict[str, Any]:
    """Do the repeats of the same cell get better or worse as the sweep goes on?

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


def valid_outcomes(results: pd.DataFrame) -> list[str]:
    """The outcomes `results` can be ranked by (the known ones first)."""
    return outcome_columns(ok_attempts(results), OUTCOMES)


def check_outcome(results: pd.DataFrame, outcome: str, source: object = None) -> None:
    """Refuse an outcome the results do not have, naming the valid ones (and `source`, the
    folder they came from, when given). The known :data:`OUTCOMES` are always accepted: when
    no completed run recorded one, the verdict says so."""
    valid = valid_outcomes(results)
    if outcome in valid or outcome in OUTCOMES:
        return
    listed = ", ".join(valid) if valid else "none measured yet; usually " + ", ".join(OUTCOMES)
    where = f"{source}: " if source is not None else ""
    raise BmoeError(f"{where}unknown outcome {outcome!r} (valid outcomes: {listed})")


def sweep_verdict(
    results: pd.DataFrame,
    outcome: str = "tok_s_mean",
    *,
    stall: pd.DataFrame | None = None,
    traced: Sequence[str] = (),
    contamination_flags: pd.DataFrame | None = None,
) -> Verdict:
    """The verdict on the sweep's ranking by `outcome` (:func:`bmoe.analyze.verdict.judge`):
    stability per cell, neighbours compared with intervals, and why the ranking is not
    settled. `stall` is a per-cell attribution (:func:`per_cell` of
    :func:`bmoe.analyze.stall.stall_by_run`) that measures the off-CPU share instead of
    estimating it; `traced` names runs that recorded traces."""
    check_outcome(results, outcome)
    if contamination_flags is None:
        contamination_flags = contamination(results)
    return judge(
        rank_cells(results, outcome), ok_attempts(results), outcome,
        lower_is_better=outcome in LOWER_IS_BETTER, axes=axes_of(results),
        rounds=reversed_rounds(results, outcome), drift=within_cell_drift(results, outcome),
        stall=stall, contamination=contamination_flags, traced=traced, all_attempts=results,
    )  # fmt: skip


def analyze_sweep(
    results: pd.DataFrame,
    outcome: str = "tok_s_mean",
    *,
    stall: pd.DataFrame | None = None,
    traced: Sequence[str] = (),
    predictions: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Every view of ``bmoe analyze sweep``: the verdict first, then attempts, ranking,
    neighbours compared, stability per cell, axes, predicted against measured tok/s (when
    the sweep recorded `predictions`, its ``predictions.csv``), drift with execution order
    and contamination, keyed by their slugs in :data:`bmoe.analyze.views.SWEEP` (titled with
    ``outcome=``). Raises :class:`BmoeError` for an unknown `outcome`."""
    check_outcome(results, outcome)
    flags = contamination(results)
    verdict = sweep_verdict(results, outcome, stall=stall, traced=traced,
                            contamination_flags=flags)  # fmt: skip
    views: dict[str, Any] = {
        "verdict": verdict.view(),
        "attempts": attempts_by_status(results),
        "ranking": rank_cells(results, outcome),
    }
    if len(verdict.neighbours):
        views["neighbours"] = verdict.neighbours[["sentence"]]
    if len(verdict.stability):
        views["stability"] = verdict.stability
    shown = [outcome, *[o for o in AXIS_VIEW_OUTCOMES if o != outcome]]
    effects = axis_table(results, shown)
    if len(effects):
        views["axis_table"] = effects
    influence = axis_influence(results, outcome)
    if len(influence):
        views["axis_influence"] = influence
    if predictions is not None:
        views["predicted"] = predicted_vs_measured(results, predictions)
    views["order_effect"] = within_cell_drift(results, outcome)
    rounds = reversed_rounds(results, outcome)
    if not rounds.empty:
        views["reversed_rounds"] = rounds
    views["contamination"] = flags
    return views


def predicted_vs_measured(results: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the tok/s the sweep's profile predicted (``predictions.csv``) next to the
    median measured over its completed repeats (tokens over decode time), and the error."""
    ok = ok_attempts(results)
    rate = "tok_s_reported" if "tok_s_reported" in ok else "tok_s_mean"
    measured = ok.groupby("cell")[rate].median().rename("tok_s_measured")
    predicted = predictions.groupby("cell")["tok_s"].first().rename("tok_s_predicted")
    parts = [predicted, measured]
    for side in ("low", "high"):  # the prediction's interval, where it was kept
        if f"tok_s_{side}" in predictions:
            first = predictions.groupby("cell")[f"tok_s_{side}"].first()
            parts.append(first.rename(f"tok_s_{side}_predicted"))
    table = pd.concat(parts, axis=1, join="inner").reset_index()
    table["error_pct"] = 100.0 * (table["tok_s_predicted"] / table["tok_s_measured"] - 1.0)
    return table
