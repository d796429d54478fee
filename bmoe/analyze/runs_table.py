"""The one-row-per-run table every analysis of many runs takes: a sweep's attempts (from its
manifest, each completed run's summary figures added) or a folder's loose metrics files
(each file a run). Both rows hold a run's summary under the same names
(:func:`bmoe.analyze.metrics.run_summary`), so the analyses read either.

The runs come read (:mod:`bmoe.formats.archive_runs`: an attempt as its record with its run,
a loose file as its run with its sidecar, ``.state`` and modification time); this module
only builds the table from them and computes the figures. The shell puts the two together
(:mod:`bmoe.sweep.results`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bmoe.errors import BmoeError
from bmoe.formats.archive import RUN_CSV

if TYPE_CHECKING:
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.sidecar import DeviceState

#: An attempt as read (:class:`bmoe.formats.archive_runs.Attempt`): its manifest record, and
#: for a completed run that read, the run, its pressure figures and its file in the sweep.
AttemptRead = tuple[Mapping[str, Any], "MetricsRun | None", Mapping[str, Any] | None, str | None]
#: A loose metrics file as read (:class:`bmoe.formats.archive_runs.LooseRun`): the run, its
#: pressure figures, its ``.state`` snapshot's ``BEFORE`` section, its modification time and
#: its cell (the path relative to the folder the files share).
LooseRead = tuple["MetricsRun", Mapping[str, Any] | None, "DeviceState | None", float, str]

#: The manifest keys a results row carries as they are.
_RECORD_KEYS = (
    "run", "cell", "repeat", "attempt", "order", "round", "reversed", "target", "target_kind",
    "host", "node", "engine", "status", "exit_code", "started", "ended", "duration_s", "error",
    "dir",
)  # fmt: skip
#: Run parameters of the metrics preamble a results row takes when the sweep did not set them.
_PREAMBLE_KEYS = ("n_expert_used", "arch", "n_layer", "n_expert", "o_direct", "engine")


def run_figures(run: MetricsRun, pressure: Mapping[str, Any] | None) -> dict[str, Any]:
    """The summary figures of a run read with its ``.metrics`` sidecar's pressure figures."""
    from bmoe.analyze.metrics import run_summary

    return dict(run_summary(run, pressure))


# ----------------------------------------------------------------------------- a sweep's attempts


def _flat(value: Any) -> Any:
    import json

    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def attempts_frame(attempts: Iterable[AttemptRead]) -> pd.DataFrame:
    """One row per attempt of a sweep, as read in manifest order: parameters, target, entry
    state, summary figures (of each completed run: :func:`run_figures`), pressure. An ``ok``
    attempt whose run did not read (or gives no figures) is ``invalid``; of a run's ``ok``
    attempts the latest counts, the others are ``superseded``. ``attrs["params"]`` are the
    parameter names in the order met."""
    params_keys: list[str] = []
    rows = []
    for record, run, pressure, file in attempts:
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
        ok = record.get("status") == "ok"
        figures = _summary_of(run, pressure, file) if ok and run is not None else {}
        if ok and not figures:
            row["status"] = "invalid"
            row["error"] = f"its {RUN_CSV} is missing or unreadable"
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


def _summary_of(run: MetricsRun, pressure: Mapping[str, Any] | None, file: str | None
                ) -> dict[str, Any]:  # fmt: skip
    """A completed attempt's figures, its file and the preamble's parameters; empty when the
    run gives no figures (it counts as unreadable, as a missing file does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            figures = run_figures(run, pressure)
        except BmoeError:
            return {}
    figures["file"] = file
    for key in _PREAMBLE_KEYS:
        if key in run.params:
            figures.setdefault(key, run.params[key])
    return figures


def varying_columns(frame: pd.DataFrame, params: list[str]) -> list[str]:
    """The parameters among `params` that take more than one value in `frame` (the axes of
    a results table rebuilt from its manifest)."""
    return [p for p in params if p in frame and frame[p].astype(str).nunique(dropna=False) > 1]


# ----------------------------------------------------------------------------- loose files


def loose_runs_frame(runs: Iterable[LooseRead]) -> pd.DataFrame:
    """One row per loose metrics file, as read: its summary (stable names), configuration,
    entry state.

    ``cell`` is the file's path relative to the deepest common folder. ``order`` is a guess
    from the files' modification times (ties by name) since a loose metrics file does not
    record when it ran; ``order_source`` says so. Entry state comes from the ``.metrics``
    sidecar (``cpu_temp_before_mC``, ``mem_avail_before_kb``) or the ``.state`` snapshot's
    BEFORE section (CPU temperature, MemAvailable, ``scaling_max_freq`` summed over policies).
    """
    records = []
    for run, pressure, before, mtime, cell in runs:
        record = run_figures(run, pressure)
        record["cell"] = cell
        for key, value in run.params.items():
            record.setdefault(key, value)
        record.update(entry_state(pressure, before))
        record["_mtime"] = mtime
        records.append(record)
    if not records:
        raise BmoeError("no metrics files to compare")
    frame = pd.DataFrame.from_records(records)
    order = frame.sort_values(["_mtime", "cell"], kind="stable").index
    frame.loc[order, "order"] = np.arange(len(frame))
    frame["order"] = frame["order"].astype(int)
    frame["order_source"] = "file modification time (not recorded by the run)"
    return frame.drop(columns="_mtime")


def entry_state(pressure: Mapping[str, Any] | None, before: DeviceState | None
                ) -> dict[str, float]:  # fmt: skip
    """A run's entry state: CPU temperature and available memory from its sidecar's pressure
    figures, else from its ``.state`` snapshot's BEFORE section (which alone gives the
    summed ``scaling_max_freq``)."""
    out: dict[str, float] = {}
    if pressure:
        if isinstance(pressure.get("cpu_temp_before_mC"), int | float):
            out["entry_cpu_temp_c"] = pressure["cpu_temp_before_mC"] / 1000.0
        if isinstance(pressure.get("mem_avail_before_kb"), int | float):
            out["entry_mem_available_mb"] = pressure["mem_avail_before_kb"] / 1024.0
    if before is not None:
        if before.cpu_temp_max_c is not None:
            out.setdefault("entry_cpu_temp_c", before.cpu_temp_max_c)
        if "MemAvailable" in before.meminfo_kb:
            out.setdefault("entry_mem_available_mb", before.meminfo_kb["MemAvailable"] / 1024)
        if before.scaling_max_freq:
            out["entry_scaling_max_freq_khz"] = float(sum(before.scaling_max_freq.values()))
    return out


__all__ = [
    "AttemptRead",
    "LooseRead",
    "attempts_frame",
    "entry_state",
    "loose_runs_frame",
    "run_figures",
    "varying_columns",
]
