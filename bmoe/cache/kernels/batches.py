"""Trace preparation: rows cut into batches of dense key ids in the reference batch order, and
each lookup's next use (for the policies that read the future)."""

from __future__ import annotations

import numpy as np

from bmoe.cache.kernels.shared import OPTS
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


#: the route columns' own types (:data:`bmoe.formats.route.COLUMN_TYPES`): turn, phase, step,
#: layer, slot
COLUMNS = "i2 i1 i4 i2 i1"


@njit(ahead=lambda: (*arrays(COLUMNS), 0, 0, 0, 0, 1, 1), **OPTS)
def batch_sort_key(turn, phase, step, layer, slot, t0, s0, l0, o0, span, n_slot):
    """Each row's place in the reference batch order as one int64 (turn, phase, then step
    before layer in decode and layer before step in prefill, slot), and whether the rows
    already are in that order. The caller checks that the ranges fit 62 bits."""
    n = len(layer)
    out = np.empty(n, dtype=np.int64)
    ordered = True
    prev = -1
    for r in range(n):
        st = np.int64(step[r]) - s0
        ly = np.int64(layer[r]) - l0
        dec = phase[r] != 0
        key = (np.int64(turn[r]) - t0) * 2 + (1 if dec else 0)
        if dec:
            key = (key * span + st) * span + ly
        else:
            key = (key * span + ly) * span + st
        key = key * n_slot + (np.int64(slot[r]) - o0)
        out[r] = key
        if key < prev:
            ordered = False
        prev = key
    return out, ordered


@njit(**OPTS)
def _row(order, i):
    return order[i] if len(order) else i


@njit(ahead=lambda: arrays("i8 " + COLUMNS[:-3]), **OPTS)
def count_batches(order, turn, phase, step, layer):
    """The batches of the rows taken in `order` (empty: as they are): a batch ends where
    the turn, the phase or the layer changes, or the step in decode."""
    n = len(layer)
    if n == 0:
        return 0
    count = 1
    r0 = _row(order, 0)
    for i in range(1, n):
        r = _row(order, i)
        if (
            turn[r] != turn[r0]
            or (phase[r] != 0) != (phase[r0] != 0)
            or layer[r] != layer[r0]
            or (phase[r] != 0 and step[r] != step[r0])
        ):
            count += 1
        r0 = r
    return count


@njit(
    ahead=lambda: [
        (*arrays(f"i8 {COLUMNS[:-3]} {ids} b1 i8"), 1, 1, 1, *arrays("i8"))
        for ids in ("i2", "i8")  # the expert column, or the key ids that occur
    ],
    **OPTS,
)
def cut_batches(
    order, turn, phase, step, layer, expert, resident, part_of, n_e, n_b, n_keys, look_row
):
    """Rows taken in `order` (empty: as they are) cut into `n_b` batches (see
    :func:`count_batches`) of lookups, in one pass: per batch its first row, the lookup
    bounds, whether an id repeated and how many lookups the run recorded as resident (the
    row's `resident` flag at a key's first row; `resident` may be empty); per lookup the
    dense key id (``part_of[layer] * n_e + expert``) in first-seen order (``look``) and in
    last-touch order (``rec``), and, when `look_row` has a slot per row, the row of each
    lookup's first sight in it."""
    n = len(layer)
    has_res = len(resident) == n
    want_rows = len(look_row) == n
    mark = np.full(n_keys, -1, dtype=np.int64)
    look = np.empty(n, dtype=np.int32)
    rec = np.empty(n, dtype=np.int32)
    first_row = np.empty(n_b, dtype=np.int64)
    bounds = np.zeros(n_b + 1, dtype=np.int64)
    repeated = np.zeros(n_b, dtype=np.bool_)
    recorded = np.zeros(n_b, dtype=np.int64)
    m = 0
    b = -1
    s = 0
    r0 = -1
    for i in range(n + 1):
        r = _row(order, i) if i < n else -1
        new = i == n or i == 0
        if not new:
            new = (
                turn[r] != turn[r0]
                or (phase[r] != 0) != (phase[r0] != 0)
                or layer[r] != layer[r0]
                or (phase[r] != 0 and step[r] != step[r0])
            )
        if new and b >= 0:  # close batch b (rows s .. i-1)
            start = bounds[b]
            bounds[b + 1] = m
            if m - start != i - s:
                repeated[b] = True
                pos = m
                for j in range(i - 1, s - 1, -1):
                    rj = _row(order, j)
                    k = part_of[layer[rj]] * n_e + expert[rj]
                    if mark[k] != -2 - b:
                        mark[k] = -2 - b
                        pos -= 1
                        rec[pos] = k
            else:
                for j in range(start, m):
                    rec[j] = look[j]
        if i == n:
            break
        if new:
            b += 1
            s = i
            first_row[b] = r
        k = part_of[layer[r]] * n_e + expert[r]
        if mark[k] != b:
            mark[k] = b
            look[m] = k
            if want_rows:
                look_row[m] = r
            if has_res and resident[r]:
                recorded[b] += 1
            m += 1
        r0 = r
    if m < n - n // 4:  # give back the room of the repeats
        return look[:m].copy(), rec[:m].copy(), first_row, bounds, repeated, recorded
    return look[:m], rec[:m], first_row, bounds, repeated, recorded


@njit(ahead=lambda: (*arrays("i8 i4"), 1), **OPTS)
def next_uses(bounds, look, n_keys):
    """For each lookup, the next batch looking the same key up; the number of batches
    (one past the last) if none."""
    n_b = len(bounds) - 1
    return next_uses_continue(bounds, look, np.full(n_keys, n_b, dtype=np.int32), 0)


@njit(ahead=lambda: (*arrays("i8 i4 i4"), 0), **OPTS)
def next_uses_continue(bounds, look, nextb, b0):
    """:func:`next_uses` of the batches numbered from `b0` on, `nextb` (per key, the first
    batch after them looking it up, updated in place) carried from the chunk after: chunks
    given last to first give the next uses of a whole."""
    n_b = len(bounds) - 1
    out = np.empty(len(look), dtype=np.int32)
    for b in range(n_b - 1, -1, -1):
        for i in range(bounds[b], bounds[b + 1]):
            k = look[i]
            out[i] = nextb[k]
            nextb[k] = b0 + b
    return out


@njit(**{**OPTS, "inline": "always"})
def _group(turn, phase, step, r):
    """Row `r`'s batch group as one int64 growing in replay order: turn, then prefill (all
    of it one group) before decode, then the decode step."""
    dec = np.int64(1) if phase[r] != 0 else np.int64(0)
    return (
        ((np.int64(turn[r]) + (1 << 15)) << 41)
        | (dec << 40)
        | (dec * (np.int64(step[r]) + (1 << 31)))
    )


@njit(ahead=lambda: arrays(COLUMNS[:-6]), **OPTS)
def last_group(turn, phase, step):
    """Rows of a block by batch group (:func:`_group`): where the run of rows of the last
    row's group that ends the block starts, whether no row before that run is of the
    group, and the lowest and highest group before it (the last row's group when none)."""
    n = len(step)
    last = _group(turn, phase, step, n - 1)
    start = n - 1
    while start > 0 and _group(turn, phase, step, start - 1) == last:
        start -= 1
    lo = last
    hi = last
    alone = True
    for r in range(start):
        g = _group(turn, phase, step, r)
        if g == last:
            alone = False
        if r == 0 or g < lo:
            lo = g
        if r == 0 or g > hi:
            hi = g
    return start, alone, lo, hi
