"""Predict a run's speed for configurations that were never run.

The recorded routing goes through each configuration's cache with the existing replay
(:mod:`bmoe.analyze.replay`), which says exactly which experts each decode step misses, so
MiB/token and hit % are replay figures, not estimates. A :class:`~bmoe.formats.profile.
DeviceProfile` then turns those misses into time, token by token:

* flash wait: for every layer that misses ``m`` experts of ``s`` slices each, the lanes read
  ``m * s`` requests: ``batch_overhead + latency(request size, lanes) * ceil(m * s / lanes)``
  (serial engines); under ``--overlap`` the stall per missed expert;
* cache management: ``token_ms + per_admit_ms * (misses + prefetched experts)``;
* compute: the profile's time per token, the same for every configuration of one model;
* prefetch (``--prefetch K``): the speculative reads' lane time beyond what compute hides.

Latency for a lane count the profile lacks is interpolated per lane (throughput saturates
past the largest measured count), and a batch's flash time is the best over any lane count up
to the asked one: more lanes never predict slower flash. The interval comes from the profile's
spread (10th and 90th percentiles of request latency and of compute per token).

Two rates are given. ``tok_s`` is the whole decode's (tokens over decode time, what a sweep
measures); ``steady_tok_s`` applies the run analysis's steady-state rule
(:func:`bmoe.analyze.metrics.steady_state`) to the predicted per-token series: warm-up ends
where the predicted flash MiB per token settles within 1.25x its second-half median, and a
decode shorter than 32 tokens has no steady state (NaN).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze import replay
from bmoe.analyze.metrics import steady_state
from bmoe.cache import DEFAULT_POLICY, ExpertCache, policy_name
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace

MIB = 1 << 20
GRID_AXES = ("cache_mb", "io_threads", "prefetch", "overlap")


PREDICT_COLUMNS = (
    "cache_mb",
    "io_threads",
    "prefetch",
    "policy",
    "overlap",
    "tok_s",
    "tok_s_low",
    "tok_s_high",
    "steady_tok_s",
    "steady_tok_s_low",
    "steady_tok_s_high",
    "warmup_tokens",
    "mib_per_token",
    "hit_pct",
    "hit_pct_decode",
    "token_ms",
    "compute_ms",
    "flash_ms",
    "mgmt_ms",
    "compute_pct",
    "flash_pct",
    "mgmt_pct",
    "misses_per_token",
    "prefetched_per_token",
    "faults_per_token",
    "interval_pct",
)


# ----------------------------------------------------------------------------- grid


def parse_grid(text: str | Iterable[str]) -> dict[str, list[float]]:
    """``cache_mb=64,128,io_threads=1,4`` (or the axes apart: ``;``, spaces, several
    strings) -> {"cache_mb": [64, 128], "io_threads": [1, 4]}. Unknown axes are errors."""
    parts = [text] if isinstance(text, str) else list(text)
    tokens = [t for p in parts for t in p.replace(";", ",").replace(" ", ",").split(",") if t]
    grid: dict[str, list[float]] = {}
    axis = None
    for token in tokens:
        if "=" in token:
            axis, _, token = token.partition("=")
            axis = axis.strip().replace("-", "_")
            if axis not in GRID_AXES:
                raise BmoeError(f"--grid: unknown axis {axis!r} (axes: {', '.join(GRID_AXES)})")
            grid.setdefault(axis, [])
            if not token:
                continue
        if axis is None:
            raise BmoeError(f"--grid: {token!r} comes before any axis=")
        try:
            value = float(token)
        except ValueError:
            raise BmoeError(f"--grid: {axis}={token!r} is not a number") from None
        if value < 0 or (axis != "cache_mb" and not value.is_integer()):
            raise BmoeError(f"--grid: {axis}={token} is not a valid value")
        grid[axis].append(value)
    for axis, values in grid.items():
        if not values:
            raise BmoeError(f"--grid: {axis}= names no value")
    if "cache_mb" not in grid:
        raise BmoeError("--grid needs cache_mb=...")
    return grid


def grid_cells(grid: Mapping[str, Sequence[float]], defaults: Mapping[str, float]) -> pd.DataFrame:
    """Every combination of the grid's values (axes it lacks take `defaults`)."""
    axes = {a: list(grid.get(a, [defaults[a]])) for a in GRID_AXES}
    rows = list(itertools.product(*axes.values()))
    cells = pd.DataFrame(rows, columns=list(axes))
    cells["io_threads"] = cells["io_threads"].astype(int)
    cells["prefetch"] = cells["prefetch"].astype(int)
    return cells


# ----------------------------------------------------------------------------- reads


@dataclass
class CellReads:
    """What one configuration's cache does with the recorded routing.

    Per decode batch (layer of one step): ``step`` index (0-based decode token), demand
    ``misses`` and experts ``prefetched`` after it; and the hit rates as the engine counts
    them (every lookup, prefill included, and decode only)."""

    step: np.ndarray
    layer: np.ndarray
    misses: np.ndarray
    prefetched: np.ndarray
    n_tokens: int
    hit_pct: float
    hit_pct_decode: float


def _last_token_keys(trace: RouteTrace) -> dict[tuple[int, int, int], list[int]]:
    """(turn, step, layer) -> the distinct keys the last token of that cell routed, in slot
    order (what ``--prefetch`` bets the next token will route)."""
    rows = trace.rows
    frame = pd.DataFrame(
        {
            "turn": rows["turn"].to_numpy(np.int64) if "turn" in rows else 0,
            "step": rows["step"].to_numpy(np.int64),
            "layer": rows["layer"].to_numpy(np.int64),
            "slot": rows["slot"].to_numpy(np.int64) if "slot" in rows else 0,
            "key": (rows["layer"].to_numpy(np.int64) << 16) | rows["expert"].to_numpy(np.int64),
        }
    )
    frame = frame.sort_values(["turn", "step", "layer", "slot"], kind="stable")
    frame = frame.drop_duplicates(["turn", "step", "layer", "key"])
    return {
        (int(t), int(s), int(layer)): g["key"].tolist()
        for (t, s, layer), g in frame.groupby(["turn", "step", "layer"], sort=False)
    }


def cell_reads(
    trace: RouteTrace,
    batches: replay.ReplayBatches,
    policy: str,
    budget_mib: float,
    prefetch: int = 0,
    *,
    seed: int = 0,
    bets: dict[tuple[int, int, int], list[int]] | None = None,
    drop: float | None = None,
) -> CellReads:
    """Replay one configuration and keep what each decode batch missed and prefetched.

    Without prefetch this is :func:`bmoe.analyze.replay.simulate`; with ``prefetch=K`` each
    decode batch of layer l then bets on layers l+1..l+K as the previous token routed them
    (the first decode token bets on the last prompt token), as the engine does. With
    ``drop=F`` a decode miss whose gate weight is below ``F / k`` is dropped, never the
    token's top slot (``--drop-cold-experts F``): not looked up, not read."""
    budget = round(budget_mib * MIB)
    n = batches.n_lookups
    if drop is not None:
        if prefetch > 0:
            raise BmoeError("--drop with --prefetch is not predicted")
        hits, n = _drop_hits(trace, batches, policy, budget, drop, seed)
        prefetched = np.zeros(len(batches), dtype=np.int64)
    elif prefetch <= 0:
        hits = replay.simulate(batches, policy, budget, seed=seed)
        prefetched = np.zeros(len(batches), dtype=np.int64)
    else:
        hits, prefetched = _prefetch_hits(trace, batches, policy, budget, prefetch, seed, bets)
    decode = batches.decode
    steps = batches.step[decode]
    turns = batches.turn[decode]
    token = pd.factorize(pd.MultiIndex.from_arrays([turns, steps]), sort=True)[0]
    total = int(n.sum())
    dec_total = int(n[decode].sum())
    return CellReads(
        step=token.astype(np.int64),
        layer=batches.layer[decode],
        misses=(n - hits)[decode],
        prefetched=prefetched[decode],
        n_tokens=int(token.max()) + 1 if len(token) else 0,
        hit_pct=100.0 * int(hits.sum()) / total if total else float("nan"),
        hit_pct_decode=100.0 * int(hits[decode].sum()) / dec_total if dec_total else float("nan"),
    )


def _drop_hits(trace, batches, policy, budget, frac, seed):
    """Hits and lookups per batch when decode misses below ``frac / k`` are dropped."""
    rows = trace.rows
    if "weight" not in rows:
        raise BmoeError(f"{trace.path or 'trace'}: no gate weights; --drop needs them")
    if not frac >= 0:
        raise BmoeError(f"--drop {frac}: give a fraction of the uniform share 1/k, >= 0")
    dec = rows[rows["phase"] != 0] if "phase" in rows else rows
    keyed = pd.DataFrame(
        {
            "turn": dec["turn"].to_numpy(np.int64) if "turn" in dec else 0,
            "step": dec["step"].to_numpy(np.int64),
            "layer": dec["layer"].to_numpy(np.int64),
            "key": (dec["layer"].to_numpy(np.int64) << 16) | dec["expert"].to_numpy(np.int64),
            "weight": dec["weight"].to_numpy(np.float64),
        }
    )
    best = keyed.groupby(["turn", "step", "layer", "key"], sort=False)["weight"].max()
    weights: dict[tuple[int, int, int], dict[int, float]] = {}
    for (t, st, layer, key), w in best.items():
        weights.setdefault((int(t), int(st), int(layer)), {})[int(key)] = float(w)
    k = batches.k or 1
    threshold = frac / k
    cache = ExpertCache(budget, policy, n_layer=batches.n_layer, seed=seed)
    if cache.needs_future:
        raise BmoeError(f"policy {policy!r} reads the future; dropping is not replayed with it")
    b_turn, b_step = batches.turn.tolist(), batches.step.tolist()
    b_dec, b_layer = batches.decode.tolist(), batches.layer.tolist()
    sizes = batches.size.tolist()
    hits = np.zeros(len(batches), dtype=np.int64)
    looked = np.zeros(len(batches), dtype=np.int64)
    for i, look in enumerate(batches.lookups):
        layer = b_layer[i]
        recency = batches.recency[i]
        if b_dec[i]:
            cell = weights.get((b_turn[i], b_step[i], layer), {})
            top = max(cell, key=cell.get) if cell else None
            kept = [
                key
                for key in look
                if key == top or cell.get(key, 1.0) >= threshold or (layer, key & 0xFFFF) in cache
            ]
            if len(kept) != len(look):
                keep = set(kept)
                recency = None if recency is None else [x for x in recency if x in keep]
            look = kept
        h, _, _, _ = cache.stage_keys(layer, look, recency, sizes[i])
        hits[i] = len(h)
        looked[i] = len(look)
    return hits, looked


def _prefetch_hits(trace, batches, policy, budget, depth, seed, bets):
    """Hits and experts prefetched per batch with the previous-token bet at `depth` (the
    replay's batches staged one by one, so each decode batch's admissions are known)."""
    cache = ExpertCache(budget, policy, n_layer=batches.n_layer, seed=seed)
    if cache.needs_future:
        raise BmoeError(f"policy {policy!r} reads the future; prefetch is not replayed with it")
    bets = _last_token_keys(trace) if bets is None else bets
    layers = sorted(set(batches.layer.tolist()))
    following = {x: layers[i + 1 : i + 1 + depth] for i, x in enumerate(layers)}
    size_of = dict(zip(batches.layer.tolist(), batches.size.tolist(), strict=False))
    # the step before each decode step (the last prompt position for the first one)
    prev_step: dict[tuple[int, int], int] = {}
    b_turn, b_step = batches.turn.tolist(), batches.step.tolist()
    b_dec = batches.decode.tolist()
    by_turn: dict[int, list[int]] = {}
    for t, s, _layer in bets:
        by_turn.setdefault(t, []).append(s)
    for t, steps in by_turn.items():
        ordered = sorted(set(steps))
        for a, b in itertools.pairwise(ordered):
            prev_step[(t, b)] = a
    hits = np.zeros(len(batches), dtype=np.int64)
    prefetched = np.zeros(len(batches), dtype=np.int64)
    sizes = batches.size.tolist()
    for i, look in enumerate(batches.lookups):
        layer = batches.layer[i]
        h, _, _, _ = cache.stage_keys(int(layer), look, batches.recency[i], sizes[i])
        hits[i] = len(h)
        if not b_dec[i]:
            continue
        before = prev_step.get((b_turn[i], b_step[i]))
        if before is None:
            continue
        for nxt in following[int(layer)]:
            keys = bets.get((b_turn[i], before, nxt))
            if keys:
                prefetched[i] += len(cache.prefetch_keys(nxt, keys, size_of[nxt]))
    return hits, prefetched


# ----------------------------------------------------------------------------- time


def check_model(trace: RouteTrace, profile: DeviceProfile) -> None:
    """Refuse a profile measured on another model (its latencies price other expert sizes),
    at another top-k (``--n-expert-used`` changes the routing), or one that does not know its
    model's expert sizes."""
    mine = trace.expert_bytes()
    theirs = profile.expert_bytes()
    where = trace.path or "the trace"
    if not mine:
        raise BmoeError(f"{trace.path or 'trace'}: no expert_bytes in the preamble")
    if not theirs:
        raise BmoeError(
            f"{profile.path or 'the profile'} does not know its model's expert sizes (built "
            "from metrics without a route trace, model file or preamble that says them): it "
            f"cannot price {where}'s reads; rebuild it with bmoe profile RUNS --trace "
            f"{where}, or predict the measured files themselves (--against FILES without a "
            "trace)"
        )
    approximate = "preamble" in str(profile.model.get("sizes_from") or "")
    if approximate:  # sizes the preamble implies: one mean size, summaries' rounding
        ours, given = np.mean(list(theirs.values())), np.mean(list(mine.values()))
        slack = 0.02 * given + 0.1 * MIB / max(len(mine), 1)
        differ = (
            []
            if len(mine) == len(theirs) and abs(ours - given) <= slack
            else [min(set(mine) ^ set(theirs) or set(mine))]
        )
    else:
        differ = sorted(
            layer for layer in set(mine) | set(theirs) if mine.get(layer) != theirs.get(layer)
        )
    if differ:
        layer = differ[0]
        name = profile.model.get("name") or "another model"
        raise BmoeError(
            f"{profile.path or 'profile'} was measured on {name} (layer {layer}: "
            f"{theirs.get(layer, 'no')} expert bytes) but {where} has "
            f"{mine.get(layer, 'no')} at layer {layer}: a profile prices its own model's "
            "expert reads only"
        )
    k_trace = trace.meta.get("n_expert_used")
    k_profile = profile.model.get("n_expert_used")
    if k_trace and k_profile and int(k_trace) != int(k_profile):
        raise BmoeError(
            f"{where} was recorded at top-{int(k_trace)} but {profile.path or 'the profile'}'s "
            f"runs ran top-{int(k_profile)} (--n-expert-used changes the routing): record a "
            "trace at the top-k you predict"
        )


def check_settled(profile: DeviceProfile, strict: bool) -> list[str]:
    """The profile's unsettled terms (a sentence each); with `strict`, a :class:`BmoeError`
    when there are any."""
    if strict and profile.unsettled:
        raise BmoeError(
            f"{profile.path or 'the profile'} is not settled (--strict): "
            + "; ".join(profile.unsettled)
        )
    return list(profile.unsettled)


def interval_z(coverage: float) -> float:
    """The normal quantile of a two-sided interval of `coverage` (0.8 -> 1.2816)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + coverage / 2.0)


def _latency_column(flash: pd.DataFrame, column: str) -> pd.Series:
    values = flash[column].astype(float)
    return values.fillna(flash["latency_ms"].astype(float))


def _lane_curve(
    flash: pd.DataFrame, req_bytes: float, column: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per measured lane count: the latency of a `req_bytes` request and the batch overhead."""
    per_lanes = []
    for n_lanes, rows in flash.groupby("lanes"):
        rows = rows.sort_values("req_bytes")
        sizes = rows["req_bytes"].to_numpy(np.float64)
        lat = _latency_column(rows, column).to_numpy(np.float64)
        if req_bytes <= sizes[0]:
            value = lat[0]  # smaller requests: no cheaper than the smallest measured
        elif req_bytes > sizes[-1]:
            value = lat[-1] * req_bytes / sizes[-1]
        else:
            value = float(np.interp(req_bytes, sizes, lat))
        overhead = float(rows["batch_overhead_ms"].astype(float).median())
        per_lanes.append((int(n_lanes), value, overhead))
    arrays = np.array(per_lanes, dtype=np.float64).T
    return arrays[0], arrays[1], arrays[2]


def _at_lanes(curve, lanes: int) -> tuple[float, float]:
    lanes_known, lat_known, over_known = curve
    per_lane = lat_known / lanes_known  # time per request when the lanes are kept busy
    if lanes <= lanes_known[0]:
        return float(lat_known[0]), float(over_known[0])
    if lanes >= lanes_known[-1]:
        return float(per_lane[-1] * lanes), float(over_known[-1])
    return (
        float(np.interp(lanes, lanes_known, per_lane) * lanes),
        float(np.interp(lanes, lanes_known, over_known)),
    )


def request_latency_ms(
    flash: pd.DataFrame, req_bytes: float, lanes: int, column: str = "latency_ms"
) -> tuple[float, float]:
    """(latency of one request of `req_bytes` with `lanes` lanes busy, per-batch overhead)
    from a profile's flash table, interpolated as the module docstring says."""
    return _at_lanes(_lane_curve(flash, req_bytes, column), lanes)


def batch_flash_ms(
    flash: pd.DataFrame,
    requests: np.ndarray,
    req_bytes: float,
    lanes: int,
    column: str = "latency_ms",
) -> np.ndarray:
    """Flash wait of read batches of `requests` requests each with `lanes` lanes: the best
    of every lane count up to `lanes` (never slower with more lanes)."""
    requests = np.asarray(requests, dtype=np.float64)
    curve = _lane_curve(flash, req_bytes, column)
    best = np.full(requests.shape, np.inf)
    for n in range(1, max(1, int(lanes)) + 1):
        lat, overhead = _at_lanes(curve, n)
        best = np.minimum(best, overhead + lat * np.ceil(requests / n))
    return np.where(requests > 0, best, 0.0)


def _req_bytes(profile: DeviceProfile) -> float:
    """Bytes of one flash request: an expert slice, or the profile's read unit when unsized."""
    slices = int(profile.model["slices_per_expert"])
    sizes = profile.expert_bytes()
    if not sizes:
        return profile.read_unit_bytes
    return float(np.median(list(sizes.values()))) / slices


def per_lane_ms(profile: DeviceProfile, lanes: int, latency: str = "latency_ms") -> float:
    """Flash time per request when `lanes` lanes keep busy: the best over every lane count up
    to `lanes` of latency / lanes (never more with more lanes)."""
    curve = _lane_curve(profile.flash, _req_bytes(profile), latency)
    return min(_at_lanes(curve, n)[0] / n for n in range(1, max(1, int(lanes)) + 1))


def stall_per_miss(profile: DeviceProfile, lanes: int) -> float:
    """The overlap's stall per missed read at `lanes` lanes: the measured one, scaled by how
    much faster (or slower) the flash table says a request is per lane at `lanes` than at the
    lanes the stall was measured with."""
    per = float(profile.overlap.get("stall_ms_per_miss", 0.0))
    measured: list[int] = list(profile.overlap.get("lanes") or [])
    if not measured or not per:
        return per
    at = int(np.median(measured))
    base = per_lane_ms(profile, at)
    return per * per_lane_ms(profile, lanes) / base if base > 0 else per


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
    req = _req_bytes(profile)
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


def predict_cell(
    profile: DeviceProfile,
    reads: CellReads,
    lanes: int,
    read_bytes: Mapping[int, int],
    *,
    overlap: bool | None = None,
    cache_mb: float | None = None,
) -> dict[str, float]:
    """One configuration's predicted figures from its replayed (or measured) reads, with an
    interval of the profile's stated coverage."""
    if overlap is None:
        overlap = profile.mode == "overlap"
    c = profile.compute
    faults, _note = memory_faults(profile, cache_mb) if cache_mb is not None else (0.0, None)
    fault_ms = faults * float(profile.memory.get("ms_per_fault", 0.0))
    mid = token_times(
        profile, reads, lanes, compute_ms=c["token_ms"], overlap=overlap, fault_ms=fault_ms
    )
    n = max(reads.n_tokens, 1)
    per_expert = np.vectorize(lambda layer: read_bytes[int(layer)], otypes=[np.float64])
    moved = (reads.misses + reads.prefetched) * per_expert(reads.layer) if len(reads.layer) else 0
    wall = float(mid["wall_ms"].sum())
    parts = {k: float(mid[f"{k}_ms"].sum()) / n for k in ("compute", "flash", "mgmt")}
    token_ms = wall / n
    # the interval: each term's mean moves by its relative sd; independent terms add in
    # quadrature, and the coverage sets how many sds each side
    sd_ms = math.sqrt(
        (_term_sd(profile, "compute") * parts["compute"]) ** 2
        + (_term_sd(profile, "stall" if overlap else "flash") * parts["flash"]) ** 2
        + (_term_sd(profile, "mgmt") * parts["mgmt"]) ** 2
    )
    rel = interval_z(profile.coverage) * sd_ms / token_ms if token_ms > 0 else 0.0
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
    }


def _cells_frame(profile: DeviceProfile, grid) -> pd.DataFrame:
    defaults = _defaults(profile)
    if isinstance(grid, pd.DataFrame):
        cells = grid.copy()
        for axis, default in defaults.items():
            if axis not in cells:
                cells[axis] = default
            cells[axis] = pd.to_numeric(cells[axis], errors="coerce").fillna(default)
        for axis in ("io_threads", "prefetch", "overlap"):
            cells[axis] = cells[axis].astype(int)
        return cells
    return grid_cells(grid, defaults)


def predict(
    trace: RouteTrace,
    profile: DeviceProfile,
    grid: Mapping[str, Sequence[float]] | pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    drop: float | None = None,
) -> pd.DataFrame:
    """Predict every configuration of `grid` (axes cache_mb, io_threads, prefetch, overlap;
    a mapping of value lists or a DataFrame of cells, which may also name each cell's
    ``policy``) for the routing `trace` recorded: one row per cell with tok/s (and its
    interval), MiB/token, hit %, and the stall attribution."""
    check_model(trace, profile)
    cells = _cells_frame(profile, grid)
    policies = cells["policy"].astype(str) if "policy" in cells else pd.Series(
        policy, index=cells.index
    )  # fmt: skip
    replay.check_policies(sorted(set(policies)))
    batches = replay.prepare_batches(trace)
    if not batches.n_decode:
        raise BmoeError(f"{trace.path or 'trace'}: no decode steps to predict")
    read_bytes = profile.read_bytes_per_expert()
    bets = _last_token_keys(trace) if (cells["prefetch"] > 0).any() else None
    rows = []
    for cell, cell_policy in zip(cells.itertuples(index=False), policies, strict=True):
        reads = cell_reads(
            trace,
            batches,
            cell_policy,
            float(cell.cache_mb),
            int(cell.prefetch),
            seed=seed,
            bets=bets,
            drop=drop,
        )
        rows.append(
            {
                "cache_mb": cell.cache_mb,
                "io_threads": int(cell.io_threads),
                "prefetch": int(cell.prefetch),
                "policy": cell_policy,
                **predict_cell(
                    profile,
                    reads,
                    int(cell.io_threads),
                    read_bytes,
                    overlap=bool(cell.overlap),
                    cache_mb=float(cell.cache_mb),
                ),
            }
        )
    return pd.DataFrame(rows, columns=list(PREDICT_COLUMNS))


def measured_reads(
    profile: DeviceProfile, tokens: pd.DataFrame, hit_pct: float = float("nan")
) -> tuple[CellReads, dict[int, int]]:
    """The reads a recorded run made, as a replay would give them, in the profile's units:
    per decode token its demand ``read_mib`` and speculative ``spec_mib`` (columns of
    `tokens`), split evenly over the profile's MoE layers (one batch a token when the
    profile does not know them). With the bytes one read moves per batch index."""
    unit = profile.read_unit_bytes
    layers = sorted(profile.expert_bytes())
    n = len(tokens)
    demand = (
        np.maximum(
            tokens["read_mib"].to_numpy(np.float64) - tokens["spec_mib"].to_numpy(np.float64), 0.0
        )
        * MIB
        / unit
    )
    spec = tokens["spec_mib"].to_numpy(np.float64) * MIB / unit
    if layers:
        k = len(layers)
        whole = np.rint(demand)
        base, extra = np.divmod(whole, k)
        matrix = base[:, None] + (np.arange(k)[None, :] < extra[:, None])
        spec_matrix = np.zeros_like(matrix, dtype=np.float64)
        spec_matrix[:, 0] = spec
    else:
        k = 1
        matrix = demand[:, None]
        spec_matrix = spec[:, None]
    step = np.repeat(np.arange(n), k)
    layer = np.tile(np.arange(k), n)
    reads = CellReads(
        step=step.astype(np.int64),
        layer=layer.astype(np.int64),
        misses=matrix.ravel(),
        prefetched=spec_matrix.ravel(),
        n_tokens=n,
        hit_pct=hit_pct,
        hit_pct_decode=float("nan"),
    )
    return reads, {i: round(unit) for i in range(k)}


def _defaults(profile: DeviceProfile) -> dict[str, float]:
    return {
        "cache_mb": 0,
        "io_threads": _default_lanes(profile),
        "prefetch": 0,
        "overlap": 1 if profile.mode == "overlap" else 0,
    }


def _default_lanes(profile: DeviceProfile) -> int:
    return int(profile.flash["lanes"].max())


__all__ = [
    "GRID_AXES",
    "PREDICTED_FIGURES",
    "PREDICT_COLUMNS",
    "WIDEST_INTERVAL_PCT",
    "CellReads",
    "against",
    "batch_flash_ms",
    "cell_reads",
    "check_model",
    "check_settled",
    "compare_cells",
    "grid_cells",
    "interval_z",
    "measured_cells",
    "measured_reads",
    "memory_faults",
    "parse_grid",
    "per_lane_ms",
    "predict",
    "predict_cell",
    "request_latency_ms",
    "stall_per_miss",
    "sweep_duration",
    "token_times",
]


# ----------------------------------------------------------------------------- against

#: An interval wider than this (high - low, % of the prediction) predicts nothing: its cell is
#: not counted as covered, whatever was measured.
WIDEST_INTERVAL_PCT = 100.0


def measured_cells(results: pd.DataFrame, defaults: Mapping[str, float]) -> pd.DataFrame:
    """One row per sweep cell (ok attempts): its grid values (and ``policy`` where the runs
    named a ``cache_policy``), the median over repeats of tok/s (tokens over decode time),
    steady-state tok/s (NaN where the runs had none), MiB/token and hit %, and
    ``measurement``: why the cell's own figure is not firm (the verdict's judgement of its
    repeats: they disagree, the rounds differ, the engine was mostly off-CPU, a run was
    traced; None when firm; a single run is not counted against it)."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    if not len(ok):
        raise BmoeError("the sweep has no successful run to compare with")
    if "cache_mb" not in ok:
        raise BmoeError("the sweep's runs have no cache_mb: nothing to predict them from")
    frame = pd.DataFrame({"cell": (ok["cell"] if "cell" in ok else pd.Series(range(len(ok))))
                          .astype(str).to_numpy()})  # fmt: skip
    for axis in GRID_AXES:
        values = ok[axis] if axis in ok else pd.Series(defaults[axis], index=ok.index)
        if values.dtype == object:
            values = values.map(lambda v: {"true": 1, "false": 0}.get(str(v).lower(), v))
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(defaults[axis]).to_numpy()
    if "cache_policy" in ok:
        frame["policy"] = [
            policy_name(p) if isinstance(p, str) and p else DEFAULT_POLICY
            for p in ok["cache_policy"]
        ]
    rate = "tok_s_reported" if "tok_s_reported" in ok else "tok_s_mean"
    frame["tok_s"] = pd.to_numeric(ok[rate], errors="coerce").to_numpy()
    steady = ok["steady_tok_s_mean"] if "steady_tok_s_mean" in ok else pd.Series(np.nan, ok.index)
    frame["steady_tok_s"] = pd.to_numeric(steady, errors="coerce").to_numpy(np.float64)
    for out, col in (("mib_per_token", "read_mib_per_token"), ("hit_pct", "cache_hit_pct")):
        frame[out] = pd.to_numeric(ok[col], errors="coerce").to_numpy() if col in ok else np.nan
    keys = ["cell", *GRID_AXES] + (["policy"] if "policy" in frame else [])
    grouped = frame.groupby(keys, sort=False, dropna=False)
    cells = grouped[["tok_s", "steady_tok_s", "mib_per_token", "hit_pct"]].median()
    cells["runs"] = grouped.size()
    cells = cells.reset_index()
    for axis in ("io_threads", "prefetch", "overlap"):
        cells[axis] = cells[axis].astype(int)
    cells["measurement"] = _measurement_labels(ok, cells["cell"])
    return cells


def _measurement_labels(ok: pd.DataFrame, cells: pd.Series) -> list[str | None]:
    """Per cell, the verdict layer's reasons its figure is not firm (single runs aside)."""
    from bmoe.analyze.sweep import rank_cells
    from bmoe.analyze.verdict import cell_stability

    attempts = ok.assign(cell=ok["cell"].astype(str)) if "cell" in ok else ok
    outcome = "tok_s_mean" if "tok_s_mean" in attempts else None
    if outcome is None or "cell" not in attempts:
        return [None] * len(cells)
    stability = cell_stability(rank_cells(attempts, outcome), attempts)
    reasons = stability.set_index(stability["cell"].astype(str))["unstable"]
    out = []
    for cell in cells.astype(str):
        why = reasons.get(cell)
        parts = [p for p in str(why).split(", ") if p and p != "single run"] if why else []
        out.append(", ".join(parts) or None)
    return out


def compare_cells(cells: pd.DataFrame, profile: DeviceProfile) -> dict[str, Any]:
    """Measured cells (``tok_s``, ``steady_tok_s``, ``mib_per_token``, ``hit_pct``, and a
    ``measurement`` label: None when the cell's own figure is firm) beside their predictions
    (the same names with ``_predicted``; ``tok_s_low_predicted`` / ``_high_`` the interval):
    the error of each figure, whether the interval covers the measurement, its width, and a
    summary. The headline error and the achieved coverage count only cells whose
    measurement is firm and that were predicted; an interval wider than
    :data:`WIDEST_INTERVAL_PCT` % of its prediction covers nothing."""
    cells = cells.copy()
    if "measurement" not in cells:
        cells["measurement"] = None
    cells["tok_s_error_pct"] = 100.0 * (cells["tok_s_predicted"] - cells["tok_s"]) / cells["tok_s"]
    cells["steady_tok_s_error_pct"] = (
        100.0 * (cells["steady_tok_s_predicted"] - cells["steady_tok_s"]) / cells["steady_tok_s"]
    )
    cells["mib_per_token_error"] = cells["mib_per_token_predicted"] - cells["mib_per_token"]
    cells["hit_pct_error"] = cells["hit_pct_predicted"] - cells["hit_pct"]
    width = (
        100.0
        * (cells["tok_s_high_predicted"] - cells["tok_s_low_predicted"])
        / cells["tok_s_predicted"]
    )
    cells["interval_width_pct"] = width
    informative = width <= WIDEST_INTERVAL_PCT
    predicted = cells["tok_s_predicted"].notna()
    covered = (
        (cells["tok_s"] >= cells["tok_s_low_predicted"])
        & (cells["tok_s"] <= cells["tok_s_high_predicted"])
        & informative
    )
    cells["inside_interval"] = covered.astype(object).where(predicted, None)
    firm = cells["measurement"].isna() & predicted
    err = cells.loc[firm, "tok_s_error_pct"].abs()
    every = cells.loc[predicted, "tok_s_error_pct"].abs()
    steady_err = cells.loc[firm, "steady_tok_s_error_pct"].abs().dropna()
    steady_inside = (
        (cells["steady_tok_s"] >= cells["steady_tok_s_low_predicted"])
        & (cells["steady_tok_s"] <= cells["steady_tok_s_high_predicted"])
        & informative
    )
    inside = int(covered[firm].sum())

    def stat(series: pd.Series, how: str) -> float:
        return float(getattr(series, how)()) if len(series) else float("nan")

    summary = {
        "cells": len(cells),
        "compared": int(firm.sum()),
        "labelled": int((cells["measurement"].notna() & predicted).sum()),
        "not_predicted": int((~predicted).sum()),
        "median_abs_tok_s_error_pct": stat(err, "median"),
        "mean_abs_tok_s_error_pct": stat(err, "mean"),
        "max_abs_tok_s_error_pct": stat(err, "max"),
        "median_abs_tok_s_error_pct_all": stat(every, "median"),
        "coverage_stated_pct": 100.0 * profile.coverage,
        "inside_interval": inside,
        "coverage_pct": 100.0 * inside / int(firm.sum()) if firm.any() else float("nan"),
        "median_interval_width_pct": stat(width[predicted], "median"),
        "intervals_too_wide": int((~informative & predicted).sum()),
        "steady_cells": len(steady_err),
        "median_abs_steady_tok_s_error_pct": stat(steady_err, "median"),
        "steady_inside_interval": int((steady_inside & firm).sum()),
        "max_abs_mib_per_token_error": stat(cells["mib_per_token_error"].abs().dropna(), "max"),
        "max_abs_hit_pct_error": stat(cells["hit_pct_error"].abs().dropna(), "max"),
        "profile_settled": profile.settled,
    }
    return {"cells": cells, "summary": summary}


PREDICTED_FIGURES = (
    "tok_s",
    "tok_s_low",
    "tok_s_high",
    "steady_tok_s",
    "steady_tok_s_low",
    "steady_tok_s_high",
    "mib_per_token",
    "hit_pct",
    "interval_pct",
    "faults_per_token",
)


def against(
    trace: RouteTrace,
    profile: DeviceProfile,
    results: pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    drop: float | None = None,
) -> dict[str, pd.DataFrame | dict]:
    """Every measured cell of a sweep next to its prediction: ``cells`` (measured, predicted
    and the error of each figure) and ``summary`` (see :func:`compare_cells`). Like is
    compared with like: whole-run tok/s with the predicted whole-run rate, and the runs'
    steady-state tok/s (where the archive has one) with the predicted steady-state rate."""
    measured = measured_cells(results, _defaults(profile))
    grid = measured[[*GRID_AXES] + (["policy"] if "policy" in measured else [])]
    predicted = predict(trace, profile, grid, policy=policy, seed=seed, drop=drop)
    cells = measured.copy()
    for col in PREDICTED_FIGURES:
        cells[f"{col}_predicted"] = predicted[col].to_numpy()
    return compare_cells(cells, profile)


# ----------------------------------------------------------------------------- sweeps


def sweep_duration(
    trace: RouteTrace | None,
    profile: DeviceProfile,
    runs: pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
) -> pd.DataFrame:
    """Predicted duration of each planned run (columns cache_mb, io_threads, prefetch,
    n_predict): model load + prefill + n_predict tokens at the predicted rate. Without a
    trace every routed expert is priced as a miss (an upper bound, ``bound=True``)."""
    frame = runs.copy()
    defaults = _defaults(profile)
    for axis, default in defaults.items():
        values = frame[axis] if axis in frame else pd.Series(default, index=frame.index)
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(default)
    for axis in ("io_threads", "prefetch", "overlap"):
        frame[axis] = frame[axis].astype(int)
    if "n_predict" not in frame:
        frame["n_predict"] = 128
    cells = frame[list(GRID_AXES)].drop_duplicates(ignore_index=True)
    if trace is not None:
        columns = [*GRID_AXES, "tok_s", "tok_s_low", "tok_s_high"]
        rates = predict(trace, profile, cells, policy=policy)[columns]
        bound = False
    else:
        rates = cells.assign(tok_s=[_all_miss_rate(profile, int(n)) for n in cells["io_threads"]])
        bound = True
    frame = frame.merge(rates, on=list(GRID_AXES), how="left")
    fixed = float(profile.prefill.get("load_s", 0.0)) + float(profile.prefill.get("prefill_s", 0.0))
    frame["predicted_s"] = fixed + pd.to_numeric(frame["n_predict"]) / frame["tok_s"]
    frame["bound"] = bound
    return frame


def _all_miss_rate(profile: DeviceProfile, lanes: int) -> float:
    """tok/s when every routed expert of every MoE layer is read (no cache, no prefetch)."""
    k = int(profile.model.get("n_expert_used") or 1)
    layers = sorted(profile.expert_bytes())
    slices = int(profile.model["slices_per_expert"])
    req = float(np.median(list(profile.expert_bytes().values()))) / slices
    if profile.mode == "overlap":
        per = stall_per_miss(profile, lanes)
        flash = float(profile.overlap.get("stall_ms", 0.0)) + len(layers) * k * per
    else:
        flash = float(
            batch_flash_ms(profile.flash, np.full(len(layers), k * slices), req, lanes).sum()
        )
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * k * len(layers)
    return 1000.0 / (profile.compute["token_ms"] + flash + mgmt)
