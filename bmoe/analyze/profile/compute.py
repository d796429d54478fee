"""The profile's compute term: the ``compute_ms`` residual of the timing runs, less what the
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
:func:`bmoe.analyze.predict.timing.compute_at`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.fits import volume_groups
from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.analyze.profile.spread import provenance, term_spread
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
    least :data:`~bmoe.analyze.profile.fits.SAME_VOLUME` apart."""
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


__all__ = [
    "compute_by_read",
    "compute_section",
    "cpu_calibration",
    "expert_share",
]
