"""``lru``: a recency list per budget slice (head = least recent); the live class is
:class:`bmoe.cache.policies.lru.LRU`. ``layer`` runs the same kernel a slice per layer
(:mod:`bmoe.cache.kernels.layered`).

Several budgets replay in one pass (:func:`lru_budgets_continue`): under the batch semantics
each budget's cache is a run of the most recent keys, the larger budget's holding the
smaller's, so one recency list and a boundary per budget give every budget's hits."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Budgets, Chunk, KernelSpec, Replay, ReplayBudgets, Setup
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


class LRUBudgetsState(NamedTuple):
    nxt: np.ndarray  # one recency list: a node per key id, then its sentinel
    prv: np.ndarray
    level: np.ndarray  # per key id, the first budget (ascending) holding it; n_budgets: none
    ksize: np.ndarray  # per key id, its bytes while resident
    held: np.ndarray  # per budget, bytes held
    n_held: np.ndarray  # per budget, keys held
    oldest: np.ndarray  # per budget, its least recent key (-1: none)


def lru_budgets_state(n_keys: int, n_budgets: int) -> LRUBudgetsState:
    """Empty caches of `n_keys` key ids at `n_budgets` budgets."""
    nxt, prv = node_lists(n_keys, 1)
    return LRUBudgetsState(
        nxt,
        prv,
        np.full(n_keys, n_budgets, dtype=np.int32),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_budgets, dtype=np.int64),
        np.zeros(n_budgets, dtype=np.int64),
        np.full(n_budgets, -1, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8 i8"), lru_budgets_state(1, 1)), **OPTS)
def lru_budgets_continue(bounds, look, rec, repeated, size, capacity, state):
    """:func:`lru_continue` of one slice at each of the budgets `capacity` (ascending) at
    once, from `state` (updated in place): the hits per batch and budget. A key's bytes are
    the same in every batch (its layer's expert size).

    The list holds the largest budget's keys, least recent first; budget ``j`` holds those
    from ``oldest[j]`` to the tail, and a key those from ``level[key]`` on. A looked-up key
    goes to the tail (a budget whose oldest key it was starts at the next one); after the
    batch each budget drops its oldest keys until it fits, as :func:`lru_continue` does."""
    nxt, prv, level, ksize, held, count, oldest = state
    n_b = len(bounds) - 1
    nk = len(capacity)
    hits = np.zeros((n_b, nk), dtype=np.int64)
    found = np.zeros(nk + 1, dtype=np.int64)  # per batch: lookups by the key's level
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        for j in range(nk + 1):
            found[j] = 0
        for i in range(s, e):
            k = look[i]
            lv = level[k]
            found[lv] += 1
            if lv < nk:
                n = nxt[k]
                j = lv
                while n >= 0 and j < nk and oldest[j] == k:
                    oldest[j] = n
                    j += 1
                unlink(k, nxt, prv)
            else:
                ksize[k] = sz
            for j in range(lv):  # it joins the budgets that did not hold it
                held[j] += sz
                count[j] += 1
                if oldest[j] < 0:
                    oldest[j] = k
            level[k] = 0
            append(k, -1, nxt, prv)
        if repeated[b]:
            for i in range(s, e):
                k = rec[i]
                n = nxt[k]
                j = 0
                while n >= 0 and j < nk and oldest[j] == k:
                    oldest[j] = n
                    j += 1
                unlink(k, nxt, prv)
                append(k, -1, nxt, prv)
        h = 0
        for j in range(nk):
            h += found[j]
            hits[b, j] = h
        keep = e - s
        for j in range(nk):
            cap = capacity[j]
            while held[j] > cap and count[j] > keep:
                k = oldest[j]
                oldest[j] = nxt[k]
                held[j] -= ksize[k]
                count[j] -= 1
                level[k] = j + 1
                if j == nk - 1:
                    unlink(k, nxt, prv)
    return hits


def new_budgets(setup: Setup, n_budgets: int) -> LRUBudgetsState:
    return lru_budgets_state(setup.n_keys, n_budgets)


def step_budgets(r: ReplayBudgets, c: Chunk) -> np.ndarray:
    hits = lru_budgets_continue(c.bounds, c.look, c.rec, c.repeated, c.size, r.capacities, r.state)
    return hits.T


PER_KEY = ("nxt", "prv", "resident", "ksize")
BUDGETS = Budgets(new_budgets, step_budgets, ("nxt", "prv", "level", "ksize"))
SPECS = (KernelSpec(LRU, new, step, PER_KEY, budgets=BUDGETS),)
