"""The profile's sections measured from the evidence, in order: which runs the timing terms
come from (and how traced runs are dealt with), management, memory pressure, compute, flash,
the overlap's stall, the prefill; then what is unsettled."""

from __future__ import annotations

from typing import Any

from bmoe.analyze.profile.compute import compute_section
from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.flash import flash_section
from bmoe.analyze.profile.spread import BLOCK_TOKENS
from bmoe.analyze.profile.state import tracing_section
from bmoe.analyze.profile.terms import (
    memory_section,
    mgmt_section,
    prefill_section,
    stall_section,
)
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile


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


__all__ = ["measure"]
