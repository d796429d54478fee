"""How close a run ran to its device's memory limit: what it asked of the memory (its cache
budget and what else it kept resident), what the device had available when it started, the
least that was left while it ran, swap and major faults. From the per-token memory columns
(``rss_mib``, ``rss_anon_mib``, ``swap_mib``, ``mem_available_mib``, ``majflt``) where the
metrics have them, else the ``.metrics`` sidecar (``peak_rss_kb``, ``mem_avail_before_kb``,
``mem_avail_floor_kb``). A prediction for a configuration that asks more than any profile run
did is judged against these (:mod:`bmoe.analyze.predict.levers`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.profile.runs import ProfileRun, RunConfig, number

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


__all__ = ["memory_state"]
