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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bmoe.analyze import replay
from bmoe.analyze.metrics import steady_state
from bmoe.cache import DEFAULT_POLICY, ExpertCache
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace

MIB = 1 << 20
GRID_AXES = ("cache_mb", "io_threads", "prefetch")
PREDICT_COLUMNS = (
    "cache_mb",
    "io_threads",
    "prefetch",
    "policy",
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
    """Refuse a profile measured on another model: its latencies price other expert sizes."""
    mine = trace.expert_bytes()
    theirs = profile.expert_bytes()
    if not mine:
        raise BmoeError(f"{trace.path or 'trace'}: no expert_bytes in the preamble")
    differ = sorted(
        layer for layer in set(mine) | set(theirs) if mine.get(layer) != theirs.get(layer)
    )
    if differ:
        layer = differ[0]
        name = profile.model.get("name") or "another model"
        raise BmoeError(
            f"{profile.path or 'profile'} was measured on {name} (layer {layer}: "
            f"{theirs.get(layer, 'no')} expert bytes) but {trace.path or 'the trace'} has "
            f"{mine.get(layer, 'no')} at layer {layer}: a profile prices its own model's "
            "expert reads only"
        )


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


def token_times(
    profile: DeviceProfile,
    reads: CellReads,
    lanes: int,
    *,
    compute_ms: float,
    latency: str = "latency_ms",
) -> pd.DataFrame:
    """Per decode token: compute, flash wait, mgmt and wall milliseconds."""
    slices = int(profile.model["slices_per_expert"])
    sizes = profile.expert_bytes()
    req = float(np.median([sizes[layer] for layer in sizes])) / slices
    n_tok = reads.n_tokens
    if profile.mode == "overlap":
        per = float(profile.overlap["stall_ms_per_miss"])
        flash = np.bincount(reads.step, weights=reads.misses * per, minlength=n_tok)
    else:
        per_batch = batch_flash_ms(profile.flash, reads.misses * slices, req, lanes, latency)
        flash = np.bincount(reads.step, weights=per_batch, minlength=n_tok)
        spec_requests = np.bincount(reads.step, weights=reads.prefetched * slices, minlength=n_tok)
        if spec_requests.any():
            spec_ms = batch_flash_ms(profile.flash, spec_requests, req, lanes, latency)
            flash = flash + np.maximum(spec_ms - compute_ms, 0.0)
    admits = np.bincount(reads.step, weights=reads.misses + reads.prefetched, minlength=n_tok)
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * admits
    compute = np.full(n_tok, compute_ms)
    return pd.DataFrame(
        {
            "compute_ms": compute,
            "flash_ms": flash,
            "mgmt_ms": mgmt,
            "wall_ms": compute + flash + mgmt,
            "misses": np.bincount(reads.step, weights=reads.misses, minlength=n_tok),
            "prefetched": np.bincount(reads.step, weights=reads.prefetched, minlength=n_tok),
        }
    )


def predict_cell(
    profile: DeviceProfile, reads: CellReads, lanes: int, read_bytes: Mapping[int, int]
) -> dict[str, float]:
    """One configuration's predicted figures from its replayed reads."""
    c = profile.compute
    mid = token_times(profile, reads, lanes, compute_ms=c["token_ms"])
    slow = token_times(
        profile, reads, lanes, compute_ms=c["token_ms_p90"], latency="latency_ms_p90"
    )
    fast = token_times(
        profile, reads, lanes, compute_ms=c["token_ms_p10"], latency="latency_ms_p10"
    )
    n = max(reads.n_tokens, 1)
    per_expert = np.vectorize(lambda layer: read_bytes[int(layer)], otypes=[np.float64])
    moved = (reads.misses + reads.prefetched) * per_expert(reads.layer) if len(reads.layer) else 0
    wall = float(mid["wall_ms"].sum())
    parts = {k: float(mid[f"{k}_ms"].sum()) / n for k in ("compute", "flash", "mgmt")}
    token_ms = wall / n
    moved_mib = np.bincount(reads.step, weights=moved, minlength=reads.n_tokens) / MIB
    steady = steady_state(pd.DataFrame({"wall_ms": mid["wall_ms"], "read_mib": moved_mib}))
    window = steady.mask()

    def rate(frame: pd.DataFrame, rows: np.ndarray | None = None) -> float:
        wall_ms = frame["wall_ms"].to_numpy() if rows is None else frame["wall_ms"].to_numpy()[rows]
        total = float(wall_ms.sum())
        return 1000.0 * len(wall_ms) / total if total > 0 else float("inf")

    def steady_rate(frame: pd.DataFrame) -> float:
        return rate(frame, window) if steady.steady_tokens else float("nan")

    return {
        "tok_s": rate(mid),
        "tok_s_low": rate(slow),
        "tok_s_high": rate(fast),
        "steady_tok_s": steady_rate(mid),
        "steady_tok_s_low": steady_rate(slow),
        "steady_tok_s_high": steady_rate(fast),
        "warmup_tokens": float("nan") if steady.warmup_tokens is None else steady.warmup_tokens,
        "mib_per_token": float(np.sum(moved)) / n / MIB,
        "hit_pct": reads.hit_pct,
        "hit_pct_decode": reads.hit_pct_decode,
        "token_ms": token_ms,
        **{f"{k}_ms": v for k, v in parts.items()},
        **{f"{k}_pct": 100.0 * v / token_ms if token_ms else 0.0 for k, v in parts.items()},
        "misses_per_token": float(reads.misses.sum()) / n,
        "prefetched_per_token": float(reads.prefetched.sum()) / n,
    }


def predict(
    trace: RouteTrace,
    profile: DeviceProfile,
    grid: Mapping[str, Sequence[float]] | pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    drop: float | None = None,
) -> pd.DataFrame:
    """Predict every configuration of `grid` (axes cache_mb, io_threads, prefetch; a
    mapping of value lists or a DataFrame of cells) for the routing `trace` recorded: one row
    per cell with tok/s (and its interval), MiB/token, hit %, and the stall attribution."""
    check_model(trace, profile)
    replay.check_policies([policy])
    if isinstance(grid, pd.DataFrame):
        cells = grid.copy()
        for axis, default in (("io_threads", 1), ("prefetch", 0)):
            if axis not in cells:
                cells[axis] = default
    else:
        cells = grid_cells(
            grid, {"cache_mb": 0, "io_threads": _default_lanes(profile), "prefetch": 0}
        )
    batches = replay.prepare_batches(trace)
    if not batches.n_decode:
        raise BmoeError(f"{trace.path or 'trace'}: no decode steps to predict")
    read_bytes = profile.read_bytes_per_expert()
    bets = _last_token_keys(trace) if (cells["prefetch"] > 0).any() else None
    rows = []
    for cell in cells.itertuples(index=False):
        reads = cell_reads(
            trace,
            batches,
            policy,
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
                "policy": policy,
                **predict_cell(profile, reads, int(cell.io_threads), read_bytes),
            }
        )
    return pd.DataFrame(rows, columns=list(PREDICT_COLUMNS))


def _default_lanes(profile: DeviceProfile) -> int:
    return int(profile.flash["lanes"].max())


__all__ = [
    "GRID_AXES",
    "PREDICT_COLUMNS",
    "CellReads",
    "against",
    "batch_flash_ms",
    "cell_reads",
    "check_model",
    "grid_cells",
    "measured_cells",
    "parse_grid",
    "predict",
    "predict_cell",
    "request_latency_ms",
    "sweep_duration",
    "token_times",
]


# ----------------------------------------------------------------------------- against


def measured_cells(results: pd.DataFrame, defaults: Mapping[str, float]) -> pd.DataFrame:
    """One row per sweep cell (ok attempts): its grid values and the median over repeats
    of tok/s (tokens over decode time), steady-state tok/s (NaN where the runs had none),
    MiB/token and hit %."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    if not len(ok):
        raise BmoeError("the sweep has no successful run to compare with")
    if "cache_mb" not in ok:
        raise BmoeError("the sweep's runs have no cache_mb: nothing to predict them from")
    frame = pd.DataFrame({"cell": ok["cell"] if "cell" in ok else range(len(ok))})
    for axis in GRID_AXES:
        values = ok[axis] if axis in ok else pd.Series(defaults[axis], index=ok.index)
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(defaults[axis]).to_numpy()
    rate = "tok_s_reported" if "tok_s_reported" in ok else "tok_s_mean"
    frame["tok_s"] = pd.to_numeric(ok[rate], errors="coerce").to_numpy()
    steady = ok["steady_tok_s_mean"] if "steady_tok_s_mean" in ok else pd.Series(np.nan, ok.index)
    frame["steady_tok_s"] = pd.to_numeric(steady, errors="coerce").to_numpy(np.float64)
    for out, col in (("mib_per_token", "read_mib_per_token"), ("hit_pct", "cache_hit_pct")):
        frame[out] = pd.to_numeric(ok[col], errors="coerce").to_numpy() if col in ok else np.nan
    grouped = frame.groupby(["cell", *GRID_AXES], sort=False, dropna=False)
    cells = grouped[["tok_s", "steady_tok_s", "mib_per_token", "hit_pct"]].median()
    cells["runs"] = grouped.size()
    cells = cells.reset_index()
    cells["io_threads"] = cells["io_threads"].astype(int)
    cells["prefetch"] = cells["prefetch"].astype(int)
    return cells


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
    and the error of each figure) and ``summary`` (median and mean absolute tok/s error,
    cells inside the interval, largest MiB/token and hit % gaps). Like is compared with like:
    whole-run tok/s with the predicted whole-run rate, and the runs' steady-state tok/s (where
    the archive has one) with the predicted steady-state rate."""
    defaults = {"cache_mb": 0, "io_threads": _default_lanes(profile), "prefetch": 0}
    measured = measured_cells(results, defaults)
    predicted = predict(
        trace, profile, measured[list(GRID_AXES)], policy=policy, seed=seed, drop=drop
    )
    cells = measured.copy()
    for col in (
        "tok_s",
        "tok_s_low",
        "tok_s_high",
        "steady_tok_s",
        "steady_tok_s_low",
        "steady_tok_s_high",
        "mib_per_token",
        "hit_pct",
    ):
        cells[f"{col}_predicted"] = predicted[col].to_numpy()
    cells["tok_s_error_pct"] = 100.0 * (cells["tok_s_predicted"] - cells["tok_s"]) / cells["tok_s"]
    cells["steady_tok_s_error_pct"] = (
        100.0 * (cells["steady_tok_s_predicted"] - cells["steady_tok_s"]) / cells["steady_tok_s"]
    )
    cells["mib_per_token_error"] = cells["mib_per_token_predicted"] - cells["mib_per_token"]
    cells["hit_pct_error"] = cells["hit_pct_predicted"] - cells["hit_pct"]
    inside = (cells["tok_s"] >= cells["tok_s_low_predicted"]) & (
        cells["tok_s"] <= cells["tok_s_high_predicted"]
    )
    err = cells["tok_s_error_pct"].abs()
    steady_err = cells["steady_tok_s_error_pct"].abs().dropna()
    steady_inside = (cells["steady_tok_s"] >= cells["steady_tok_s_low_predicted"]) & (
        cells["steady_tok_s"] <= cells["steady_tok_s_high_predicted"]
    )
    summary = {
        "cells": len(cells),
        "median_abs_tok_s_error_pct": float(err.median()),
        "mean_abs_tok_s_error_pct": float(err.mean()),
        "max_abs_tok_s_error_pct": float(err.max()),
        "inside_interval": int(inside.sum()),
        "steady_cells": len(steady_err),
        "median_abs_steady_tok_s_error_pct": float(steady_err.median())
        if len(steady_err)
        else float("nan"),
        "steady_inside_interval": int(steady_inside.sum()),
        "max_abs_mib_per_token_error": float(cells["mib_per_token_error"].abs().max()),
        "max_abs_hit_pct_error": float(cells["hit_pct_error"].abs().max()),
    }
    return {"cells": cells, "summary": summary}


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
    defaults = {"cache_mb": 0, "io_threads": _default_lanes(profile), "prefetch": 0}
    for axis, default in defaults.items():
        values = frame[axis] if axis in frame else pd.Series(default, index=frame.index)
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(default)
    frame["io_threads"] = frame["io_threads"].astype(int)
    frame["prefetch"] = frame["prefetch"].astype(int)
    if "n_predict" not in frame:
        frame["n_predict"] = 128
    cells = frame[list(GRID_AXES)].drop_duplicates(ignore_index=True)
    if trace is not None:
        rates = predict(trace, profile, cells, policy=policy)[[*GRID_AXES, "tok_s"]]
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
        flash = len(layers) * k * float(profile.overlap["stall_ms_per_miss"])
    else:
        flash = float(
            batch_flash_ms(profile.flash, np.full(len(layers), k * slices), req, lanes).sum()
        )
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * k * len(layers)
    return 1000.0 / (profile.compute["token_ms"] + flash + mgmt)
