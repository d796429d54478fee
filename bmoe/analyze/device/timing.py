"""A token's predicted time from a profile, term by term.

One configuration's time per decode token from its reads and a profile, and its interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.interval import half_width, interval_z, model_error, read_distance
from bmoe.analyze.device.lanes import batch_flash_ms, per_lane_ms, request_bytes, stall_per_miss
from bmoe.analyze.device.levers import BUDGET_SLACK, check_levers, effect_of
from bmoe.analyze.device.reads import CellReads
from bmoe.analyze.metrics import steady_state
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.units import MIB


def memory_faults(profile: DeviceProfile, cache_mb: float) -> tuple[float, str | None]:
    """Major faults per token a configuration of `cache_mb` is expected to take: the
    profile's faults per token against the share of the available memory a run asked for
    (its budget plus what else it kept resident), interpolated, non-decreasing in that
    share; beyond the largest share measured the last segment's slope goes on (flat with
    one point, and a note says so)."""
    memory = profile.memory
    points = memory.get("points") or []
    if not points:
        return 0.0, None
    available = float(memory["available_mib"])
    ratio = [p["asked_mib"] / p["available_mib"] for p in points]
    faults = [p["faults_per_token"] for p in points]
    order = np.argsort(ratio)
    x = np.asarray(ratio, dtype=float)[order]
    y = np.maximum.accumulate(np.asarray(faults, dtype=float)[order])
    asked = (float(cache_mb) + float(memory["resident_mib"])) / available
    note = None
    if asked <= x[0]:
        value = float(y[0])
    elif asked <= x[-1]:
        value = float(np.interp(asked, x, y))
    else:
        distinct = np.unique(x)
        if len(distinct) >= 2 and x[-1] > x[-2]:
            slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
            value = float(y[-1] + slope * (asked - x[-1]))
        else:
            value = float(y[-1])
        if y[-1] > 0:  # faults measured: extrapolated; none anywhere: nothing to say
            note = (
                f"asks {100 * asked:.0f} % of the available memory, more than any profile run "
                f"({100 * x[-1]:.0f} %): its major faults are extrapolated"
            )
    return max(value, 0.0), note


def token_times(
    profile: DeviceProfile,
    reads: CellReads,
    lanes: int,
    *,
    compute_ms: float,
    latency: str = "latency_ms",
    overlap: bool | None = None,
    fault_ms: float = 0.0,
) -> pd.DataFrame:
    """Per decode token: compute, flash wait, mgmt and wall milliseconds (see the module
    docstring). `overlap` picks the overlap's stall (default: the profile's mode);
    `fault_ms` is the major-fault time per token the configuration's memory costs."""
    slices = int(profile.model["slices_per_expert"])
    req = request_bytes(profile)
    n_tok = reads.n_tokens
    if overlap is None:
        overlap = profile.mode == "overlap"
    misses = np.bincount(reads.step, weights=reads.misses, minlength=n_tok)
    spec = np.bincount(reads.step, weights=reads.prefetched * slices, minlength=n_tok)
    compute = np.full(n_tok, compute_ms + fault_ms)
    if overlap:
        if not profile.overlap:
            raise BmoeError(
                f"{profile.path or 'the profile'} has no overlap term (no run used --overlap): "
                "overlap configurations cannot be predicted with it"
            )
        base = float(profile.overlap.get("stall_ms", 0.0))
        flash = base + stall_per_miss(profile, lanes) * misses
        if spec.any():  # speculative reads on the same lanes: what compute no longer hides
            per = per_lane_ms(profile, lanes, latency)
            demand = misses * slices * per
            flash = (
                flash
                + np.maximum(demand + spec * per - compute, 0.0)
                - np.maximum(demand - compute, 0.0)
            )
    else:
        per_batch = batch_flash_ms(profile.flash, reads.misses * slices, req, lanes, latency)
        flash = np.bincount(reads.step, weights=per_batch, minlength=n_tok).astype(np.float64)
        if spec.any():
            spec_ms = batch_flash_ms(profile.flash, spec, req, lanes, latency)
            flash = flash + np.maximum(spec_ms - compute, 0.0)
    admits = np.bincount(reads.step, weights=reads.misses + reads.prefetched, minlength=n_tok)
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * admits
    return pd.DataFrame(
        {
            "compute_ms": compute,
            "flash_ms": flash,
            "mgmt_ms": mgmt,
            "wall_ms": compute + flash + mgmt,
            "misses": misses,
            "prefetched": np.bincount(reads.step, weights=reads.prefetched, minlength=n_tok),
        }
    )


def _term_sd(profile: DeviceProfile, term: str) -> float:
    """The relative standard deviation of a term's mean (how much a run's mean of it moves),
    from the profile's record of the term; a version 1 profile's from its 10th-90th
    percentile spread of compute and request latency."""
    record = profile.terms.get(term)
    if record is not None and record.get("sd_rel") is not None:
        return float(record["sd_rel"])
    if profile.version >= 2:
        return 0.0
    z = interval_z(0.8)
    if term == "compute":
        c = profile.compute
        return (
            (c["token_ms_p90"] - c["token_ms_p10"]) / (2 * z * c["token_ms"])
            if c["token_ms"]
            else 0.0
        )
    if term in ("flash", "stall"):
        f = profile.flash
        lat = f["latency_ms"].astype(float)
        hi = f["latency_ms_p90"].astype(float).fillna(lat)
        lo = f["latency_ms_p10"].astype(float).fillna(lat)
        return float(((hi - lo) / (2 * z * lat)).median()) if len(f) else 0.0
    return 0.0


def _spread(
    profile: DeviceProfile, parts: Mapping[str, float], overlap: bool, token_ms: float
) -> float:
    """The relative sd of a token's time from its terms' spread: each term's mean moves by
    its relative sd, independent terms add in quadrature (the model's own error is added to
    this in :func:`bmoe.analyze.device.interval.half_width`)."""
    sd_ms = math.sqrt(
        (_term_sd(profile, "compute") * parts["compute"]) ** 2
        + (_term_sd(profile, "stall" if overlap else "flash") * parts["flash"]) ** 2
        + (_term_sd(profile, "mgmt") * parts["mgmt"]) ** 2
    )
    return sd_ms / token_ms if token_ms > 0 else 0.0


def compute_at(compute: Mapping[str, Any], read_mib: float) -> float:
    """A profile's compute per token for a configuration that reads `read_mib` a token: its
    ``by_read`` points interpolated (the nearest point's beyond them), else ``token_ms``.
    Held, not extrapolated: on the phone corpus a line through the points, extrapolated,
    took the two-run profiles' median error from 8.2 to 10.4 %; interpolating and holding
    errs at the ends of the range, which the model error measured inside the range leaves
    out of the intervals of the configurations inside it."""
    points = compute.get("by_read") or []
    if len(points) < 2 or not np.isfinite(read_mib):
        return float(compute["token_ms"])
    xs = [float(p["read_mib"]) for p in points]
    ys = [float(p["token_ms"]) for p in points]
    return float(np.interp(read_mib, xs, ys))


def excess_at(points: Sequence[Mapping[str, Any]], read_mib: float, lanes: int) -> float:
    """The measured flash wait a token beyond the flash table's (ms) for a serial
    configuration at `lanes` lanes reading `read_mib` a token: a profile's ``flash_by_read``
    points at those lanes interpolated, and beyond them the nearest point's excess a MiB
    read (a volume half the smallest point's waits half its excess: held in ms, a fixed
    cost of a run that read 23 MiB a token took the whole flash wait of one that read 2);
    0 at lane counts whose runs read one volume."""
    at = [p for p in points if int(p["lanes"]) == int(lanes)]
    if len(at) < 2 or not np.isfinite(read_mib):
        return 0.0
    xs = [float(p["read_mib"]) for p in at]
    ys = [float(p["excess_ms"]) for p in at]
    if read_mib < xs[0] or read_mib > xs[-1]:
        end = 0 if read_mib < xs[0] else -1
        return ys[end] * read_mib / xs[end] if xs[end] > 0 else ys[end]
    return float(np.interp(read_mib, xs, ys))


def flash_volume_sd(profile: DeviceProfile, read_mib: float, lanes: int) -> float:
    """How uncertain a serial configuration's flash wait is (relative sd, log scale) for
    reading another volume a token than the profile measured at its lanes, where the
    profile's runs read one volume there (no ``flash_by_read`` to follow): what that has
    been seen to do (:mod:`bmoe.analyze.device.levers`, ``flash_volume``), growing from 0
    at the measured volume to the whole of it at one
    :data:`~bmoe.analyze.device.levers.BUDGET_SLACK` apart (runs that close count as one
    volume). 0 where the lanes read several volumes, or none the profile measured (the lane
    count is then a lever of its own)."""
    if sum(1 for p in profile.flash_by_read if int(p["lanes"]) == int(lanes)) >= 2:
        return 0.0
    points = [(int(p["io_threads"]), float(p["read_mib"]))
              for p in (profile.model_error or {}).get("configurations_at") or []
              if int(p["io_threads"]) == int(lanes)]  # fmt: skip
    if not points or not np.isfinite(read_mib):
        return 0.0
    distance = read_distance(read_mib, lanes, points)
    return effect_of("flash_volume").sd_rel * min(1.0, distance / math.log(BUDGET_SLACK))


def flash_factor(excess_ms: float, priced_ms: float) -> float:
    """What a configuration's priced flash wait (`priced_ms` a token) is multiplied by to
    add `excess_ms` a token (:func:`excess_at`): its tokens keep their shape, a token that
    reads nothing waits nothing, and the wait never goes below zero."""
    if priced_ms <= 0 or not np.isfinite(excess_ms):
        return 1.0
    return max(0.0, 1.0 + excess_ms / priced_ms)


def predict_cell(
    profile: DeviceProfile,
    reads: CellReads,
    lanes: int,
    read_bytes: Mapping[int, int],
    *,
    overlap: bool | None = None,
    cache_mb: float | None = None,
    levers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One configuration's predicted figures from its replayed (or measured) reads, with an
    interval of the profile's stated coverage (see :mod:`bmoe.analyze.device.interval`):
    ``interval_pct`` its half-width (% of the token time), ``spread_pct`` the part the terms'
    spread alone gives. `levers` are the configuration's other levers (``prefetch``,
    ``policy``, ``drop``, ``threads``; absent: the profile's): each is priced from the
    profile's evidence or named in ``unpriced`` (why, None when every lever is priced) and
    ``unpriced_levers``, the interval widened by what it has been seen to do
    (``lever_effect_pct``; see :mod:`bmoe.analyze.device.levers`); ``lever_factor`` is what
    the profile's lever terms multiply the decode time by, ``memory_note`` what the
    configuration asks of memory where that is worth saying."""
    if overlap is None:
        overlap = profile.mode == "overlap"
    c = profile.compute
    faults, fault_note = memory_faults(profile, cache_mb) if cache_mb is not None else (0.0, None)
    fault_ms = faults * float(profile.memory.get("ms_per_fault", 0.0))
    n = max(reads.n_tokens, 1)
    per_expert = np.vectorize(lambda layer: read_bytes[int(layer)], otypes=[np.float64])
    moved = (reads.misses + reads.prefetched) * per_expert(reads.layer) if len(reads.layer) else 0
    read_mib = float(np.sum(moved)) / n / MIB
    compute_ms = compute_at(c, read_mib)
    mid = token_times(
        profile, reads, lanes, compute_ms=compute_ms, overlap=overlap, fault_ms=fault_ms
    )
    if not overlap:  # the wait the runs nearest its read volume measured beyond the table
        excess = excess_at(profile.flash_by_read, read_mib, lanes)
        mid["flash_ms"] *= flash_factor(excess, float(mid["flash_ms"].mean()))
        mid["wall_ms"] = mid["compute_ms"] + mid["flash_ms"] + mid["mgmt_ms"]
    check = check_levers(profile, cache_mb=cache_mb, lanes=lanes, overlap=bool(overlap),
                         levers=levers)  # fmt: skip
    if fault_note:
        check.notes.append(fault_note)
    if check.factor != 1.0:  # a lever value's own term: the whole token's time
        for column in ("compute_ms", "flash_ms", "mgmt_ms", "wall_ms"):
            mid[column] *= check.factor
    wall = float(mid["wall_ms"].sum())
    parts = {k: float(mid[f"{k}_ms"].sum()) / n for k in ("compute", "flash", "mgmt")}
    token_ms = wall / n
    spread = math.hypot(_spread(profile, parts, bool(overlap), token_ms), check.factor_sd)
    if not overlap and token_ms > 0:
        spread = math.hypot(spread, flash_volume_sd(profile, read_mib, lanes) * parts["flash"]
                            / token_ms)  # fmt: skip
    rel, _q = half_width(
        profile.coverage, spread, model_error(profile, read_mib, lanes), check.effect_sd
    )
    moved_mib = np.bincount(reads.step, weights=moved, minlength=reads.n_tokens) / MIB
    steady = steady_state(pd.DataFrame({"wall_ms": mid["wall_ms"], "read_mib": moved_mib}))
    window = steady.mask()

    def rate(scale: float, rows: np.ndarray | None = None) -> float:
        wall_ms = mid["wall_ms"].to_numpy() if rows is None else mid["wall_ms"].to_numpy()[rows]
        total = float(wall_ms.sum()) * scale
        if scale <= 0:
            return float("inf")
        return 1000.0 * len(wall_ms) / total if total > 0 else float("inf")

    def steady_rate(scale: float) -> float:
        return rate(scale, window) if steady.steady_tokens else float("nan")

    low, high = 1.0 + rel, 1.0 - rel
    return {
        "overlap": int(bool(overlap)),
        "tok_s": rate(1.0),
        "tok_s_low": rate(low),
        "tok_s_high": rate(high),
        "steady_tok_s": steady_rate(1.0),
        "steady_tok_s_low": steady_rate(low),
        "steady_tok_s_high": steady_rate(high),
        "warmup_tokens": float("nan") if steady.warmup_tokens is None else steady.warmup_tokens,
        "mib_per_token": float(np.sum(moved)) / n / MIB,
        "hit_pct": reads.hit_pct,
        "hit_pct_decode": reads.hit_pct_decode,
        "token_ms": token_ms,
        **{f"{k}_ms": v for k, v in parts.items()},
        **{f"{k}_pct": 100.0 * v / token_ms if token_ms else 0.0 for k, v in parts.items()},
        "misses_per_token": float(reads.misses.sum()) / n,
        "prefetched_per_token": float(reads.prefetched.sum()) / n,
        "faults_per_token": faults,
        "interval_pct": 100.0 * rel,
        "spread_pct": 100.0 * interval_z(profile.coverage) * spread,
        "unpriced": check.reason(),
        "unpriced_levers": ", ".join(check.unpriced) or None,
        "lever_effect_pct": 100.0 * check.effect_sd,
        "lever_factor": check.factor,
        "memory_note": "; ".join(check.notes) or None,
    }


__all__ = [
    "compute_at",
    "excess_at",
    "flash_factor",
    "flash_volume_sd",
    "memory_faults",
    "predict_cell",
    "token_times",
]
