"""The profile's sections, in order, measured from the evidence; the model section first.

The profile's model section: which model the runs ran, its expert sizes (from a route
trace, the model file or the preamble, in that order) and the bytes one read moves.

The profile's sections measured from the evidence, in order: which runs the timing terms
come from (and how traced runs are dealt with), management, memory pressure, compute, flash,
the overlap's stall, the prefill; then what is unsettled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.evidence import Evidence
from bmoe.analyze.device.fits import BLOCK_TOKENS
from bmoe.analyze.device.flash import flash_section
from bmoe.analyze.device.runs import ProfileRun, number
from bmoe.analyze.device.state import tracing_section
from bmoe.analyze.device.terms import (
    compute_section,
    memory_section,
    mgmt_section,
    prefill_section,
    stall_section,
)
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace
from bmoe.units import MIB

#: The contract's figures of one token's routed bytes (see the telemetry contract): where a
#: run's file keeps each, and what it is of the model's per-layer expert sizes at top-k ``k``.
#: ``cache_cycle_mb`` (v2's preamble) and ``token_demand_MiB`` (the summary) are ``k`` times
#: the sum over the MoE layers (dense layers route nothing), ``layer_demand_MiB`` ``k`` times
#: the widest MoE layer's expert: a model whose layers mix quantisation types (a K-quant) has
#: a widest layer wider than its mean.
DEMAND_FIGURES = {
    "cache_cycle_mb": "sum",
    "token_demand_MiB": "sum",
    "layer_demand_MiB": "max",
}
#: Slack of a demand figure against the sizes: the summaries print 0.1 MiB, and 2 % beyond.
DEMAND_SLACK = 0.02
DEMAND_ROUNDING_MIB = 0.05


def demand_figures(run: ProfileRun) -> dict[str, float]:
    """The run's demand figures (:data:`DEMAND_FIGURES`) in bytes, those its file records."""
    out = {}
    for key in DEMAND_FIGURES:
        where = run.metrics.params if key == "cache_cycle_mb" else None
        value = number(where.get(key)) if where is not None else number(run.figure(key))
        if value:
            out[key] = value * MIB
    return out


def summary_sizes(run: ProfileRun) -> tuple[dict[int, int], str] | None:
    """Expert sizes a run's preamble and summary imply when nothing else says them: one
    token's routed bytes (v2's ``cache_cycle_mb``, else v1's ``token_demand_MiB``) over
    ``n_layer`` x ``n_expert_used``, every layer taken as MoE and of the mean size (the
    total a token reads is right; how it splits over the layers is not known)."""
    params = run.metrics.params
    n_layer = number(params.get("n_layer"))
    k = number(params.get("n_expert_used"))
    if not n_layer or not k:
        return None
    figures = demand_figures(run)
    for key in ("cache_cycle_mb", "token_demand_MiB"):
        if key in figures:
            per = figures[key] / (n_layer * k)
            return {i: round(per) for i in range(int(n_layer))}, key
    return None


def _check_sizes(sizes: Mapping[int, int], where: str, run: ProfileRun) -> None:
    """Refuse per-layer expert sizes (of the MoE layers) that do not give `run`'s demand
    figures as the contract defines them (:data:`DEMAND_FIGURES`); a run that dropped
    experts routed less than the sizes allow, never more."""
    k = number(run.metrics.params.get("n_expert_used"))
    if not sizes or not k:
        return
    dropped = bool(number(run.metrics.params.get("drop_cold_frac"))) or bool(
        number(run.figure("experts_dropped"))
    )
    values = [float(v) for v in sizes.values()]
    for key, value in demand_figures(run).items():
        how = DEMAND_FIGURES[key]
        mine = k * (sum(values) if how == "sum" else max(values))
        slack = DEMAND_SLACK * mine + DEMAND_ROUNDING_MIB * MIB
        # cache_cycle_mb is priced from the shapes: dropping does not lower it
        low = 0.0 if dropped and key != "cache_cycle_mb" else mine - slack
        if not low <= value <= mine + slack:
            what = "MoE layers' experts summed" if how == "sum" else "widest MoE layer's expert"
            raise BmoeError(
                f"{where} has experts of {sum(values) / len(values) / MIB:.3f} MiB on average "
                f"over {len(values)} MoE layers ({max(values) / MIB:.3f} the widest): top-{int(k)} "
                f"x the {what} is {mine / MIB:.3f} MiB but {run.name} says {key}="
                f"{value / MIB:.3f}: runs of another model (or quantisation)"
            )


def _check_shape(meta: Mapping[str, Any], where: str, run: ProfileRun) -> None:
    """Refuse a model (its ``n_layer`` / ``n_expert``) that is not the one `run` ran."""
    params = run.metrics.params
    for key in ("n_layer", "n_expert"):
        mine, theirs = number(meta.get(key)), number(params.get(key))
        if mine is not None and theirs is not None and mine != theirs:
            raise BmoeError(
                f"{where} ({key}={int(mine)}) and {run.name} ({key}={int(theirs)}) are "
                "runs of different models: a profile describes one model"
            )


def check_model_file(
    meta: Mapping[str, Any], sizes: Mapping[int, int], runs: Sequence[ProfileRun], where: str
) -> bool:
    """Refuse expert sizes read from a model file (`where`) of another model than the runs'
    (their preamble's ``n_layer``, ``n_expert``, or the expert sizes their summaries imply);
    whether any run said enough to check it."""
    checked = False
    for run in runs:
        _check_shape(meta, where, run)
        _check_sizes(sizes, where, run)
        params = run.metrics.params
        checked = checked or any(number(params.get(k)) is not None for k in ("n_layer", "n_expert"))
        checked = checked or summary_sizes(run) is not None
    return checked


def check_against_runs(trace: RouteTrace, runs: Sequence[ProfileRun]) -> None:
    """Refuse a route trace of another model than the runs' (their preamble's n_layer,
    n_expert, top-k, or the expert sizes their summaries imply), naming both files."""
    meta = trace.meta
    where = trace.path or "the route trace"
    for run in runs:
        params = run.metrics.params
        _check_shape(meta, where, run)
        mine_k, theirs_k = number(meta.get("n_expert_used")), number(params.get("n_expert_used"))
        if mine_k is not None and theirs_k is not None and mine_k != theirs_k:
            raise BmoeError(
                f"{where} routes top-{int(mine_k)} but {run.name} ran top-{int(theirs_k)} "
                "(--n-expert-used changes the routing): give a trace recorded at the same top-k"
            )
        _check_sizes(trace.expert_bytes(), where, run)


def _named_traces(
    runs: Sequence[ProfileRun], trace: RouteTrace | None
) -> list[tuple[str, RouteTrace]]:
    """The route traces that say expert sizes: the one given first, then the runs' own."""
    named = [(r.name, r.route) for r in runs if r.route is not None and r.route.expert_bytes()]
    if trace is not None:
        if not trace.expert_bytes():
            raise BmoeError(f"{trace.path or 'the route trace'}: no expert_bytes in its preamble")
        check_against_runs(trace, runs)
        named = [(trace.path or "the route trace", trace), *named]
    return named


def _sizes(
    runs: Sequence[ProfileRun],
    named: list[tuple[str, RouteTrace]],
    expert_sizes: Mapping[int, int] | None,
    sizes_from: str | None,
    model_meta: Mapping[str, Any] | None,
) -> tuple[dict[int, int], str | None, dict[str, Any]]:
    """Expert sizes, where they came from, and the route trace's preamble (if any)."""
    if named:
        first_name, first = named[0]
        sizes = first.expert_bytes()
        for name, other in named[1:]:
            if other.expert_bytes() != sizes:
                raise BmoeError(
                    f"{name} is a run of another model than {first_name} (expert sizes "
                    "differ): a profile describes one model on one device"
                )
        for run in runs:
            if run.route is not None:
                check_against_runs(first, [run])
        return sizes, f"route trace {first.path or first_name}", first.meta
    if expert_sizes:
        sizes = {int(k): int(v) for k, v in expert_sizes.items()}
        where = sizes_from or "the model file"
        if model_meta is not None and not check_model_file(model_meta, sizes, runs, where):
            where += " (not checked: no run records its model)"
        return sizes, where, {}
    for run in runs:
        implied = summary_sizes(run)
        if implied:
            return implied[0], f"the preamble of {run.name} ({implied[1]})", {}
    return {}, None, {}


def _read_per_expert(runs: Sequence[ProfileRun], sizes: dict[int, int]) -> tuple[int, dict]:
    """Slices per expert read and, per layer, the bytes one expert read moved (the io
    traces' median; alignment included)."""
    ios = [r.io for r in runs if r.io is not None and len(r.io.rows)]
    if not ios:
        return 1, {}
    slices = max(int(t.rows["proj"].nunique()) if "proj" in t.rows else 1 for t in ios)
    keys = ["turn", "phase", "step", "layer", "expert", "spec"]
    per = pd.concat(  # bytes one expert read moved, per run, then per layer
        [t.rows.groupby(keys, observed=True)["read_bytes"].sum() for t in ios]
    )
    per = per.groupby(level="layer").median()
    return slices, {str(int(k)): int(v) for k, v in per.items() if int(k) in sizes}


def model_section(
    runs: Sequence[ProfileRun],
    trace: RouteTrace | None,
    expert_sizes: Mapping[int, int] | None,
    sizes_from: str | None,
    model_meta: Mapping[str, Any] | None = None,
) -> dict:
    """The profile's ``model`` section (see :mod:`bmoe.formats.profile`). `model_meta` is
    what the model file the sizes were read from says of its shape (``n_layer``,
    ``n_expert``): checked against the runs."""
    named = _named_traces(runs, trace)
    sizes, source, meta = _sizes(runs, named, expert_sizes, sizes_from, model_meta)
    sizes = {k: v for k, v in sizes.items() if v > 0}  # a dense layer: no experts to read
    params = next((r.metrics.params for r in runs if r.metrics.params), {})
    slices, read_per = _read_per_expert(runs, sizes)
    route_path = named[0][1].path if named else None
    values = [float(v) for v in read_per.values()] or [float(v) for v in sizes.values()]
    unit = float(np.median(values)) if values else float(MIB)
    model_name = meta.get("model") or params.get("model") or ""
    return {
        "name": str(model_name).replace("\\", "/").rsplit("/", 1)[-1] or None,
        "route_trace": str(Path(route_path).resolve()) if route_path else None,
        "arch": meta.get("arch", params.get("arch")),
        "n_layer": meta.get("n_layer", params.get("n_layer")),
        "n_expert": meta.get("n_expert", params.get("n_expert")),
        "n_expert_used": meta.get("n_expert_used", params.get("n_expert_used")),
        "expert_bytes": {str(k): int(v) for k, v in sorted(sizes.items())},
        "read_bytes_per_expert": read_per,
        "slices_per_expert": slices,
        "sizes_from": source,
        "read_unit_bytes": round(unit),
    }


def _timing_runs(ev: Evidence, allow_traced: bool) -> dict[str, Any]:
    """Which runs compute, management and the stall come from (untraced ones where there
    are any; never compute-traced ones unless allowed); the profile's tracing section."""
    runs = ev.runs
    ev.untraced = [r for r in runs if not r.traced]
    eligible = [r for r in runs if not r.compute_traced]
    if not eligible:
        if not allow_traced:
            raise BmoeError(
                "every run was compute-traced (per-node timing synchronises each graph node): "
                "their compute time is not a benchmark figure; add an untraced run, or allow "
                "traced runs (--allow-traced) and the profile will say so"
            )
        eligible = list(runs)
        ev.caveats.append(
            "compute time from compute-traced runs: instrumented, expect predictions too slow"
        )
    ev.timing = ev.untraced or eligible
    tracing = tracing_section(runs, ev.untraced, ev.timing, ev.frames, ev.configs)
    if tracing["how"] == "not removed":
        ev.unsettled.append(
            "compute and management come from traced runs only (tracing slows them): "
            "untraced configurations will be predicted slow; add one untraced run"
        )
    elif tracing["how"] != "no traced runs":
        ev.caveats.append(f"tracing: {tracing['how']}")
    return tracing


def _closing_notes(ev: Evidence) -> None:
    """Unsettled terms, contended timing runs, a run too short to tell spread, and the runs'
    system warnings."""
    for term, record in ev.terms.items():
        if not record["settled"]:
            ev.unsettled.append(f"{term}: {record['why']}")
    contended = [r for r in ev.timing if ev.contended(r)]
    if contended:
        ev.unsettled.append(
            f"{len(contended)} of {len(ev.timing)} timing runs were contended (their compute "
            "waited for a core): compute comes from their CPU time and their other token times "
            "are scaled down by their compute's slowdown, an estimate (flash that waits for a "
            "device, not a CPU, is scaled down too far); measure on a quieter machine"
        )
    runs = ev.runs
    if len(runs) == 1 and len(ev.frame(runs[0])) < 2 * BLOCK_TOKENS:
        ev.unsettled.append(
            f"one run of {len(ev.frame(runs[0]))} tokens: too few to tell a term's spread"
        )
    for state in ev.states:
        if state["system_warnings"]:
            ev.caveats.append(
                f"{state['name']}: system warnings: {'; '.join(state['system_warnings'])}"
            )


def _mode(ev: Evidence) -> str:
    modes = {c.overlap for c in ev.configs.values()}
    return "mixed" if len(modes) > 1 else ("overlap" if modes.pop() else "serial")


def measure(
    ev: Evidence, model: dict[str, Any], *, allow_traced: bool, coverage: float
) -> DeviceProfile:
    """The profile the evidence's runs measure (not yet validated, without its model error):
    each section in turn, what they found in ``ev``."""
    tracing = _timing_runs(ev, allow_traced)
    mgmt, mgmt_fitted = mgmt_section(ev)
    memory, fault_ms = memory_section(ev)
    compute = compute_section(ev, mgmt if mgmt_fitted else None, fault_ms)
    flash, flash_local = flash_section(ev)
    overlap = stall_section(ev)
    prefill = prefill_section(ev.runs)
    if not prefill:
        ev.absent["prefill"] = "no run's summary has its prefill time"
    _closing_notes(ev)
    return DeviceProfile(
        mode=_mode(ev),
        model=model,
        flash=flash,
        flash_by_read=flash_local,
        compute=compute,
        mgmt=mgmt,
        prefill=prefill,
        overlap=overlap,
        sources=[r.name for r in ev.runs],
        caveats=ev.caveats,
        memory=memory,
        terms=ev.terms,
        absent=ev.absent,
        runs=ev.states,
        tracing=tracing,
        coverage=coverage,
        unsettled=ev.unsettled,
    )


__all__ = [
    "DEMAND_FIGURES",
    "check_against_runs",
    "check_model_file",
    "demand_figures",
    "measure",
    "model_section",
    "summary_sizes",
]
