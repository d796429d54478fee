"""Measured runs next to their predictions: errors, and whether the intervals cover them.

Measured cells next to their predictions: the error of each figure, whether the interval
covers the measurement, and the summary a reader checks first.

Loose metrics files (the shape of an archived phone matrix) matched to configurations by
their preamble and put next to what a profile predicts for each.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.cells import GRID_AXES, grid_defaults, measured_reads, predict
from bmoe.analyze.device.evidence import token_frame, token_reads
from bmoe.analyze.device.interval import (
    DOUBLE,
    coverage_check,
    error_at_distance,
    model_error,
    read_range,
)
from bmoe.analyze.device.runs import ProfileRun, RunConfig, not_comparable, number, run_config
from bmoe.analyze.device.state import run_state
from bmoe.analyze.device.timing import predict_cell
from bmoe.cache import DEFAULT_POLICY, policy_name
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace

#: An interval wider than this (high - low, % of the prediction) predicts nothing: its cell is
#: not counted as covered, whatever was measured.
WIDEST_INTERVAL_PCT = 100.0

PREDICTED_FIGURES = (
    "tok_s",
    "tok_s_low",
    "tok_s_high",
    "steady_tok_s",
    "steady_tok_s_low",
    "steady_tok_s_high",
    "mib_per_token",
    "hit_pct",
    "interval_pct",
    "spread_pct",
    "faults_per_token",
    "lever_effect_pct",
    "lever_factor",
)
#: What a prediction says of its levers, in words (see :mod:`bmoe.analyze.device.levers`).
LEVER_TEXTS = ("unpriced", "unpriced_levers", "memory_note")
#: The label of a measured cell that a profile run measured (its error is not a prediction's).
IN_SAMPLE = "a profile run (in sample)"


def label_text(value: object) -> str | None:
    """A label's text, or None for a missing one (None, NaN, pandas' NA, an empty string):
    a missing label never reaches a sentence as ``nan``."""
    return value if isinstance(value, str) and value and value.lower() != "nan" else None


def join_labels(*labels: object) -> str | None:
    """The labels that are there, joined by commas (None when none is)."""
    return ", ".join(t for t in map(label_text, labels) if t) or None


def measured_cells(results: pd.DataFrame, defaults: Mapping[str, float]) -> pd.DataFrame:
    """One row per sweep cell (ok attempts): its grid values (and ``policy`` where the runs
    named a ``cache_policy``), the median over repeats of tok/s (tokens over decode time),
    steady-state tok/s (NaN where the runs had none), MiB/token and hit %, and
    ``measurement``: why the cell's own figure is not firm (the verdict's judgement of its
    repeats: they disagree, the rounds differ, the engine was mostly off-CPU, a run was
    traced; or that its compute waited for a core; None when firm; too few repeats are not
    counted against it)."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    if not len(ok):
        raise BmoeError("the sweep has no successful run to compare with")
    if "cache_mb" not in ok:
        raise BmoeError("the sweep's runs have no cache_mb: nothing to predict them from")
    frame = pd.DataFrame({"cell": (ok["cell"] if "cell" in ok else pd.Series(range(len(ok))))
                          .astype(str).to_numpy()})  # fmt: skip
    for axis in GRID_AXES:
        values = ok[axis] if axis in ok else pd.Series(defaults[axis], index=ok.index)
        if values.dtype == object:
            values = values.map(lambda v: {"true": 1, "false": 0}.get(str(v).lower(), v))
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(defaults[axis]).to_numpy()
    if "cache_policy" in ok:
        frame["policy"] = [
            policy_name(p) if isinstance(p, str) and p else DEFAULT_POLICY
            for p in ok["cache_policy"]
        ]
    rate = "tok_s_reported" if "tok_s_reported" in ok else "tok_s_mean"
    frame["tok_s"] = pd.to_numeric(ok[rate], errors="coerce").to_numpy()
    steady = ok["steady_tok_s_mean"] if "steady_tok_s_mean" in ok else pd.Series(np.nan, ok.index)
    frame["steady_tok_s"] = pd.to_numeric(steady, errors="coerce").to_numpy(np.float64)
    for out, col in (("mib_per_token", "read_mib_per_token"), ("hit_pct", "cache_hit_pct")):
        frame[out] = pd.to_numeric(ok[col], errors="coerce").to_numpy() if col in ok else np.nan
    keys = ["cell", *GRID_AXES] + (["policy"] if "policy" in frame else [])
    grouped = frame.groupby(keys, sort=False, dropna=False)
    cells = grouped[["tok_s", "steady_tok_s", "mib_per_token", "hit_pct"]].median()
    cells["runs"] = grouped.size()
    cells = cells.reset_index()
    for axis in ("io_threads", "prefetch", "overlap"):
        cells[axis] = cells[axis].astype(int)
    cells["measurement"] = pd.Series(
        _measurement_labels(ok, cells["cell"]), index=cells.index, dtype=object
    )
    return cells


def _measurement_labels(ok: pd.DataFrame, cells: pd.Series) -> list[str | None]:
    """Per cell, the verdict layer's reasons its figure is not firm (the repeat count aside)."""
    from bmoe.analyze.sweep import rank_cells
    from bmoe.analyze.verdict import CONTENDED, CONTENDED_RATIO, FEW_REPEATS, cell_stability

    attempts = ok.assign(cell=ok["cell"].astype(str)) if "cell" in ok else ok
    outcome = "tok_s_mean" if "tok_s_mean" in attempts else None
    if outcome is None or "cell" not in attempts:
        return [None] * len(cells)
    stability = cell_stability(rank_cells(attempts, outcome), attempts)
    reasons = stability.set_index(stability["cell"].astype(str))["unstable"]
    contended = _compute_over_cpu(attempts)
    out = []
    for cell in cells.astype(str):
        why = label_text(reasons.get(cell))
        parts = [p for p in why.split(", ") if p and p != FEW_REPEATS] if why else []
        ratio = contended.get(cell, np.nan)
        if not parts and ratio > CONTENDED_RATIO:
            parts.append(f"{CONTENDED} ({ratio:.1f}x its CPU time)")
        out.append(", ".join(parts) or None)
    return out


def _compute_over_cpu(attempts: pd.DataFrame) -> pd.Series:
    """Per cell, the median over its runs of compute time over CPU time per thread (empty
    where the results do not have both; NaN for runs that took major faults)."""
    needed = ("compute_s_per_token", "cpu_s_per_token", "threads")
    if not all(c in attempts for c in needed):
        return pd.Series(dtype=float)
    cpu = pd.to_numeric(attempts["cpu_s_per_token"], errors="coerce") / pd.to_numeric(
        attempts["threads"], errors="coerce"
    )
    ratio = pd.to_numeric(attempts["compute_s_per_token"], errors="coerce") / cpu.where(cpu > 0)
    if "majflt_per_token" in attempts:  # a fault's wait is compute off the CPU too
        faults = pd.to_numeric(attempts["majflt_per_token"], errors="coerce")
        ratio = ratio.where(~(faults >= 1))
    return ratio.groupby(attempts["cell"].astype(str)).median()


def _errors(cells: pd.DataFrame) -> pd.DataFrame:
    """Each figure's error (tok/s in % of the measurement), and the interval's width."""
    cells["tok_s_error_pct"] = 100.0 * (cells["tok_s_predicted"] - cells["tok_s"]) / cells["tok_s"]
    cells["steady_tok_s_error_pct"] = (
        100.0 * (cells["steady_tok_s_predicted"] - cells["steady_tok_s"]) / cells["steady_tok_s"]
    )
    cells["mib_per_token_error"] = cells["mib_per_token_predicted"] - cells["mib_per_token"]
    cells["hit_pct_error"] = cells["hit_pct_predicted"] - cells["hit_pct"]
    cells["interval_width_pct"] = (
        100.0
        * (cells["tok_s_high_predicted"] - cells["tok_s_low_predicted"])
        / cells["tok_s_predicted"]
    )
    return cells


def _within(cells: pd.DataFrame, figure: str) -> pd.Series:
    """Whether the measurement of `figure` lies within its interval's bounds."""
    return (cells[figure] >= cells[f"{figure}_low_predicted"]) & (
        cells[figure] <= cells[f"{figure}_high_predicted"]
    )


def _inside(cells: pd.DataFrame, figure: str) -> pd.Series:
    """Whether the interval of `figure` covers its measurement (a too wide one never does)."""
    return _within(cells, figure) & (cells["interval_width_pct"] <= WIDEST_INTERVAL_PCT)


def interval_kind(profile: DeviceProfile) -> tuple[str, bool]:
    """What a profile's intervals are made of, and whether they claim its stated coverage
    (only when the model's own error was measured)."""
    error = model_error(profile)
    if not error.known:
        return f"the terms' spread only (model error unknown: {error.why})", False
    held = f"from {error.k} held-out configuration{'s' if error.k != 1 else ''}"
    at_zero = error_at_distance(profile.model_error, 0.0)
    if at_zero is not None:
        at_double = error_at_distance(profile.model_error, DOUBLE) or 0.0
        return (
            f"the terms' spread and the model's own error, which grows with a "
            f"configuration's distance from the nearest the profile measured ({held}): "
            f"{100 * at_zero:.0f} % at its reads a token, {100 * at_double:.0f} % at twice "
            "or half them",
            True,
        )
    text = f"the terms' spread and the model's own error ({100 * (error.sd_rel or 0):.0f} %, {held}"
    span = read_range(profile)
    if span is None:
        return text + ")", True
    inner = model_error(profile, (span[0] + span[1]) / 2)
    if inner.inside:
        text += (
            f"; {100 * (inner.sd_rel or 0):.0f} % from the {inner.k} inside the others' read "
            f"range, for configurations reading {span[0]:.3g}-{span[1]:.3g} MiB a token"
        )
    return text + ")", True


def compare_cells(cells: pd.DataFrame, profile: DeviceProfile) -> dict[str, Any]:
    """Measured cells (``tok_s``, ``steady_tok_s``, ``mib_per_token``, ``hit_pct``, and a
    ``measurement`` label: None when the cell's own figure is firm) beside their predictions
    (the same names with ``_predicted``; ``tok_s_low_predicted`` / ``_high_`` the interval;
    ``unpriced``: why part of a prediction's time is not priced by what the profile
    measured): the error of each figure, whether the interval covers the measurement, its
    width, and a summary. The headline error and the achieved coverage count only cells
    whose measurement is firm and whose prediction is priced; an interval wider than
    :data:`WIDEST_INTERVAL_PCT` % of its prediction covers nothing (``within_bounds`` counts
    the measurements between the bounds all the same: how well the width is calibrated,
    apart from how useful it is; ``coverage_check`` says whether that count is consistent
    with the stated coverage, and which coverages it is consistent with)."""
    cells = _errors(cells.copy())
    for column in ("measurement", "unpriced"):
        if column not in cells:
            cells[column] = None
    predicted = cells["tok_s_predicted"].notna()
    covered = _inside(cells, "tok_s")
    cells["inside_interval"] = covered.astype(object).where(predicted, None)
    for column in ("measurement", "unpriced"):
        cells[column] = pd.Series(map(label_text, cells[column]), index=cells.index, dtype=object)
    firm = cells["measurement"].isna() & cells["unpriced"].isna() & predicted
    summary = _summary(cells, profile, predicted, firm)
    summary["no_headline"] = None if firm.any() else no_headline(cells, predicted)
    summary["inside_interval"] = int(covered[firm].sum())
    summary["coverage_pct"] = (
        100.0 * summary["inside_interval"] / int(firm.sum()) if firm.any() else float("nan")
    )
    within = _within(cells, "tok_s")
    summary["within_bounds"] = int(within[firm].sum())
    summary["within_bounds_pct"] = (
        100.0 * summary["within_bounds"] / int(firm.sum()) if firm.any() else float("nan")
    )
    check = coverage_check(summary["within_bounds"], int(firm.sum()), profile.coverage)
    summary["coverage_p"] = check["p"]
    summary["coverage_consistent_pct"] = (
        None
        if check["consistent_low_pct"] is None
        else [check["consistent_low_pct"], check["consistent_high_pct"]]
    )
    summary["coverage_check"] = check["verdict"]
    summary["steady_inside_interval"] = int((_inside(cells, "steady_tok_s") & firm).sum())
    return {"cells": cells, "summary": summary}


def no_headline(cells: pd.DataFrame, predicted: pd.Series) -> str:
    """Why no cell counts in the headline, in one sentence: how many cells were left out
    for each reason (a profile run, a measurement that is not firm, a lever the profile does
    not price, no prediction)."""
    counts: dict[str, int] = {}
    comparable = cells["comparable"] if "comparable" in cells else pd.Series(None, cells.index)
    for ok, why_not, measurement in zip(predicted, comparable, cells["measurement"], strict=True):
        if not ok:
            reason = f"not predicted ({label_text(why_not) or 'not comparable'})"
        elif measurement is not None and measurement.startswith(IN_SAMPLE):
            reason = "measured by the profile's own runs (in sample)"
        elif measurement is not None:
            reason = "measured in a way that is not firm (see their notes)"
        else:
            reason = "predicted with a lever the profile does not price (see unpriced)"
        counts[reason] = counts.get(reason, 0) + 1
    if not counts:
        return "No cell to compare."
    parts = [f"{n} of {len(cells)} {why}" for why, n in counts.items()]
    return "No cell counts in the headline: " + "; ".join(parts) + "."


def _summary(cells, profile: DeviceProfile, predicted: pd.Series, firm: pd.Series) -> dict:
    def stat(series: pd.Series, how: str) -> float:
        return float(getattr(series, how)()) if len(series) else float("nan")

    err = cells.loc[firm, "tok_s_error_pct"].abs()
    steady_err = cells.loc[firm, "steady_tok_s_error_pct"].abs().dropna()
    width = cells["interval_width_pct"]
    kind, claimed = interval_kind(profile)
    return {
        "cells": len(cells),
        "compared": int(firm.sum()),
        "labelled": int((predicted & ~firm).sum()),
        "not_predicted": int((~predicted).sum()),
        "median_abs_tok_s_error_pct": stat(err, "median"),
        "mean_abs_tok_s_error_pct": stat(err, "mean"),
        "max_abs_tok_s_error_pct": stat(err, "max"),
        "median_abs_tok_s_error_pct_all": stat(
            cells.loc[predicted, "tok_s_error_pct"].abs(), "median"
        ),
        "coverage_stated_pct": 100.0 * profile.coverage,
        "coverage_claimed": claimed,
        "interval": kind,
        "median_interval_width_pct": stat(width[predicted], "median"),
        "intervals_too_wide": int((~(width <= WIDEST_INTERVAL_PCT) & predicted).sum()),
        "steady_cells": len(steady_err),
        "median_abs_steady_tok_s_error_pct": stat(steady_err, "median"),
        "max_abs_mib_per_token_error": stat(cells["mib_per_token_error"].abs().dropna(), "max"),
        "max_abs_hit_pct_error": stat(cells["hit_pct_error"].abs().dropna(), "max"),
        "profile_settled": profile.settled,
    }


def in_sample_cells(
    results: pd.DataFrame, profile: DeviceProfile, sweep_dir: str | os.PathLike | None
) -> set[str]:
    """The sweep cells at least one of whose runs the profile was built from (a run's folder,
    ``dir`` under `sweep_dir`, holding one of the profile's source files)."""
    if "dir" not in results or "cell" not in results:
        return set()
    sources = {Path(s).resolve().parent for s in profile.sources}
    root = Path(sweep_dir) if sweep_dir is not None else None
    found = set()
    for cell, folder in zip(results["cell"].astype(str), results["dir"], strict=True):
        if not isinstance(folder, str) or not folder:
            continue
        path = Path(folder)
        if not path.is_absolute() and root is not None:
            path = root / path
        if path.resolve() in sources:
            found.add(cell)
    return found


def against(
    trace: RouteTrace,
    profile: DeviceProfile,
    results: pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    drop: float | None = None,
    sweep_dir: str | os.PathLike | None = None,
) -> dict[str, pd.DataFrame | dict]:
    """Every measured cell of a sweep next to its prediction: ``cells`` (measured, predicted
    and the error of each figure) and ``summary`` (see :func:`compare_cells`). Like is
    compared with like: whole-run tok/s with the predicted whole-run rate, and the runs'
    steady-state tok/s (where the archive has one) with the predicted steady-state rate.
    A cell one of whose runs the profile was built from (found under `sweep_dir`, the
    sweep's folder) is labelled in sample and kept out of the headline."""
    measured = measured_cells(results, grid_defaults(profile))
    inside = in_sample_cells(results, profile, sweep_dir)
    measured["measurement"] = pd.Series(
        [
            join_labels(IN_SAMPLE if cell in inside else None, why)
            for cell, why in zip(measured["cell"].astype(str), measured["measurement"], strict=True)
        ],
        index=measured.index,
        dtype=object,
    )
    grid = measured[[*GRID_AXES] + (["policy"] if "policy" in measured else [])]
    predicted = predict(trace, profile, grid, policy=policy, seed=seed, drop=drop)
    cells = measured.copy()
    for col in PREDICTED_FIGURES:
        cells[f"{col}_predicted"] = predicted[col].to_numpy()
    for text in LEVER_TEXTS:
        cells[text] = predicted[text].to_numpy()
    return compare_cells(cells, profile)


def short_labels(names: Sequence[str]) -> list[str]:
    """File stems, with as many parent folders before them as it takes to tell apart files
        whose stems are the same (``r1/run`` beside ``r2/run``; ``cell-a/r1/run``...); a file
    given twice is numbered."""
    paths = [Path(n) for n in names]
    out = [p.stem for p in paths]
    for depth in range(1, max((len(p.parts) for p in paths), default=1)):
        clash = {label for label in out if out.count(label) > 1}
        if not clash:
            break
        for i, p in enumerate(paths):
            if out[i] in clash:
                out[i] = "/".join([*p.parent.parts[-depth:], p.stem])
    seen: dict[str, int] = {}
    for i, label in enumerate(out):  # the same file given twice: numbered
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            out[i] = f"{label} ({seen[label]})"
    return out


def _notes(run: ProfileRun, config: RunConfig) -> str | None:
    """What was assumed of a file, whether it is partial, how hot the CPU ran."""
    notes = [f"{k} {v}" for k, v in config.assumed.items()]
    if run.metrics.partial:
        notes.append(f"partial: {len(run.metrics.rows)} of {run.metrics.steps} tokens")
    temp = run.pressure.get("cpu_temp_max_mC")
    if temp:
        notes.append(f"CPU up to {float(temp) / 1000:.1f} °C")
    return "; ".join(notes) or None


def _mean(values: pd.Series, scale: float = 1.0) -> float:
    return float(np.nanmean(values)) / scale if values.notna().any() else 0.0


def _attempt(label: str, run: ProfileRun, config: RunConfig, frame, tok_s: float) -> dict:
    """The file as one attempt of a sweep cell, for the verdict's judgement of it."""
    return {
        "cell": label,
        "tok_s_mean": tok_s,
        "cpu_s_per_token": _mean(frame["cpu_ms"], 1000.0) if frame["cpu_ms"].notna().any()
        else np.nan,
        "threads": config.threads,
        "stall_ms_per_token": float(np.nanmean(frame["stall_ms"])) if config.overlap else 0.0,
        "io_s_per_token": _mean(frame["io_ms"], 1000.0),
        "mgmt_ms_per_token": _mean(frame["mgmt_ms"]),
        "route_trace": run.traced,
    }  # fmt: skip


def _contention(state: dict) -> dict[str, float | None]:
    """A file's off-CPU share and its compute over its CPU time per thread."""
    return {
        "off_cpu_pct": state["off_cpu_pct"],
        "compute_over_cpu": state["compute_over_cpu"],
        "contended": state["contended"],
    }


#: Why a file without token rows (cut before its first row ended) is not compared.
_NO_ROWS = "no token rows (the file ends before its first row does)"


def _file_row(label: str, run: ProfileRun, profile, k_trace) -> tuple[dict, dict]:
    """One file's row of :func:`measured_files` and its attempt."""
    from bmoe.analyze.metrics import run_summary

    config = run_config(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = run_summary(run.metrics)
    frame = token_frame(run, profile.read_unit_bytes, None).frame
    tokens = len(frame)
    wall = float(frame["wall_ms"].sum())
    row = {
        "cell": label,
        "file": run.name,
        **config.axes(),
        "threads": config.threads,
        "drop": config.drop or 0.0,
        "version": run.metrics.version,
        "tokens": tokens,
        "tok_s": 1000.0 * tokens / wall if wall > 0 else float("nan"),
        "steady_tok_s": summary.get("steady_tok_s_mean"),
        "mib_per_token": float(frame["read_mib"].mean()) if tokens else float("nan"),
        "hit_pct": number(run.figure("cache_hit_pct")),
        **_contention(run_state(run, frame, config)),
        "comparable": not_comparable(run, config, profile, k_trace) if tokens else _NO_ROWS,
        "notes": _notes(run, config),
    }
    return row, _attempt(label, run, config, frame, row["tok_s"])


def _judged(table: pd.DataFrame, attempts: pd.DataFrame, profile: DeviceProfile) -> list:
    """Per file, why its own figure is not firm: the verdict's reasons (the repeat count aside),
    or that its compute waited for a core (``run_state``'s ``contended``: the figure measures
    the machine's load), after
    "a profile run (in sample)" where the profile was built from it."""
    from bmoe.analyze.verdict import CONTENDED, FEW_REPEATS, cell_stability

    ranked = pd.DataFrame(
        {
            "rank": np.arange(1, len(table) + 1),
            "cell": table["cell"],
            "n": 1,
            "mean": table["tok_s"],
            "sd": np.nan,
            "cv_pct": np.nan,
        }
    )
    stability = cell_stability(ranked, attempts).set_index("cell")["unstable"]
    sources = {str(Path(s).resolve()) for s in profile.sources}
    judged: list[str | None] = []
    for cell, file, ratio, contended in zip(
        table["cell"], table["file"], table["compute_over_cpu"], table["contended"], strict=True
    ):
        parts = [p for p in str(stability.get(cell) or "").split(", ") if p and p != FEW_REPEATS]
        if contended and not parts:
            parts.append(f"{CONTENDED} ({ratio:.1f}x its CPU time)")
        if str(Path(file).resolve()) in sources:
            parts.insert(0, IN_SAMPLE)
        judged.append(", ".join(parts) or None)
    return judged


def measured_files(
    runs: Sequence[ProfileRun], profile: DeviceProfile, trace: RouteTrace | None = None
) -> pd.DataFrame:
    """One row per loose metrics file: its configuration (from its preamble; what a file does
    not say is inferred as :func:`run_config` explains, in ``assumed``), what it measured
    (tok/s over its tokens, steady-state tok/s, MiB/token, hit %), ``comparable`` (None, or
    why no prediction of it can be compared: no expert streaming, another top-k or model),
    ``measurement`` (why its figure is not firm: mostly off-CPU, compute waited for a core, traced)
    and ``notes`` (partial runs, CPU temperature)."""
    labels = short_labels([r.name for r in runs])
    k_trace = number(trace.meta.get("n_expert_used")) if trace is not None else None
    pairs = [
        _file_row(label, run, profile, k_trace) for label, run in zip(labels, runs, strict=True)
    ]
    table = pd.DataFrame([row for row, _ in pairs])
    attempts = pd.DataFrame([attempt for _, attempt in pairs])
    table["measurement"] = _judged(table, attempts, profile)
    return table


def _empty(n: int) -> dict[str, np.ndarray]:
    """Room for `n` files' predicted figures (NaN) and why each is unpriced (None)."""

    out = {f: np.full(n, np.nan) for f in PREDICTED_FIGURES}
    for text in LEVER_TEXTS:
        out[text] = np.full(n, None, dtype=object)
    return out


def _measured_predictions(files: pd.DataFrame, profile, runs, comparable) -> dict:
    """Each comparable file predicted from the reads it recorded itself."""

    by_name = {r.name: r for r in runs}
    predicted = _empty(len(files))
    for i in np.flatnonzero(comparable):
        row = files.iloc[i]
        tokens, _ = token_reads(by_name[row["file"]], profile.read_unit_bytes, None)
        cell, read_bytes = measured_reads(profile, tokens, float(row["hit_pct"] or np.nan))
        figures = predict_cell(
            profile,
            cell,
            int(row["io_threads"]),
            read_bytes,
            overlap=bool(row["overlap"]),
            cache_mb=None if pd.isna(row["cache_mb"]) else float(row["cache_mb"]),
            levers={k: row[k] for k in ("prefetch", "policy", "drop", "threads")},
        )
        for f in predicted:
            predicted[f][i] = figures[f]
    return predicted


def _replayed_predictions(files, trace, profile, comparable, seed, drop) -> dict:
    """Each comparable file predicted from the replay of `trace` through its configuration."""

    predicted = _empty(len(files))
    grid = files.loc[
        comparable, ["cache_mb", "io_threads", "prefetch", "overlap", "policy", "threads"]
    ]
    missing = grid["cache_mb"].isna()
    if missing.any():
        names = ", ".join(files.loc[comparable].loc[missing, "cell"])
        raise BmoeError(f"no cache budget recorded for {names}: cannot replay it")
    out = predict(trace, profile, grid.reset_index(drop=True), seed=seed, drop=drop)
    for f in predicted:
        predicted[f][comparable] = out[f].to_numpy()
    return predicted


def against_files(
    trace: RouteTrace | None,
    profile: DeviceProfile,
    runs: Sequence[ProfileRun],
    *,
    seed: int = 0,
    drop: float | None = None,
) -> dict[str, Any]:
    """Loose metrics files (the shape of an archived phone matrix) each predicted with its
    own configuration and compared with what it measured (see
    :func:`bmoe.analyze.device.compare_cells`). With `trace`, each file's reads are the
    replay of that routing through its configuration; without, they are the reads the file
    itself recorded (``reads`` says which: the time model is then what is checked, given
    the reads a replay would have given)."""

    files = measured_files(runs, profile, trace)
    if not profile.overlap:
        need = files["comparable"].isna() & (files["overlap"] == 1)
        files.loc[need, "comparable"] = (
            "an --overlap run: the profile has no overlap term (none of its runs used --overlap)"
        )
    comparable = files["comparable"].isna().to_numpy()
    if trace is not None and comparable.any():
        predicted = _replayed_predictions(files, trace, profile, comparable, seed, drop)
        reads = "replay"
    else:
        predicted = _measured_predictions(files, profile, runs, comparable)
        reads = "measured"
    cells = files.copy()
    for f in PREDICTED_FIGURES:
        cells[f"{f}_predicted"] = predicted[f]
    for text in LEVER_TEXTS:
        cells[text] = predicted[text]
    cells["reads"] = [reads if ok else None for ok in comparable]
    out = compare_cells(cells, profile)
    out["summary"]["reads"] = reads
    return out


__all__ = [
    "IN_SAMPLE",
    "LEVER_TEXTS",
    "PREDICTED_FIGURES",
    "WIDEST_INTERVAL_PCT",
    "against",
    "against_files",
    "compare_cells",
    "in_sample_cells",
    "interval_kind",
    "measured_cells",
    "measured_files",
    "short_labels",
]
