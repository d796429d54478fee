"""LRU replay of a trace larger than memory: the rows come block by block, each block is cut
into batches as :func:`~bmoe.analyze.replay.prepare_batches` cuts a whole trace, and one
cache per budget is carried from block to block, so memory stays that of one block.

A batch must not straddle two blocks: the rows of the last batch group of a block (a decode
step, or a turn's whole prefill) wait for the next block. The rows must come in the order
the engine writes them (turns, then a turn's prefill before its decode steps, steps
ascending); a group seen again after a later one is an error, since the whole-trace replay
would have put it earlier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from bmoe.analyze.replay import (
    CURVE_COLUMNS,
    MIB,
    check_budgets,
    column_or,
    preamble_count,
    prepare_batches,
)
from bmoe.cache import EXPERT_BITS
from bmoe.cache.expert_cache import EXPERT_MASK
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace


def _groups(rows: pd.DataFrame) -> np.ndarray:
    """Per row, its batch group packed in one int64 that grows in replay order: turn, then
    prefill (every step of it one group) before decode, then the decode step."""
    turn = column_or(rows, "turn", 0).astype(np.int64)
    decode = (column_or(rows, "phase", 1) != 0).astype(np.int64)
    step = column_or(rows, "step", 0).astype(np.int64)
    return ((turn + (1 << 15)) << 41) | (decode << 40) | (decode * (step + (1 << 31)))


def stream_lru_curve(
    trace: RouteTrace, blocks: Iterable[pd.DataFrame], budgets_mib: Sequence[float]
) -> pd.DataFrame:
    """The ``lru`` rows of :func:`~bmoe.analyze.replay.replay_curve` (same columns, same
    figures) for the trace whose preamble is `trace` (its rows are not read) and whose rows
    are `blocks`, in file order (e.g. :func:`~bmoe.formats.route.iter_route_rows`)."""
    from bmoe.cache import kernels

    budgets = check_budgets(budgets_mib)
    name = trace.path or "trace"
    sizes = trace.expert_bytes()
    if not sizes:
        raise BmoeError(f"{name}: no expert_bytes in the preamble (a replay cannot price misses)")
    layers = np.array(sorted(sizes), dtype=np.int64)
    part_of = np.full(int(layers.max()) + 1, -1, dtype=np.int64)
    part_of[layers] = np.arange(len(layers))
    n_e = preamble_count(trace.meta, "n_expert") or EXPERT_MASK + 1
    n_keys = len(layers) * n_e
    states = [kernels.lru_state(1, n_keys) for _ in budgets]
    capacity = [round(b * MIB) for b in budgets]
    lookups = decode_lookups = 0
    total_bytes = 0
    hits = np.zeros(len(budgets), dtype=np.int64)
    decode_hits = np.zeros(len(budgets), dtype=np.int64)
    hit_bytes = np.zeros(len(budgets), dtype=np.int64)
    done = -1  # the last batch group replayed

    def run(rows: pd.DataFrame, groups: np.ndarray) -> None:
        nonlocal lookups, decode_lookups, total_bytes, done
        if not len(rows):
            return
        if int(groups.min()) <= done:
            raise BmoeError(
                f"{name}: routing rows out of the engine's order (a step or prefill seen again "
                "after a later one); replay the trace whole instead"
            )
        done = int(groups.max())
        b = prepare_batches(RouteTrace(trace.path, trace.version, trace.meta, trace.layers, rows))
        expert = b.key_code & EXPERT_MASK
        if int(expert.max(initial=0)) >= n_e:
            raise BmoeError(f"{name}: expert {int(expert.max())} but n_expert={n_e}")
        to_global = part_of[b.key_code >> EXPERT_BITS] * n_e + expert
        look = to_global[b.look].astype(np.int32)
        rec = to_global[b.rec].astype(np.int32)
        one_part = np.zeros(len(b), dtype=np.int64)
        n = b.n_lookups
        lookups += int(n.sum())
        decode_lookups += int(n[b.decode].sum())
        total_bytes += int((n * b.size).sum())
        for i, state in enumerate(states):
            h = kernels.lru_continue(
                b.bounds, look, rec, b.repeated, b.size, one_part, capacity[i], state
            )
            hits[i] += int(h.sum())
            decode_hits[i] += int(h[b.decode].sum())
            hit_bytes[i] += int((h * b.size).sum())

    carry: pd.DataFrame | None = None
    for block in blocks:
        rows = block if carry is None else pd.concat([carry, block], ignore_index=True)
        if not len(rows):
            continue
        groups = _groups(rows)
        last = groups == groups[-1]
        run(rows[~last], groups[~last])
        carry = rows[last]
    if carry is not None:
        run(carry, _groups(carry))
    if not lookups:
        raise BmoeError(f"{name}: no routing rows to replay")
    return pd.DataFrame(
        {
            "budget_mib": budgets,
            "policy": "lru",
            "hit_pct_cum": 100.0 * hits / lookups,
            "hit_pct_decode": 100.0 * decode_hits / decode_lookups if decode_lookups else np.nan,
            "read_mib": (total_bytes - hit_bytes) / MIB,
        },
        columns=list(CURVE_COLUMNS),
    )
