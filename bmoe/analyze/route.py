"""What the router asked for: the views of a routing trace, as DataFrames.

A routing trace is conceptually a matrix: rows are steps, columns are MoE layers, and a cell
holds the ``n_expert_used`` experts one layer routed for one token. Per layer, the *step
sequence* is that layer's cells ordered by step. Every view here reads that sequence:

- ``sanity``   row and cell counts, cells of the wrong size, weight sums;
- ``hot``      distinct experts per layer and the share carried by the top N;
- ``reuse``    distance (in cells of the sequence) between routings of one expert;
- ``overlap``  share of a cell's experts also routed ``lag`` cells earlier;
- ``workset``  cumulative distinct experts after m steps, and the bytes of that union;
- ``cache``    share of routings that missed, hit, or hit a prefetched expert;
- ``entropy``  entropy of the normalised routing weights, and the top-1 share;
- ``bytes``    flash bytes read per layer, one-expert and dense sizes;
- ``matrix``   the step x layer matrix itself, as text cells.

Figures match the established route analysis exactly (see the reference semantics): quantiles
take the element at ``min(n-1, floor(q*n))`` of the sorted values, ties among equally hot
experts go to the one routed first. Everything is vectorised; nothing loops over rows.

Each view is computed once, as columns of numpy arrays (:func:`view_columns`, no pandas: what
the command line prints); :func:`route_views` and the per-view functions give them as
DataFrames (:func:`as_frame`). The trace may be a :class:`RouteTrace` (rows in a DataFrame), a
:class:`RouteColumns` (rows as numpy columns) or a bare frame of rows. The selection and the
step sequence the views share are in :mod:`bmoe.analyze.route_cells`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bmoe.analyze import route_order, route_weights
from bmoe.analyze.route_cells import (
    ALL,
    PHASES,
    Columns,
    Facts,
    IntsWithGaps,
    StepSequence,
    Trace,
    View,
    as_frame,
    caveats,
    cell_blocks,
    columns_of,
    count_steps,
    kept_rows,
    layer_view,
    one_row,
    order_rows,
    select,
    select_sequence,
    sequence_of,
    trace_columns,
    with_all_row,
)
from bmoe.analyze.views import ROUTE
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteColumns, RouteTrace
from bmoe.units import MIB

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALL",
    "DEFAULT_VIEWS",
    "MATRIX_CELLS",
    "MATRIX_STEPS",
    "PHASES",
    "VIEWS",
    "Columns",
    "IntsWithGaps",
    "Trace",
    "View",
    "as_frame",
    "caveats",
    "count_steps",
    "select",
    "select_sequence",
]

#: The views ``--view`` names, in the catalogue's order (its ``prefetch_slots`` comes with
#: ``cache``); every one but the matrix by default.
VIEWS = tuple(slug for slug in ROUTE.slugs if slug != "prefetch_slots")
DEFAULT_VIEWS = tuple(slug for slug in VIEWS if slug != "matrix")
MATRIX_CELLS = ("experts", "weights", "mb", "hit")
WORKSET_MARKS = (1, 2, 5, 10, 25, 50, 100, 200, 500, 1000)
OVERLAP_LAGS = (1, 2, 4, 8)
REUSE_QUANTILES = (0.5, 0.9)
RESIDENCY_LETTERS = {0: "M", 1: "H", 2: "P"}
MATRIX_STEPS = 20  # steps the matrix shows when no window was chosen


# ----------------------------------------------------------------------------- sanity


def sanity(trace: Trace) -> pd.DataFrame:
    """One row: rows, cells over steps x layers, cells whose size is not ``n_expert_used``,
    steps per layer (uneven in prefill: the last layer routes only the final prompt token),
    and the min/max per-cell weight sum over cells whose weights are all known."""
    seq, meta_trace = sequence_of(trace)
    return as_frame(_sanity(seq, meta_trace))


def _sanity(seq: StepSequence, trace: Facts | None) -> View:
    k = trace.n_expert_used if trace is not None else None
    n_cells = len(seq.cell_start)
    sizes = np.diff(np.append(seq.cell_start, seq.n_rows))
    wmin = wmax = np.nan
    weighed = 0
    if "weight" in seq.rows and n_cells:
        complete, sums, _, _ = seq.cell_weights()
        weighed = int(complete.sum())
        if weighed:
            wmin, wmax = float(sums[complete].min()), float(sums[complete].max())
    per_layer = seq.cells_per_layer
    row = {
        "rows": seq.n_rows,
        "cells": n_cells,
        "steps": seq.n_steps,
        "layers": seq.n_layers,
        "k": k,
        "cells_not_k": int((sizes != k).sum()) if k is not None else None,
        "steps_per_layer_min": int(per_layer.min()) if n_cells else 0,
        "steps_per_layer_max": int(per_layer.max()) if n_cells else 0,
        "cells_weighed": weighed,
        "weight_sum_min": wmin,
        "weight_sum_max": wmax,
    }
    return one_row(row)


# ----------------------------------------------------------------------------- hot


def expert_counts(trace: Trace) -> pd.DataFrame:
    """Per (layer, expert): activations, the share of the layer's activations, and the rank
    (hottest first; ties to the expert routed first). Long form, for plots and notebooks."""
    seq, _ = sequence_of(trace)
    return as_frame(_expert_counts(seq))


def _expert_counts(seq: StepSequence) -> View:
    if not seq.n_rows:
        none = np.zeros(0, dtype=np.int64)
        return {c: none for c in ("layer", "expert", "activations", "rank")} | {
            "share_pct": np.zeros(0)
        }
    layer_idx, expert, c, share, rank = _ranked(seq)
    return {
        "layer": seq.layers[layer_idx].astype(np.int64),
        "expert": expert,
        "activations": c,
        "share_pct": share,
        "rank": rank,
    }


def _ranked(seq: StepSequence) -> tuple[np.ndarray, ...]:
    """Per (layer, expert), hottest first within each layer (layers in order): the layer
    index, the expert, its activations, their share of the layer's (%) and the rank."""
    order, key = seq.by_key()
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.append(start, len(key)))
    first_row = order[start]  # row position in step-sequence order: (cell, slot)
    ukey = key[start].astype(np.int64)
    layer_idx = ukey // seq.n_expert
    # rank within layer: by count descending, then first routed
    rank_order = np.lexsort((first_row, -counts, layer_idx))
    layer_sorted = layer_idx[rank_order]
    group_start = np.flatnonzero(np.r_[True, layer_sorted[1:] != layer_sorted[:-1]])
    rank = np.arange(len(rank_order)) - np.repeat(
        group_start, np.diff(np.append(group_start, len(rank_order)))
    )
    totals = np.bincount(layer_idx, weights=counts, minlength=seq.n_layers)
    c = counts[rank_order]
    return (
        layer_sorted,
        (ukey[rank_order] % seq.n_expert).astype(np.int64),
        c.astype(np.int64),
        100.0 * c / totals[layer_sorted],
        rank.astype(np.int64),
    )


def hot(trace: Trace, top: int = 8) -> pd.DataFrame:
    """Per layer: distinct experts routed, the share of activations carried by the top
    `top` experts (``coverage_pct``) and those experts as ``expert:count`` text."""
    seq, _ = sequence_of(trace)
    return as_frame(_hot(seq, top))


def _hot(seq: StepSequence, top: int) -> View:
    if not seq.n_rows:
        none = np.zeros(0, dtype=np.int64)
        return {"layer": none, "unique": none, "coverage_pct": np.zeros(0),
                "top": np.zeros(0, dtype=object)}  # fmt: skip
    layer_idx, expert, count, _share, rank = _ranked(seq)
    unique = np.bincount(layer_idx, minlength=seq.n_layers)
    first = np.concatenate([[0], np.cumsum(unique)[:-1]])  # each layer's hottest
    shown = np.minimum(unique, top)
    # the top experts' activations over the layer's, from the integer counts: exact to the
    # last bit (a sum of rounded shares is not)
    head = np.bincount(layer_idx[rank < top], weights=count[rank < top], minlength=seq.n_layers)
    total = 100.0 * head / np.bincount(layer_idx, weights=count, minlength=seq.n_layers)
    labels = [f"{e}:{n}" for e, n in zip(expert.tolist(), count.tolist(), strict=True)]
    listing = np.array(
        [" ".join(labels[a : a + n]) for a, n in zip(first.tolist(), shown.tolist(), strict=True)],
        dtype=object,
    )
    return {
        "layer": seq.layers.astype(np.int64),
        "unique": unique.astype(np.int64),
        "coverage_pct": total,
        "top": listing,
    }


# ----------------------------------------------------------------------------- reuse


def reuse_distances(trace: Trace) -> pd.DataFrame:
    """Every reuse, long form: layer, expert, the step of the reuse and its distance in
    cells of the layer's step sequence (not in step numbers)."""
    seq, _ = sequence_of(trace)
    same, dist = _reuse_pairs(seq)
    order, key = seq.by_key()
    k = key[1:][same]
    n = max(seq.n_expert, 1)
    layer_idx, expert, rows = k // n, k % n, order[1:][same]
    return as_frame(
        {
            "layer": seq.layers[layer_idx].astype(np.int64),
            "expert": expert.astype(np.int64),
            "step": seq.rows["step"][rows].astype(np.int64),
            "distance": dist.astype(np.int64),
        }
    )


def _reuse_pairs(seq: StepSequence) -> tuple[np.ndarray, np.ndarray]:
    """The reuses, in by-key order: a mask over positions 1.. of ``seq.by_key()`` (the
    routing there repeats the key before it), and each reuse's distance in cells."""
    order, key = seq.by_key()
    if len(key) < 2:
        return np.zeros(max(len(key) - 1, 0), dtype=bool), np.zeros(0, dtype=np.int32)
    same = key[1:] == key[:-1]
    cell = seq.cell_index[seq.gcell[order]]
    dist = np.diff(cell)[same]
    return same, dist


def _quantile_index(n: np.ndarray, q: float) -> np.ndarray:
    """The reference quantile: element ``min(n-1, floor(q*n))`` of the sorted values."""
    return np.minimum(n - 1, np.floor(q * n).astype(np.int64))


def reuse(trace: Trace) -> pd.DataFrame:
    """Per layer: the number of reuses, p50/p90/max reuse distance (in cells of the step
    sequence) and ``never_2nd``, the experts routed exactly once (cache pollution)."""
    seq, _ = sequence_of(trace)
    return as_frame(_reuse(seq))


def _reuse(seq: StepSequence) -> View:
    """Layer by layer (the by-key order keeps each layer's rows together), so the scratch
    arrays are one layer's."""
    n_layers = seq.n_layers
    order, key = seq.by_key()
    n_reuse = np.zeros(n_layers, dtype=np.int64)
    quantiles = {q: np.full(n_layers, -1, dtype=np.int64) for q in REUSE_QUANTILES}
    longest = np.full(n_layers, -1, dtype=np.int64)
    never = np.zeros(n_layers, dtype=np.int64)
    blocks = seq.layer_blocks()
    bounds = np.array([0, *(b for _a, b in blocks)], dtype=np.int64)
    block_layer = seq.layer_idx[bounds[:-1]].astype(np.int32)
    fractions = np.array(REUSE_QUANTILES, dtype=np.float64)
    most = int(seq.cells_per_layer.max()) if n_layers else 0
    table = np.full((len(fractions), n_layers), -1, dtype=np.int64)
    figures_args = (key, order, seq.gcell, seq.cell_index, bounds, block_layer, fractions, most,
                    n_reuse, table, longest, never)  # fmt: skip
    if blocks and route_order.reuse_figures.takes(*figures_args):  # one pass, no scratch
        route_order.reuse_figures(*figures_args)
        for j, fraction in enumerate(REUSE_QUANTILES):
            quantiles[fraction] = table[j]
        blocks = []
    for a, b in blocks:
        i = int(seq.layer_idx[a])
        k = key[a:b]
        same = k[1:] == k[:-1]
        dist = np.diff(seq.cell_index[seq.gcell[order[a:b]]])[same]
        starts = np.flatnonzero(np.r_[True, ~same])
        never[i] = int((np.diff(np.append(starts, b - a)) == 1).sum())
        n_reuse[i] = len(dist)
        if len(dist):
            cum = np.cumsum(np.bincount(dist))
            for q in REUSE_QUANTILES:
                quantiles[q][i] = int((cum > _quantile_index(np.array(len(dist)), q)).argmax())
            longest[i] = len(cum) - 1
    figures: dict[str, Any] = {"n_reuse": n_reuse}
    for q in REUSE_QUANTILES:
        figures[f"p{round(q * 100)}"] = quantiles[q]
    figures["max"] = longest
    figures["never_2nd"] = never
    for col in ("p50", "p90", "max"):  # no reuse at all: unknown, not zero
        figures[col] = IntsWithGaps(figures[col], n_reuse == 0)
    return layer_view(seq, **figures)


# ----------------------------------------------------------------------------- overlap


def overlap(trace: Trace, lags: Sequence[int] = OVERLAP_LAGS) -> pd.DataFrame:
    """Per layer, for each lag g: the mean over cells i >= g of the share (%) of cell i's
    experts also routed in cell i-g; the ``ALL`` row pools every layer's cells. A layer with
    no cell i >= g (fewer than g+1 cells: in prefill the last layer often routes only the
    final prompt token) shows 0.0, as the established analysis prints its empty mean."""
    seq, _ = sequence_of(trace)
    return as_frame(_overlap(seq, lags))


def _cell_sets(seq: StepSequence) -> np.ndarray:
    """Each cell's set of experts as a bitmask: (words, cells) uint64, expert e at bit e % 64
    of word e // 64 (a word's row contiguous: the lags compare whole rows)."""
    n_cells = len(seq.cell_start)
    words = max(1, (seq.n_expert + 63) // 64)
    if route_order.cell_sets.takes(seq.expert, seq.gcell, n_cells, words):  # one pass
        return route_order.cell_sets(seq.expert, seq.gcell, n_cells, words)
    masks = np.zeros((words, n_cells), dtype=np.uint64)
    ids = np.arange(words * 64, dtype=np.uint64)
    # per word, each expert id's bit in that word (0 outside it): one small table lookup
    in_word = ids // np.uint64(64) == np.arange(words, dtype=np.uint64)[:, None]
    bits = np.where(in_word, np.left_shift(np.uint64(1), ids % np.uint64(64)), np.uint64(0))
    for a, b, lo, hi in cell_blocks(seq):
        expert = seq.expert[lo:hi]
        starts = seq.cell_start[a:b] - lo
        for w in range(words):
            masks[w, a:b] = np.bitwise_or.reduceat(bits[w][expert], starts)
    return masks


def _shared(masks: np.ndarray, lag: int) -> np.ndarray:
    """Per cell c >= lag: the experts cell c shares with cell c - lag."""
    count = np.bitwise_count(masks[0, lag:] & masks[0, :-lag]).astype(np.int64)
    for w in range(1, len(masks)):
        count += np.bitwise_count(masks[w, lag:] & masks[w, :-lag])
    return count


def _overlap(seq: StepSequence, lags: Sequence[int]) -> View:
    n_cells = len(seq.cell_start)
    masks = _cell_sets(seq)
    size = np.bitwise_count(masks[0]).astype(np.int64)
    for w in range(1, len(masks)):
        size += np.bitwise_count(masks[w])
    cols: dict[str, Any] = {}
    pooled: dict[str, Any] = {}
    # made once for every lag (the same values each lag's figures divide by and group on)
    nonempty = size > 0
    every_cell = bool(nonempty.all())
    per_cell = np.maximum(size, 1).astype(np.float64)
    cell_layer = seq.cell_layer_idx.astype(np.intp)
    for g in lags:
        if g < 1:
            raise BmoeError(f"overlap lag {g}: lags count cells back, from 1")
        if _overlap_compiled(seq, masks, g, per_cell, nonempty, cols, pooled):
            continue
        inter = np.zeros(n_cells, dtype=np.int64)  # cell c against cell c-g (same layer where
        if g < n_cells:  # its index in the layer is >= g: layers are contiguous)
            inter[g:] = _shared(masks, g)
        counted = seq.cell_index >= g
        counted &= nonempty
        pct = inter * 100.0
        pct /= per_cell
        pct[~counted] = 0.0
        total = np.bincount(cell_layer, weights=pct, minlength=seq.n_layers)
        if every_cell:  # the cells counted: each layer's from its g-th on
            n = np.maximum(seq.cells_per_layer - g, 0).astype(np.float64)
        else:
            n = np.bincount(cell_layer, weights=counted, minlength=seq.n_layers)
        cols[f"lag_{g}"] = np.where(n > 0, total / np.maximum(n, 1), 0.0)
        pooled[f"lag_{g}"] = float(pct[counted].mean()) if counted.any() else 0.0
    return with_all_row(layer_view(seq, **cols), pooled)


def _overlap_compiled(
    seq: StepSequence,
    masks: np.ndarray,
    g: int,
    per_cell: np.ndarray,
    nonempty: np.ndarray,
    cols: dict[str, Any],
    pooled: dict[str, Any],
) -> bool:
    """Lag `g`'s figures into `cols` and `pooled` by one compiled pass over the cells
    (:func:`route_order.overlap_lag`: the same shares, sums and counts as the numpy path
    makes); False where it does not take the arrays."""
    n_cells = len(seq.cell_start)
    pct = np.empty(n_cells)
    total = np.zeros(seq.n_layers)
    counted = np.zeros(seq.n_layers, dtype=np.int64)
    args = (masks, g, seq.cell_index, per_cell, nonempty, seq.cell_layer_idx, pct, total, counted)
    if not route_order.overlap_lag.takes(*args):
        return False
    route_order.overlap_lag(*args)
    n = counted.astype(np.float64)
    cols[f"lag_{g}"] = np.where(n > 0, total / np.maximum(n, 1), 0.0)
    if counted.any():
        kept = seq.cell_index >= g
        kept &= nonempty
        pooled[f"lag_{g}"] = float(pct[kept].mean())
    else:
        pooled[f"lag_{g}"] = 0.0
    return True


# ----------------------------------------------------------------------------- workset


def workset(
    trace: Trace,
    marks: Sequence[int] = WORKSET_MARKS,
    expert_bytes: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per layer: ``of`` (experts in the model), cumulative distinct experts after m steps
    of the layer's sequence at each mark <= the step count (``s<m>`` columns, plus the step
    count itself), and ``union_mib``, the bytes of that union; the ``ALL`` row sums them."""
    seq, meta_trace = sequence_of(trace)
    sizes = expert_bytes if expert_bytes is not None else _sizes(meta_trace)
    return as_frame(_workset(seq, marks, sizes, _n_expert(meta_trace, seq)))


def _sizes(trace: Facts | None) -> dict[int, int]:
    return trace.expert_bytes() if trace is not None else {}


def _n_expert(trace: Facts | None, seq: StepSequence) -> int:
    n = trace.meta.get("n_expert") if trace is not None else None
    return int(n) if isinstance(n, int) else seq.n_expert


def workset_marks(n_steps: int, marks: Sequence[int] = WORKSET_MARKS) -> list[int]:
    chosen = [m for m in marks if m <= n_steps]
    return [*chosen, n_steps] if n_steps and (not chosen or chosen[-1] != n_steps) else chosen


def _first_cells(seq: StepSequence) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct (layer, expert): its layer index and the first cell that routed it."""
    order, key = seq.by_key()
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, int)
    first = seq.cell_index[seq.gcell[order[start]]]  # (not seq.cell: every row's)
    return key[start].astype(np.int64) // max(seq.n_expert, 1), first


def _workset(
    seq: StepSequence, marks: Sequence[int], sizes: Mapping[int, int], n_expert: int
) -> View:
    chosen = workset_marks(seq.n_steps, marks)
    layer_idx, first = _first_cells(seq)
    cols: dict[str, Any] = {"of": np.full(seq.n_layers, n_expert, dtype=np.int64)}
    for m in chosen:
        cols[f"s{m}"] = np.bincount(layer_idx[first < m], minlength=seq.n_layers).astype(np.int64)
    distinct = np.bincount(layer_idx, minlength=seq.n_layers)
    one = np.array([sizes.get(int(x), np.nan) for x in seq.layers], dtype=np.float64)
    cols["union_mib"] = distinct * one / MIB
    return _with_workset_totals(layer_view(seq, **cols))


def _with_workset_totals(view: View) -> View:
    totals: dict[str, float] = {
        c: int(v.sum()) for c, v in view.items() if c not in ("layer", "union_mib")
    }
    totals["union_mib"] = float(np.sum(view["union_mib"]))
    return with_all_row(view, totals)


def workset_curve(trace: Trace) -> pd.DataFrame:
    """Working-set growth for every m: layer, steps (m), distinct experts after m cells of
    the layer's sequence, and their bytes (MiB; nan where the preamble lacks the size)."""
    import pandas as pd

    seq, meta_trace = sequence_of(trace)
    sizes = _sizes(meta_trace)
    layer_idx, first = _first_cells(seq)
    frames = []
    new = np.zeros((seq.n_layers, int(seq.cells_per_layer.max()) if seq.n_layers else 0))
    np.add.at(new, (layer_idx, first), 1)
    for i, layer in enumerate(seq.layers):  # one pass per layer, not per row
        n = int(seq.cells_per_layer[i])
        distinct = np.cumsum(new[i, :n]).astype(np.int64)
        frames.append(
            pd.DataFrame(
                {
                    "layer": int(layer),
                    "steps": np.arange(1, n + 1, dtype=np.int64),
                    "distinct": distinct,
                    "mib": distinct * sizes.get(int(layer), np.nan) / MIB,
                }
            )
        )
    if not frames:
        return pd.DataFrame(columns=["layer", "steps", "distinct", "mib"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- cache


def cache(trace: Trace) -> pd.DataFrame:
    """Per layer and overall (``ALL``): the share of routings that missed (residency 0),
    hit (1) or hit a prefetched expert on its first touch (2), and the routing count."""
    seq, _ = sequence_of(trace)
    return as_frame(_cache(seq))


def _no_rows(names: Iterable[str]) -> View:
    """A view with these columns and no rows (untyped: object columns)."""
    return {name: np.zeros(0, dtype=object) for name in names}


def _cache(seq: StepSequence) -> View:
    cols = ("miss_pct", "hit_pct", "prefetch_pct")
    if "residency" not in seq.rows:
        return _no_rows(["layer", *cols, "routings"])
    res = seq.rows["residency"]
    counts = np.zeros((seq.n_layers, 3), dtype=np.int64)
    if route_order.residency_counts.takes(seq.layer_idx, res, counts):  # one pass
        route_order.residency_counts(seq.layer_idx, res, counts)
        routings = counts.sum(axis=1)
    else:
        routings = np.zeros(seq.n_layers, dtype=np.int64)
        for a, b in seq.layer_blocks():  # one layer's rows at a time
            i = int(seq.layer_idx[a])
            counts[i] = np.bincount(np.clip(res[a:b], 0, 2), minlength=3)[:3]
            routings[i] = b - a
    with np.errstate(invalid="ignore", divide="ignore"):
        share = 100.0 * counts / routings[:, None]
    frame = layer_view(seq, **{c: share[:, i] for i, c in enumerate(cols)})
    frame["routings"] = routings.astype(np.int64)
    n = int(routings.sum())
    pooled = {c: 100.0 * counts[:, i].sum() / n if n else np.nan for i, c in enumerate(cols)}
    return with_all_row(frame, {**pooled, "routings": n})


def prefetch_slots(trace: Trace) -> pd.DataFrame:
    """Prefetch hits (residency 2) by router slot: count, share of all prefetch hits and
    share of that slot's routings. Empty when no prefetch hit was recorded."""
    return as_frame(prefetch_slot_columns(trace))


def prefetch_slot_columns(trace: Trace) -> View:
    """:func:`prefetch_slots` as columns."""
    rows = trace_columns(trace)
    columns = ["slot", "prefetch_hits", "share_pct", "of_slot_pct"]
    if "residency" not in rows or "slot" not in rows:
        return _no_rows(columns)
    slot = rows["slot"]
    hit = rows["residency"] == 2
    if not hit.any():
        return _no_rows(columns)
    n = int(slot.max()) + 1
    hits = np.bincount(slot[hit].astype(np.int64), minlength=n)
    if n <= 64 and int(slot.min()) >= 0:  # a few slots: counted in place, no wide copy
        routings = np.array([np.count_nonzero(slot == s) for s in range(n)], dtype=np.int64)
    else:
        routings = np.bincount(slot.astype(np.int64), minlength=n)
    return {
        "slot": np.arange(n, dtype=np.int64),
        "prefetch_hits": hits.astype(np.int64),
        "share_pct": 100.0 * hits / hits.sum(),
        "of_slot_pct": 100.0 * hits / np.maximum(routings, 1),
    }


# ----------------------------------------------------------------------------- entropy


def entropy(trace: Trace) -> pd.DataFrame:
    """Per layer, averaged over cells: the entropy (bits) of the cell's known weights
    normalised by their sum, and the top-1 share (%). Cells with weight sum <= 0 are
    skipped; the maximum entropy is log2(k)."""
    seq, _ = sequence_of(trace)
    return as_frame(_entropy(seq))


def _entropy(seq: StepSequence) -> View:
    n_cells = len(seq.cell_start)
    if "weight" not in seq.rows or not n_cells:
        return layer_view(
            seq, entropy_bits=np.full(seq.n_layers, np.nan), top1_pct=np.full(seq.n_layers, np.nan)
        )
    _, total, acc, top = seq.cell_weights()
    ok = total > 0
    safe = np.where(ok, total, 1.0)
    log2_total = np.log2(safe)
    counted, sums = np.zeros(seq.n_layers), (np.zeros(seq.n_layers), np.zeros(seq.n_layers))
    args = (seq.cell_layer_idx, total, acc, top, log2_total, counted, *sums)
    if route_weights.entropy_sums.takes(*args):  # one pass over the cells
        route_weights.entropy_sums(*args)
        with np.errstate(invalid="ignore", divide="ignore"):
            return layer_view(seq, entropy_bits=sums[0] / counted, top1_pct=sums[1] / counted)
    bits = log2_total - acc / safe
    share = 100.0 * top / safe
    n = np.bincount(seq.cell_layer_idx, weights=ok, minlength=seq.n_layers)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_bits = (
            np.bincount(seq.cell_layer_idx, weights=np.where(ok, bits, 0), minlength=seq.n_layers)
            / n
        )
        mean_top = (
            np.bincount(seq.cell_layer_idx, weights=np.where(ok, share, 0), minlength=seq.n_layers)
            / n
        )
    return layer_view(seq, entropy_bits=mean_bits, top1_pct=mean_top)


# ----------------------------------------------------------------------------- bytes


def bytes_read(trace: Trace) -> pd.DataFrame:
    """Per layer: MiB read from flash (sum of the ``expert_bytes`` column), one expert's
    and the dense weights' MiB (from the preamble) and read MiB per step; the ``ALL`` row
    holds the totals (``mib_per_step`` averages over distinct steps)."""
    seq, meta_trace = sequence_of(trace)
    return as_frame(_bytes(seq, meta_trace))


def _bytes(seq: StepSequence, trace: Facts | None) -> View:
    if "expert_bytes" in seq.rows:
        values = seq.rows["expert_bytes"]
        read = np.zeros(seq.n_layers)
        for a, b in seq.layer_blocks():  # exact integer sums, one layer's rows at a time
            read[int(seq.layer_idx[a])] = float(values[a:b].sum(dtype=np.int64))
    else:
        read = np.full(seq.n_layers, np.nan)
    one = _sizes(trace)
    dense = trace.dense_bytes() if trace is not None else {}
    steps = max(seq.n_steps, 1)
    frame = layer_view(
        seq,
        read_mib=read / MIB,
        expert_mib=np.array([one.get(int(x), np.nan) for x in seq.layers], dtype=float) / MIB,
        dense_mib=np.array([dense.get(int(x), np.nan) for x in seq.layers], dtype=float) / MIB,
        mib_per_step=read / MIB / steps,
    )
    total = float(read.sum()) / MIB
    return with_all_row(
        frame,
        {
            "read_mib": total,
            "expert_mib": np.nan,
            "dense_mib": float(np.sum(frame["dense_mib"])),
            "mib_per_step": total / steps,
        },
    )


# ----------------------------------------------------------------------------- matrix


def matrix(trace: Trace, cells: str = "experts", limit: int | None = MATRIX_STEPS) -> pd.DataFrame:
    """The step x layer matrix: one row per step (the first `limit` steps; None for all),
    one text column per layer (``L<n>``). Cells: ``experts`` (ids in slot order, ``*``
    marking an id the same layer routed on the previous row), ``weights`` (2 decimals),
    ``mb`` (MiB the cell read) or ``hit`` (H/M/P per slot: hit, miss, prefetch hit)."""
    if cells not in MATRIX_CELLS:
        raise BmoeError(f"unknown matrix cells {cells!r} (choose {', '.join(MATRIX_CELLS)})")
    seq, _ = sequence_of(trace)
    return _matrix(seq, cells, limit)


def _matrix(seq: StepSequence, cells: str, limit: int | None) -> pd.DataFrame:
    import pandas as pd

    rows = seq.rows
    steps, step_row = np.unique(seq.cell_step_code, return_inverse=True)
    if limit is not None:
        steps = steps[:limit]
    n_rows = len(steps)
    cell_keep = step_row < n_rows
    row_keep = cell_keep[seq.gcell]
    cell_row = step_row[seq.gcell][row_keep]  # matrix row of each kept routing
    layer_idx = seq.layer_idx[row_keep]
    expert = seq.expert[row_keep].astype(np.int64)
    if cells == "experts":
        E = seq.n_expert
        present = np.zeros((n_rows + 1) * seq.n_layers * E, dtype=bool)
        code = (cell_row.astype(np.int64) * seq.n_layers + layer_idx) * E + expert
        present[code] = True
        prev = code - seq.n_layers * E
        star = (cell_row > 0) & present[np.maximum(prev, 0)]
        text = np.where(star, "*", "") + expert.astype(str)
        sep = " "
    elif cells == "weights":
        text = (
            np.char.mod("%.2f", rows["weight"].astype(np.float64)[row_keep])
            if "weight" in rows
            else np.full(len(expert), "?")
        )
        sep = " "
    elif cells == "hit":
        res = rows["residency"][row_keep] if "residency" in rows else np.full(len(expert), -1)
        text = pd.Series(res).map(RESIDENCY_LETTERS).fillna("?").to_numpy(str)
        sep = ""
    else:  # mb: one figure per cell
        read = (
            rows["expert_bytes"].astype(np.float64)[row_keep]
            if "expert_bytes" in rows
            else np.zeros(len(expert))
        )
        text, sep = None, ""
    kept_cells = np.flatnonzero(cell_keep)
    cell_pos = np.searchsorted(kept_cells, seq.gcell[row_keep])  # index among kept cells
    if text is None:
        mib = np.bincount(cell_pos, weights=read, minlength=len(kept_cells)) / MIB
        cell_text = pd.Series(np.char.mod("%.2f", mib))
    else:
        cell_text = _join_by_group(pd.Series(text, dtype=object), cell_pos, len(kept_cells), sep)
    grid = np.full((n_rows, seq.n_layers), None, dtype=object)
    grid[step_row[kept_cells], seq.cell_layer_idx[kept_cells]] = cell_text.to_numpy(object)
    step_of = rows["step"][seq.cell_start]
    first_cell_of_row = np.full(n_rows, -1, dtype=np.int64)
    first_cell_of_row[step_row[kept_cells][::-1]] = kept_cells[::-1]
    frame = (
        pd.DataFrame({"step": step_of[first_cell_of_row].astype(np.int64)})
        if n_rows
        else pd.DataFrame({"step": pd.Series(dtype="int64")})
    )
    if "turn" in rows and len(np.unique(rows["turn"])) > 1:
        frame.insert(0, "turn", rows["turn"][seq.cell_start][first_cell_of_row].astype(np.int64))
    for j, layer in enumerate(seq.layers):
        frame[f"L{int(layer)}"] = grid[:, j]
    return frame


def _join_by_group(text: pd.Series, group: np.ndarray, n_groups: int, sep: str) -> pd.Series:
    """Concatenate `text` per group (rows of a group are contiguous and in order)."""
    import pandas as pd

    if not len(text):
        return pd.Series([""] * n_groups, dtype=object)
    start = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    pos = np.arange(len(group)) - np.repeat(start, np.diff(np.append(start, len(group))))
    wide = pd.DataFrame({"g": group, "p": pos, "t": text.to_numpy(object)}).pivot(
        index="g", columns="p", values="t"
    )
    joined = wide[wide.columns[0]].astype(object)
    for col in wide.columns[1:]:
        part = wide[col]
        joined = joined.where(part.isna(), joined + sep + part.fillna(""))
    return joined.reindex(range(n_groups)).fillna("").reset_index(drop=True)


# ----------------------------------------------------------------------------- all views


def route_views(
    trace: Trace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    top: int = 8,
    cells: str = "experts",
    matrix_limit: int | None = MATRIX_STEPS,
) -> dict[str, pd.DataFrame]:
    """Several views at once, sharing one pass of ordering: name -> DataFrame."""
    views = view_columns(trace, names, top=top, cells=cells, matrix_limit=matrix_limit)
    return {name: v if name == "matrix" else as_frame(v) for name, v in views.items()}


def view_columns(
    trace: Trace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    top: int = 8,
    cells: str = "experts",
    matrix_limit: int | None = MATRIX_STEPS,
    sequence: StepSequence | None = None,
) -> dict[str, Any]:
    """:func:`route_views` as columns, without pandas: name -> :data:`View` (the matrix, made
    of text cells, is a DataFrame). `sequence`: the step sequence of `trace`'s rows, when the
    caller has it (:func:`select_sequence`), so that it is not worked out again."""
    names = list(names)
    unknown = [n for n in names if n not in VIEWS]
    if unknown:
        raise BmoeError(f"unknown view {', '.join(unknown)} (choose from {', '.join(VIEWS)})")
    if sequence is None:
        seq, meta_trace = sequence_of(trace)
    else:
        seq, meta_trace = sequence, trace if isinstance(trace, RouteTrace | RouteColumns) else None
    build = {
        "sanity": lambda: _sanity(seq, meta_trace),
        "hot": lambda: _hot(seq, top),
        "reuse": lambda: _reuse(seq),
        "overlap": lambda: _overlap(seq, OVERLAP_LAGS),
        "workset": lambda: _workset(
            seq, WORKSET_MARKS, _sizes(meta_trace), _n_expert(meta_trace, seq)
        ),
        "cache": lambda: _cache(seq),
        "entropy": lambda: _entropy(seq),
        "bytes": lambda: _bytes(seq, meta_trace),
        "matrix": lambda: _matrix(seq, cells, matrix_limit),
    }
    return {name: build[name]() for name in names}


# ----------------------------------------------------------------------------- reuse in bytes


def reuse_bytes_distances(trace: RouteTrace) -> pd.DataFrame:
    """Every reuse with its LRU stack distance in bytes: the bytes of the distinct experts
    (of any layer) looked up between an expert's previous lookup and this one. An LRU cache
    holding at least that many bytes plus the expert itself still has it resident.

    Lookups follow the engine's batches: prefill is one batch per layer holding every prompt
    token's experts, decode one batch per (step, layer); a repeated id inside a batch is one
    lookup. Sizes come from the preamble (a layer without one is an error, never free).
    Computed by the replay's stack-distance kernel (one implementation)."""
    from bmoe.analyze.replay import lru_reuse_bytes

    return lru_reuse_bytes(trace)


# ----------------------------------------------------------------------------- grids for plots


def routing_grid(trace: Trace, value: str = "residency") -> pd.DataFrame:
    """The step x (layer, slot) grid of one column (``residency`` or ``expert``): one row
    per step (index: step), columns a (layer, slot) MultiIndex, -1 where nothing was routed."""
    import pandas as pd

    seq, _ = sequence_of(trace)
    rows = seq.rows
    if value not in ("residency", "expert"):
        raise BmoeError(f"unknown grid value {value!r} (choose residency or expert)")
    if value not in rows or not seq.n_rows:
        return pd.DataFrame()
    slot = rows["slot"].astype(np.int64) if "slot" in rows else seq.cell * 0
    k = int(slot.max()) + 1
    steps, step_row = np.unique(seq.cell_step_code, return_inverse=True)
    grid = np.full((len(steps), seq.n_layers * k), -1, dtype=np.int16)
    grid[step_row[seq.gcell], seq.layer_idx * k + slot] = rows[value].astype(np.int16)
    step_of = np.zeros(len(steps), dtype=np.int64)
    step_of[step_row] = rows["step"][seq.cell_start]
    columns = pd.MultiIndex.from_product(
        [seq.layers.astype(np.int64), np.arange(k)], names=["layer", "slot"]
    )
    return pd.DataFrame(grid, index=pd.Index(step_of, name="step"), columns=columns)


# ----------------------------------------------------------------------------- in passes


def route_views_in_passes(
    blocks: Callable[[], Iterable[pd.DataFrame]],
    trace: RouteTrace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    top: int = 8,
    max_rows: int = 20_000_000,
) -> dict[str, pd.DataFrame]:
    """The views of :func:`route_views` (all but the matrix) of a trace too large to hold,
    holding about `max_rows` rows at a time. Every view is per layer (the pooled rows are
    sums), so a first pass over the blocks counts each layer's rows and the distinct steps,
    then each further pass analyses a group of whole layers and the groups are joined.

    `blocks()` starts a fresh walk over the rows, block by block (for a file:
    ``lambda: iter_route_rows(path)``); `trace` gives the preamble (its rows are unused).
    The figures are :func:`route_views`'s on the same selection (the pooled means to the
    last bits of a float)."""
    names = list(names)
    unknown = [n for n in names if n not in DEFAULT_VIEWS]
    if unknown:
        raise BmoeError(
            f"view {', '.join(unknown)} cannot be analysed in passes "
            f"(choose from {', '.join(DEFAULT_VIEWS)})"
        )
    per_layer: dict[int, int] = {}
    step_keys = np.zeros(0, dtype=np.int64)
    empty: pd.DataFrame | None = None
    for block in blocks():
        empty = block.iloc[:0] if empty is None else empty
        cols = columns_of(block)
        keep = kept_rows(cols, phase, turn, layers, steps)
        ids, counts = np.unique(cols["layer"][keep], return_counts=True)
        for layer, count in zip(ids.tolist(), counts.tolist(), strict=True):
            per_layer[layer] = per_layer.get(layer, 0) + count
        step_keys = np.union1d(step_keys, np.unique(_step_keys(cols, keep)))
    if not per_layer:
        import pandas as pd

        none = empty if empty is not None else pd.DataFrame(columns=["step", "layer", "expert"])
        return route_views(dataclasses.replace(trace, rows=none), names, top=top)
    groups: list[list[int]] = [[]]
    held = 0
    for layer in sorted(per_layer):
        if groups[-1] and held + per_layer[layer] > max_rows:
            groups.append([])
            held = 0
        groups[-1].append(layer)
        held += per_layer[layer]
    parts = [
        _group_views(blocks, trace, group, len(step_keys), phase, turn, steps, top)
        for group in groups
    ]
    joined = _join_groups(parts, len(step_keys))
    return {name: as_frame(joined[name]) for name in names}


def _step_keys(rows: Columns, keep: np.ndarray) -> np.ndarray:
    """(turn, step, phase) as one int64 per kept row, the same for every block."""
    key = rows["step"][keep].astype(np.int64)
    if "turn" in rows:
        key += rows["turn"][keep].astype(np.int64) << 32
    key <<= 1
    if "phase" in rows:
        key += rows["phase"][keep]
    return key


def _group_views(
    blocks: Callable[[], Iterable[pd.DataFrame]],
    trace: RouteTrace,
    group: list[int],
    n_steps: int,
    phase: str,
    turn: int | None,
    steps: Collection[int] | None,
    top: int,
) -> dict[str, Any]:
    """One pass: the rows of the layers in `group`, and their views and counts."""
    parts = []
    for block in blocks():
        cols = columns_of(block)
        keep = kept_rows(cols, phase, turn, group, steps)
        parts.append({c: a[keep] for c, a in cols.items()})
    rows = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    del parts
    seq = dataclasses.replace(order_rows(rows), n_steps=n_steps)
    sizes = _sizes(trace)
    out: dict[str, Any] = {
        "sanity": _sanity(seq, trace),
        "hot": _hot(seq, top),
        "reuse": _reuse(seq),
        "overlap": _without_all(_overlap(seq, OVERLAP_LAGS)),
        "workset": _without_all(_workset(seq, WORKSET_MARKS, sizes, _n_expert(trace, seq))),
        "cache": _without_all(_cache(seq)),
        "entropy": _entropy(seq),
        "bytes": _without_all(_bytes(seq, trace)),
        "cells": seq.cells_per_layer,
    }
    return out


def _without_all(view: View) -> View:
    layer = view.get("layer")
    if layer is None or not len(layer):
        return view
    keep = layer != ALL
    out = {c: v[keep] for c, v in view.items()}
    out["layer"] = out["layer"].astype(np.int64)
    return out


def _concat(arrays: Sequence[Any]) -> Any:
    if any(isinstance(a, IntsWithGaps) for a in arrays):
        return IntsWithGaps.concatenate(arrays)
    return np.concatenate(arrays)


def _join_groups(parts: list[dict[str, Any]], n_steps: int) -> dict[str, View]:
    """The groups' per-layer rows one after the other, and the pooled rows recomputed."""

    def cat(name: str) -> View:
        return {c: _concat([p[name][c] for p in parts]) for c in parts[0][name]}

    out = {name: cat(name) for name in ("hot", "reuse", "entropy")}
    cells = np.concatenate([p["cells"] for p in parts])  # per layer, in the views' order
    overlap = cat("overlap")
    pooled = {}
    for g in OVERLAP_LAGS:
        counted = np.maximum(cells - g, 0)
        total = float((overlap[f"lag_{g}"] * counted).sum())
        pooled[f"lag_{g}"] = total / counted.sum() if counted.sum() else 0.0
    out["overlap"] = with_all_row(overlap, pooled)
    out["workset"] = _with_workset_totals(cat("workset"))
    cache = cat("cache")
    if "routings" in cache and len(cache["routings"]):
        routings = cache["routings"]
        n = int(routings.sum())
        share = {
            c: 100.0 * float(np.round(cache[c] * routings / 100.0).sum()) / n if n else np.nan
            for c in ("miss_pct", "hit_pct", "prefetch_pct")
        }
        cache = with_all_row(cache, {**share, "routings": n})
    out["cache"] = cache
    by = cat("bytes")
    total = float(np.nansum(by["read_mib"]))
    out["bytes"] = with_all_row(
        by,
        {
            "read_mib": total,
            "expert_mib": np.nan,
            "dense_mib": float(np.sum(by["dense_mib"])),
            "mib_per_step": total / max(n_steps, 1),
        },
    )
    san = cat("sanity")
    k = san["k"][0]
    out["sanity"] = one_row(
        {
            "rows": int(san["rows"].sum()),
            "cells": int(san["cells"].sum()),
            "steps": n_steps,
            "layers": int(san["layers"].sum()),
            "k": k,
            "cells_not_k": int(san["cells_not_k"].sum()) if k is not None else None,
            "steps_per_layer_min": int(san["steps_per_layer_min"].min()),
            "steps_per_layer_max": int(san["steps_per_layer_max"].max()),
            "cells_weighed": int(san["cells_weighed"].sum()),
            "weight_sum_min": _nan_extreme(san["weight_sum_min"], np.nanmin),
            "weight_sum_max": _nan_extreme(san["weight_sum_max"], np.nanmax),
        }
    )
    return out


def _nan_extreme(values: np.ndarray, pick: Callable[[np.ndarray], Any]) -> float:
    known = np.asarray(values, dtype=np.float64)
    known = known[~np.isnan(known)]
    return float(pick(known)) if len(known) else np.nan
