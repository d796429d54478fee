"""The system state each run was measured in, and how the profile deals with traced runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.profile.pressure import memory_state
from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.analyze.verdict import CONTENDED_RATIO, OFF_CPU_PCT, off_cpu_pct


def compute_over_cpu(tokens: pd.DataFrame, threads: int) -> float:
    """A run's compute time over its CPU time per thread (NaN when it recorded either not at
    all): above 1 the compute threads were waiting for a core while they computed, since CPU
    time per thread also holds the reads' and management's CPU."""
    compute = pd.to_numeric(tokens["compute_ms"], errors="coerce").astype(float)
    cpu = pd.to_numeric(tokens["cpu_ms"], errors="coerce").astype(float) / max(threads, 1)
    keep = compute.notna() & cpu.notna()
    if not keep.any() or float(cpu[keep].sum()) <= 0:
        return float("nan")
    return float(compute[keep].sum()) / float(cpu[keep].sum())


def _off_cpu(tokens: pd.DataFrame, config: RunConfig) -> float:
    """The verdict's off-CPU share, token by token, and its median over the run's tokens (NaN
    when it cannot tell): one token that waited a second for flash while starved (a cold
    first token) would otherwise count as a measured wait for the whole run."""
    wall = pd.to_numeric(tokens["wall_ms"], errors="coerce").astype(float)
    cpu = pd.to_numeric(tokens["cpu_ms"], errors="coerce").astype(float)
    stall = tokens["stall_ms"] if config.overlap else pd.Series(0.0, index=tokens.index)
    frame = pd.DataFrame(
        {
            "tok_s_mean": 1000.0 / wall.where(wall > 0),
            "cpu_s_per_token": cpu / 1000.0,
            "threads": config.threads,
            "stall_ms_per_token": pd.to_numeric(stall, errors="coerce").astype(float),
            "io_s_per_token": pd.to_numeric(tokens["io_ms"], errors="coerce") / 1000.0,
            "mgmt_ms_per_token": pd.to_numeric(tokens["mgmt_ms"], errors="coerce"),
        }
    )
    off = off_cpu_pct(frame)
    return float(off.median()) if off.notna().any() else float("nan")


def run_state(run: ProfileRun, tokens: pd.DataFrame, config: RunConfig) -> dict[str, Any]:
    """The system state a run was measured in: its sweep record's system warnings and entry
    load (where it ran in a sweep), the engine's CPU share (CPU time over wall time), and its
    off-CPU share (the verdict's measure: wall time that was neither CPU time per thread nor
    a measured wait; the median over its tokens), whether it was starved of a core, its
    compute time over its CPU time per thread, and whether it was contended (starved, or its
    compute took more than :data:`CONTENDED_RATIO` times its CPU time per thread while it
    took no major faults: a fault's wait is compute time off the CPU too); and its memory
    picture (:func:`bmoe.analyze.profile.pressure.memory_state`)."""
    record = run.record or {}
    entry = record.get("entry") if isinstance(record.get("entry"), dict) else {}
    wall = float(np.nansum(tokens["wall_ms"]))
    cpu = float(np.nansum(tokens["cpu_ms"])) if tokens["cpu_ms"].notna().any() else None
    n = max(len(tokens), 1)
    off = _off_cpu(tokens, config)
    warnings_ = record.get("system_warnings") or []
    share = record.get("engine_cpu_share")
    if share is None and cpu and wall > 0:
        share = cpu / wall
    off_value = None if off != off else float(off)
    ratio = compute_over_cpu(tokens, config.threads)
    starved = bool(off_value is not None and off_value > OFF_CPU_PCT)
    faults = pd.to_numeric(tokens["majflt"], errors="coerce") if "majflt" in tokens else None
    faulting = faults is not None and bool(faults.notna().any()) and float(faults.mean()) >= 1
    return {
        "name": run.name,
        "version": run.metrics.version,
        "tokens": len(tokens),
        "tok_s": 1000.0 * n / wall if wall > 0 else None,
        **config.axes(),
        "threads": config.threads,
        "n_expert_used": config.n_expert_used,
        "drop": config.drop or 0.0,
        "dense_weights": run.metrics.params.get("dense_weights"),
        "traced": run.traced,
        "compute_traced": run.compute_traced,
        "assumed": dict(config.assumed),
        "system_warnings": [str(w) for w in warnings_],
        "load_1m": entry.get("load_1m") if entry else None,
        "cpu_share": None if share is None else float(share),
        "off_cpu_pct": off_value,
        "starved": starved,
        "compute_over_cpu": None if ratio != ratio else ratio,
        "contended": starved or bool(not faulting and ratio == ratio and ratio > CONTENDED_RATIO),
        **memory_state(run, config),
    }


def tracing_section(
    runs: Sequence[ProfileRun],
    untraced: Sequence[ProfileRun],
    timing: Sequence[ProfileRun],
    frames: Mapping[str, pd.DataFrame],
    configs: Mapping[str, RunConfig],
) -> dict[str, Any]:
    """How the profile deals with traced runs, and the overhead where it can be measured (a
    traced and an untraced run of one configuration)."""
    traced = [r for r in runs if r.traced]
    if not traced:
        return {"how": "no traced runs"}
    out: dict[str, Any] = {
        "traced_runs": [r.name for r in traced],
        "timing_runs": [r.name for r in timing],
    }
    if untraced:
        out["how"] = (
            "compute, management and stall from the untraced runs; routing and flash "
            "latency from the traced ones (its level from the untraced runs of their "
            "configurations, where there are any: see the flash note)"
        )
    else:
        out["how"] = "not removed"
    overhead: dict[str, list[float]] = {}
    for t in traced:
        key = configs[t.name].axes()
        twins = [u for u in untraced if configs[u.name].axes() == key]
        if twins:
            for col in ("compute_ms", "mgmt_ms"):
                a = float(np.nanmean(frames[t.name][col]))
                b = float(np.nanmean(np.concatenate([frames[u.name][col] for u in twins])))
                if np.isfinite(a) and np.isfinite(b):
                    overhead.setdefault(col, []).append(a - b)
    if overhead:
        out["overhead_ms"] = {k: float(np.mean(v)) for k, v in overhead.items()}
    return out


__all__ = ["compute_over_cpu", "run_state", "tracing_section"]
