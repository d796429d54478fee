"""LRU byte stack distances of every lookup, in one pass (a Fenwick tree over touch order),
whole or chunk by chunk: the exact LRU curve of every budget at once."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr
from bmoe.cache.kernels.shared import OPTS
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


def lru_byte_distances(
    bounds: Arr,
    look: Arr,
    rec: Arr,
    repeated: Arr,
    size: Arr,
    n_keys: int,
    batch_semantics: bool,
) -> Arr:
    """Per lookup, its LRU byte stack distance (inf for a first lookup), by a Fenwick tree
    over touch order that holds each key's bytes at its last touch.

    With `batch_semantics` (the replay's, see
    :func:`bmoe.analyze.replay.lru_stack_distances`): a batch's keys are touched after all
    its lookups, in last-touch order; the distance is the bytes touched since the key's
    last touch plus its own, and 0 when the key was in the previous batch (a hit at any
    budget). Without: every lookup touches its key at once, in lookup order, and the
    distance is the bytes of the distinct keys looked up since (the classic stack
    distance, the key itself not counted)."""
    state = distances_state(n_keys, len(look))
    return lru_byte_distances_continue(bounds, look, rec, repeated, size, batch_semantics, state)


class DistanceState(NamedTuple):
    tree: np.ndarray  # a Fenwick tree over touch order: each key's bytes at its last touch
    last: np.ndarray  # per key id, its last touch (1-based), 0 = never
    prevb: np.ndarray  # per key id, the last batch that looked it up
    scalars: np.ndarray  # [bytes of the keys touched, clock, batches done]

    @property
    def seen_bytes(self) -> int:
        """The bytes of every key touched so far."""
        return int(self.scalars[0])


def distances_state(n_keys: int, room: int) -> DistanceState:
    """No key touched yet, a tree with room for `room` touches, for
    :func:`lru_byte_distances_continue`."""
    return DistanceState(
        np.zeros(room + 1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),  # last touch (1-based), 0 = never
        np.full(n_keys, -1, dtype=np.int64),  # the last batch that looked the key up
        np.zeros(3, dtype=np.int64),
    )


@njit(ahead=lambda: (distances_state(1, 1), *arrays("i8"), 1), **OPTS)
def distances_restart(state, key_bytes, room):
    """The touched keys of `state` (:func:`distances_state`) renumbered 1..m in touch order
    (in place) and the new tree holding their `key_bytes` with room for `room` more touches,
    for ``state._replace(tree=...)``: between chunks, so the tree is bounded by the keys and
    a chunk, not the trace."""
    _, last, _, scalars = state
    live = np.flatnonzero(last > 0)
    order = live[np.argsort(last[live])]
    m = len(order)
    n = m + room
    new = np.zeros(n + 1, dtype=np.int64)
    for r in range(m):
        k = order[r]
        last[k] = r + 1
        new[r + 1] = key_bytes[k]
    for i in range(1, n + 1):  # prefix sums to a Fenwick tree in place
        j = i + (i & -i)
        if j <= n:
            new[j] += new[i]
    scalars[1] = m
    return new


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8"), True, distances_state(1, 1)), **OPTS)
def lru_byte_distances_continue(bounds, look, rec, repeated, size, batch_semantics, state):
    """:func:`lru_byte_distances` from `state` (:func:`distances_state`, updated in place,
    its tree with room for these lookups): batches given chunk by chunk give the distances
    of a whole."""
    tree, last, prevb, scalars = state
    n = len(tree) - 1
    out = np.full(len(look), np.inf)
    total = scalars[0]
    clock = scalars[1]
    done = scalars[2]
    for b in range(len(bounds) - 1):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        gb = done + b
        for i in range(s, e):
            k = look[i]
            t = last[k]
            if t > 0:
                if batch_semantics and prevb[k] == gb - 1:
                    out[i] = 0.0
                else:
                    acc = 0
                    j = t
                    while j > 0:
                        acc += tree[j]
                        j &= j - 1
                    out[i] = float(total - acc + sz) if batch_semantics else float(total - acc)
            if not batch_semantics:
                clock = _touch(tree, last, k, sz, clock, n)
                if t == 0:
                    total += sz
        if batch_semantics:
            order = rec if repeated[b] else look
            for i in range(s, e):
                k = order[i]
                if last[k] == 0:
                    total += sz
                clock = _touch(tree, last, k, sz, clock, n)
            for i in range(s, e):
                prevb[look[i]] = gb
    scalars[0] = total
    scalars[1] = clock
    scalars[2] = done + len(bounds) - 1
    return out


@njit(**OPTS)
def _touch(tree, last, k, sz, clock, n):
    """Move key `k`'s bytes from its last touch to a new one; return the new clock."""
    t = last[k]
    if t > 0:
        j = t
        while j <= n:
            tree[j] -= sz
            j += j & -j
    clock += 1
    j = clock
    while j <= n:
        tree[j] += sz
        j += j & -j
    last[k] = clock
    return clock
