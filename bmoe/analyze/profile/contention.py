"""Contended runs' token times, scaled to what an uncontended run of the machine would take.

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

from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.analyze.profile.tokens import Tokens

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


__all__ = ["SCALED", "scaled", "slowdowns"]
