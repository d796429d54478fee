"""Compiled loops for the route views' row order (:mod:`bmoe.analyze.route_cells`): the
distinct values of a small integer column with each row's index among them, and the
layer-major order of rows, in one or two passes where numpy takes five to ten; the gather of
a column into that order; and two of the views' passes over the ordered rows (each cell's set
of experts, the reuse figures).
Integers only: every figure they lead to is the same as numpy's."""

from __future__ import annotations

import numpy as np

from bmoe.compiled import arrays, njit

_OPTS = {"cache": True, "nogil": True, "boundscheck": False}

#: what :func:`layer_major` found: rows already layer-major, step-major (sorted by layer
#: here), or neither (the caller sorts)
LAYER_MAJOR, STEP_MAJOR, UNSORTED = 0, 1, 2


@njit(ahead=lambda: [arrays(f"{v} {i}") for v in ("i2", "i4") for i in ("i2", "i4")], **_OPTS)
def small_unique(values, inverse):
    """The distinct values of `values` (ascending), each one's index among them written to
    `inverse` (numpy's array, as wide as the count of distinct values needs: large arrays
    numba allocates get no huge pages), for integers spanning at most a few million (the
    caller checks the span)."""
    n = len(values)
    lo = np.int64(values[0]) if n else np.int64(0)
    hi = lo
    for i in range(n):
        v = np.int64(values[i])
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    seen = np.zeros(hi - lo + 1, dtype=np.int32)
    for i in range(n):
        seen[np.int64(values[i]) - lo] = 1
    distinct = 0
    for j in range(len(seen)):
        if seen[j]:
            seen[j] = distinct + 1
            distinct += 1
    uniq = np.empty(distinct, dtype=values.dtype)
    for j in range(len(seen)):
        if seen[j]:
            uniq[seen[j] - 1] = lo + j
    for i in range(n):
        inverse[i] = seen[np.int64(values[i]) - lo] - 1
    return uniq


@njit(
    ahead=lambda: [arrays(f"{li} {sc} i1 b1 i4") for li in ("i2", "i4") for sc in ("i4", "i8")],
    **_OPTS,
)
def layer_major(layer_idx, step_code, slot, keep, take):
    """Whether rows are in layer-major order (layer, step code, slot ascending), or in
    step-major order (step code, layer, slot ascending), over every row; and for step-major
    rows, the kept ones (`keep`; empty: all) sorted by layer, stably, into the first of
    `take` (one per row, numpy's): what ``np.argsort(layer_idx, kind="stable")`` restricted
    to `keep` gives. Returns (the order found, how many of `take` it wrote)."""
    n = len(layer_idx)
    layer_sorted = True
    step_sorted = True
    n_layers = 0
    for r in range(n):
        if layer_idx[r] + 1 > n_layers:
            n_layers = layer_idx[r] + 1
    for r in range(1, n):
        a0, a1, a2 = layer_idx[r - 1], step_code[r - 1], slot[r - 1]
        b0, b1, b2 = layer_idx[r], step_code[r], slot[r]
        if layer_sorted and (b0 < a0 or (b0 == a0 and (b1 < a1 or (b1 == a1 and b2 < a2)))):
            layer_sorted = False
        if step_sorted and (b1 < a1 or (b1 == a1 and (b0 < a0 or (b0 == a0 and b2 < a2)))):
            step_sorted = False
        if not layer_sorted and not step_sorted:
            return UNSORTED, 0
    if layer_sorted:
        return LAYER_MAJOR, 0
    every = len(keep) == 0
    count = np.zeros(n_layers + 1, dtype=np.int64)
    for r in range(n):
        if every or keep[r]:
            count[layer_idx[r] + 1] += 1
    for j in range(n_layers):
        count[j + 1] += count[j]
    written = count[n_layers]
    for r in range(n):
        if every or keep[r]:
            j = layer_idx[r]
            take[count[j]] = r
            count[j] += 1
    return STEP_MAJOR, written


@njit(
    ahead=lambda: [arrays(f"{li} {sc} i4 i8") for li in ("i2", "i4") for sc in ("i4", "i8")],
    **_OPTS,
)
def cells(layer_idx, step_code, gcell, cell_start):
    """The cells of rows in step-sequence order (a cell: consecutive rows of one layer and
    step code): each row's cell into `gcell`, each cell's first row into the first of
    `cell_start` (one per row; numpy's arrays); returns the count of cells. At least one row."""
    c = 0
    cell_start[0] = 0
    gcell[0] = 0
    for r in range(1, len(layer_idx)):
        if layer_idx[r] != layer_idx[r - 1] or step_code[r] != step_code[r - 1]:
            c += 1
            cell_start[c] = r
        gcell[r] = c
    return c + 1


@njit(ahead=lambda: [arrays("i4 i1 i8[:,:]")], **_OPTS)
def residency_counts(layer_idx, residency, counts):
    """Per layer index, its rows' residencies counted into ``counts[layer, 0..2]`` (a value
    below 0 counted as 0, above 2 as 2; `counts` starts at zero)."""
    for r in range(len(layer_idx)):
        v = residency[r]
        counts[layer_idx[r], 0 if v < 0 else (2 if v > 2 else v)] += 1


@njit(ahead=lambda: [arrays(f"{v} i4 {v}") for v in ("i1", "i2", "i4", "f4")], **_OPTS)
def gather(values, take, out):
    """``out[:] = values[take]`` for int32 positions: numpy's fancy indexing first widens
    them to intp (a copy of the positions per column), then gathers at about half this loop's
    speed. (`out` is numpy's: its large arrays get huge pages, numba's own do not.)"""
    for i in range(len(take)):
        out[i] = values[take[i]]


@njit(
    ahead=lambda: [(*arrays(f"i4 {e}"), 1, 1, *arrays(f"i4 {k}")) for e in ("i2", "i4")
                   for k in ("i2", "i4")],
    **_OPTS,
)  # fmt: skip
def key_order(layer_idx, expert, n_expert, n_keys, order, sorted_key):
    """The rows sorted by key ``layer_idx * n_expert + expert`` (in ``0..n_keys-1``), stably,
    by counting: their positions into `order`, their keys into `sorted_key` (numpy's arrays;
    the keys' type). What ``np.argsort(key, kind="stable")`` and the keys it puts in order
    give, in two passes, without the keys of the rows in their own order."""
    count = np.zeros(n_keys + 1, dtype=np.int64)
    for r in range(len(layer_idx)):
        count[np.int64(layer_idx[r]) * n_expert + np.int64(expert[r]) + 1] += 1
    for j in range(n_keys):
        count[j + 1] += count[j]
    for r in range(len(layer_idx)):
        k = np.int64(layer_idx[r]) * n_expert + np.int64(expert[r])
        at = count[k]
        order[at] = r
        sorted_key[at] = k
        count[k] = at + 1


@njit(ahead=lambda: [(*arrays(f"{e} i4"), 1, 1) for e in ("i2", "i4")], **_OPTS)
def cell_sets(expert, gcell, n_cells, words):
    """Each cell's experts as a bitmask: (words, cells) uint64, expert e at bit e % 64 of
    word e // 64; `gcell` gives each row's cell."""
    masks = np.zeros((words, n_cells), dtype=np.uint64)
    one = np.uint64(1)
    for r in range(len(expert)):
        e = np.int64(expert[r])
        masks[e >> 6, gcell[r]] |= one << np.uint64(e & 63)
    return masks


@njit(inline="always", **_OPTS)
def _bits(x):
    """The set bits of a uint64 (the classic bit-parallel count)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(ahead=lambda: [(arrays("u8[:,:]")[0], 1, *arrays("i4 f8 b1 i4 f8 f8 i8"))], **_OPTS)
def overlap_lag(masks, lag, cell_index, per_cell, nonempty, cell_layer, pct, total, counted):
    """One lag of the overlap view, per cell c: the share (%) of its experts (`masks`, as
    :func:`cell_sets` makes them) that cell c - `lag` routed too, into `pct` (0 where the cell
    is not counted: its index in the layer below `lag`, or no expert); per layer the sum of
    the shares, in cell order (as ``np.bincount(cell_layer, weights=pct)`` adds them), into
    `total`, and the cells counted into `counted` (`total` and `counted` start at zero)."""
    words, n_cells = masks.shape
    for c in range(n_cells):
        if cell_index[c] < lag or not nonempty[c]:
            pct[c] = 0.0
        else:
            shared = np.int64(0)
            for w in range(words):
                shared += _bits(masks[w, c] & masks[w, c - lag])
            pct[c] = np.float64(shared) * 100.0 / per_cell[c]
            counted[cell_layer[c]] += 1
        total[cell_layer[c]] += pct[c]


@njit(
    ahead=lambda: [(*arrays(f"{k} i4 i4 i4 i8 i4 f8"), 1, *arrays("i8 i8[:,:] i8 i8"))
                   for k in ("i2", "i4")],
    **_OPTS,
)  # fmt: skip
def reuse_figures(key, order, gcell, cell_index, bounds, block_layer, q, n_max, n_reuse,
                  quantile, longest, never):  # fmt: skip
    """The reuse view's figures, layer block by layer block of the by-key order (`key`
    sorted, `order` the rows; block j spans ``bounds[j]:bounds[j + 1]`` and is layer
    ``block_layer[j]``): into ``n_reuse``, ``quantile[i]`` (the element at ``min(n-1,
    floor(q[i]*n))`` of the sorted distances), ``longest`` and ``never`` (keys routed
    once), per layer. A distance is the step between a routing and the previous one of its
    key, in cells of the layer's sequence; `n_max` bounds it (the most cells of a layer)."""
    hist = np.zeros(n_max + 1, dtype=np.int64)
    for j in range(len(bounds) - 1):
        a, b = bounds[j], bounds[j + 1]
        i = block_layer[j]
        if a == b:
            continue
        hist[:] = 0
        count = 0
        top = -1
        run = 1
        lonely = 0
        prev = cell_index[gcell[order[a]]]
        for r in range(a + 1, b):
            cell = cell_index[gcell[order[r]]]
            if key[r] == key[r - 1]:
                d = cell - prev
                hist[d] += 1
                count += 1
                if d > top:
                    top = d
                run += 1
            else:
                if run == 1:
                    lonely += 1
                run = 1
            prev = cell
        if run == 1:
            lonely += 1
        never[i] = lonely
        n_reuse[i] = count
        if count:
            for k in range(len(q)):
                at = np.int64(np.floor(q[k] * count))
                if at > count - 1:
                    at = count - 1
                seen = 0
                for d in range(top + 1):
                    seen += hist[d]
                    if seen > at:
                        quantile[k, i] = d
                        break
            longest[i] = top
