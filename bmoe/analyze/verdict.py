"""The verdict on a ranking: how sure each cell's figure is, whether neighbours in the ranking
can be told apart, and a plain sentence saying whether the ranking is settled and why not.

A ranking of cell means says nothing about whether the order would survive a second sweep.
Four things decide that, and this module checks each from the sweep's tables:

* **spread across repeats**: a cell whose repeats disagree (coefficient of variation above
  :data:`NOISY_CV_PCT`) or that ran once has no figure to rank by;
* **order drift**: forward and reversed rounds of the same cell that differ by a median of
  more than :data:`DRIFT_PCT` across cells, or repeats that trend with the execution
  position, mean the machine changed under the sweep;
* **off-CPU time**: a token whose wall time is mostly neither compute nor a measured wait
  (more than :data:`OFF_CPU_PCT`) was waiting for a core: the figure measures the machine;
* **instrumented runs**: traced runs synchronise the engine, so their timings are not
  benchmark figures.

Neighbours are compared as a ratio of means with a 95 % interval (Welch's t on the log scale,
the delta method for each mean), phrased "A is 1.23 ± 0.04x faster than B" or "not
distinguishable" when the interval reaches 1. A ratio needs enough data to mean anything:
with fewer than :data:`MIN_REPEATS` runs on either side the comparison says "too few repeats
(n = 2)", and where the interval is wider than the ratio itself "not measurable", without a
number (:func:`ratio_caveats`; the bounds are NaN and the ``why`` column says why).

Everything here is a pure function of DataFrames (the ranking of
:func:`bmoe.analyze.sweep.rank_cells`, the completed attempts, the forward/reversed table);
:func:`bmoe.analyze.sweep.analyze_sweep` assembles them, and the terminal, ``summary.md``,
the report and the notebooks all read the same :class:`Verdict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze import stats

#: Repeats of a cell disagree when their coefficient of variation exceeds this (%).
NOISY_CV_PCT = 25.0
#: Forward and reversed rounds disagree when the median |difference| over cells exceeds this (%).
DRIFT_PCT = 20.0
#: A repeat trend with execution position matters from this change first to last (%) ...
TREND_PCT = 5.0
#: ... when its permutation p-value is below this.
TREND_P = 0.05
#: A token measured the machine more than its configuration past this off-CPU share (%).
OFF_CPU_PCT = 50.0
#: A run whose compute took more than this many times its CPU time per thread lost the CPU
#: during compute (a quiet machine gives 0.8-1.2, the phone corpus 0.96; two spinning
#: processes on two cores 1.2-2.5): its timings measure the machine's load. Predictions are
#: not compared with such a measurement.
CONTENDED_RATIO = 1.25
#: Why a measurement is not compared with a prediction when its compute waited for a core.
CONTENDED = "compute waited for a core"
#: Confidence level of every interval.
LEVEL = 0.95
#: Fewest runs per side for a ratio with an interval (two runs give an interval that spans
#: orders of magnitude: t = 12.7 at one degree of freedom).
MIN_REPEATS = 3
#: the stability reason for fewer than MIN_REPEATS runs (callers judging single runs drop it)
FEW_REPEATS = "too few repeats"

#: Parameter names that turn on tracing (traced timings are not benchmark figures).
TRACE_PARAMS = ("route_trace", "compute_trace", "compute_trace_layers", "io_trace")

#: Numeric columns of a results table that describe a run rather than measure it.
BOOKKEEPING = (
    "repeat", "attempt", "order", "round", "exit_code", "duration_s", "tokens", "steps",
    "turns", "version", "n_expert_used", "n_layer", "n_expert", "threads", "warmup_tokens",
    "steady_tokens", "n_prompt", "o_direct", "reversed", "partial",
)  # fmt: skip

#: Outcomes that are rates of tokens (a higher ratio reads "faster").
THROUGHPUT = ("tok_s", "prefill_tps")


def t_quantile(df: np.ndarray | float) -> np.ndarray:
    """The two-sided 95 % quantile of Student's t at `df` degrees of freedom (fractional df
    rounded down, which widens the interval; NaN below 1)."""
    return stats.t_quantile(0.975, np.floor(np.asarray(df, dtype=float)))


def mean_interval_pct(mean: pd.Series, sd: pd.Series, n: pd.Series) -> pd.Series:
    """Half-width of the 95 % interval of each mean, as a percentage of the mean (NaN for a
    single run or a zero mean)."""
    n = pd.to_numeric(n, errors="coerce").astype(float)
    t = pd.Series(t_quantile(n.to_numpy() - 1), index=n.index)
    half = t * pd.to_numeric(sd, errors="coerce") / np.sqrt(n)
    mean = pd.to_numeric(mean, errors="coerce").astype(float)
    return (100.0 * half / mean.abs()).where(mean != 0)


def is_throughput(outcome: str) -> bool:
    return outcome.startswith(THROUGHPUT)


def outcome_columns(results: pd.DataFrame, known: Sequence[str] = ()) -> list[str]:
    """The columns a ranking can use: `known` outcomes first, then every other numeric column
    that is not bookkeeping, a parameter or an entry state (a figure the runs measured)."""
    skip = set(results.attrs.get("params", [])) | set(results.attrs.get("axes", []))
    skip |= set(BOOKKEEPING)
    numeric = [
        str(c) for c in results.columns
        if str(c) not in skip
        and not str(c).startswith(("entry_", "mem_avail", "stream_", "summary_"))
        and not str(c).endswith("_kb")
        and pd.api.types.is_numeric_dtype(results[c]) and not pd.api.types.is_bool_dtype(results[c])
    ]  # fmt: skip
    first = [o for o in known if o in results.columns]
    return first + [c for c in numeric if c not in first]


# ----------------------------------------------------------------------------- per cell


def off_cpu_pct(attempts: pd.DataFrame) -> pd.Series:
    """Per attempt, the share of a token's wall time that is neither compute (CPU seconds per
    token over the compute threads) nor a measured wait (flash wait, cache mgmt): the time the
    engine was runnable but not running. Wall per token is 1 / ``tok_s_mean`` (which makes
    this an underestimate). NaN where the columns are missing or the CPU time unmeasured."""

    def col(name: str) -> pd.Series:
        if name not in attempts:
            return pd.Series(np.nan, index=attempts.index)
        return pd.to_numeric(attempts[name], errors="coerce").astype(float)

    wall = 1.0 / col("tok_s_mean")
    cpu = col("cpu_s_per_token").where(lambda s: s > 0)
    threads = col("threads").where(lambda s: s > 0)
    stall = col("stall_ms_per_token").fillna(0.0) / 1000.0
    wait = stall.where(stall > 0, col("io_s_per_token").fillna(0.0))
    mgmt = col("mgmt_ms_per_token").fillna(0.0) / 1000.0
    busy = cpu / threads + wait + mgmt
    return (100.0 * (1.0 - busy / wall)).clip(lower=0.0)


def cpu_share_pct(attempts: pd.DataFrame) -> pd.Series:
    """Per attempt, the engine's CPU time over its wall time, in percent of one CPU (200 % = two
    cores busy throughout): the sweep's ``engine_cpu_share`` where recorded, else CPU seconds
    per token times tokens per second."""
    out = pd.Series(np.nan, index=attempts.index)
    if {"cpu_s_per_token", "tok_s_mean"} <= set(attempts.columns):
        cpu = pd.to_numeric(attempts["cpu_s_per_token"], errors="coerce").astype(float)
        rate = pd.to_numeric(attempts["tok_s_mean"], errors="coerce").astype(float)
        out = (100.0 * cpu * rate).where(cpu > 0)
    if "engine_cpu_share" in attempts:  # the sweep's own measurement, where it made one
        share = 100.0 * pd.to_numeric(attempts["engine_cpu_share"], errors="coerce")
        out = share.astype(float).where(share.notna(), out)
    return out


def instrumented(attempts: pd.DataFrame, traced: Iterable[str] = ()) -> pd.Series:
    """Per attempt, whether it recorded a trace (a tracing parameter set, or its run id in
    `traced`)."""
    out = pd.Series(False, index=attempts.index)
    for name in TRACE_PARAMS:
        if name in attempts:
            value = attempts[name]
            out |= value.map(lambda v: bool(v) and str(v).lower() not in ("0", "false", "none"))
    traced = set(traced)
    if traced and "run" in attempts:
        out |= attempts["run"].astype(str).isin(traced)
    return out.astype(bool)


def cell_stability(
    ranked: pd.DataFrame,
    attempts: pd.DataFrame,
    rounds: pd.DataFrame | None = None,
    stall: pd.DataFrame | None = None,
    traced: Iterable[str] = (),
) -> pd.DataFrame:
    """Per ranked cell: its repeats (n), mean, 95 % interval of the mean (``ci_pct``, half-width
    in % of the mean; NaN below :data:`MIN_REPEATS` runs), coefficient of variation,
    forward-vs-reversed difference, off-CPU share, the engine's CPU share, instrumented runs,
    and ``unstable``: why its figure is not firm (None when it is).

    `ranked` is :func:`bmoe.analyze.sweep.rank_cells`; `attempts` the completed attempts;
    `rounds` :func:`bmoe.analyze.sweep.reversed_rounds`; `stall` a per-cell attribution
    (``cell``, ``unattributed_pct``) that replaces the off-CPU estimate from the results.
    """
    cols = ["rank", "cell", "n", "mean", "ci_pct", "cv_pct", "drift_pct", "off_cpu_pct",
            "cpu_pct", "traced", "unstable"]  # fmt: skip
    if ranked.empty:
        return pd.DataFrame(columns=cols)
    table = ranked[["rank", "cell", "n", "mean", "cv_pct"]].copy()
    # below three runs the interval is what t = 12.7 (n = 2) makes of one sd: blank instead
    interval = mean_interval_pct(ranked["mean"], ranked["sd"], ranked["n"])
    table["ci_pct"] = interval.where(pd.to_numeric(ranked["n"], errors="coerce") >= MIN_REPEATS)
    keyed = attempts.assign(
        _off=off_cpu_pct(attempts), _cpu=cpu_share_pct(attempts),
        _traced=instrumented(attempts, traced),
    )  # fmt: skip
    per_cell = keyed.groupby(keyed["cell"].astype(str), sort=False).agg(
        off_cpu_pct=("_off", "median"), cpu_pct=("_cpu", "median"), traced=("_traced", "sum")
    )
    if stall is not None and "unattributed_pct" in stall and len(stall):
        measured = stall.set_index(stall["cell"].astype(str))["unattributed_pct"]
        per_cell["off_cpu_pct"] = measured.reindex(per_cell.index).fillna(per_cell["off_cpu_pct"])
    table = table.join(per_cell, on=table["cell"].astype(str))
    if rounds is not None and len(rounds):
        drift = rounds.set_index(rounds["cell"].astype(str))["diff_pct"]
        table["drift_pct"] = table["cell"].astype(str).map(drift)
    else:
        table["drift_pct"] = np.nan
    table["traced"] = table["traced"].fillna(0).astype(int)
    reasons = pd.DataFrame(
        {
            FEW_REPEATS: table["n"] < MIN_REPEATS,
            "repeats disagree": table["cv_pct"] > NOISY_CV_PCT,
            "rounds differ": table["drift_pct"].abs() > DRIFT_PCT,
            "mostly off-CPU": table["off_cpu_pct"] > OFF_CPU_PCT,
            "traced": table["traced"] > 0,
        }
    ).fillna(False)
    names = np.array(reasons.columns)
    table["unstable"] = [", ".join(names[row]) or None for row in reasons.to_numpy(dtype=bool)]
    return table[cols].reset_index(drop=True)


# ----------------------------------------------------------------------------- neighbours


def compare_neighbours(
    ranked: pd.DataFrame, outcome: str, lower_is_better: bool = False, labels: Sequence[str] = ()
) -> pd.DataFrame:
    """Each cell against the next one down the ranking: the ratio of their means (how many
    times better the higher-ranked one is), its 95 % interval, whether the two can be told
    apart, ``why`` not when there is no usable interval, and a sentence.

    The interval is Welch's on the log scale: the variance of log(mean) is (sd / mean)^2 / n
    per cell, the degrees of freedom Welch-Satterthwaite's. Below :data:`MIN_REPEATS` runs on
    either side, or where the interval is wider than the ratio, the bounds are NaN and the
    sentence says "too few repeats (n = 2)" or "not measurable" (:func:`ratio_caveats`).
    """
    cols = ["better", "worse", "ratio", "ratio_low", "ratio_high", "distinguishable", "why",
            "sentence"]  # fmt: skip
    if len(ranked) < 2:
        return pd.DataFrame(columns=cols)
    names = list(labels) if len(labels) == len(ranked) else ranked["cell"].astype(str).tolist()
    mean = pd.to_numeric(ranked["mean"], errors="coerce").to_numpy(float)
    sd = pd.to_numeric(ranked["sd"], errors="coerce").to_numpy(float)
    n = pd.to_numeric(ranked["n"], errors="coerce").to_numpy(float)
    a, b = slice(0, -1), slice(1, None)
    if lower_is_better:
        ratio, low, high, why = judged_ratio(mean[b], sd[b], n[b], mean[a], sd[a], n[a])
    else:
        ratio, low, high, why = judged_ratio(mean[a], sd[a], n[a], mean[b], sd[b], n[b])
    apart = np.isfinite(low) & (low > 1.0)
    word = _better_word(outcome, lower_is_better)
    sentences = []
    for i in range(len(ratio)):
        first, second = names[i], names[i + 1]
        if why[i] is not None:
            sentences.append(f"{first} and {second}: {why[i]}")
        elif apart[i]:
            sentences.append(
                f"{first} is {_ratio_text(ratio[i], low[i], high[i])}x {word} than {second}"
            )
        else:
            sentences.append(
                f"{first} and {second}: not distinguishable "
                f"({_ratio_text(ratio[i], low[i], high[i])}x, the interval includes 1)"
            )
    return pd.DataFrame(
        {
            "better": names[:-1], "worse": names[1:], "ratio": ratio,
            "ratio_low": low, "ratio_high": high,
            "distinguishable": apart, "why": why, "sentence": sentences,
        }
    )[cols]  # fmt: skip


def ratio_caveats(
    ratio: np.ndarray, low: np.ndarray, high: np.ndarray, n_a: np.ndarray, n_b: np.ndarray
) -> np.ndarray:
    """Per ratio, why its interval is no use (None where it is): ``too few repeats (n = 2)``
    below :data:`MIN_REPEATS` runs on either side (n is the smaller side), else ``not
    measurable`` where the interval is missing or wider than the ratio itself. The words every
    comparison prints instead of a number."""
    ratio, low, high, n_a, n_b = (
        np.atleast_1d(np.asarray(v, dtype=float)) for v in (ratio, low, high, n_a, n_b)
    )
    n = np.fmin(n_a, n_b)
    few = ~(n >= MIN_REPEATS)
    known = np.isfinite(low) & np.isfinite(high) & np.isfinite(ratio)
    with np.errstate(invalid="ignore"):
        wide = known & (high - low > np.abs(ratio))
    shown = np.where(np.isfinite(n), n, 0).astype(int)
    out = np.full(len(n), None, dtype=object)
    for i in range(len(n)):  # one entry per compared pair, not per row of a trace
        if few[i]:
            out[i] = f"too few repeats (n = {shown[i]})"
        elif wide[i]:
            out[i] = "not measurable (the 95 % interval is wider than the ratio)"
        elif not known[i]:
            out[i] = "not measurable (no interval: a zero or missing mean)"
    return out


def judged_ratio(
    mean_a: np.ndarray,
    sd_a: np.ndarray,
    n_a: np.ndarray,
    mean_b: np.ndarray,
    sd_b: np.ndarray,
    n_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`ratio_interval` held to :func:`ratio_caveats`: the ratio a / b, its bounds (NaN
    where there is no usable interval) and why not (None where the interval is usable)."""
    ratio, low, high = ratio_interval(mean_a, sd_a, n_a, mean_b, sd_b, n_b)
    why = ratio_caveats(ratio, low, high, n_a, n_b)
    bad = np.array([w is not None for w in why], dtype=bool)
    return ratio, np.where(bad, np.nan, low), np.where(bad, np.nan, high), why


def ratio_interval(
    mean_a: np.ndarray,
    sd_a: np.ndarray,
    n_a: np.ndarray,
    mean_b: np.ndarray,
    sd_b: np.ndarray,
    n_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ratio of means a / b and its 95 % interval (low, high): Welch's t on the log scale,
    the variance of log(mean) being (sd / mean)^2 / n (the delta method), the degrees of
    freedom Welch-Satterthwaite's. NaN bounds where either side has fewer than two runs."""
    mean_a, sd_a, n_a, mean_b, sd_b, n_b = (
        np.asarray(v, dtype=float) for v in (mean_a, sd_a, n_a, mean_b, sd_b, n_b)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        va, vb = (sd_a / mean_a) ** 2 / n_a, (sd_b / mean_b) ** 2 / n_b
        ratio = mean_a / mean_b
        se = np.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
        df = np.where(se == 0, np.minimum(n_a, n_b) - 1, df)
        t = t_quantile(df)
        low, high = ratio * np.exp(-t * se), ratio * np.exp(t * se)
    few = (n_a < 2) | (n_b < 2) | ~np.isfinite(low) | ~np.isfinite(high)
    return ratio, np.where(few, np.nan, low), np.where(few, np.nan, high)


def _better_word(outcome: str, lower_is_better: bool) -> str:
    if is_throughput(outcome) and not lower_is_better:
        return "faster"
    return f"{'lower' if lower_is_better else 'higher'} on {outcome}"


def _ratio_text(ratio: float, low: float, high: float) -> str:
    """``1.23 ± 0.04`` (the half-width of the interval, which is slightly asymmetric around
    the ratio on a linear scale), with a third decimal when the interval is narrower."""
    half = (high - low) / 2.0
    digits = 3 if half < 0.005 else 2
    return f"{ratio:.{digits}f} ± {half:.{digits}f}"


def cell_labels(ranked: pd.DataFrame, axes: Sequence[str]) -> list[str]:
    """Short names for ranked cells: their axis values (``cache_mb=8 io_threads=4``; an axis a
    cell has no value for is left out of its name), else the cell id."""
    axes = [a for a in axes if a in ranked]
    if not axes:
        return ranked["cell"].astype(str).tolist()
    parts = [ranked[a].astype(str).radd(f"{a}=").where(ranked[a].notna(), "") for a in axes]
    named = [" ".join(p for p in row if p) for row in zip(*parts, strict=True)]
    return [name or str(cell) for name, cell in zip(named, ranked["cell"], strict=True)]


# ----------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    """Whether a ranking is settled, why not, and how its neighbours compare."""

    outcome: str
    settled: bool
    sentence: str  # the plain sentence for a terminal, summary.md or a page
    reasons: list[str]  # why the ranking is not settled (empty when it is)
    caveats: list[str]  # the reasons and everything else a reader should know
    stability: pd.DataFrame  # :func:`cell_stability`
    neighbours: pd.DataFrame  # :func:`compare_neighbours`
    figures: dict[str, Any] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        """The verdict as named figures (a view for every renderer; the reasons are in the
        sentence, and one per item in :attr:`reasons`)."""
        return {
            "outcome": self.outcome,
            "ranking": "settled" if self.settled else "not settled",
            "verdict": self.sentence,
            **self.figures,
        }


def judge(
    ranked: pd.DataFrame,
    attempts: pd.DataFrame,
    outcome: str,
    *,
    lower_is_better: bool = False,
    axes: Sequence[str] = (),
    rounds: pd.DataFrame | None = None,
    drift: Mapping[str, Any] | None = None,
    stall: pd.DataFrame | None = None,
    contamination: pd.DataFrame | None = None,
    traced: Iterable[str] = (),
    all_attempts: pd.DataFrame | None = None,
) -> Verdict:
    """The verdict on `ranked` (:func:`bmoe.analyze.sweep.rank_cells` by `outcome`) from the
    completed `attempts`, the forward/reversed `rounds`, the repeat `drift` with execution
    position (:func:`bmoe.analyze.sweep.within_cell_drift`), a per-cell `stall` attribution,
    the `contamination` tells, and every attempt (`all_attempts`, for failures)."""
    every = all_attempts if all_attempts is not None else attempts
    caveats: list[str] = []
    if "status" in every:
        failed = every[every["status"] != "ok"]
        if len(failed):
            counts = failed["status"].astype(str).value_counts().to_dict()
            caveats.append(
                f"{len(failed)} of {len(every)} attempt(s) did not complete ("
                + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
            )  # fmt: skip
    if attempts.empty or ranked.empty or ranked["n"].sum() == 0:
        if attempts.empty:
            what = f"none of the {len(every)} attempt(s) completed" if len(every) else "no attempts"
        else:
            what = f"none of the {len(attempts)} completed run(s) recorded {outcome}"
        sentence = f"Nothing to rank by {outcome}: {what}."
        return Verdict(outcome, False, sentence, [what], [*caveats, what],
                       cell_stability(ranked.iloc[:0], attempts), pd.DataFrame())  # fmt: skip

    if "cell" in every:
        missing = sorted(set(every["cell"].astype(str)) - set(ranked["cell"].astype(str)))
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                             else "")  # fmt: skip
            caveats.append(f"{len(missing)} cell(s) have no completed run and are not ranked: "
                           f"{shown}")  # fmt: skip
    stability = cell_stability(ranked, attempts, rounds, stall, traced)
    labels = cell_labels(ranked, axes)
    neighbours = compare_neighbours(ranked, outcome, lower_is_better, labels)
    reasons = _reasons(stability, outcome, rounds, drift, contamination)
    caveats = [*reasons, *caveats]
    if "partial" in attempts and attempts["partial"].fillna(False).astype(bool).any():
        caveats.append("some completed runs say they are partial")
    if "order_source" in attempts:
        caveats.append("loose files: the execution order is guessed from file modification times")
    caveats += _system_warnings(attempts)
    if contamination is not None:
        caveats += [f"not checked: {why}" for why in contamination.attrs.get("not_checked", [])]

    pairs = len(neighbours)
    apart = int(neighbours["distinguishable"].sum()) if pairs else 0
    unmeasured = int(neighbours["why"].notna().sum()) if pairs else 0
    top = neighbours["sentence"].iloc[0] if pairs else f"{labels[0]} is the only cell"
    close = pairs - apart - unmeasured
    told = [f"{close} of {pairs} neighbouring pairs are not distinguishable"] if close else []
    if unmeasured:
        told.append(f"{unmeasured} of {pairs} without a usable interval")
    tell = "".join(f"; {t}" for t in told)
    if reasons:
        sentence = f"Ranking by {outcome} not settled, because " + "; ".join(reasons) + "."
    else:
        sentence = (
            f"Ranking by {outcome} settled (repeats agree, no order drift, the engine had the "
            f"CPU): {top}{tell}."
        )
    figures = {
        "cells": len(ranked),
        "neighbouring pairs distinguishable": f"{apart} of {pairs}",
        "median cv_pct": _median(stability["cv_pct"]),
        "median ci_pct": _median(stability["ci_pct"]),
    }
    return Verdict(outcome, not reasons, sentence, reasons, caveats, stability, neighbours,
                   figures)  # fmt: skip


def _system_warnings(attempts: pd.DataFrame) -> list[str]:
    """The sweep's system checks (``system_warnings``, "; "-joined per run): each distinct
    warning once, with the number of runs it was raised for."""
    if "system_warnings" not in attempts:
        return []
    said = attempts["system_warnings"].dropna().astype(str)
    items = said.str.split("; ").explode().str.strip()
    counts = items[items != ""].value_counts(sort=False)
    return [f"system check ({n} of {len(attempts)} runs): {w}" for w, n in counts.items()]


def _median(values: pd.Series) -> float | None:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def _reasons(
    stability: pd.DataFrame,
    outcome: str,
    rounds: pd.DataFrame | None,
    drift: Mapping[str, Any] | None,
    contamination: pd.DataFrame | None,
) -> list[str]:
    total = len(stability)
    reasons: list[str] = []
    few = stability[stability["n"] < MIN_REPEATS]
    if len(few):
        n = pd.to_numeric(few["n"], errors="coerce")
        reasons.append(
            f"{len(few)} of {total} cells ran fewer than {MIN_REPEATS} times (n = "
            f"{_span(n.min(), n.max())}): too few repeats to judge their spread or compare them"
        )
    noisy = stability[stability["cv_pct"] > NOISY_CV_PCT]
    if len(noisy):
        low, high = noisy["cv_pct"].min(), noisy["cv_pct"].max()
        reasons.append(
            f"the repeats of {len(noisy)} of {total} cells disagree (coefficient of variation "
            f"{_span(low, high)} %, above {NOISY_CV_PCT:g} %)"
        )
    if rounds is not None and len(rounds):
        diff = pd.to_numeric(rounds["diff_pct"], errors="coerce").abs().dropna()
        if len(diff) and diff.median() > DRIFT_PCT:
            reasons.append(
                f"forward and reversed rounds differ by a median of {diff.median():.0f} % per "
                f"cell (up to {diff.max():.0f} %): the order the cells ran in moved the figures"
            )
    if drift:
        p, change = drift.get("p_value"), drift.get("change_pct_first_to_last")
        if p is not None and change is not None and p < TREND_P and abs(change) >= TREND_PCT:
            reasons.append(
                f"repeats of the same cell drift with execution order ({change:+.0f} % from "
                f"first to last, p = {p:.3g}): the machine changed during the sweep"
            )
    off = stability[stability["off_cpu_pct"] > OFF_CPU_PCT]
    if len(off):
        cpu = pd.to_numeric(off["cpu_pct"], errors="coerce").dropna()
        got = f"; the engine got {_span(cpu.min(), cpu.max())} % of a CPU" if len(cpu) else ""
        reasons.append(
            f"in {len(off)} of {total} cells more than {OFF_CPU_PCT:g} % of a token's wall time "
            f"was off-CPU (waiting for a core{got}): the figures measure the machine"
        )
    traced = stability[stability["traced"] > 0]
    if len(traced) and _is_timing(outcome):
        reasons.append(
            f"{int(traced['traced'].sum())} run(s) in {len(traced)} of {total} cells recorded "
            "traces: their timings are instrumented, not benchmark figures"
        )
    if contamination is not None and len(contamination):
        for row in contamination.itertuples(index=False):
            reasons.append(f"contamination ({row.tell}): {row.evidence}")
    return reasons


def _is_timing(outcome: str) -> bool:
    return is_throughput(outcome) or outcome.endswith(("_s", "_ms_per_token", "_s_per_token"))


def _span(low: float, high: float) -> str:
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def verdict_frame(verdict: Verdict) -> pd.DataFrame:
    """The caveats as a one-column table (for pages and notebooks)."""
    return pd.DataFrame({"caveat": verdict.caveats})


__all__ = [
    "CONTENDED",
    "CONTENDED_RATIO",
    "DRIFT_PCT",
    "FEW_REPEATS",
    "MIN_REPEATS",
    "NOISY_CV_PCT",
    "OFF_CPU_PCT",
    "Verdict",
    "cell_labels",
    "cell_stability",
    "compare_neighbours",
    "cpu_share_pct",
    "instrumented",
    "judge",
    "judged_ratio",
    "mean_interval_pct",
    "off_cpu_pct",
    "outcome_columns",
    "ratio_caveats",
    "ratio_interval",
    "t_quantile",
    "verdict_frame",
]
