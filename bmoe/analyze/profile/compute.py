"""The profile's compute term: the ``compute_ms`` residual of the timing runs, less what the
management and fault terms explain; taken from CPU time where the engine was starved of a
core, so that a profile recorded on a busy machine describes the machine, not the noise.

Where the timing runs read different volumes a token, compute is also kept per run against
that volume (``by_read``): on a machine with few cores the reads' copying and page clearing
take CPU from the compute threads, so compute grows with the bytes read (on 2 cores, the
``small`` model: 12 ms a token at 2 MiB read, 37 at 35 MiB, 52 at 122 MiB). A prediction
interpolates between those points and holds the nearest one beyond them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.fits import fit_line, fit_two
from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.analyze.profile.spread import provenance, term_spread
from bmoe.formats.op_traces import ComputeTrace


def cpu_calibration(
    runs: Sequence[ProfileRun],
    frames: Mapping[str, pd.DataFrame],
    configs: Mapping[str, RunConfig],
) -> tuple[float, float] | None:
    """How CPU time relates to compute on unstarved tokens: ``compute = scale x (cpu / threads
    - per_mib x read_mib)`` (the I/O lanes' CPU grows with what they read). None without
    unstarved tokens that recorded CPU time."""
    xs, mibs, ys = [], [], []
    for run in runs:
        frame = frames[run.name]
        cpu = frame["cpu_ms"].to_numpy() / configs[run.name].threads
        keep = np.isfinite(cpu) & np.isfinite(frame["compute_ms"].to_numpy())
        if keep.sum() < 4:
            continue
        xs.append(cpu[keep])
        mibs.append(frame["read_mib"].to_numpy()[keep])
        ys.append(frame["compute_ms"].to_numpy()[keep])
    if not xs:
        return None
    cpu, mib, compute = np.concatenate(xs), np.concatenate(mibs), np.concatenate(ys)
    # cpu/threads = compute / scale + per_mib x mib
    inv_scale, per_mib = fit_two(compute, mib, cpu)
    if inv_scale <= 0:
        inv_scale, per_mib = (float(np.sum(cpu)) / max(float(np.sum(compute)), 1e-12)), 0.0
    if inv_scale <= 0:
        return None
    return 1.0 / inv_scale, per_mib


def cpu_io_share(
    runs: Sequence[ProfileRun],
    frames: Mapping[str, pd.DataFrame],
    configs: Mapping[str, RunConfig],
) -> tuple[float, float] | None:
    """Without an unstarved run: CPU time per thread taken one to one for compute, less the
    part that grows with the MiB read (the lanes' CPU: the slope of CPU time per thread on
    MiB read over the runs' tokens). None without CPU time."""
    xs, ys = [], []
    for run in runs:
        frame = frames[run.name]
        cpu = frame["cpu_ms"].to_numpy() / configs[run.name].threads
        keep = np.isfinite(cpu)
        xs.append(frame["read_mib"].to_numpy()[keep])
        ys.append(cpu[keep])
    if not xs or not sum(len(x) for x in xs):
        return None
    _base, per_mib = fit_line(np.concatenate(xs), np.concatenate(ys))
    return 1.0, per_mib


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


def _calibration(ev: Evidence) -> tuple[float, float] | None:
    """CPU time's calibration against compute from the unstarved timing runs; failing those,
    the starved runs' CPU time one to one (and the profile says it is unsettled)."""
    frames = ev.frames
    calibration = cpu_calibration([r for r in ev.timing if not ev.starved(r)], frames, ev.configs)
    starved_runs = [r for r in ev.timing if ev.starved(r)]
    if calibration is None and starved_runs:
        calibration = cpu_io_share(starved_runs, frames, ev.configs)
        if calibration is not None:
            ev.unsettled.append(
                "every run was starved of a core: compute is their CPU time per thread, "
                "uncalibrated (no unstarved run to weigh it against; threads that spin while "
                "they wait count as CPU time)"
            )
    return calibration


def _run_compute(
    ev: Evidence,
    run: ProfileRun,
    mgmt: Mapping[str, float] | None,
    fault_ms: float,
    calibration: tuple[float, float] | None,
    notes: list[str],
) -> np.ndarray:
    """Per token of one timing run, its compute (see the module docstring). `mgmt` is the
    management fit to take out of a run that did not record ``mgmt_ms`` (None: no fit)."""
    compute = ev.values(run, "compute_ms").copy()
    if not ev.measured(run, "mgmt_ms") and mgmt is not None:
        compute = compute - (mgmt["token_ms"] + mgmt["per_admit_ms"] * ev.admits(run))
    if fault_ms and ev.measured(run, "majflt"):
        compute = compute - fault_ms * np.nan_to_num(ev.values(run, "majflt"))
    if ev.starved(run):
        off = ev.state[run.name]["off_cpu_pct"]
        cpu = ev.values(run, "cpu_ms")
        if np.isfinite(cpu).any() and calibration is not None:
            scale, per_mib = calibration
            threads = ev.configs[run.name].threads
            from_cpu = scale * (cpu / threads - per_mib * ev.values(run, "read_mib"))
            compute = np.where(np.isfinite(from_cpu), np.maximum(from_cpu, 0.0), compute)
            notes.append(
                f"{run.name}: the engine was starved of a core ({off:.0f} % off-CPU): compute "
                "from its CPU time"
            )
        else:
            ev.unsettled.append(
                f"{run.name} was starved of a core ({off:.0f} % off-CPU) and its compute "
                "cannot be taken from CPU time: it recorded none"
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
    if any(ev.starved(r) for r in ev.timing) and calibration is not None:
        columns.append("cpu_ms/threads")
    if fault_ms:
        columns.append("majflt")
    ev.terms["compute"] = provenance(
        [r.name for r in ev.timing], columns, term_spread(per_run), note="; ".join(notes)
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
    by_read = compute_by_read(ev, per_run)
    if by_read:
        section["by_read"] = by_read
    if section["expert_share"] is None:
        ev.absent["expert_share"] = "no compute trace among the runs (the dense/expert split)"
    if any(r.route is not None for r in ev.runs) and not ev.untraced:
        ev.caveats.append(
            "route-traced runs: their cache management includes the trace bookkeeping"
        )
    return section


#: Timing runs whose read volumes a token are within this factor count as one volume.
SAME_VOLUME = 1.25


def compute_by_read(ev: Evidence, per_run: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
    """Compute per token against the MiB read per token, one point per read volume (runs of
    one volume averaged token by token), ascending; empty unless there are two volumes at
    least :data:`SAME_VOLUME` apart."""
    points = sorted(
        (
            (float(np.nanmean(ev.values(r, "read_mib"))), per_run[r.name])
            for r in ev.timing
            if len(per_run[r.name]) and np.isfinite(ev.values(r, "read_mib")).any()
        ),
        key=lambda point: point[0],
    )
    groups: list[list[tuple[float, np.ndarray]]] = []
    for mib, values in points:
        if groups and mib <= max(groups[-1][0][0], 1.0) * SAME_VOLUME:
            groups[-1].append((mib, values))
        else:
            groups.append([(mib, values)])
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
    "cpu_io_share",
    "expert_share",
]
