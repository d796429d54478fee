"""Loose metrics files (the shape of an archived phone matrix) matched to configurations by
their preamble and put next to what a profile predicts for each."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import IN_SAMPLE, LEVER_TEXTS
from bmoe.analyze.profile.matching import not_comparable
from bmoe.analyze.profile.runs import ProfileRun, RunConfig, number, run_config
from bmoe.analyze.profile.state import run_state
from bmoe.analyze.profile.tokens import token_frame, token_reads
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace


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
    from bmoe.analyze.predict import PREDICTED_FIGURES

    out = {f: np.full(n, np.nan) for f in PREDICTED_FIGURES}
    for text in LEVER_TEXTS:
        out[text] = np.full(n, None, dtype=object)
    return out


def _measured_predictions(files: pd.DataFrame, profile, runs, comparable) -> dict:
    """Each comparable file predicted from the reads it recorded itself."""
    from bmoe.analyze.predict import measured_reads, predict_cell

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
    from bmoe.analyze.predict import predict

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
    :func:`bmoe.analyze.predict.compare_cells`). With `trace`, each file's reads are the
    replay of that routing through its configuration; without, they are the reads the file
    itself recorded (``reads`` says which: the time model is then what is checked, given
    the reads a replay would have given)."""
    from bmoe.analyze.predict import PREDICTED_FIGURES, compare_cells

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


__all__ = ["against_files", "measured_files", "short_labels"]
