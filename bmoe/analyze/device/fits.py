"""How a term is fitted and how settled it is: the fits, volume groups, spread, provenance.

Least-squares fits with non-negative coefficients, as the profile's terms need them, and
the grouping of runs by the volume they read a token that the per-volume figures share.

How settled a term of the profile is: the spread of its per-run means and of its means
over blocks of tokens, and the record of where it came from.

A term's ``sd_rel`` (the spread an interval is built from) is how much a repeat of one
configuration moves the term's mean: the runs' ratios to the term's model, each against the
mean of its configuration's runs, pooled over the configurations run more than once; never
less than what a run's drift from quarter to quarter implies: a run's mean moves by the
quarters' relative sd over the square root of their number, and a prediction from one run
compared with another run moves by that times the square root of two. How far whole
configurations sit from the term's model is not a repeat's noise but the model's error,
which the profile measures on its own by holding configurations out
(:mod:`bmoe.analyze.device.build`); counting it here as well counted it twice.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a + b x by least squares, with a, b >= 0 (a constant when x does not vary)."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return 0.0, 0.0
    if np.ptp(x) == 0:
        if x[0] > 0:
            return 0.0, float(np.mean(y) / x[0])
        return float(max(np.mean(y), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(np.mean(y), 0.0)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)


def fit_two(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a x1 + b x2 by least squares with a, b >= 0 (no intercept); where the two do not
    separate (collinear), all of it on x2."""
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    if not len(y) or not np.any(x2 > 0):
        return 0.0, 0.0
    design = np.column_stack([x1, x2])
    if np.linalg.matrix_rank(design) == 2 and np.linalg.cond(design) < 1e6:
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if a >= 0 and b >= 0:
            return float(a), float(b)
        if b > 0 and a < 0:
            return 0.0, float(np.sum(x2 * y) / np.sum(x2 * x2))
    return 0.0, float(max(np.sum(y), 0.0) / np.sum(x2))


#: Runs whose read volumes a token are within this factor count as one volume.
SAME_VOLUME = 1.25


def volume_groups(points: Sequence[tuple[float, T]]) -> list[list[tuple[float, T]]]:
    """`points` (MiB read a token, anything) in ascending volume, cut where a volume is more
    than :data:`SAME_VOLUME` times the first of its group (volumes under 1 MiB count as 1)."""
    groups: list[list[tuple[float, T]]] = []
    for mib, item in sorted(points, key=lambda point: point[0]):
        if groups and mib <= max(groups[-1][0][0], 1.0) * SAME_VOLUME:
            groups[-1].append((mib, item))
        else:
            groups.append([(mib, item)])
    return groups


#: A term whose contributing runs' means differ by more than this (%, max over min) is
#: unsettled: the runs disagree about it.
RUNS_DISAGREE_PCT = 25.0
#: Tokens per block when a run's tokens are cut into blocks for the spread of a term's mean.
BLOCK_TOKENS = 16
#: A term whose mean is uncertain by more than this (%, standard error from its block means)
#: is unsettled.
TERM_SE_PCT = 10.0
#: Parts a run is cut into for how much its mean drifts (the interval's width).
RUN_PARTS = 4


def _block_ratios(values: np.ndarray, model: np.ndarray, parts: int | None = None) -> np.ndarray:
    """Per block of :data:`BLOCK_TOKENS` consecutive tokens (at least two where there are 4
    tokens or more; or `parts` equal blocks), measured over modelled: sum(values) /
    sum(model)."""
    keep = np.isfinite(values) & np.isfinite(model)
    values, model = values[keep], model[keep]
    n = len(values)
    if not n:
        return np.asarray([])
    k = 1 if n < 4 else (min(parts, n) if parts else max(2, n // BLOCK_TOKENS))
    out = []
    for v, m in zip(np.array_split(values, k), np.array_split(model, k), strict=True):
        if m.sum() > 0:
            out.append(v.sum() / m.sum())
    return np.asarray(out)


def _drift(values: dict[str, np.ndarray], model: dict[str, np.ndarray]) -> float:
    """How far a quarter of a run strays from its run (relative sd), pooled over runs."""
    quarters = [_block_ratios(values[n], model[n], RUN_PARTS) for n in values]
    spreads = [np.std(q / q.mean(), ddof=1) for q in quarters if len(q) > 1 and q.mean() > 0]
    return float(np.sqrt(np.mean(np.square(spreads)))) if spreads else 0.0


def _repeat_cv(ratios: Mapping[str, float], configs: Mapping[str, Hashable] | None) -> float:
    """The relative sd of a repeat's ratio about its configuration's mean, pooled over the
    configurations with two runs or more (every run one configuration without `configs`);
    NaN when no configuration was repeated."""
    groups: dict[Hashable, list[float]] = {}
    for name, ratio in ratios.items():
        groups.setdefault(configs.get(name, name) if configs else 0, []).append(ratio)
    squares, dof = 0.0, 0
    for values in groups.values():
        arr = np.asarray(values)
        if len(arr) > 1 and arr.mean() > 0:
            squares += float(np.sum(np.square(arr / arr.mean() - 1.0)))
            dof += len(arr) - 1
    return float(np.sqrt(squares / dof)) if dof else float("nan")


def _run_ratios(values: dict[str, np.ndarray], model: dict[str, np.ndarray]) -> dict[str, float]:
    """Per run, its measured total over its modelled total."""
    out = {}
    for name in values:
        keep = np.isfinite(values[name]) & np.isfinite(model[name])
        total = float(model[name][keep].sum())
        if total > 0:
            out[name] = float(values[name][keep].sum()) / total
    return out


def term_spread(
    per_run: Mapping[str, np.ndarray],
    fitted: Mapping[str, np.ndarray] | None = None,
    configs: Mapping[str, Hashable] | None = None,
) -> dict[str, Any]:
    """How settled a term is, from its per-token values in each run it came from, as ratios
    to what the term's model says per token (`fitted`: its fit, where the term depends on the
    reads; else its mean): the mean, each run's ratio, the coefficient of variation of the
    ratios over blocks of tokens (within runs), over runs, and over repeats of a
    configuration (`configs`: each run's configuration key), the standard error of the mean
    from the blocks, and ``sd_rel``, how much a repeat moves the term's mean (see the module
    docstring)."""
    values = {n: np.asarray(v, dtype=np.float64) for n, v in per_run.items()}
    every: np.ndarray = (
        np.concatenate([v[np.isfinite(v)] for v in values.values()]) if values else np.array([])
    )
    mean = float(np.mean(every)) if len(every) else float("nan")
    if fitted is None:
        model = {n: np.full(len(v), mean) for n, v in values.items()}
    else:
        model = {n: np.asarray(fitted[n], dtype=np.float64) for n in values}
    blocks = [_block_ratios(values[n], model[n]) for n in values]
    ratios = np.concatenate(blocks) if blocks else np.asarray([])
    drift = _drift(values, model)
    run_ratio = _run_ratios(values, model)
    centre = float(np.mean(ratios)) if len(ratios) else 1.0
    block_cv = float(np.std(ratios, ddof=1) / centre) if len(ratios) > 1 and centre > 0 else 0.0
    se = block_cv / np.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    run_values = np.asarray(list(run_ratio.values()))
    if len(run_values) > 1 and run_values.mean() > 0:
        run_cv = float(np.std(run_values, ddof=1) / run_values.mean())
        disagree = float(100.0 * (run_values.max() / max(run_values.min(), 1e-12) - 1.0))
    else:
        run_cv, disagree = float("nan"), 0.0
    repeat_cv = _repeat_cv(run_ratio, configs)
    floor = drift * float(np.sqrt(2.0 / RUN_PARTS))
    return {
        "value": mean,
        "p10": float(np.quantile(every, 0.1)) if len(every) else float("nan"),
        "p90": float(np.quantile(every, 0.9)) if len(every) else float("nan"),
        "run_means": {n: float(np.nanmean(v)) for n, v in values.items() if np.isfinite(v).any()},
        "run_ratios": run_ratio,
        "block_cv_pct": 100.0 * block_cv,
        "se_pct": 100.0 * se,
        "run_cv_pct": 100.0 * run_cv if run_cv == run_cv else None,
        "runs_disagree_pct": disagree,
        "drift_cv_pct": 100.0 * drift,
        "repeat_cv_pct": 100.0 * repeat_cv if repeat_cv == repeat_cv else None,
        "sd_rel": max(floor, repeat_cv) if repeat_cv == repeat_cv else floor,
        "tokens": len(every),
    }


#: Run means a term's note lists one by one (more are given as their range).
MEANS_LISTED = 6


def provenance(
    runs: Sequence[str], columns: Sequence[str], spread: dict[str, Any], note: str = ""
) -> dict[str, Any]:
    """A term's record: where it came from, its spread, and whether it is settled (with why
    not: the runs disagree about it by more than :data:`RUNS_DISAGREE_PCT` %, or its mean is
    uncertain by more than :data:`TERM_SE_PCT` %)."""
    why = []
    if spread.get("runs_disagree_pct", 0.0) > RUNS_DISAGREE_PCT:
        values = list(spread["run_means"].values())
        means = (
            ", ".join(f"{v:.3g}" for v in values)
            if len(values) <= MEANS_LISTED
            else f"{min(values):.3g} to {max(values):.3g} over {len(values)} runs"
        )
        why.append(f"its runs disagree by {spread['runs_disagree_pct']:.0f} % (run means {means})")
    if spread.get("se_pct", 0.0) > TERM_SE_PCT:
        why.append(
            f"its mean is uncertain by +-{spread['se_pct']:.0f} % (tokens vary by "
            f"{spread['block_cv_pct']:.0f} % from block to block)"
        )
    return {
        "runs": list(runs),
        "columns": list(columns),
        **spread,
        "settled": not why,
        "why": "; ".join(why) or None,
        "note": note or None,
    }


__all__ = [
    "BLOCK_TOKENS",
    "RUNS_DISAGREE_PCT",
    "RUN_PARTS",
    "SAME_VOLUME",
    "TERM_SE_PCT",
    "fit_line",
    "fit_two",
    "provenance",
    "term_spread",
    "volume_groups",
]
