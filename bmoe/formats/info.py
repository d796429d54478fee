"""A short description of any telemetry file (what ``bmoe info`` prints)."""

from __future__ import annotations

from typing import Any

from bmoe.formats.csvtable import PathLike
from bmoe.formats.load import load_file

_KEY_PARAMS = (
    "engine", "model", "arch", "n_layer", "n_expert", "n_expert_used", "threads", "moe_stream",
    "cache_mb", "io_threads", "o_direct", "overlap", "prefetch", "dense_weights",
    "drop_cold_frac", "temp", "spec",
)  # fmt: skip
_KEY_SUMMARY = ("tokens", "tok/s", "s/tok", "read_MiB", "cache_hit_pct", "prefill_tps", "load_s")


def describe(path: PathLike) -> dict[str, dict[str, Any]]:
    """Named groups of figures describing the file at `path`."""
    from bmoe.formats.decode import ComputeTrace, IoTrace
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.route import RouteTrace

    obj = load_file(path)
    head: dict[str, Any] = {"file": str(path)}
    if isinstance(obj, MetricsRun):
        head.update(format="bmoe_metrics", version=obj.version, rows=obj.tokens)
        head.update(steps=obj.steps, partial=obj.partial, turns=len(obj.summaries) or None)
        params = {k: obj.params[k] for k in _KEY_PARAMS if k in obj.params}
        summary = {k: obj.summary[k] for k in _KEY_SUMMARY if k in obj.summary}
        return {"file": head, "parameters": params, "summary": summary}
    if isinstance(obj, RouteTrace):
        rows = obj.rows
        head.update(format="route_trace", version=obj.version, rows=len(rows))
        head["steps"] = int(rows["step"].nunique()) if len(rows) else 0
        head["layers with sizes"] = len(obj.expert_bytes())
        head["recorded with dropping"] = obj.recorded_with_dropping
        params = {k: obj.meta[k] for k in _KEY_PARAMS if k in obj.meta}
        return {"file": head, "parameters": params}
    if isinstance(obj, ComputeTrace | IoTrace):
        tag = "compute_trace" if isinstance(obj, ComputeTrace) else "io_trace"
        head.update(format=tag, version=obj.version, rows=len(obj.rows))
        if "step" in obj.rows:
            head["steps"] = int(obj.rows["step"].nunique())
        if isinstance(obj, ComputeTrace):
            head["layer granular"] = obj.layer_granular
        return {"file": head, "parameters": dict(obj.meta)}
    return {"file": head}
