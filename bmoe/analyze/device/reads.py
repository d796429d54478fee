"""The replay of one configuration's cache over the recorded routing, per decode batch.

What one configuration's cache does with the recorded routing: the replay, per decode
batch, of the demand misses and the experts prefetched (or dropped).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bmoe.analyze import replay
from bmoe.cache import ExpertCache
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace
from bmoe.units import MIB


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


def last_token_keys(trace: RouteTrace) -> dict[tuple[int, int, int], list[int]]:
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
    bets = last_token_keys(trace) if bets is None else bets
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


__all__ = ["CellReads", "cell_reads", "last_token_keys"]
