"""The system state each run was measured in: memory pressure, contention, tracing.

How close a run ran to its device's memory limit: what it asked of the memory (its cache
budget and what else it kept resident), what the device had available when it started, the
least that was left while it ran, swap and major faults. From the per-token memory columns
(``rss_mib``, ``rss_anon_mib``, ``swap_mib``, ``mem_available_mib``, ``majflt``) where the
metrics have them, else the ``.metrics`` sidecar (``peak_rss_kb``, ``mem_avail_before_kb``,
``mem_avail_floor_kb``). A prediction for a configuration that asks more than any profile run
did is judged against these (:mod:`bmoe.analyze.device.levers`).

The system state each run was measured in, and how the profile deals with traced runs.

Contended runs' token times, scaled to what an uncontended run of the machine would take.

A run whose compute took more than :data:`~bmoe.analyze.verdict.CONTENDED_RATIO` times its
CPU time per thread waited for a core while it computed, and so did the rest of its token: on
the ``small`` model beside two spinning processes on two cores, compute's wall time grew by
1.2-2.5x, the flash wait and management by 1.2-1.5x (the host's reads are CPU work: copies out
of the page cache), while CPU time per token stayed within 3-8 %. Such a run's token times
(wall, compute, flash wait, stall, management) are divided by its slowdown: its compute over
its CPU time per thread, over the same ratio on the uncontended runs (1 without any). An
estimate, and the profile says so: where flash waits for a device rather than a CPU, it takes
too much off the flash wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.evidence import Tokens
from bmoe.analyze.device.runs import ProfileRun, RunConfig, number
from bmoe.analyze.verdict import CONTENDED_RATIO, OFF_CPU_PCT, off_cpu_pct

KIB_PER_MIB = 1024.0


def _column(rows: pd.DataFrame, name: str) -> np.ndarray | None:
    if name not in rows or not len(rows):
        return None
    values = pd.to_numeric(rows[name], errors="coerce").to_numpy(np.float64)
    values = values[np.isfinite(values)]
    return values if len(values) else None


def memory_state(run: ProfileRun, config: RunConfig) -> dict[str, Any]:
    """A run's memory picture (MiB; None where its files say nothing): ``asked_mib`` its cache
    budget plus what else it kept resident, ``available_mib`` what the device had for it when
    it started (MemAvailable then, plus what the run itself already held), ``left_min_mib``
    the least MemAvailable while it ran, ``swap_mib`` the most swap, ``majflt_per_token``,
    ``rss_anon_mib`` and ``peak_rss_mib``; ``memory_from`` says which files said it."""
    rows = run.metrics.rows
    side = run.pressure
    rss = _column(rows, "rss_mib")
    anon = _column(rows, "rss_anon_mib")
    avail = _column(rows, "mem_available_mib")
    swap = _column(rows, "swap_mib")
    faults = _column(rows, "majflt")
    peak_kb = number(side.get("peak_rss_kb"))
    before_kb = number(side.get("mem_avail_before_kb"))
    floor_kb = number(side.get("mem_avail_floor_kb"))
    peak = float(rss.max()) if rss is not None else (peak_kb / KIB_PER_MIB if peak_kb else None)
    held = float(np.median(rss)) if rss is not None else peak
    cache = config.cache_mb or 0.0
    resident = float(np.median(anon)) if anon is not None else held
    other = max((held or 0.0) - min(cache, resident or 0.0), 0.0) if held is not None else None
    if avail is not None and held is not None:
        available = float(avail[0]) + float(rss[0] if rss is not None else held)
    elif before_kb:
        available = before_kb / KIB_PER_MIB
    else:
        available = None
    left = float(avail.min()) if avail is not None else (
        floor_kb / KIB_PER_MIB if floor_kb else None)  # fmt: skip
    sources = [c for c in ("rss_mib", "rss_anon_mib", "mem_available_mib", "swap_mib", "majflt")
               if c in rows]  # fmt: skip
    if side:
        sources.append(".metrics sidecar")
    return {
        "asked_mib": cache + other if other is not None else None,
        "available_mib": available,
        "left_min_mib": left,
        "swap_mib": float(swap.max()) if swap is not None else None,
        "majflt_per_token": float(faults.mean()) if faults is not None else None,
        "rss_anon_mib": resident,
        "peak_rss_mib": peak,
        "memory_from": ", ".join(sources) or None,
    }


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
    picture (:func:`bmoe.analyze.device.state.memory_state`)."""
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


#: The token columns a slowdown divides.
SCALED = ("wall_ms", "compute_ms", "io_ms", "stall_ms", "mgmt_ms")


def _ratio(tokens: Tokens, threads: int) -> tuple[float, float]:
    """(compute, CPU time per thread) summed over the tokens that recorded both."""
    compute = tokens.values("compute_ms")
    cpu = tokens.values("cpu_ms") / max(threads, 1)
    keep = np.isfinite(compute) & np.isfinite(cpu)
    return float(compute[keep].sum()), float(cpu[keep].sum())


def slowdowns(
    runs: Sequence[ProfileRun],
    tokens: Mapping[str, Tokens],
    configs: Mapping[str, RunConfig],
    states: Sequence[Mapping[str, Any]],
) -> dict[str, float]:
    """Per contended run that recorded CPU time, its slowdown (see the module docstring;
    at least 1); runs not named are not scaled."""
    contended = {s["name"] for s in states if s.get("contended")}
    sums = {r.name: _ratio(tokens[r.name], configs[r.name].threads) for r in runs}
    clean = [sums[r.name] for r in runs if r.name not in contended and not r.compute_traced]
    compute, cpu = (sum(c for c, _ in clean), sum(p for _, p in clean)) if clean else (0, 0)
    baseline = compute / cpu if compute > 0 and cpu > 0 else 1.0
    out = {}
    for name in contended:
        compute, cpu = sums[name]
        if compute > 0 and cpu > 0:
            out[name] = max(compute / cpu / baseline, 1.0)
    return out


def scaled(tokens: Tokens, factor: float) -> Tokens:
    """`tokens` with their times divided by `factor`."""
    frame = tokens.frame.copy()
    for column in SCALED:
        if column in frame:
            frame[column] = frame[column] / factor
    return replace(tokens, frame=frame, _arrays={})


__all__ = [
    "SCALED",
    "compute_over_cpu",
    "memory_state",
    "run_state",
    "scaled",
    "slowdowns",
    "tracing_section",
]
