"""The decisions of a tune: which runs next, whether the best is settled, what to recommend.

The decisions of ``bmoe tune``: from predictions and measurements to the runs still worth a
device's time, whether the best cell is settled, and what to recommend.

Pure functions over DataFrames (the side effects, running and archiving, are in
:mod:`bmoe.sweep.tune`). Everything is computed on a *score* where higher is better: the
objective itself (tok/s, prefill tok/s) or its inverse for a time (time to first token), so
that a ratio of scores reads "how many times better".

Each candidate cell has an estimate and an interval at the tune's confidence:

* measured at least twice: the mean of its runs and the Student t interval of the mean;
* measured once: that run, with the spread the repeated cells show (pooled coefficient of
  variation), or 10 % before any cell was repeated;
* measured, and priced by the profile too: the estimate that ranks it is the measured mean
  and the corrected prediction weighted by their precision (the runs' relative variance over
  their number against the predictions' scatter), so one lucky run does not crown a cell the
  model of the device says is slower; its interval stays the measurement's;
* not measured: the profile's prediction, corrected by how the measured cells compared with
  theirs (the median ratio, per group of the axes the profile cannot price), its interval the
  profile's spread widened by the scatter of those ratios;
* an axis the profile cannot price and no measured cell in its group: unknown (an interval
  from 0 to infinity: it must be run before anything is settled).

A cell is *feasible* when every constraint holds on every one of its runs (the worst run
counts); a cell not yet measured is not known to be feasible, and only a measured, feasible
cell is ever recommended. A cell is *excluded* when a measured cell that is no lossier breaks
a fidelity constraint (more dropping, a smaller cache, fewer experts; the read lanes do not
change the output).

The best measured feasible cell (by that estimate) is settled when every cell that could
still beat it (its interval reaches the best's) has been measured at least ``min_repeats``
times and the verdict
layer's ratio interval (:func:`bmoe.analyze.verdict.ratio_interval`, Welch's t on the log
scale) says it is worse, or when the cells left are at their repeat bound and still not
distinguishable (then equivalent within the noise, and said so). Until then, the runs that
would settle it are counted (:func:`runs_to_settle`), for a tune whose budget ran out first.

The recommendation (:func:`recommend`) is taken from the measured feasible cells by their
measured means, never on one run's strength: a cell measured fewer than ``min_repeats``
times does not take it from one measured that often. When the best is not distinguishable
from other cells, the cheapest of them is recommended (:data:`CHEAPER_RULE`, by
:func:`cost_key`), and the reasons say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze import stats
from bmoe.analyze.verdict import ratio_interval, t_quantile
from bmoe.errors import BmoeError

#: Objective names -> (results column, lower is better, the predicted column). ``tok_s`` is
#: the whole decode's rate (tokens over decode time, the engine's own tok/s), as predicted.
OBJECTIVES: dict[str, tuple[str, bool, str]] = {
    "tok_s": ("tok_s_reported", False, "tok_s"),
    "steady_tok_s": ("steady_tok_s_mean", False, "steady_tok_s"),
    "prefill_tps": ("prefill_tps", False, "prefill_tps"),
    "ttft_s": ("ttft_s", True, "ttft_s"),
}
#: Constraint names that are not results columns as such -> the derived column.
CONSTRAINT_ALIASES = {"rss_mb": "rss_mb", "mem_available_mb": "mem_available_mb"}
#: Columns whose constraint follows how lossy a cell is (inferred for cells not yet run).
FIDELITY_COLUMNS = {"fidelity": "min", "fidelity_kl": "max"}
#: Axes and the direction that makes a cell lossier (+1: a larger value; -1: a smaller one).
LOSSY_AXES = {"drop_cold_experts": 1, "n_expert_used": -1, "cache_mb": -1, "prefetch": 0}
#: Axes that never change the output (reads in more lanes read the same bytes).
OUTPUT_NEUTRAL_AXES = ("io_threads",)
#: The relative half-width given to a single run before any cell was repeated.
SINGLE_RUN_CV = 0.10
#: The scatter (log scale) of predictions around measurements before three cells are measured.
DEFAULT_SCATTER = 0.20


# ----------------------------------------------------------------------------- statistics


def t_at(level: float, dof: float) -> float:
    """The two-sided `level` quantile of Student's t at `dof` degrees of freedom, rounded
    down (NaN below one degree of freedom or at infinity)."""
    if not math.isfinite(dof) or dof < 1:
        return float("nan")
    if not 0.0 < level < 1.0:
        raise BmoeError(f"confidence {level}: a level between 0 and 1")
    return float(stats.t_quantile(0.5 + level / 2.0, math.floor(dof))[0])


def ratio_at(
    level: float,
    mean_a: float,
    sd_a: float,
    n_a: float,
    mean_b: float,
    sd_b: float,
    n_b: float,
) -> tuple[float, float, float]:
    """The verdict layer's ratio a / b with its interval (:func:`ratio_interval`, 95 %),
    rescaled to `level` on the log scale with the same Welch degrees of freedom."""
    ratio, low, high = (
        float(x[0])
        for x in ratio_interval(
            np.array([mean_a]),
            np.array([sd_a]),
            np.array([n_a]),
            np.array([mean_b]),
            np.array([sd_b]),
            np.array([n_b]),
        )
    )
    if abs(level - 0.95) < 1e-12 or not (math.isfinite(low) and math.isfinite(high)):
        return ratio, low, high
    va, vb = (sd_a / mean_a) ** 2 / n_a, (sd_b / mean_b) ** 2 / n_b
    dof = (
        (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
        if va + vb > 0
        else min(n_a, n_b) - 1
    )
    scale = t_at(level, dof) / float(t_quantile(dof)[0])
    return ratio, ratio * (low / ratio) ** scale, ratio * (high / ratio) ** scale


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Constraint:
    """A bound on a results column: ``kind`` "max" (at most) or "min" (at least)."""

    column: str
    kind: str
    bound: float

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.column}"

    def holds(self, value: float) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value <= self.bound if self.kind == "max" else value >= self.bound

    def text(self) -> str:
        return f"{self.column} {'<=' if self.kind == 'max' else '>='} {self.bound:g}"


def objective_of(name: str) -> tuple[str, bool, str]:
    """(results column, lower is better, predicted column) of an objective name."""
    if name in OBJECTIVES:
        return OBJECTIVES[name]
    for key, spec in OBJECTIVES.items():
        if name == spec[0]:
            return OBJECTIVES[key]
    raise BmoeError(f"objective {name!r}: one of {', '.join(OBJECTIVES)}")


def derived_columns(results: pd.DataFrame) -> pd.DataFrame:
    """`results` with the columns constraints name in MB: ``rss_mb`` (the peak resident set,
    from the rows or else the sidecar) and ``mem_available_mb`` (the lowest MemAvailable)."""
    out = results.copy()

    def mb(*cols: str) -> pd.Series:
        value = pd.Series(np.nan, index=out.index)
        for col in cols:
            if col in out:
                value = value.fillna(pd.to_numeric(out[col], errors="coerce") * 1024.0)
        return value

    out["rss_mb"] = mb("rows_rss_max_gb", "peak_rss_gb")
    out["mem_available_mb"] = mb("rows_mem_available_min_gb", "mem_floor_gb")
    return out


# ----------------------------------------------------------------------------- measurements


def measured_cells(
    results: pd.DataFrame,
    cells: Sequence[str],
    objective: str,
    lower_is_better: bool,
    constraints: Sequence[Constraint],
) -> pd.DataFrame:
    """Per candidate cell with a completed run: ``n``, the score's ``mean`` and ``sd``, the
    objective's own mean (``value``), the worst value of each constrained column
    (``worst_<column>``), ``feasible`` and ``broken`` (the constraints it breaks, or why they
    could not be checked)."""
    cols = ["cell", "n", "mean", "sd", "value", "feasible", "broken"]
    frame = derived_columns(results) if len(results) else results
    if frame.empty or "status" not in frame:
        return pd.DataFrame(columns=cols)
    ok = frame[(frame["status"] == "ok") & frame["cell"].astype(str).isin(set(cells))]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    value = (
        pd.to_numeric(ok[objective], errors="coerce")
        if objective in ok
        else pd.Series(np.nan, index=ok.index)
    )
    score = 1.0 / value if lower_is_better else value
    keyed = pd.DataFrame({"cell": ok["cell"].astype(str), "score": score, "value": value})
    grouped = keyed.groupby("cell", sort=False)
    table = grouped.agg(
        n=("score", "count"), mean=("score", "mean"), sd=("score", "std"), value=("value", "mean")
    ).reset_index()
    broken: dict[str, list[str]] = {c: [] for c in table["cell"]}
    for con in constraints:
        values = (
            pd.to_numeric(ok[con.column], errors="coerce")
            if con.column in ok
            else pd.Series(np.nan, index=ok.index)
        )
        per = values.groupby(ok["cell"].astype(str), sort=False)
        worst = per.max() if con.kind == "max" else per.min()
        missing = per.apply(lambda v: bool(v.isna().any()))
        table[f"worst_{con.column}"] = table["cell"].map(worst)
        for cell in table["cell"]:
            if missing.get(cell, True):
                broken[cell].append(f"{con.column} not measured")
            elif not con.holds(float(worst[cell])):
                broken[cell].append(f"{con.column} {float(worst[cell]):.4g} breaks {con.text()}")
    table["broken"] = table["cell"].map(lambda c: "; ".join(broken[c]) or None)
    table["feasible"] = table["broken"].isna() & (table["n"] > 0)
    return table


def pooled_cv(measured: pd.DataFrame) -> tuple[float, float]:
    """The pooled coefficient of variation of the repeated cells and its degrees of freedom
    (:data:`SINGLE_RUN_CV` and infinity before any cell was repeated)."""
    rep = measured[(measured["n"] >= 2) & (measured["mean"] > 0)]
    if rep.empty:
        return SINGLE_RUN_CV, float("inf")
    dof = (rep["n"] - 1).astype(float)
    rel_var = (rep["sd"].fillna(0.0) / rep["mean"]) ** 2
    return float(np.sqrt((rel_var * dof).sum() / dof.sum())), float(dof.sum())


# ----------------------------------------------------------------------------- estimates


def estimates(
    candidates: pd.DataFrame,
    measured: pd.DataFrame,
    confidence: float,
    groups: Sequence[str] = (),
) -> pd.DataFrame:
    """Every candidate's estimate (score) and interval at `confidence` (see the module
    docstring). `candidates` has ``cell``, ``predicted`` (score, NaN when the profile cannot
    price it), ``predicted_low``, ``predicted_high`` and the axes in `groups` (those the
    profile cannot price: the prediction is corrected per group of their values)."""
    table = candidates.copy()
    m = measured.set_index("cell") if len(measured) else pd.DataFrame(columns=["n", "mean", "sd"])
    table["n"] = table["cell"].map(m["n"]).fillna(0).astype(int)
    table["mean"] = table["cell"].map(m["mean"])
    table["sd"] = table["cell"].map(m["sd"])
    pred = table["predicted"].astype(float)
    log_ratio = np.log(table["mean"] / pred)
    usable = (table["n"] > 0) & np.isfinite(log_ratio)
    key = (
        table[list(groups)].astype(str).agg("|".join, axis=1)
        if groups
        else pd.Series("", index=table.index)
    )
    by_group = log_ratio[usable].groupby(key[usable]).median()
    overall = float(log_ratio[usable].median()) if usable.any() else 0.0
    correction = key.map(by_group)
    own = correction.notna()  # corrected by measured cells of its own group
    residual = (log_ratio - correction)[usable]
    scatter = float(np.sqrt(np.mean(residual**2))) if usable.sum() >= 3 else DEFAULT_SCATTER
    scatter = max(scatter, 0.02)
    # a group none of whose cells ran takes the overall correction, with twice the scatter
    spread = pd.Series(np.where(own, scatter, 2 * max(scatter, DEFAULT_SCATTER)), index=table.index)
    correction = correction.fillna(overall)
    z = (
        t_at(confidence, max(int(usable.sum()) - 1, 1))
        if usable.sum() >= 3
        else t_at(confidence, 1000)
    )
    factor = np.exp(correction)
    corrected = pred * factor
    low = np.fmin(table["predicted_low"] * factor, corrected * np.exp(-z * spread))
    high = np.fmax(table["predicted_high"] * factor, corrected * np.exp(z * spread))
    cv, cv_dof = pooled_cv(measured) if len(measured) else (SINGLE_RUN_CV, float("inf"))
    priced = np.isfinite(pred)
    est = corrected.where(priced, np.nan)
    lo = low.where(priced, 0.0)
    hi = high.where(priced, np.inf)
    source = pd.Series(
        np.where(priced, np.where(own, "predicted", "predicted, uncorrected"), "unknown"),
        index=table.index,
    )
    one = table["n"] == 1
    t1 = t_at(confidence, cv_dof) if math.isfinite(cv_dof) else t_at(confidence, 1000)
    est = est.where(~one, table["mean"])
    lo = lo.where(~one, table["mean"] * (1 - t1 * cv))
    hi = hi.where(~one, table["mean"] * (1 + t1 * cv))
    source = source.where(~one, "measured once")
    many = table["n"] >= 2
    tn = table["n"].clip(lower=2).astype(float)
    tq = np.array([t_at(confidence, d) for d in (tn - 1)])
    half = tq * table["sd"].fillna(0.0) / np.sqrt(tn)
    est = est.where(~many, table["mean"])
    lo = lo.where(~many, table["mean"] - half)
    hi = hi.where(~many, table["mean"] + half)
    source = source.where(~many, "measured")
    # a measured cell's estimate leans on its prediction as much as the two are precise: the
    # measurement's relative variance cv^2 / n against the prediction's scatter^2 (log scale)
    blend = table["n"].ge(1) & priced & (table["mean"] > 0)
    w_run = table["n"] / max(cv, 0.02) ** 2
    w_pred = 1.0 / spread**2
    mixed = np.exp(
        (
            np.log(table["mean"].where(blend, 1.0)) * w_run
            + np.log(corrected.where(blend, 1.0)) * w_pred
        )
        / (w_run + w_pred)
    )
    est = est.where(~blend, mixed)
    table["estimate"], table["low"], table["high"], table["source"] = est, lo, hi, source
    table["correction"] = np.exp(correction)
    table.attrs["scatter"] = scatter
    return table


# ----------------------------------------------------------------------------- exclusion


def excluded_by_fidelity(
    candidates: pd.DataFrame,
    axes: Sequence[str],
    measured: pd.DataFrame,
    constraints: Sequence[Constraint],
) -> dict[str, str]:
    """Cells not yet run that a measured cell implies break a fidelity constraint: the
    measured cell broke it and the other is at least as lossy (at least as much dropping, at
    most its cache and its experts, the same on every other axis but the read lanes)."""
    fid = [c for c in constraints if c.column in FIDELITY_COLUMNS]
    if not fid or measured.empty:
        return {}
    lossy = [a for a in axes if LOSSY_AXES.get(a)]
    fixed = [a for a in axes if a not in lossy and a not in OUTPUT_NEUTRAL_AXES]
    cand = candidates.set_index("cell")
    ran = set(measured["cell"])
    out: dict[str, str] = {}
    for con in fid:
        col = f"worst_{con.column}"
        if col not in measured:
            continue
        values = pd.to_numeric(measured[col], errors="coerce")
        breakers = measured[values.notna() & ~values.map(lambda v, c=con: c.holds(float(v)))]
        for cell in breakers["cell"]:
            if cell not in cand.index:
                continue
            ref = cand.loc[cell]
            same = np.ones(len(cand), dtype=bool)
            for a in fixed:
                same &= (cand[a].astype(str) == str(ref[a])).to_numpy()
            for a in lossy:
                have = pd.to_numeric(cand[a], errors="coerce").to_numpy(float)
                mine = float(pd.to_numeric(pd.Series([ref[a]]), errors="coerce").iloc[0])
                same &= have >= mine if LOSSY_AXES[a] > 0 else have <= mine
            for other in cand.index[same]:
                if other != cell and other not in ran:
                    out.setdefault(other, f"no less lossy than {cell}, which broke {con.text()}")
    return out


# ----------------------------------------------------------------------------- decisions


#: How the recommendation chooses among cells not distinguishable from the best.
CHEAPER_RULE = (
    "lossless over lossy, then the smaller cache, then fewer read lanes, then less prefetch"
)


def cost_key(params: Mapping[str, Any], lossless: bool) -> tuple[float, ...]:
    """A cell's cost for :data:`CHEAPER_RULE` (lower is cheaper): lossy or not, its cache
    budget (MiB; no budget costs the most), its read lanes, its prefetch depth."""

    def number(key: str, default: float) -> float:
        value = _num(params.get(key, default))
        return value if math.isfinite(value) else default

    return (
        0.0 if lossless else 1.0,
        number("cache_mb", math.inf),
        number("io_threads", 0.0),
        number("prefetch", 0.0),
    )


@dataclass
class Recommendation:
    """The cell to ship, the cell it was compared with last and that comparison (the
    recommended over the runner-up), and the reasons it is not simply the fastest mean."""

    cell: str | None
    runner_up: str | None = None
    ratio: tuple[float, float, float] | None = None
    distinguishable: bool | None = None
    reasons: list[str] = field(default_factory=list)


def recommend(
    table: pd.DataFrame,
    feasible: Mapping[str, bool],
    *,
    confidence: float,
    min_repeats: int,
    costs: Mapping[str, tuple[float, ...]],
    labels: Mapping[str, str] | None = None,
    unit: Any = None,
) -> Recommendation:
    """The recommendation from `table` (:func:`estimates`; the measured ``n``, ``mean`` and
    ``sd`` of each cell's score): the best measured mean among the feasible cells measured at
    least `min_repeats` times (among all the feasible measured cells when none was), then the
    cheapest by `costs` (:func:`cost_key`) of it and the cells (measured twice or more) not
    distinguishable from it at `confidence`. `unit` turns a score back into the objective
    for the reasons' figures."""
    labels = labels or {}
    name = lambda c: labels.get(c, c)  # noqa: E731
    show = unit or (lambda v: v)
    t = table.set_index("cell")
    good = [c for c in t.index if feasible.get(c) and t.at[c, "n"] > 0]
    if not good:
        return Recommendation(None)
    mean = lambda c: _num(t.at[c, "mean"])  # noqa: E731
    firm = [c for c in good if t.at[c, "n"] >= min_repeats]
    pool = firm or good
    reasons: list[str] = []
    top = max(pool, key=lambda c: (mean(c), int(t.at[c, "n"])))
    passed = sorted((c for c in good if c not in pool and mean(c) > mean(top)), key=mean)
    if passed:
        c = passed[-1]
        n = int(t.at[c, "n"])
        reasons.append(
            f"{len(passed)} cell(s) measured fewer than {min_repeats} times looked faster "
            f"({name(c)}: {show(mean(c)):.4g} from {n} run{'s' if n > 1 else ''}); a cell "
            f"measured {min_repeats} times is recommended over a cell measured fewer times"
        )
    if not firm:
        reasons.append(
            f"no cell was measured {min_repeats} times: the recommendation is the best mean "
            f"of cells measured fewer than {min_repeats} times"
        )

    def tied(c: str) -> bool:
        if t.at[c, "n"] < 2 or t.at[top, "n"] < 2:
            return False
        low = _cells_ratio(t, confidence, top, c)[1]
        return not (math.isfinite(low) and low > 1.0)

    ties = [c for c in good if c != top and tied(c)]
    cost = lambda c: (costs.get(c, (math.inf,)), -mean(c))  # noqa: E731
    chosen = min([top, *ties], key=cost)
    if chosen != top:
        r = _cells_ratio(t, confidence, top, chosen)
        reasons.append(
            f"{name(top)} measured {r[0]:.2f}x {name(chosen)}, but {r[1]:.2f} to {r[2]:.2f} "
            f"includes 1: not distinguishable, so the cheaper is recommended ({CHEAPER_RULE})"
        )
    others = [c for c in good if c != chosen]
    if not others:
        return Recommendation(chosen, reasons=reasons)
    runner_up = top if chosen != top else max(others, key=lambda c: (mean(c), t.at[c, "n"]))
    ratio = _cells_ratio(t, confidence, chosen, runner_up)
    distinguishable = bool(math.isfinite(ratio[1]) and ratio[1] > 1.0)
    return Recommendation(chosen, runner_up, ratio, distinguishable, reasons)


def runs_to_settle(
    table: pd.DataFrame,
    incumbent: str,
    pending: Sequence[str],
    *,
    confidence: float,
    min_repeats: int,
    max_repeats: int,
) -> int:
    """About how many more runs would settle `incumbent` against the `pending` cells: each
    pair to as many runs a side as the pooled spread needs for their ratio's interval (at
    `confidence`) to leave out 1, at least `min_repeats` and at most `max_repeats` (where
    cells not told apart count as equivalent)."""
    t = table.set_index("cell")
    cv, _ = pooled_cv(t.reset_index())
    est = lambda c: _num(t.at[c, "mean"] if t.at[c, "n"] else t.at[c, "estimate"])  # noqa: E731
    need_inc = 0
    total = 0
    for c in pending:
        gap = abs(math.log(est(incumbent) / est(c))) if est(c) > 0 < est(incumbent) else 0.0
        side = max_repeats
        for m in range(max(min_repeats, 2), max_repeats + 1):
            if gap > t_at(confidence, 2 * m - 2) * cv * math.sqrt(2.0 / m):
                side = m
                break
        total += max(side - int(t.at[c, "n"]), 0)
        need_inc = max(need_inc, side - int(t.at[incumbent, "n"]))
    return total + max(need_inc, 0)


@dataclass
class Decision:
    """One round's reading of the candidates: the best cell so far, what could still beat
    it, the runs chosen to find out, and whether it is settled."""

    incumbent: str | None
    contenders: list[str]
    chosen: list[tuple[str, str]]  # (cell, why)
    settled: bool
    sentence: str
    runner_up: str | None = None
    distinguishable: bool | None = None
    ratio: tuple[float, float, float] | None = None
    table: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: About how many more runs would settle it (0 when settled; :func:`runs_to_settle`).
    more_runs: int = 0


def decide(
    table: pd.DataFrame,
    feasible: Mapping[str, bool],
    excluded: Mapping[str, str],
    *,
    confidence: float,
    slots: int,
    min_repeats: int = 3,
    max_repeats: int = 5,
    labels: Mapping[str, str] | None = None,
    lossless: Sequence[str] = (),
) -> Decision:
    """Read `table` (:func:`estimates`): the incumbent (the best measured feasible cell by
    its mean score), the contenders (cells neither infeasible nor excluded whose interval
    reaches the incumbent's low end), whether the incumbent is settled against them, and up
    to `slots` runs (one per cell) that can still change the answer. Until a cell is known
    to meet every constraint, the best of the `lossless` cells (those whose output is the
    unmodified model's, so a fidelity floor cannot fail them) is run beside the best
    estimate."""
    labels = labels or {}
    name = lambda c: labels.get(c, c)  # noqa: E731
    t = table.set_index("cell")
    measured_bad = {c for c, ok in feasible.items() if not ok}
    alive = [c for c in t.index if c not in measured_bad and c not in excluded]
    good = [c for c in alive if feasible.get(c) and t.at[c, "n"] > 0]
    chosen: list[tuple[str, str]] = []
    if not alive:
        return Decision(None, [], [], False, "every cell breaks a constraint", table=table)
    if good:
        incumbent = max(good, key=lambda c: (_num(t.at[c, "estimate"]), t.at[c, "n"]))
    else:  # the best estimate among the cells not known to break a constraint
        incumbent = max(alive, key=lambda c: (_num(t.at[c, "estimate"]), -int(t.at[c, "n"])))
    inc_low = _num(t.at[incumbent, "low"]) if t.at[incumbent, "n"] else 0.0
    contenders = [c for c in alive if c != incumbent and _num(t.at[c, "high"]) >= inc_low]
    contenders.sort(key=lambda c: -(_num(t.at[c, "high"]) - inc_low))
    n_inc = int(t.at[incumbent, "n"])

    # Settled: every contender measured enough and worse (or at its bound, not distinguishable)
    pending: list[str] = []
    tied: list[str] = []
    closest: tuple[str, tuple[float, float, float]] | None = None
    if good and n_inc >= min_repeats:
        for c in contenders:
            if t.at[c, "n"] < min_repeats:
                pending.append(c)
                continue
            r = _cells_ratio(t, confidence, incumbent, c)
            if closest is None or r[0] < closest[1][0]:
                closest = (c, r)
            if not (math.isfinite(r[1]) and r[1] > 1.0):
                if t.at[c, "n"] >= max_repeats and n_inc >= max_repeats:
                    tied.append(c)
                else:
                    pending.append(c)
    else:
        pending = contenders
    settled = bool(good) and n_inc >= min_repeats and not pending

    # The runs that can still change the answer
    if not settled:
        if n_inc < min_repeats or (not good):
            why = "the best so far, repeated" if n_inc else "the predicted best"
            chosen.append((incumbent, why))
        safe = [c for c in alive if c in set(lossless) and c != incumbent]
        if not good and safe:
            best_safe = max(safe, key=lambda c: (_num(t.at[c, "estimate"]), -int(t.at[c, "n"])))
            if t.at[best_safe, "n"] < min_repeats:
                chosen.append((best_safe, "the best cell that leaves the output unchanged"))
                pending = [c for c in pending if c != best_safe]
        for c in pending:
            if len(chosen) >= slots:
                break
            n = int(t.at[c, "n"])
            if n >= max_repeats:
                continue
            why = (
                f"its interval reaches the best's ({t.at[c, 'source']})"
                if n == 0
                else f"not yet distinguishable from the best after {n} run(s)"
            )
            chosen.append((c, why))
        if (
            good
            and n_inc < max_repeats
            and len(chosen) < slots
            and any(t.at[c, "n"] >= n_inc for c, _ in chosen if c != incumbent)
            and all(c != incumbent for c, _ in chosen)
        ):
            chosen.append((incumbent, "the best so far, repeated to compare"))
        chosen = chosen[:slots]
    runner_up = None
    if good:
        others = [c for c in good if c != incumbent]
        if others:
            runner_up = max(others, key=lambda c: t.at[c, "mean"])
    ratio = None
    distinguishable = None
    if runner_up is not None:
        ratio = _cells_ratio(t, confidence, incumbent, runner_up)
        distinguishable = bool(math.isfinite(ratio[1]) and ratio[1] > 1.0)
    if settled:
        sentence = f"{name(incumbent)} is settled as the best"
        if tied:
            sentence += (
                f"; {len(tied)} cell(s) are not distinguishable from it after "
                f"{max_repeats} runs each (equivalent within the noise)"
            )
        elif contenders:
            sentence += f"; each of the {len(contenders)} cell(s) that could reach it is worse"
        else:
            sentence += "; no other cell's interval reaches it"
    elif not good:  # nothing measured meets every constraint: no "best so far" to name
        sentence = "no cell measured yet meets every constraint; " + (
            f"the predicted best is {name(incumbent)}, and {len(contenders)} other cell(s) "
            "could reach it"
            if chosen
            else "nothing is left to run"
        )
    elif not chosen:
        sentence = (
            f"{name(incumbent)} is the best found; the cells that could still beat it "
            f"are at their repeat bound ({max_repeats})"
        )
    else:
        sentence = (
            f"{name(incumbent)} is the best so far; {len(contenders)} cell(s) could still reach it"
        )
    more = 0
    if not settled:
        more = runs_to_settle(
            table, incumbent, pending, confidence=confidence,
            min_repeats=min_repeats, max_repeats=max_repeats,
        )  # fmt: skip
    return Decision(
        incumbent, contenders, chosen, settled, sentence, runner_up, distinguishable, ratio,
        table, more,
    )  # fmt: skip


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return v if not math.isnan(v) else float("-inf")


def _cells_ratio(t: pd.DataFrame, level: float, a: str, b: str) -> tuple[float, float, float]:
    """:func:`ratio_at` of cell `a`'s mean score over cell `b`'s, from the estimates table."""
    return ratio_at(
        level,
        t.at[a, "mean"], _sd(t, a), t.at[a, "n"],
        t.at[b, "mean"], _sd(t, b), t.at[b, "n"],
    )  # fmt: skip


def _sd(t: pd.DataFrame, cell: str) -> float:
    sd = t.at[cell, "sd"]
    return 0.0 if sd is None or not math.isfinite(float(sd)) else float(sd)
