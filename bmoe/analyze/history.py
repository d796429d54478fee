"""The same cells across archived sweeps: trends over engine versions and dates, and the
regressions between one sweep and the next, with their intervals, judged only where the
sweeps measured the same thing and each sweep's own ranking is settled.

Cells are lined up by their axis values (``cache_mb=8 io_threads=4``), not by their ids.
Sweeps are ordered by when they started. Before any step is judged, the sweeps are checked
for like with like (:func:`sweep_facts`, :func:`sweep_differences`):

not comparable
    a different base flag (``n_predict``, ``threads``, the prompt, ...), tracing on one side
    only or a different tracing, a different model (SHA-256 where both recorded it, else
    file name and shape), a different engine;
listed
    a different engine version, bmoe version or commit (what a history is there to follow),
    another host, CPU, device or kernel (each where both sweeps recorded it), a model SHA-256
    recorded on one side only.

A step from one sweep to the next is then, in this order: *not comparable* (no change or
ratio given), *too few repeats (n = 2)* or *not measurable* (fewer than three runs a side, or
an interval wider than the ratio: :func:`bmoe.analyze.verdict.ratio_caveats`), *not settled*
(either sweep's own ranking is not settled: :func:`bmoe.analyze.sweep.sweep_verdict`), and
only then a *regression* (worse by more than a threshold with the 95 % interval of the ratio
of means on the worse side of 1), an *improvement*, or *no change beyond noise*.

Pure functions of results tables (``results.parquet``, one row per attempt), given as a
mapping of sweep label to table; reading the folders is the caller's.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.sweep import (
    LOWER_IS_BETTER,
    axes_of,
    check_outcome,
    ok_attempts,
    sweep_verdict,
)
from bmoe.analyze.verdict import TRACE_PARAMS, Verdict, is_throughput, judged_ratio

#: Default regression threshold (% worse from one sweep to the next).
THRESHOLD_PCT = 5.0

#: Parameters that record traces or synchronise the engine: a sweep's tracing.
PROBE_PARAMS = (*TRACE_PARAMS, "predict_log", "prefetch_sync")

#: What a run recorded about its model's shape (a different shape is a different model).
SHAPE_COLUMNS = ("arch", "n_layer", "n_expert", "n_expert_used")

NOT_COMPARABLE = "not comparable"
LISTED = "listed"

SWEEP_COLUMNS = ["sweep", "name", "started", "engine", "cells", "runs", "failed", "ranking"]
LINED_COLUMNS = ["cell", "sweep", "started", "engine", "n", "mean", "sd", "min", "max"]
DIFFERENCE_COLUMNS = ["before", "after", "what", "value_before", "value_after", "effect"]
STEP_COLUMNS = [
    "cell", "before", "after", "mean_before", "mean_after", "change_pct", "ratio", "ratio_low",
    "ratio_high", "comparable", "settled", "regressed", "improved", "verdict", "sentence",
]  # fmt: skip


# ----------------------------------------------------------------------------- sweeps


def _engine(results: pd.DataFrame) -> str | None:
    """The engine and its version, as the runs recorded them."""
    parts: list[str] = []
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


def _order(sweeps: Mapping[str, pd.DataFrame]) -> list[str]:
    """Sweep labels oldest first (by their first start; unknown starts last, then by label)."""
    started = {label: _started(results) for label, results in sweeps.items()}
    known = sorted((t, label) for label, t in started.items() if t is not None)
    return [label for _, label in known] + sorted(k for k, t in started.items() if t is None)


def sweeps_table(
    sweeps: Mapping[str, pd.DataFrame], verdicts: Mapping[str, Verdict] | None = None
) -> pd.DataFrame:
    """One row per sweep, oldest first: its label, name, when it started (ISO 8601, UTC), the
    engine, cells, completed runs, attempts that failed, and whether its own ranking is
    settled (from `verdicts`, :func:`bmoe.analyze.sweep.sweep_verdict` per label)."""
    rows = []
    for label in _order(sweeps):
        results = sweeps[label]
        ok = ok_attempts(results)
        started = _started(results)
        verdict = verdicts.get(label) if verdicts else None
        rows.append({
            "sweep": label, "name": results.attrs.get("name"),
            "started": started.isoformat(timespec="seconds") if started is not None else None,
            "engine": _engine(ok if len(ok) else results),
            "cells": results["cell"].nunique() if "cell" in results else 0,
            "runs": len(ok), "failed": len(results) - len(ok),
            "ranking": None if verdict is None else "settled" if verdict.settled
            else "not settled",
        })  # fmt: skip
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def _canon(value: Any) -> str:
    """One spelling per value, whatever the table stored it as (``32``, ``32.0`` -> ``32``;
    ``True``, ``"true"`` -> ``true``)."""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | float | np.integer | np.floating):
        number = float(value)
        return f"{number:.0f}" if number.is_integer() else f"{number:g}"
    text = str(value)
    return text.lower() if text in ("True", "False") else text


def _values(frame: pd.DataFrame, column: str) -> str | None:
    """The distinct values of `column` (", "-joined), None when nothing recorded one."""
    if column not in frame:
        return None
    values = sorted({_canon(v) for v in frame[column].dropna()})
    return ", ".join(values) if values else None


def _on(value: Any) -> bool:
    return _canon(value) not in ("", "0", "false", "none", "off")


def sweep_facts(results: pd.DataFrame) -> dict[str, str | None]:
    """What a sweep measured with, one text per fact (None: not recorded): each base flag
    (``base <flag>``, the parameters that are not axes), its tracing, the model's SHA-256,
    file name and shape, the engine and its version, the bmoe version, the commit of the
    configuration's repository, and the machine (host, CPU, device, kernel)."""
    ok = ok_attempts(results)
    runs = ok if len(ok) else results
    axes = set(axes_of(results))
    facts: dict[str, str | None] = {}
    params = [p for p in results.attrs.get("params", []) if p in runs.columns]
    for param in params:
        if param in axes or param == "model" or param in PROBE_PARAMS:
            continue
        facts[f"base {param}"] = _values(runs, param)
    probes = [p for p in PROBE_PARAMS if p in runs and runs[p].dropna().map(_on).any()]
    facts["tracing"] = ", ".join(probes) if probes else "none"
    facts["model SHA-256"] = _values(runs, "model_sha256")
    names = None
    for col in ("summary_model", "model"):
        if col in runs and col not in axes and runs[col].notna().any():
            names = sorted({PurePath(str(v)).name for v in runs[col].dropna()})
            break
    facts["model file"] = ", ".join(names) if names else None
    shape = [f"{c}={_values(runs, c)}" for c in SHAPE_COLUMNS if c not in axes
             and _values(runs, c) is not None]  # fmt: skip
    facts["model shape"] = " ".join(shape) or None
    facts["engine"] = _values(runs, "engine")
    facts["engine version"] = _values(runs, "summary_engine") or _values(
        runs, "machine_engine_build"
    )
    facts["bmoe version"] = _values(runs, "bmoe_version")
    facts["commit"] = _values(runs, "config_commit")
    facts["host"] = _values(runs, "host")
    facts["cpu"] = _values(runs, "machine_cpu_model")
    facts["device"] = _values(runs, "machine_device")
    facts["kernel"] = _values(runs, "machine_kernel")
    return facts


#: Facts that only describe where and with which version a sweep ran: listed, never a reason
#: to refuse the comparison (a history follows exactly these).
LISTED_FACTS = ("engine version", "bmoe version", "commit", "host", "cpu", "device", "kernel")


def sweep_differences(
    before: Mapping[str, str | None], after: Mapping[str, str | None]
) -> list[tuple[str, str | None, str | None, str]]:
    """What differs between two sweeps' :func:`sweep_facts`: ``(what, before, after, effect)``
    where effect is ``not comparable`` (they measured different things) or ``listed``."""
    out: list[tuple[str, str | None, str | None, str]] = []
    keys = list(dict.fromkeys([*before, *after]))
    sha_a, sha_b = before.get("model SHA-256"), after.get("model SHA-256")
    for key in keys:
        a, b = before.get(key), after.get(key)
        if key == "model SHA-256":
            if a is not None and b is not None:
                if a != b:
                    out.append((key, a, b, NOT_COMPARABLE))
            elif a is not None or b is not None:
                out.append((key, a, b, LISTED))  # compared by file name and shape instead
            continue
        if key == "model file" and sha_a is not None and sha_b is not None:
            continue  # the digests decide; a renamed file is the same model
        if a == b:
            continue
        if key in LISTED_FACTS:
            if a is not None and b is not None:
                out.append((key, a, b, LISTED))
            continue
        if key in ("model file", "model shape") and (a is None or b is None):
            continue  # one side did not record it: nothing to compare
        out.append((key, a, b, NOT_COMPARABLE))
    return out


def _difference_text(what: str, a: str | None, b: str | None) -> str:
    name = what.removeprefix("base ")
    if what == "model SHA-256" and (a is None or b is None):
        return "model SHA-256 recorded on one side only (compared by file name and shape)"
    if max(len(a or ""), len(b or "")) > 40:
        return f"{name} differs"
    return f"{name} {a or 'not set'} vs {b or 'not set'}"


# ----------------------------------------------------------------------------- cells


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
    axes (kept in ``attrs["axes"]``; the sweep order in ``attrs["sweeps"]``)."""
    order = _order(sweeps)
    axes: list[str] = []
    for results in sweeps.values():
        axes += [a for a in axes_of(results) if a not in axes]
    parts = []
    for label in order:
        results = sweeps[label]
        check_outcome(results, outcome, label)
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
        stats.insert(1, "sweep", label)
        stats.insert(2, "started", _started(results))
        stats.insert(3, "engine", _engine(ok))
        parts.append(stats)
    if not parts:
        lined = pd.DataFrame(columns=LINED_COLUMNS)
    else:
        lined = pd.concat(parts, ignore_index=True)
        lined["_pos"] = lined["sweep"].map({s: i for i, s in enumerate(order)})
        lined = lined.sort_values(["cell", "_pos"], kind="stable").drop(columns="_pos")
        lined = lined[LINED_COLUMNS].reset_index(drop=True)
    lined.attrs["sweeps"] = order
    lined.attrs["outcome"] = outcome
    lined.attrs["axes"] = axes
    return lined


def trend_table(
    lined: pd.DataFrame, not_comparable: Mapping[tuple[str, str], str] | None = None
) -> pd.DataFrame:
    """Wide form of :func:`line_up`: one row per cell, one column of means per sweep (oldest
    first; blank where the sweep has no such cell), and the change from the first sweep that
    has the cell to the newest sweep, in %: blank when the newest sweep lacks the cell, when
    only one sweep has it, or when those two sweeps are in `not_comparable` (pairs of labels,
    oldest first, as :class:`History` finds them)."""
    if lined.empty:
        return pd.DataFrame(columns=["cell", "change_pct"])
    order = lined.attrs.get("sweeps") or list(dict.fromkeys(lined["sweep"]))
    wide = lined.pivot(index="cell", columns="sweep", values="mean")
    wide = wide[[s for s in order if s in wide.columns]]
    present = wide.notna().to_numpy()
    first_pos = present.argmax(axis=1)
    first = wide.to_numpy(float)[np.arange(len(wide)), first_pos]
    newest = order[-1]
    last = wide[newest].to_numpy(float) if newest in wide else np.full(len(wide), np.nan)
    change = 100.0 * (last / first - 1.0)
    first_label = np.asarray(wide.columns)[first_pos]
    blocked = np.array([(str(f), newest) in (not_comparable or {}) for f in first_label])
    change[(first_label == newest) | blocked] = np.nan
    wide["change_pct"] = change
    wide.columns.name = None
    return wide.reset_index()


# ----------------------------------------------------------------------------- steps


def steps(
    lined: pd.DataFrame,
    outcome: str | None = None,
    threshold_pct: float = THRESHOLD_PCT,
    *,
    not_comparable: Mapping[tuple[str, str], str] | None = None,
    unsettled: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Every cell from each sweep to the next sweep that has it, judged in order:

    * ``not comparable`` where the pair of sweeps is in `not_comparable` (``(before, after)``
      -> what differs): the change, ratio and interval are blank;
    * ``too few repeats (n = 2)`` / ``not measurable``: no usable interval, its bounds blank;
    * ``not settled`` where either sweep is in `unsettled` (label -> why);
    * else ``regression`` (worse by more than `threshold_pct` with the 95 % interval of the
      ratio of means on the worse side of 1), ``improvement`` (the same the other way) or
      ``no change beyond noise``.

    The ratio is after / before in the better direction (above 1 is better); ``regressed``
    and ``improved`` are only ever true for comparable, settled, measurable steps."""
    outcome = outcome or lined.attrs.get("outcome", "tok_s_mean")
    not_comparable = not_comparable or {}
    unsettled = unsettled or {}
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
    ratio, low, high, why = judged_ratio(*old, *new) if lower else judged_ratio(*new, *old)
    change = 100.0 * (new[0] / old[0] - 1.0)
    labels_before = pairs["before"].astype(str).to_numpy()
    labels_after = pairs["sweep"].astype(str).to_numpy()
    labelled = list(zip(labels_before, labels_after, strict=True))
    blocked = np.array([pair in not_comparable for pair in labelled], dtype=bool)
    settled = np.array([b not in unsettled and a not in unsettled for b, a in labelled], dtype=bool)
    measurable = np.array([w is None for w in why], dtype=bool)
    judged = ~blocked & measurable & settled
    limit = 1.0 - threshold_pct / 100.0
    with np.errstate(invalid="ignore"):
        regressed = judged & (ratio < limit) & (high < 1.0)
        improved = judged & (ratio > 1.0 / limit) & (low > 1.0)
    verdicts = np.where(
        regressed, "regression", np.where(improved, "improvement", "no change beyond noise")
    ).astype(object)
    for i in np.flatnonzero(~judged):
        if blocked[i]:
            verdicts[i] = NOT_COMPARABLE
        elif not measurable[i]:
            verdicts[i] = why[i]
        else:
            verdicts[i] = "not settled"
    change = np.where(blocked, np.nan, change)
    ratio = np.where(blocked, np.nan, ratio)
    low, high = np.where(blocked, np.nan, low), np.where(blocked, np.nan, high)
    word = "faster" if is_throughput(outcome) and not lower else "better"
    sentences = [
        _step_sentence(cell, b, a, r, lo, hi, c, v, word, outcome, not_comparable, unsettled)
        for cell, b, a, r, lo, hi, c, v in zip(
            pairs["cell"], labels_before, labels_after, ratio, low, high, change, verdicts,
            strict=True,
        )
    ]  # fmt: skip
    out = pd.DataFrame(
        {"cell": pairs["cell"].to_numpy(), "before": labels_before, "after": labels_after,
         "mean_before": old[0], "mean_after": new[0], "change_pct": change, "ratio": ratio,
         "ratio_low": low, "ratio_high": high, "comparable": ~blocked, "settled": settled,
         "regressed": regressed, "improved": improved, "verdict": verdicts,
         "sentence": sentences}
    )  # fmt: skip
    out.attrs["threshold_pct"] = threshold_pct
    return out[STEP_COLUMNS].reset_index(drop=True)


def _step_sentence(
    cell: str, before: str, after: str, ratio: float, low: float, high: float, change: float,
    verdict: str, word: str, outcome: str, not_comparable: Mapping[tuple[str, str], str],
    unsettled: Mapping[str, str],
) -> str:  # fmt: skip
    if verdict == NOT_COMPARABLE:
        return (f"{cell}: {outcome} from {before} to {after}: not comparable "
                f"({not_comparable.get((before, after), 'the sweeps differ')})")  # fmt: skip
    if not np.isfinite(low):  # too few repeats or not measurable: no number
        return f"{cell}: {outcome} from {before} to {after}: {verdict}"
    size = f"ratio {ratio:.3f} [{low:.3f}, {high:.3f}]; above 1 is {word}"
    head = f"{cell}: {outcome} {change:+.1f} % from {before} to {after} ({size})"
    if verdict == "not settled":
        which = [s for s in (before, after) if s in unsettled]
        return f"{head}: not settled (the ranking of {' and '.join(which)} is not settled)"
    return f"{head}: {verdict}"


def regressions(step_table: pd.DataFrame, latest_only: bool = True) -> pd.DataFrame:
    """The steps that regressed (comparable, settled and measurable ones only); with
    `latest_only`, only those into each cell's newest sweep (what CI asks: did the last change
    make anything worse?)."""
    if step_table.empty:
        return step_table
    table = step_table
    if latest_only:
        table = table.groupby("cell", sort=False).tail(1)
    return table[table["regressed"].astype(bool)].reset_index(drop=True)


# ----------------------------------------------------------------------------- the history


@dataclass
class History:
    """Several sweeps lined up: the sweeps with their verdicts, what differs between them,
    the cells' figures per sweep and every step judged (:func:`history_of`)."""

    outcome: str
    threshold_pct: float
    sweeps: pd.DataFrame  # :func:`sweeps_table`
    verdicts: dict[str, Verdict]
    differences: pd.DataFrame  # before, after, what, value_before, value_after, effect
    lined: pd.DataFrame  # :func:`line_up`
    trend: pd.DataFrame  # :func:`trend_table`
    steps: pd.DataFrame  # :func:`steps`
    not_comparable: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def newest(self) -> str | None:
        return str(self.sweeps["sweep"].iloc[-1]) if len(self.sweeps) else None

    def regressions(self, latest_only: bool = True) -> pd.DataFrame:
        """The regressions (into the newest sweep, with `latest_only`)."""
        return regressions(self.steps, latest_only)

    def notes(self) -> list[str]:
        """What keeps steps into the newest sweep from being judged, one sentence each:
        sweeps that are not comparable (and why), rankings that are not settled, too few
        repeats, cells missing from the newest sweep."""
        newest = self.newest
        if newest is None:
            return []
        out = []
        into = self.steps[self.steps["after"] == newest]
        order = self.sweeps["sweep"].tolist()
        previous = order[-2:-1]
        for before in dict.fromkeys([*previous, *into["before"]]):
            if (before, newest) not in self.not_comparable:
                continue
            out.append(f"{before} and {newest} are not comparable "
                       f"({self.not_comparable[(before, newest)]}): no step between them is "
                       "judged")  # fmt: skip
        for label in dict.fromkeys([*into["before"], newest]):
            verdict = self.verdicts.get(label)
            if verdict is not None and not verdict.settled:
                why = "; ".join(verdict.reasons) or "no verdict"
                out.append(f"the ranking of {label} is not settled ({why}): its steps are not "
                           "judged")  # fmt: skip
        few = into[into["verdict"].astype(str).str.startswith(("too few", "not measurable"))]
        if len(few):
            out.append(f"{len(few)} of {len(into)} cell(s) into {newest} have no usable "
                       "interval (too few repeats or not measurable)")  # fmt: skip
        had = set(self.lined.loc[self.lined["sweep"] != newest, "cell"])
        missing = sorted(had - set(self.lined.loc[self.lined["sweep"] == newest, "cell"]))
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                             if len(missing) > 3 else "")  # fmt: skip
            out.append(f"{len(missing)} cell(s) of earlier sweeps are missing from {newest}: "
                       f"{shown}")  # fmt: skip
        return out

    def views(self) -> dict[str, Any]:
        """Every view of ``bmoe history``: the sweeps in order with their ranking's verdict,
        what differs between them, the cells' means per sweep with the change to the newest,
        every step judged, and the regressions into the newest sweep, keyed by their slugs in
        :data:`bmoe.analyze.views.HISTORY` (titled by :meth:`titles`)."""
        shown = ["cell", "before", "after", "change_pct", "ratio", "ratio_low", "ratio_high",
                 "verdict"]  # fmt: skip
        found = self.regressions()
        return {
            "sweeps": self.sweeps,
            "differences": self.differences,
            "trend": self.trend,
            "steps": self.steps[shown],
            "regressions": found[shown],
        }

    def titles(self) -> dict[str, str]:
        """slug -> title of :meth:`views`, with this history's outcome and threshold."""
        from bmoe.analyze.views import HISTORY

        return HISTORY.titles(outcome=self.outcome, threshold_pct=self.threshold_pct)


def history_of(
    sweeps: Mapping[str, pd.DataFrame],
    outcome: str = "tok_s_mean",
    threshold_pct: float = THRESHOLD_PCT,
) -> History:
    """Line up `sweeps` (label -> results table), check every pair that a step or the trend
    crosses for like with like, judge each sweep's own ranking, and judge every step."""
    lined = line_up(sweeps, outcome)
    verdicts = {label: sweep_verdict(results, outcome) for label, results in sweeps.items()}
    table = sweeps_table(sweeps, verdicts)
    order = table["sweep"].tolist()
    facts = {label: sweep_facts(results) for label, results in sweeps.items()}
    wanted = list(itertools.pairwise(order))
    if len(lined):
        shifted = lined.groupby("cell", sort=False)["sweep"].shift(1)
        wanted += list(zip(shifted.dropna(), lined.loc[shifted.notna(), "sweep"], strict=True))
        firsts = lined.groupby("cell", sort=False)["sweep"].first()
        wanted += [(f, order[-1]) for f in firsts if f != order[-1]]
    rows, blocked = [], {}
    for before, after in dict.fromkeys(wanted):
        found = sweep_differences(facts[before], facts[after])
        rows += [{"before": before, "after": after, "what": what, "value_before": a,
                  "value_after": b, "effect": effect} for what, a, b, effect in found]  # fmt: skip
        reasons = [_difference_text(w, a, b) for w, a, b, e in found if e == NOT_COMPARABLE]
        if reasons:
            blocked[(before, after)] = "; ".join(reasons)
    unsettled = {label: "; ".join(v.reasons) for label, v in verdicts.items() if not v.settled}
    return History(
        outcome=outcome,
        threshold_pct=threshold_pct,
        sweeps=table,
        verdicts=verdicts,
        differences=pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS),
        lined=lined,
        trend=trend_table(lined, blocked),
        steps=steps(lined, outcome, threshold_pct, not_comparable=blocked, unsettled=unsettled),
        not_comparable=blocked,
    )


def history(
    sweeps: Mapping[str, pd.DataFrame],
    outcome: str = "tok_s_mean",
    threshold_pct: float = THRESHOLD_PCT,
) -> dict[str, Any]:
    """Every view of ``bmoe history`` (:meth:`History.views` of :func:`history_of`)."""
    return history_of(sweeps, outcome, threshold_pct).views()


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
    "NOT_COMPARABLE",
    "THRESHOLD_PCT",
    "History",
    "cell_key",
    "history",
    "history_of",
    "line_up",
    "parse_threshold",
    "regressions",
    "steps",
    "sweep_differences",
    "sweep_facts",
    "sweeps_table",
    "trend_table",
]
