"""The profile's cost terms besides flash: compute, management, memory, stall, prefill.

The profile's compute term: the ``compute_ms`` residual of the timing runs, less what the
management and fault terms explain; taken from CPU time where the run was contended (starved
of a core, or its compute took well over its CPU time per thread), so that a profile recorded
on a busy machine describes the machine, not the noise: CPU time per token is the same on a
quiet machine and beside two spinning processes (within 3-8 % on the ``small`` model), while
compute's wall time grows by 1.2-2.5x.

Where the timing runs read different volumes a token, compute is also kept per read volume
(``by_read``): on a machine with few cores the reads' copying and page clearing take CPU from
the compute threads, so compute grows with the bytes read (on 2 cores, the ``small`` model:
12 ms a token at 3 MiB read, 19-25 at 37 MiB, 50 at 122 MiB). A prediction interpolates
between those points and holds the nearest one beyond them (see
:func:`bmoe.analyze.device.timing.compute_at`).

The profile's cost terms besides flash: cache management per read admitted, memory
pressure (major faults against the memory a configuration asks for), the stall the overlap
leaves, and the prefill rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.evidence import Evidence
from bmoe.analyze.device.fits import fit_line, provenance, term_spread, volume_groups
from bmoe.analyze.device.runs import ProfileRun, RunConfig
from bmoe.formats.op_traces import ComputeTrace


def cpu_calibration(
    runs: Sequence[ProfileRun],
    frames: Mapping[str, pd.DataFrame],
    configs: Mapping[str, RunConfig],
) -> float | None:
    """Compute over CPU time per thread on the tokens of `runs` (uncontended ones) that
    recorded both, a ratio of sums: one figure, because the reads' CPU grows with compute's
    own (0.8-1.0 on the ``small`` model at 3 to 122 MiB read a token, 0.96 on the phone
    corpus), and a slope per MiB fitted within runs of one read volume is noise. None
    without such tokens."""
    compute_sum = cpu_sum = 0.0
    for run in runs:
        frame = frames[run.name]
        cpu = frame["cpu_ms"].to_numpy() / configs[run.name].threads
        compute = frame["compute_ms"].to_numpy()
        keep = np.isfinite(cpu) & np.isfinite(compute)
        if keep.sum() < 4:
            continue
        compute_sum += float(compute[keep].sum())
        cpu_sum += float(cpu[keep].sum())
    if cpu_sum <= 0 or compute_sum <= 0:
        return None
    return compute_sum / cpu_sum


def expert_share(traces: Sequence[ComputeTrace]) -> float | None:
    """Share of decode compute spent in expert matmuls (MUL_MAT_ID), from compute traces."""
    total = expert = 0.0
    for trace in traces:
        rows = trace.rows
        if not len(rows) or "op" not in rows:
            continue
        dec = rows[rows["phase"] != 0] if "phase" in rows else rows
        total += float(dec["wall_ns"].sum())
        expert += float(dec.loc[dec["op"].astype(str) == "MUL_MAT_ID", "wall_ns"].sum())
    return expert / total if total else None


def _calibration(ev: Evidence) -> float | None:
    """CPU time's calibration against compute from the timing runs that were not contended;
    failing those, CPU time per thread one to one (on a quiet machine compute is 0.8-1.2 of
    it; the phone corpus 0.96) and the profile says it is uncalibrated."""
    calibration = cpu_calibration(
        [r for r in ev.timing if not ev.contended(r)], ev.frames, ev.configs
    )
    contended = [r for r in ev.timing if ev.contended(r)]
    recorded = any(np.isfinite(ev.values(r, "cpu_ms")).any() for r in contended)
    if calibration is None and recorded:
        calibration = 1.0
        ev.unsettled.append(
            "every run was contended (starved of a core, or its compute waited for one): "
            "compute is their CPU time per thread, uncalibrated (no uncontended run to "
            "weigh it against; threads that spin while they wait count as CPU time)"
        )
    return calibration


def _contention(state: Mapping[str, Any]) -> str:
    """Why a run counts as contended, in words."""
    if state["starved"]:
        return f"the engine was starved of a core ({state['off_cpu_pct']:.0f} % off-CPU)"
    return (
        f"its compute took {state['compute_over_cpu']:.2f}x its CPU time per thread (the "
        "compute threads waited for a core)"
    )


def _run_compute(
    ev: Evidence,
    run: ProfileRun,
    mgmt: Mapping[str, float] | None,
    fault_ms: float,
    calibration: float | None,
    notes: list[str],
) -> np.ndarray:
    """Per token of one timing run, its compute (see the module docstring). `mgmt` is the
    management fit to take out of a run that did not record ``mgmt_ms`` (None: no fit)."""
    compute = ev.values(run, "compute_ms").copy()
    if not ev.measured(run, "mgmt_ms") and mgmt is not None:
        compute = compute - (mgmt["token_ms"] + mgmt["per_admit_ms"] * ev.admits(run))
    if fault_ms and ev.measured(run, "majflt"):
        compute = compute - fault_ms * np.nan_to_num(ev.values(run, "majflt"))
    if ev.contended(run):
        why = _contention(ev.state[run.name])
        cpu = ev.values(run, "cpu_ms")
        if np.isfinite(cpu).any() and calibration is not None:
            from_cpu = calibration * cpu / ev.configs[run.name].threads
            compute = np.where(np.isfinite(from_cpu), np.maximum(from_cpu, 0.0), compute)
            notes.append(f"{run.name}: {why}: compute from its CPU time")
        else:
            ev.unsettled.append(
                f"{run.name}: {why}, and its compute cannot be taken from CPU time: it "
                "recorded none"
            )
    return np.maximum(compute, 0.0)


def compute_section(
    ev: Evidence, mgmt: Mapping[str, float] | None, fault_ms: float
) -> dict[str, Any]:
    """The profile's ``compute`` section and its term record (see the module docstring)."""
    calibration = _calibration(ev)
    notes: list[str] = []
    per_run = {r.name: _run_compute(ev, r, mgmt, fault_ms, calibration, notes) for r in ev.timing}
    columns = ["compute_ms"]
    if any(ev.contended(r) for r in ev.timing) and calibration is not None:
        columns.append("cpu_ms/threads")
    if fault_ms:
        columns.append("majflt")
    by_read = compute_by_read(ev, per_run)
    ev.terms["compute"] = provenance(
        [r.name for r in ev.timing],
        columns,
        term_spread(per_run, _by_read_model(ev, per_run, by_read), ev.config_keys(ev.timing)),
        note="; ".join(notes),
    )
    every = np.concatenate(list(per_run.values()))
    section: dict[str, Any] = {
        "token_ms": float(np.mean(every)),  # tok/s is tokens over summed time
        "token_ms_p10": float(np.quantile(every, 0.1)),
        "token_ms_p90": float(np.quantile(every, 0.9)),
        "expert_share": expert_share([r.compute for r in ev.runs if r.compute is not None]),
        "source": " and ".join(columns),
        "threads": int(np.median([ev.configs[r.name].threads for r in ev.timing])),
    }
    if by_read:
        section["by_read"] = by_read
    if section["expert_share"] is None:
        ev.absent["expert_share"] = "no compute trace among the runs (the dense/expert split)"
    if any(r.route is not None for r in ev.runs) and not ev.untraced:
        ev.caveats.append(
            "route-traced runs: their cache management includes the trace bookkeeping"
        )
    return section


def _by_read_model(
    ev: Evidence, per_run: Mapping[str, np.ndarray], by_read: list[dict[str, float]]
) -> dict[str, np.ndarray] | None:
    """What the per-volume points say each run's compute is (None: one volume, one figure):
    runs that differ because they read different volumes do not disagree."""
    if not by_read:
        return None
    xs = [p["read_mib"] for p in by_read]
    ys = [p["token_ms"] for p in by_read]
    out = {}
    for name, values in per_run.items():
        mib = _run_mib(ev, name)
        level = np.interp(mib, xs, ys) if np.isfinite(mib) else np.nanmean(values)
        out[name] = np.full(len(values), float(level))
    return out


def _run_mib(ev: Evidence, name: str) -> float:
    """A timing run's mean MiB read per token (NaN where it recorded none)."""
    run = next(r for r in ev.timing if r.name == name)
    mib = ev.values(run, "read_mib")
    return float(np.nanmean(mib)) if np.isfinite(mib).any() else float("nan")


def compute_by_read(ev: Evidence, per_run: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
    """Compute per token against the MiB read per token, one point per read volume (runs of
    one volume averaged token by token), ascending; empty unless there are two volumes at
    least :data:`~bmoe.analyze.device.fits.SAME_VOLUME` apart."""
    groups = volume_groups(
        [
            (float(np.nanmean(ev.values(r, "read_mib"))), per_run[r.name])
            for r in ev.timing
            if len(per_run[r.name]) and np.isfinite(ev.values(r, "read_mib")).any()
        ]
    )
    if len(groups) < 2:
        return []
    return [
        {
            "read_mib": float(np.mean([m for m, _v in g])),
            "token_ms": float(np.mean(np.concatenate([v for _m, v in g]))),
        }
        for g in groups
    ]


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


__all__ = [
    "compute_by_read",
    "compute_section",
    "cpu_calibration",
    "expert_share",
    "memory_section",
    "mgmt_section",
    "prefill_section",
    "stall_section",
]
