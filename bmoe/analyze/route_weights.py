"""The route views' per-cell weight figures (sanity's weight sums, entropy) in one compiled
pass over a cell block, where numpy made a float64 temporary per step (masks, the
``w * log2(w)`` terms, three ``reduceat`` sums). The sums are added in the order numpy's
``np.add.reduceat`` adds them (a segment's first value, plus the pairwise sum of the others),
so every figure, to the last bit, is numpy's; the logarithms are numpy's, passed in."""

from __future__ import annotations

import numpy as np

from bmoe.compiled import arrays, njit

_OPTS = {"cache": True, "nogil": True, "boundscheck": False}

#: the longest cell the compiled pass takes: numpy sums at most this many values after the
#: first without splitting them in halves (longer cells are numpy's to sum)
MAX_CELL = 129


@njit(inline="always", **_OPTS)
def _term(w, log2w, entropy):
    """A weight's contribution: the weight (0 when unknown), or ``w * log2(w)`` (0 unless
    the weight is positive)."""
    if entropy:
        return w * log2w if w > 0 else 0.0
    return w if w == w else 0.0


@njit(inline="always", **_OPTS)
def _segment(weight, logs, lo, hi, entropy):
    """``np.add.reduceat``'s sum of one segment of terms: the first term, plus the others
    summed pairwise as numpy sums up to 128 values (eight running sums, then the rest)."""
    first = _term(np.float64(weight[lo]), logs[lo], entropy)
    n = hi - lo - 1
    start = lo + 1
    if n < 8:
        rest = -0.0
        for i in range(start, hi):
            rest += _term(np.float64(weight[i]), logs[i], entropy)
        return first + rest
    r = np.empty(8)
    for j in range(8):
        r[j] = _term(np.float64(weight[start + j]), logs[start + j], entropy)
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += _term(np.float64(weight[start + i + j]), logs[start + i + j], entropy)
        i += 8
    rest = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        rest += _term(np.float64(weight[start + i]), logs[start + i], entropy)
        i += 1
    return first + rest


@njit(ahead=lambda: [arrays("f4 f8 i8 b1 f8 f8 f8"), arrays("f8 f8 i8 b1 f8 f8 f8")], **_OPTS)
def cell_weights(weight, logs, starts, complete, total, acc, top):
    """Per cell of a block (`starts`: each cell's first row; the last cell ends with the
    block): whether every weight is known, the sum of the known weights, the sum of
    ``w * log2(w)`` over the positive ones (`logs`: numpy's ``log2`` of each weight as
    float64) and the largest known weight (-inf for none), into the four outputs. Cells of
    at most :data:`MAX_CELL` rows (the caller checks)."""
    n_cells = len(starts)
    n = len(weight)
    for c in range(n_cells):
        lo = starts[c]
        hi = starts[c + 1] if c + 1 < n_cells else n
        if hi - lo <= 8:  # a short cell (top-k routing): every figure in one pass
            w = np.float64(weight[lo])
            known = w == w
            best = w if known else -np.inf
            first_total = _term(w, logs[lo], False)
            first_acc = _term(w, logs[lo], True)
            rest_total = -0.0  # numpy's sum of fewer than 8 values: in order, from -0.0
            rest_acc = -0.0
            for i in range(lo + 1, hi):
                w = np.float64(weight[i])
                if w != w:
                    known = False
                elif w > best:
                    best = w
                rest_total += _term(w, logs[i], False)
                rest_acc += _term(w, logs[i], True)
            complete[c] = known
            top[c] = best
            total[c] = first_total + rest_total
            acc[c] = first_acc + rest_acc
            continue
        known = True
        best = -np.inf
        for i in range(lo, hi):
            w = np.float64(weight[i])
            if w != w:
                known = False
            elif w > best:
                best = w
        complete[c] = known
        top[c] = best
        total[c] = _segment(weight, logs, lo, hi, False)
        acc[c] = _segment(weight, logs, lo, hi, True)


@njit(ahead=lambda: [arrays("i4 f8 f8 f8 f8 f8 f8 f8")], **_OPTS)
def entropy_sums(cell_layer, total, acc, top, log2_total, counted, bits, share):
    """Per layer (`cell_layer`: each cell's), over its cells whose weight sum is positive:
    their count, the sum of their entropies ``log2(total) - acc / total`` (`log2_total`:
    numpy's logarithm of each cell's sum, 0 where it is not positive) and of their top-1
    shares ``100 * top / total``, into the three outputs (zero to start). Each sum adds every
    cell's value in cell order, 0.0 for a cell left out, as ``np.bincount(cell_layer,
    weights=np.where(ok, x, 0))`` adds them."""
    for c in range(len(cell_layer)):
        layer = cell_layer[c]
        if total[c] > 0:
            counted[layer] += 1.0
            bits[layer] += log2_total[c] - acc[c] / total[c]
            share[layer] += 100.0 * top[c] / total[c]
        else:
            counted[layer] += 0.0
            bits[layer] += 0.0
            share[layer] += 0.0
