"""The one-row-per-run table every analysis of many runs takes: a sweep's attempts (from its
manifest, each completed run's summary figures added) or a folder's loose metrics files
(each file a run). Both rows hold a run's summary under the same names
(:func:`bmoe.analyze.metrics.run_summary`), so the analyses read either.

The archive's files are read through :mod:`bmoe.formats.archive`; this module builds the
table from them (the figures are computed here, which is why it is not a format).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.errors import BmoeError
from bmoe.formats import archive as layout
from bmoe.formats.errors import warn

#: The manifest keys a results row carries as they are.
_RECORD_KEYS = (
    "run", "cell", "repeat", "attempt", "order", "round", "reversed", "target", "target_kind",
    "host", "node", "engine", "status", "exit_code", "started", "ended", "duration_s", "error",
    "dir",
)  # fmt: skip
#: Run parameters of the metrics preamble a results row takes when the sweep did not set them.
_PREAMBLE_KEYS = ("n_expert_used", "arch", "n_layer", "n_expert", "o_direct", "engine")


def run_row(path: Path) -> tuple[dict[str, Any], Any, dict[str, Any] | None]:
    """The summary figures of the run whose metrics file is `path` (with its ``.metrics``
    sidecar), and the run and its pressure figures as read."""
    from bmoe.analyze.metrics import run_summary
    from bmoe.formats.runfiles import read_with_pressure

    run, pressure = read_with_pressure(path)
    return dict(run_summary(run, pressure)), run, pressure


# ----------------------------------------------------------------------------- a sweep's attempts


def _flat(value: Any) -> Any:
    import json

    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def results_frame(root: Path) -> pd.DataFrame:
    """One row per attempt of the sweep folder `root`: parameters, target, entry state,
    summary figures, pressure.

    Built from the manifest, reading each completed run's CSV and ``.metrics`` sidecar for the
    summary figures (:func:`run_row`).
    """
    root = Path(root)
    records = layout.read_manifest(root / layout.MANIFEST)
    params_keys: list[str] = []
    rows = []
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("run"), str):
            continue  # not the record of an attempt (a damaged line)
        if record.get("warmup"):
            continue  # warm-up runs stay in the archive, out of the results
        row: dict[str, Any] = {key: record.get(key) for key in _RECORD_KEYS}
        row.update(_mapping(record.get("entry_columns")))
        row["engine_cpu_share"] = record.get("engine_cpu_share")
        system_warnings = record.get("system_warnings")
        row["system_warnings"] = "; ".join(map(str, system_warnings)) if system_warnings else None
        for key in ("model_sha256", "bmoe_version", "config_commit"):
            row[key] = record.get(key)
        machine = record.get("machine")
        for key, value in machine.items() if isinstance(machine, dict) else ():
            row[f"machine_{key}"] = value
        params = _mapping(record.get("params"))
        for key, value in params.items():
            if key not in params_keys:
                params_keys.append(key)
            row[key] = _flat(value)
        figures = _summary_for(root, record) if record.get("status") == "ok" else {}
        if record.get("status") == "ok" and not figures:
            row["status"] = "invalid"
            row["error"] = f"its {layout.RUN_CSV} is missing or unreadable"
        for key, value in figures.items():
            row[key if key not in row else f"summary_{key}"] = _flat(value)
        for key, value in _mapping(record.get("pressure")).items():
            row.setdefault(key, value)
        for key, value in _mapping(record.get("stream")).items():
            row.setdefault(f"stream_{key}", _flat(value))
        rows.append(row)
    _one_ok_per_run(rows)
    frame = pd.DataFrame(rows)
    frame.attrs["params"] = params_keys
    return frame


def _one_ok_per_run(rows: list[dict[str, Any]]) -> None:
    """Keep one ``ok`` row per run, its latest attempt; earlier ones become ``superseded``
    (a folder from before the manifest kept one ok per run must not count a run twice)."""
    latest: dict[Any, dict[str, Any]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        best = latest.get(row.get("run"))
        if best is None or _attempt_number(row) >= _attempt_number(best):
            if best is not None:
                best["status"] = "superseded"
            latest[row.get("run")] = row
        else:
            row["status"] = "superseded"


def _attempt_number(row: Mapping[str, Any]) -> int:
    attempt = row.get("attempt")
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0


def _summary_for(root: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(record.get("dir"), str):
        return {}
    csv = root / record["dir"] / layout.RUN_CSV
    if not csv.is_file():
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            figures, run, _ = run_row(csv)
        except BmoeError:
            return {}
    figures["file"] = str(csv.relative_to(root))
    for key in _PREAMBLE_KEYS:
        if key in run.params:
            figures.setdefault(key, run.params[key])
    return figures


def load_results(root: Path, required: Sequence[str] = layout.RESULT_KEYS) -> pd.DataFrame:
    """A sweep's results table (``results.parquet``, or rebuilt from the manifest when the
    sweep did not get as far as writing it, or wrote one without the `required` columns).
    ``attrs`` carry ``axes`` and ``params``."""
    root = Path(root)
    if not root.is_dir():
        raise BmoeError(f"{root}: no such folder")
    path = root / layout.RESULTS
    manifest = root / layout.MANIFEST
    if path.is_file():
        frame = layout.read_results(root)
        missing = [c for c in required if c not in frame.columns]
        if not missing:
            _check_manifest(root, frame)
            return frame
        what = f"not a sweep's results table (no {', '.join(missing)} column)"
        if not manifest.is_file():
            raise BmoeError(f"{path}: {what}")
        warn(str(path), None, f"{what}; rebuilt from {layout.MANIFEST}")
    elif not manifest.is_file():
        raise BmoeError(f"{root}: not a sweep folder (no {layout.RESULTS} or {layout.MANIFEST})")
    frame = results_frame(root)
    frame.attrs["axes"] = _varying_columns(frame, frame.attrs.get("params", []))
    return frame


def _check_manifest(root: Path, frame: pd.DataFrame) -> None:
    """Warn when ``results.parquet`` holds attempts its manifest does not (the manifest cut
    short or replaced after the results were written); the manifest's own unreadable lines
    are named as it is read."""
    if not (root / layout.MANIFEST).is_file() or "run" not in frame:
        return
    records = layout.read_manifest(root / layout.MANIFEST)
    listed: set[Any]
    if "attempt" in frame:
        listed = {(str(r.get("run")), str(r.get("attempt"))) for r in records}
        keys = set(zip(frame["run"].astype(str), frame["attempt"].astype(str), strict=True))
    else:
        listed, keys = {str(r.get("run")) for r in records}, set(frame["run"].astype(str))
    extra = len(keys - listed)
    if extra:
        warn(str(root / layout.RESULTS), None, f"{layout.RESULTS} holds {extra} attempts the "
                                               "manifest does not (the manifest cut short or "
                                               "replaced?)")  # fmt: skip


def _varying_columns(frame: pd.DataFrame, params: list[str]) -> list[str]:
    return [p for p in params if p in frame and frame[p].astype(str).nunique(dropna=False) > 1]


# ----------------------------------------------------------------------------- loose files


def files_frame(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """One row per metrics file: its summary (stable names), configuration, entry state.

    ``cell`` is the file's path relative to the deepest common folder. ``order`` is a guess
    from the files' modification times (ties by name) since a loose metrics file does not
    record when it ran; ``order_source`` says so. Entry state comes from the ``.metrics``
    sidecar (``cpu_temp_before_mC``, ``mem_avail_before_kb``) or the ``.state`` snapshot's
    BEFORE section (CPU temperature, MemAvailable, ``scaling_max_freq`` summed over policies).
    """
    files = [Path(p) for p in paths]
    if not files:
        raise BmoeError("no metrics files to compare")
    root = Path(_common_root(files))
    records = []
    for path in files:
        record, run, pressure = run_row(path)
        where = path.resolve()  # the root is of resolved paths: a relative path is under it too
        record["cell"] = str(where.relative_to(root)) if root != where else path.name
        for key, value in run.params.items():
            record.setdefault(key, value)
        record.update(_entry_state(path, pressure))
        try:
            record["_mtime"] = path.stat().st_mtime
        except OSError:
            record["_mtime"] = math.nan
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    order = frame.sort_values(["_mtime", "cell"], kind="stable").index
    frame.loc[order, "order"] = np.arange(len(frame))
    frame["order"] = frame["order"].astype(int)
    frame["order_source"] = "file modification time (not recorded by the run)"
    return frame.drop(columns="_mtime")


def _common_root(paths: Sequence[Path]) -> str:
    parents = [str(p.resolve().parent) for p in paths]
    return os.path.commonpath(parents) if len(parents) > 1 else parents[0]


def _entry_state(path: Path, pressure: Mapping[str, Any] | None) -> dict[str, float]:
    from bmoe.formats.sidecar import read_state

    out: dict[str, float] = {}
    if pressure:
        if isinstance(pressure.get("cpu_temp_before_mC"), int | float):
            out["entry_cpu_temp_c"] = pressure["cpu_temp_before_mC"] / 1000.0
        if isinstance(pressure.get("mem_avail_before_kb"), int | float):
            out["entry_mem_available_mb"] = pressure["mem_avail_before_kb"] / 1024.0
    state_path = path.with_name(f"{layout.run_stem(path)}.state")
    if state_path.is_file() and state_path != path:
        before = read_state(state_path).get("before")
        if before is not None:
            if before.cpu_temp_max_c is not None:
                out.setdefault("entry_cpu_temp_c", before.cpu_temp_max_c)
            if "MemAvailable" in before.meminfo_kb:
                out.setdefault("entry_mem_available_mb", before.meminfo_kb["MemAvailable"] / 1024)
            if before.scaling_max_freq:
                out["entry_scaling_max_freq_khz"] = float(sum(before.scaling_max_freq.values()))
    return out


def runs_table(paths: Iterable[str | os.PathLike], required: Sequence[str] = ("cell",)
               ) -> pd.DataFrame:  # fmt: skip
    """The runs table of files, folders, or one sweep folder.

    A single sweep folder is read as its results (:func:`load_results`: one row per attempt,
    with its axes and parameters); otherwise every metrics file found (folders searched
    recursively) becomes a row (:func:`files_frame`).
    """
    given = [Path(p) for p in paths]
    if len(given) == 1 and layout.is_sweep_folder(given[0]):
        return load_results(given[0], required)
    files = layout.find_metrics_files(given)
    if not files:
        raise BmoeError(f"no metrics files found in {', '.join(str(p) for p in given)}")
    return files_frame(files)


__all__ = ["files_frame", "load_results", "results_frame", "run_row", "runs_table"]
