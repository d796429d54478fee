"""Build the device profile from the runs: a short sequence of named sections (see the
package docstring for what each term is measured from)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import request_latency_ms
from bmoe.analyze.profile.compute import compute_section
from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.flash import flash_section
from bmoe.analyze.profile.model import model_section
from bmoe.analyze.profile.runs import ProfileRun, RunConfig, run_config
from bmoe.analyze.profile.spread import BLOCK_TOKENS
from bmoe.analyze.profile.state import run_state, tracing_section
from bmoe.analyze.profile.terms import (
    memory_section,
    mgmt_section,
    prefill_section,
    stall_section,
)
from bmoe.analyze.profile.tokens import token_frame
from bmoe.errors import BmoeError
from bmoe.formats.profile import DEFAULT_COVERAGE, DeviceProfile, profile_from_dict
from bmoe.formats.route import RouteTrace


def _refuse_unusable(run: ProfileRun, config: RunConfig) -> None:
    rows = run.metrics.rows
    need = [c for c in ("wall_ms", "compute_ms") if c not in rows]
    if need:
        raise BmoeError(f"{run.name}: no {need[0]} column (a profile needs per-token times)")
    if not len(rows):
        raise BmoeError(f"{run.name}: no token rows")
    if not config.streaming:
        raise BmoeError(
            f"{run.name}: a run without expert streaming (plain mmap) measures no flash reads "
            "or cache: nothing of it applies to a streaming configuration"
        )
    if "io_ms" not in rows and run.io is None:
        raise BmoeError(
            f"{run.name}: no io_ms column and no io trace: the flash wait of its tokens is "
            "unknown (a profile needs it)"
        )


def _configs(runs: Sequence[ProfileRun]) -> dict[str, RunConfig]:
    """Each run's configuration; runs that cannot be profiled, or at different top-k, are
    refused."""
    if not runs:
        raise BmoeError("no runs to build a profile from")
    configs = {r.name: run_config(r) for r in runs}
    for run in runs:
        _refuse_unusable(run, configs[run.name])
    ks = {c.n_expert_used for c in configs.values() if c.n_expert_used}
    if len(ks) > 1:
        named = ", ".join(f"{n} (top-{c.n_expert_used})" for n, c in configs.items())
        raise BmoeError(f"the runs ran at different top-k: {named}; one profile per top-k")
    return configs


def _evidence(runs: Sequence[ProfileRun], configs: dict[str, RunConfig], model: dict) -> Evidence:
    """Per run its tokens in the model's read units and its system state."""
    sized = bool(model["expert_bytes"])
    unit = float(model["read_unit_bytes"])
    n_layers = len(model["expert_bytes"]) or None
    slices = model["slices_per_expert"]
    req = float(np.median(list(model["expert_bytes"].values()))) / slices if sized else unit
    tokens = {r.name: token_frame(r, unit, n_layers) for r in runs}
    states = [run_state(r, tokens[r.name].frame, configs[r.name]) for r in runs]
    return Evidence(list(runs), configs, tokens, states, slices, req)


def _input_caveats(ev: Evidence, sized: bool) -> None:
    """What the profile does not know (expert sizes) and what it assumed of the runs."""
    if not sized:
        ev.caveats.append(
            "expert sizes unknown (no route trace, model file or preamble said): reads are "
            "priced per MiB and a route trace cannot be predicted with this profile; give "
            "--trace ROUTE_TRACE of this model (or its GGUF) to price reads"
        )
    assumed: dict[tuple[str, str], list[str]] = {}
    for name, config in ev.configs.items():
        for key, how in config.assumed.items():
            if key in ("io_threads", "threads", "prefetch", "cache_mb"):
                assumed.setdefault((key, how), []).append(Path(name).name)
    for (key, how), names in assumed.items():
        ev.caveats.append(f"{key} {how} ({', '.join(names)})")


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
    """Unsettled terms, a run too short to tell spread, and the runs' system warnings."""
    for term, record in ev.terms.items():
        if not record["settled"]:
            ev.unsettled.append(f"{term}: {record['why']}")
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


def build_profile(
    runs: Sequence[ProfileRun],
    *,
    allow_traced: bool = False,
    trace: RouteTrace | None = None,
    expert_sizes: Mapping[int, int] | None = None,
    sizes_from: str | None = None,
    coverage: float = DEFAULT_COVERAGE,
) -> DeviceProfile:
    """The device profile these runs measure (see the package docstring). `trace` is a route
    trace of the same model (its expert sizes); `expert_sizes` sizes read from the model
    file (`sizes_from` says which); `coverage` the coverage the prediction intervals of the
    profile are to have."""
    configs = _configs(runs)
    model = model_section(runs, trace, expert_sizes, sizes_from)
    ev = _evidence(runs, configs, model)
    _input_caveats(ev, bool(model["expert_bytes"]))
    tracing = _timing_runs(ev, allow_traced)
    mgmt, mgmt_fitted = mgmt_section(ev)
    memory, fault_ms = memory_section(ev)
    compute = compute_section(ev, mgmt if mgmt_fitted else None, fault_ms)
    flash = flash_section(ev)
    overlap = stall_section(ev)
    prefill = prefill_section(runs)
    if not prefill:
        ev.absent["prefill"] = "no run's summary has its prefill time"
    _closing_notes(ev)
    profile = DeviceProfile(
        mode=_mode(ev),
        model=model,
        flash=flash,
        compute=compute,
        mgmt=mgmt,
        prefill=prefill,
        overlap=overlap,
        sources=[r.name for r in runs],
        caveats=ev.caveats,
        memory=memory,
        terms=ev.terms,
        absent=ev.absent,
        runs=ev.states,
        tracing=tracing,
        coverage=coverage,
        unsettled=ev.unsettled,
    )
    return profile_from_dict(json.loads(json.dumps(profile.to_dict())))  # validated


def with_probe(profile: DeviceProfile, flash: pd.DataFrame, where: str) -> DeviceProfile:
    """`profile` with its flash latencies replaced by a probe's (`where` it was measured);
    the per-batch overhead the runs measured (the engine's, not the device's) is kept, per
    lane count as the prediction interpolates it."""
    table = flash.copy()
    req = float(table["req_bytes"].median())
    table["batch_overhead_ms"] = [
        request_latency_ms(profile.flash, req, int(lanes))[1] for lanes in table["lanes"]
    ]
    table["source"] = "probe"
    data = profile.to_dict()
    data["flash"] = table.to_dict(orient="records")
    data["caveats"] = [*profile.caveats, f"flash latency measured by probe on {where}"]
    if "flash" in data.get("terms", {}):
        data["terms"]["flash"]["note"] = f"probe on {where}"
    return profile_from_dict(data)


__all__ = ["build_profile", "with_probe"]
