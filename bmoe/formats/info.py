"""A short description of any telemetry file (what ``bmoe info`` prints).

:func:`describe` returns named views: a dict of figures or a DataFrame each, ready for
``bmoe.render.tables.render``; it reads and summarises, it does not print.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bmoe.formats.detect import PathLike

if TYPE_CHECKING:
    import pandas as pd

_KEY_PARAMS = (
    "engine", "model", "arch", "n_layer", "n_expert", "n_expert_used", "threads", "moe_stream",
    "cache_mb", "io_threads", "o_direct", "overlap", "prefetch", "dense_weights",
    "drop_cold_frac", "temp", "spec",
)  # fmt: skip
_KEY_SUMMARY = ("tokens", "tok/s", "s/tok", "read_MiB", "cache_hit_pct", "prefill_tps", "load_s")
_DONE_COLUMNS = (
    "id", "cancelled", "tokens", "tok_s", "prefill_tps", "cache_hit_pct", "read_mib", "n_prompt",
    "n_past",
)  # fmt: skip

Views = dict[str, "dict[str, Any] | pd.DataFrame"]


def describe(path: PathLike) -> Views:
    """Named groups of figures describing the file at `path`."""
    from bmoe.formats.quickinfo import describe_route_columns, describe_small_metrics

    quick = describe_small_metrics(path, _KEY_PARAMS, _KEY_SUMMARY)
    if quick is None:
        quick = describe_route_columns(path, _KEY_PARAMS)
    if quick is not None:
        return quick
    return describe_fully(path)


def describe_fully(path: PathLike) -> Views:
    """:func:`describe` through the full reader of the file's format (every file, any size)."""
    from bmoe.formats.load import detect_kind, load_file
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace
    from bmoe.formats.runlog import RunOutput

    kind = detect_kind(path)
    obj = load_file(path, kind)
    head: dict[str, Any] = {"file": str(path)}
    if kind == "parquet":
        head["stored as"] = "parquet"
    if isinstance(obj, MetricsRun):
        head.update(format="bmoe_metrics", version=obj.version, rows=obj.tokens)
        head.update(steps=obj.steps, partial=obj.partial, turns=len(obj.summaries) or None)
        params = {k: obj.params[k] for k in _KEY_PARAMS if k in obj.params}
        summary = {k: obj.summary[k] for k in _KEY_SUMMARY if k in obj.summary}
        return _with_warnings({"file": head, "parameters": params, "summary": summary}, obj)
    if isinstance(obj, RouteTrace):
        rows = obj.rows
        head.update(format="route_trace", version=obj.version, rows=len(rows))
        head["steps"] = int(rows["step"].nunique()) if len(rows) else 0
        head["layers with sizes"] = len(obj.expert_bytes())
        head["recorded with dropping"] = obj.recorded_with_dropping
        params = {k: obj.meta[k] for k in _KEY_PARAMS if k in obj.meta}
        return _with_warnings({"file": head, "parameters": params}, obj)
    if isinstance(obj, ComputeTrace | IoTrace):
        tag = "compute_trace" if isinstance(obj, ComputeTrace) else "io_trace"
        head.update(format=tag, version=obj.version, rows=len(obj.rows))
        if "step" in obj.rows:
            head["steps"] = int(obj.rows["step"].nunique())
        if isinstance(obj, ComputeTrace):
            head["layer granular"] = obj.layer_granular
        return _with_warnings({"file": head, "parameters": dict(obj.meta)}, obj)
    if isinstance(obj, RunOutput):
        return _with_warnings(_describe_run_output(obj, head), obj)
    if kind == "pressure":
        head.update(format="pressure sidecar", keys=len(obj))
        return {"file": head, "pressure": dict(obj)}
    if kind == "state":
        head.update(format="device state", sections=", ".join(obj) or None)
        return {"file": head, "state": state_table(obj)}
    return {"file": head}


def _with_warnings(views: Views, obj: Any) -> Views:
    if getattr(obj, "warnings", None):
        views["warnings"] = {f"warning {i + 1}": w for i, w in enumerate(obj.warnings)}
    return views


def _describe_run_output(run: Any, head: dict[str, Any]) -> Views:
    import pandas as pd

    from bmoe.formats import protocol

    views: Views = {"file": head}
    if run.is_stream:
        counts = run.tag_counts()
        progress = counts.get("PROGRESS", 0)
        head.update(format="bmoe protocol stream", events=len(run.events), tokens=progress)
        head["requests"] = counts.get("BEGIN") or None
        head["generations"] = counts.get("DONE", 0) + counts.get("DECIDE", 0)
        head["errors"] = counts.get("ERROR", 0)
        views["events"] = counts
        ready = run.of(protocol.Ready)
        if ready:
            views["session"] = {k: v for k, v in ready[-1].data.items()}
        done = run.generations
        if done:
            views["generations"] = pd.DataFrame.from_records(
                [{k: d.data.get(k) for k in _DONE_COLUMNS} for d in done]
            )
        if run.errors:
            views["errors"] = pd.DataFrame(
                [
                    {"id": e.id, "fatal": e.fatal, "msg": protocol.printable(e.msg or "")}
                    for e in run.errors
                ]
            )
    else:
        head.update(format="run log")
    if run.failure:
        head["failed"] = run.failure
    if run.figures:
        views["end_of_run"] = {k: v for k, v in run.figures.items() if k != "other_lines"} | {
            f"line {i + 1}": ln for i, ln in enumerate(run.figures.get("other_lines", []))
        }
    if run.pressure:
        views["pressure"] = dict(run.pressure)
    return views


def state_table(sections: dict[str, Any]) -> pd.DataFrame:
    """The figures that matter in a ``.state`` snapshot: one row per figure, one column per
    section (``before``, ``after``)."""
    import pandas as pd

    columns: dict[str, dict[str, Any]] = {}
    for name, state in sections.items():
        col: dict[str, Any] = {
            "date": state.date,
            "thermal_status": state.thermal_status,
            "cpu_temp_max_c": state.cpu_temp_max_c,
            "mem_available_kb": state.meminfo_kb.get("MemAvailable"),
            "mem_free_kb": state.meminfo_kb.get("MemFree"),
            "battery_temp_dC": state.battery_temp_dC,
        }
        for policy, khz in state.scaling_max_freq.items():
            col[f"{policy}_scaling_max_khz"] = khz
        columns[name] = col
    figures = list(dict.fromkeys(k for col in columns.values() for k in col))
    frame = pd.DataFrame({"figure": figures})
    for name, col in columns.items():
        frame[name] = pd.Series([col.get(f) for f in figures], dtype=object)
    return frame
