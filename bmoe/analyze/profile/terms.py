"""The profile's cost terms besides flash: cache management per read admitted, memory
pressure (major faults against the memory a configuration asks for), the stall the overlap
leaves, and the prefill rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.fits import fit_line
from bmoe.analyze.profile.runs import ProfileRun
from bmoe.analyze.profile.spread import provenance, term_spread


def _read_columns(runs: Sequence[ProfileRun]) -> str:
    """Where a term's reads came from: the runs' route traces, else their read_bytes."""
    return "read_bytes" if not any(r.route for r in runs) else "route trace"


def mgmt_section(ev: Evidence) -> tuple[dict[str, float], bool]:
    """Management per token as a fixed part and a part per read admitted, fitted on the
    timing runs that recorded ``mgmt_ms`` (any run that did, failing those); and whether a
    fit was made (False: no run recorded it, named absent)."""
    runs = [r for r in ev.timing if ev.measured(r, "mgmt_ms")]
    if not runs:
        runs = [r for r in ev.runs if ev.measured(r, "mgmt_ms")]
    if not runs:
        ev.absent["mgmt"] = (
            "no run recorded mgmt_ms (v0 files of 8 columns): their compute_ms residual "
            "includes cache management"
        )
        return {"token_ms": 0.0, "per_admit_ms": 0.0}, False
    admits = np.concatenate([ev.admits(r) for r in runs])
    mgmt_ms = np.concatenate([ev.values(r, "mgmt_ms") for r in runs])
    base, per_admit = fit_line(admits.astype(float), mgmt_ms)
    ev.terms["mgmt"] = provenance(
        [r.name for r in runs],
        ["mgmt_ms", _read_columns(runs)],
        term_spread(
            {r.name: ev.values(r, "mgmt_ms") for r in runs},
            {r.name: base + per_admit * ev.admits(r) for r in runs},
            ev.config_keys(runs),
        ),
        note=f"{base:.3g} ms per token + {per_admit:.3g} ms per read admitted",
    )
    return {"token_ms": base, "per_admit_ms": per_admit}, True


def _fault_cost(ev: Evidence, faulting: Sequence[ProfileRun]) -> tuple[float, str]:
    """The time one major fault costs: the within-run slope of compute on faults."""
    xs, ys = [], []
    for run in faulting:
        faults = ev.values(run, "majflt")
        compute = ev.values(run, "compute_ms")
        keep = np.isfinite(faults) & np.isfinite(compute)
        if keep.sum() >= 4 and np.ptp(faults[keep]) > 0:
            xs.append(faults[keep] - faults[keep].mean())
            ys.append(compute[keep] - compute[keep].mean())
    if not xs:
        return 0.0, "no run's faults varied: the cost of a fault is not measured"
    x, y = np.concatenate(xs), np.concatenate(ys)
    slope = float(np.sum(x * y) / np.sum(x * x)) if np.sum(x * x) > 0 else 0.0
    return max(slope, 0.0), "within-run slope of compute_ms on majflt"


def _memory_point(ev: Evidence, run: ProfileRun) -> dict[str, Any] | None:
    """What a run asked of the available memory and the faults per token it took (None
    when it recorded no memory figures)."""
    rows = run.metrics.rows
    cache = ev.configs[run.name].cache_mb or 0.0
    rss = float(rows["rss_mib"].median()) if "rss_mib" in rows else None
    avail = float(rows["mem_available_mib"].median()) if "mem_available_mib" in rows else None
    if (rss is None or avail is None) and run.pressure.get("peak_rss_kb"):
        rss = float(run.pressure["peak_rss_kb"]) / 1024.0
        before = run.pressure.get("mem_avail_before_kb")
        avail = (float(before) / 1024.0 - rss) if before else None
    if rss is None or avail is None or rss <= 0:
        return None
    anon = float(rows["rss_anon_mib"].median()) if "rss_anon_mib" in rows else rss
    resident_other = max(rss - min(cache, anon), 0.0)
    return {
        "run": run.name,
        "cache_mb": cache,
        "resident_other_mib": resident_other,
        "asked_mib": cache + resident_other,
        "available_mib": avail + rss,
        "faults_per_token": float(np.nanmean(ev.frame(run)["majflt"])),
    }


def memory_section(ev: Evidence) -> tuple[dict[str, Any], float]:
    """Major faults per token against how much of the available memory a run asked for
    (its cache budget plus what else it kept resident), and the time one fault costs (the
    within-run slope of compute on faults). Empty (and named absent) without majflt."""
    faulting = [r for r in ev.runs if ev.measured(r, "majflt")]
    if not faulting:
        ev.absent["memory"] = "no run recorded majflt (major faults): memory pressure not priced"
        return {}, 0.0
    fault_ms, how = _fault_cost(ev, faulting)
    points = []
    for run in faulting:
        key = ("memory_point", run.name)
        if key not in ev.per_run:
            ev.per_run[key] = _memory_point(ev, run)
        if ev.per_run[key] is not None:
            points.append(dict(ev.per_run[key]))
    if not points:
        ev.absent["memory"] = (
            "the runs recorded majflt but not their memory (rss_mib, mem_available_mib or a "
            "pressure sidecar): faults cannot be related to what a configuration asks (the "
            "runs' own faults stay in compute)"
        )
        return {}, 0.0
    memory = {
        "ms_per_fault": fault_ms,
        "points": points,
        "resident_mib": float(np.median([p["resident_other_mib"] for p in points])),
        "available_mib": float(np.median([p["available_mib"] for p in points])),
    }
    ev.terms["memory"] = provenance(
        [p["run"] for p in points],
        ["majflt", "compute_ms", "cache_budget_mib", "rss_mib", "mem_available_mib"],
        term_spread({r.name: ev.values(r, "majflt") for r in faulting}),
        note=f"{fault_ms:.3g} ms per major fault ({how}); faults per token against the "
        "share of available memory a configuration asks for",
    )
    # faults differ between configurations by design: their spread is not a fault of the term
    ev.terms["memory"].update(settled=True, why=None)
    return memory, fault_ms


def stall_section(ev: Evidence) -> dict[str, Any]:
    """The stall the overlap leaves, per token and per read missed, from the timing runs
    that used ``--overlap`` (any overlap run, failing those); {} (named absent) without."""
    overlapped = [r for r in ev.runs if ev.configs[r.name].overlap]
    runs = [r for r in ev.timing if ev.configs[r.name].overlap] or overlapped
    if not runs:
        ev.absent["stall"] = "no run used --overlap: overlap configurations cannot be predicted"
        return {}
    misses = np.concatenate([ev.values(r, "misses") for r in runs])
    stall = np.concatenate([ev.values(r, "stall_ms") for r in runs])
    a, b = fit_line(misses.astype(float), stall)
    ev.terms["stall"] = provenance(
        [r.name for r in runs],
        ["stall_ms", _read_columns(runs)],
        term_spread(
            {r.name: ev.values(r, "stall_ms") for r in runs},
            {r.name: a + b * ev.values(r, "misses") for r in runs},
            ev.config_keys(runs),
        ),
        note=f"{a:.3g} ms per token + {b:.3g} ms per read missed",
    )
    return {
        "stall_ms": a,
        "stall_ms_per_miss": b,
        "lanes": sorted({ev.configs[r.name].io_threads for r in runs}),
    }


def prefill_section(runs: Sequence[ProfileRun]) -> dict[str, float]:
    """The prefill rate, prefill time and load time the runs' summaries recorded (medians)."""
    prefill: dict[str, float] = {}
    rates = [
        r.figure("n_prompt") / r.figure("prefill_s")
        for r in runs
        if r.figure("prefill_s") and r.figure("n_prompt")
    ]
    if rates:
        prefill["tok_s"] = float(np.median(rates))
        prefill["prefill_s"] = float(
            np.median([r.figure("prefill_s") for r in runs if r.figure("prefill_s")])
        )
    loads = [r.figure("load_s") for r in runs if r.figure("load_s")]
    if loads:
        prefill["load_s"] = float(np.median(loads))
    return prefill


__all__ = ["memory_section", "mgmt_section", "prefill_section", "stall_section"]
