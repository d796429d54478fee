"""Is B really faster than A? Differences with bootstrap intervals, and refusals where not.

Two metrics files answer "which is faster" only if nothing but the configuration under test
differs between them and both measured what a benchmark measures. :func:`concerns` applies
the telemetry contract's traps; the ones that make a comparison meaningless *refuse* (raise
:class:`NotComparable` unless forced), the others *warn* and travel with the result:

refuse
    different model (or architecture) or ``n_expert_used``; one speculated run
    (``spec=mtp|ngram``) against an unspeculated one, or two different draft sources; an
    instrumented run (``predict_log=1``, ``prefetch_sync=1``, ``compute_trace_layers>0``, or a
    route/compute/io trace recorded alongside); a partial run.
warn
    ``temp>0`` (stochastic: different tokens, different routing); ``load_all=1`` (its reads
    mean something else); dropping on one side only, or a drop run whose drop rate the file
    does not record; no preamble (model and top-k cannot be checked); a run too short for a
    steady state (the interval then covers every token).

Throughput differences are bootstrapped over steady-state tokens (see
:func:`bmoe.analyze.metrics.steady_state`): tokens of each run are resampled independently
(numpy, seeded), and the percentile interval of B - A is reported for the mean tok/s
(tokens / seconds) and the median per-token rate. Tokens are treated as exchangeable, which
ignores their autocorrelation, so read the interval as a lower bound on the uncertainty.
A window of fewer than three tokens on either side gets no interval (a warning says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.metrics import per_token, run_summary, steady_state
from bmoe.analyze.stall import stall_attribution
from bmoe.analyze.verdict import MIN_REPEATS
from bmoe.errors import BmoeError
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.runfiles import RunFiles

REFUSE = "refuse"
WARN = "warn"

CONCERN_COLUMNS = ["level", "run", "reason"]


class NotComparable(BmoeError):
    """The runs measure different things; `reasons` lists why."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__(
            "not comparable: " + "; ".join(reasons) + " (force=True / --force compares anyway)"
        )


@dataclass
class Comparison:
    """B against A: the figures side by side, and every concern raised on the way."""

    a: str
    b: str
    table: pd.DataFrame  # figure, a, b, delta, delta_pct, ci_low, ci_high
    concerns: pd.DataFrame  # level, run, reason
    method: dict[str, Any]  # windows, interval, and where each attributed term came from


def _as_files(run: RunFiles | MetricsRun) -> RunFiles:
    return run if isinstance(run, RunFiles) else RunFiles(run)


def _name(files: RunFiles) -> str:
    return Path(files.path).name if files.path else "<input>"


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value > 0
    return False


def _spec(params: dict[str, Any]) -> str:
    spec = params.get("spec")
    if spec is None and params.get("mtp") is True:
        return "mtp"
    return str(spec) if spec is not None else "off"


# ----------------------------------------------------------------------------- concerns


def run_concerns(files: RunFiles) -> list[tuple[str, str]]:
    """(level, reason) for problems of one run on its own."""
    run, params = files.run, files.run.params
    out: list[tuple[str, str]] = []
    probes = [k for k in ("predict_log", "prefetch_sync") if _truthy(params.get(k))]
    if _truthy(params.get("compute_trace_layers")):
        probes.append(f"compute_trace_layers={params['compute_trace_layers']}")
    if probes:
        out.append((REFUSE, f"instrumented run ({', '.join(probes)}): not a benchmark run"))
    if files.traces:
        names = ", ".join(Path(t).name for t in files.traces)
        out.append((REFUSE, f"instrumented run: trace(s) recorded alongside ({names})"))
    if run.partial:
        said = run.summary.get("tokens")
        state = (
            f"its summary says tokens={said}" if run.summaries else "no summary: the run was killed"
        )
        target = f"of {run.steps} steps" if run.steps is not None else "rows"
        out.append((REFUSE, f"partial run: {run.tokens} {target} ({state})"))
    temp = params.get("temp")
    if isinstance(temp, int | float) and temp > 0:
        out.append((WARN, f"temp={temp:g}: stochastic, tokens (and routing) differ run to run"))
    if _truthy(params.get("load_all")):
        out.append((WARN, "load_all=1: reads the whole expert set; its reads are not selective"))
    drop = params.get("drop_cold_frac")
    recorded = any("experts_dropped" in s and "experts_routed" in s for s in run.summaries)
    if isinstance(drop, int | float) and drop > 0 and not recorded:
        out.append(
            (WARN, f"drop_cold_frac={drop:g} but the file does not record its drop rate "
                   "(experts_dropped/experts_routed): the hit rate is inflated by an "
                   "unknown amount")
        )  # fmt: skip
    if not params:
        out.append((WARN, "no preamble: model, n_expert_used and speculation cannot be checked"))
    steady = steady_state(per_token(run))
    if steady.warmup_tokens is None:
        out.append((WARN, f"no steady state ({steady.reason}): intervals use every token"))
    return out


def pair_concerns(a: RunFiles, b: RunFiles) -> list[tuple[str, str]]:
    """(level, reason) for what differs between A and B that should not."""
    pa, pb = a.run.params, b.run.params
    out: list[tuple[str, str]] = []
    for key in ("model", "arch", "n_expert_used"):
        va, vb = pa.get(key), pb.get(key)
        if key == "model" and isinstance(va, str) and isinstance(vb, str):
            va, vb = Path(va).name, Path(vb).name
        if va is not None and vb is not None and va != vb:
            out.append((REFUSE, f"different {key}: {va} vs {vb}"))
    if pa and pb:
        sa, sb = _spec(pa), _spec(pb)
        if sa != sb:
            if "off" in (sa, sb):
                out.append((REFUSE, f"speculation on one side only: spec={sa} vs spec={sb}"))
            else:
                out.append((REFUSE, f"different draft sources: spec={sa} vs spec={sb}"))
    da = float(pa.get("drop_cold_frac") or 0.0)
    db = float(pb.get("drop_cold_frac") or 0.0)
    if (da > 0) != (db > 0):
        out.append(
            (WARN, f"dropping on one side only (drop_cold_frac {da:g} vs {db:g}): a dropped "
                   "routing leaves the hit rate's ratio; read the drop % row next to it")
        )  # fmt: skip
    return out


def concerns(a: RunFiles | MetricsRun, b: RunFiles | MetricsRun) -> pd.DataFrame:
    """Every concern about comparing B with A, as rows of ``level, run, reason``."""
    fa, fb = _as_files(a), _as_files(b)
    rows = [
        {"level": lvl, "run": label, "reason": reason}
        for label, files in (("A", fa), ("B", fb))
        for lvl, reason in run_concerns(files)
    ]
    rows += [{"level": lvl, "run": "A/B", "reason": r} for lvl, r in pair_concerns(fa, fb)]
    return pd.DataFrame(rows, columns=CONCERN_COLUMNS)


# ----------------------------------------------------------------------------- statistics


def bootstrap_rates(
    wall_a: np.ndarray,
    wall_b: np.ndarray,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile intervals of B - A for mean tok/s and median per-token tok/s.

    `wall_a`, `wall_b` are per-token wall times (ms) of each run's window; each run's tokens
    are resampled with replacement independently, `n_boot` times, from one seeded generator.
    """
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 50 * (1 - confidence), 50 * (1 + confidence)

    def resample(wall: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(wall), size=(n_boot, len(wall)))
        sample = wall[idx]
        mean = len(wall) / (sample.sum(axis=1) / 1000.0)
        median = np.median(1000.0 / sample, axis=1)
        return mean, median

    mean_a, median_a = resample(wall_a)
    mean_b, median_b = resample(wall_b)
    out = {}
    for name, diff in (("mean", mean_b - mean_a), ("median", median_b - median_a)):
        low, high = np.percentile(diff, [lo_q, hi_q])
        out[name] = (float(low), float(high))
    return out


def _window(run: MetricsRun) -> tuple[np.ndarray, str]:
    tokens = per_token(run)
    steady = steady_state(tokens)
    wall = tokens["wall_ms"].to_numpy(dtype=float)
    if steady.warmup_tokens is None:
        wall, label = wall, f"all {len(wall)} tokens"
    else:
        wall, label = wall[steady.mask()], f"tokens {steady.warmup_tokens + 1}..{len(wall)}"
    return wall[wall > 0], label


def _row(figure: str, a: Any, b: Any, ci=(None, None), pct: bool = True) -> dict[str, Any]:
    delta = b - a if a is not None and b is not None else None
    delta_pct = 100.0 * delta / a if pct and delta is not None and a else None
    return {"figure": figure, "a": a, "b": b, "delta": delta, "delta_pct": delta_pct,
            "ci_low": ci[0], "ci_high": ci[1]}  # fmt: skip


def compare_runs(
    a: RunFiles | MetricsRun,
    b: RunFiles | MetricsRun,
    *,
    force: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Comparison:
    """B against A. Raises :class:`NotComparable` on a refusal unless `force`."""
    fa, fb = _as_files(a), _as_files(b)
    found = concerns(fa, fb)
    refusals = found[found["level"] == REFUSE]
    if len(refusals) and not force:
        raise NotComparable([f"{r.run}: {r.reason}" for r in refusals.itertuples()])
    sa = run_summary(fa.run, fa.pressure)
    sb = run_summary(fb.run, fb.pressure)
    wall_a, label_a = _window(fa.run)
    wall_b, label_b = _window(fb.run)
    rows = []
    method: dict[str, Any] = {
        "A window": label_a,
        "B window": label_b,
        "interval": f"{confidence:.0%} percentile bootstrap of B - A, {n_boot} resamples of "
        f"each run's window, seed {seed}",
        "all tokens": "reference figures (no interval)",
        "cache hit %": "cumulative at the end of the run; delta in points",
    }
    if len(wall_a) and len(wall_b):
        few = min(len(wall_a), len(wall_b))
        ci: dict[str, tuple[float | None, float | None]]
        if few >= MIN_REPEATS:
            ci = dict(bootstrap_rates(wall_a, wall_b, n_boot, seed, confidence))
        else:  # two tokens resample into a handful of values: no interval, and said why
            ci = {"mean": (None, None), "median": (None, None)}
            method["interval"] = f"none: too few tokens (n = {few})"
            reason = f"too few tokens (n = {few}) in a window for an interval"
            said = pd.DataFrame([{"level": WARN, "run": "A/B", "reason": reason}])
            found = pd.concat([found, said], ignore_index=True)
        mean_a = len(wall_a) / (wall_a.sum() / 1000.0)
        mean_b = len(wall_b) / (wall_b.sum() / 1000.0)
        med_a = float(np.median(1000.0 / wall_a))
        med_b = float(np.median(1000.0 / wall_b))
        rows.append(_row("tok/s mean (steady)", mean_a, mean_b, ci["mean"]))
        rows.append(_row("tok/s median (steady)", med_a, med_b, ci["median"]))
    rows.append(_row("tok/s mean (all tokens)", sa["tok_s_mean"], sb["tok_s_mean"]))
    rows.append(_row("tok/s median (all tokens)", sa["tok_s_median"], sb["tok_s_median"]))
    if sa["tok_s_effective"] is not None or sb["tok_s_effective"] is not None:
        rows.append(_row("tok/s effective", sa["tok_s_effective"], sb["tok_s_effective"]))
        method["tok/s effective"] = "1 / (1/tok_s + loop overhead per token)"
    rows.append(_row("cache hit %", sa["cache_hit_pct"], sb["cache_hit_pct"], pct=False))
    if sa["drop_cold_frac"] or sb["drop_cold_frac"]:
        rows.append(_row("drop %", sa["drop_pct"], sb["drop_pct"], pct=False))
        method["drop %"] = "experts_dropped / experts_routed; delta in points"
    rows.append(_row("MiB/token", sa["read_mib_per_token"], sb["read_mib_per_token"]))
    rows.append(_row("MiB/token (steady)", sa["steady_read_mib_per_token"],
                     sb["steady_read_mib_per_token"]))  # fmt: skip
    att_a = stall_attribution(fa.run)
    att_b = stall_attribution(fb.run)
    sum_a = att_a.summary.set_index("component")
    sum_b = att_b.summary.set_index("component")
    for component in sum_a.index:
        va = _plain(sum_a.at[component, "ms_per_token"])
        vb = _plain(sum_b.at[component, "ms_per_token"])
        rows.append(_row(f"{component} ms/token", va, vb))
        source_a, source_b = sum_a.at[component, "source"], sum_b.at[component, "source"]
        if component != "wall":
            same = source_a == source_b
            method[component] = source_a if same else f"A: {source_a}; B: {source_b}"
    return Comparison(fa.path or "A", fb.path or "B", pd.DataFrame(rows), found, method)


def _plain(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if np.isnan(value) else value


def compare_many(
    runs: Sequence[RunFiles | MetricsRun], *, force: bool = False, n_boot: int = 2000, seed: int = 0
) -> list[Comparison]:
    """Every run after the first against the first (the baseline)."""
    if len(runs) < 2:
        raise BmoeError("compare needs at least two metrics files (a baseline and a candidate)")
    base = runs[0]
    return [compare_runs(base, other, force=force, n_boot=n_boot, seed=seed) for other in runs[1:]]


__all__ = [
    "REFUSE",
    "WARN",
    "Comparison",
    "NotComparable",
    "bootstrap_rates",
    "compare_many",
    "compare_runs",
    "concerns",
    "pair_concerns",
    "run_concerns",
]
