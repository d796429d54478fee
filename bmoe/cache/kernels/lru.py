"""``lru``: a recency list per budget slice (head = least recent); the live class is
:class:`bmoe.cache.policies.lru.LRU`. ``layer`` runs the same kernel a slice per layer
(:mod:`bmoe.cache.kernels.layered`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists, unlink
from bmoe.cache.policies.lru import LRU
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class LRUState(NamedTuple):
    nxt: np.ndarray  # the recency lists: a node per key id, then a sentinel per slice
    prv: np.ndarray
    resident: np.ndarray  # per key id
    ksize: np.ndarray  # per key id, its bytes while resident
    held: np.ndarray  # per slice, bytes held
    n_held: np.ndarray  # per slice, keys held


def lru_state(n_parts: int, n_keys: int) -> LRUState:
    """An empty cache of `n_keys` key ids in `n_parts` slices."""
    nxt, prv = node_lists(n_keys, n_parts)
    return LRUState(
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8 i8"), 0, lru_state(1, 1)), **OPTS)
def lru_continue(bounds, look, rec, repeated, size, part, capacity, state):
    """Replay the batches from `state` (updated in place), each slice holding `capacity`
    bytes. A batch's keys end at the tail, so while more keys are resident in the slice than
    the batch holds, the head is not the batch's."""
    nxt, prv, resident, ksize, held, count = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        j = part[b]
        lst = -1 - j
        h = 0
        for i in range(s, e):
            k = look[i]
            if resident[k]:
                h += 1
                unlink(k, nxt, prv)
            else:
                resident[k] = True
                ksize[k] = sz
                held[j] += sz
                count[j] += 1
            append(k, lst, nxt, prv)
        if repeated[b]:
            for i in range(s, e):
                k = rec[i]
                unlink(k, nxt, prv)
                append(k, lst, nxt, prv)
        hits[b] = h
        keep = e - s
        while held[j] > capacity and count[j] > keep:
            k = nxt[lst]
            unlink(k, nxt, prv)
            resident[k] = False
            held[j] -= ksize[k]
            count[j] -= 1
    return hits


def lru(
    bounds: Arr,
    look: Arr,
    rec: Arr,
    repeated: Arr,
    size: Arr,
    part: Arr,
    n_parts: int,
    n_keys: int,
    capacity: int,
) -> Arr:
    """The whole-trace call: :func:`lru_continue` from an empty cache."""
    state = lru_state(n_parts, n_keys)
    return lru_continue(bounds, look, rec, repeated, size, part, capacity, state)


def new(setup: Setup) -> LRUState:
    return lru_state(setup.n_parts, setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return lru_continue(
        c.bounds, c.look, c.rec, c.repeated, c.size, r.parts_of(c), r.capacity, r.state
    )


PER_KEY = ("nxt", "prv", "resident", "ksize")
SPECS = (KernelSpec(LRU, new, step, PER_KEY),)
