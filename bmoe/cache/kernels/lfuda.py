"""``lfuda`` and ``lfuda-libcachesim``: LFU with dynamic aging over a heap of packed
priorities ``K << shift | touch``; the live classes are
:class:`bmoe.cache.policies.lfuda.LFUDA` (K = L + F: F lookups since admission, L the last
victim's K) and :class:`~bmoe.cache.policies.lfuda.LibCacheSimLFUDA` (libCacheSim's rules: a
hit adds the age, the age is the lowest resident K, a new key's K is taken after the
evictions it causes).

Between chunks the touch stamps are renumbered (``*_restamp``), so the bits they take stay
bounded by the keys held and a chunk's lookups.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import (
    INLINE,
    OPTS,
    heap_pop,
    heap_push,
    heap_remove,
    restamp_heap,
)
from bmoe.cache.policies.lfuda import LFUDA, LibCacheSimLFUDA
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class LFUDAState(NamedTuple):
    freq: np.ndarray  # per key id, lookups since admission
    prio: np.ndarray  # per key id, K
    stamp: np.ndarray  # per key id, its last touch
    resident: np.ndarray
    ksize: np.ndarray
    hv: np.ndarray  # the heap: packed priorities
    hk: np.ndarray  # keys
    hpos: np.ndarray  # per key id, its heap slot (-1: out of the heap)
    base: np.ndarray  # [0]: the heap's first slot
    hcount: np.ndarray  # [keys in the heap]
    scalars: np.ndarray  # [held, age, clock]


def lfuda_state(n_keys: int) -> LFUDAState:
    """An empty LFUDA cache of `n_keys` key ids."""
    return LFUDAState(
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(3, dtype=np.int64),
    )


@njit(ahead=lambda: (lfuda_state(1), 0), **OPTS)
def lfuda_restamp(state, shift):
    """Renumber the touch stamps of the keys in the heap 1..m in their order and pack the
    heap priorities with `shift`; the clock restarts at m."""
    keys = state.hk[: state.hcount[0]].copy()
    state.scalars[2] = restamp_heap(
        state.prio, state.stamp, keys, state.hv, state.hk, state.base, state.hcount, shift
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8"), 0, 0, lfuda_state(1)), **OPTS)
def lfuda_continue(bounds, look, rec, repeated, size, budget, shift, state):
    """Replay the batches from `state` (updated in place; its priorities packed with
    `shift`)."""
    freq, prio, stamp, resident, ksize, hv, hk, hpos, base, hcount, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held = scalars[0]
    age = scalars[1]
    clock = scalars[2]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            if resident[k]:
                h += 1
                heap_remove(k, 0, hv, hk, hpos, base, hcount)
                freq[k] += 1
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                freq[k] = 1
            prio[k] = age + freq[k]
        order = rec if repeated[b] else look
        for i in range(s, e):
            clock += 1
            stamp[order[i]] = clock
        hits[b] = h
        while held > budget and hcount[0] > 0:
            k = heap_pop(0, hv, hk, hpos, base, hcount)
            age = prio[k]
            resident[k] = False
            held -= ksize[k]
        for i in range(s, e):
            k = look[i]
            heap_push(k, (prio[k] << shift) | stamp[k], 0, hv, hk, hpos, base, hcount)
    scalars[0] = held
    scalars[1] = age
    scalars[2] = clock
    return hits


def lfuda(
    bounds: Arr, look: Arr, rec: Arr, repeated: Arr, size: Arr, n_keys: int, budget: int, shift: int
) -> Arr:
    """The whole-trace call: :func:`lfuda_continue` from an empty cache."""
    return lfuda_continue(bounds, look, rec, repeated, size, budget, shift, lfuda_state(n_keys))


def new(setup: Setup) -> LFUDAState:
    return lfuda_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    st = r.state
    shift = r.packing(int(st.hcount[0]), int(st.prio.max(initial=0)), c)
    lfuda_restamp(st, shift)
    return lfuda_continue(c.bounds, c.look, c.rec, c.repeated, c.size, r.budget, shift, st)


# ----------------------------------------------------------------------------- lfuda-libcachesim


class LibCacheSimLFUDAState(NamedTuple):
    prio: np.ndarray  # per key id, K
    stamp: np.ndarray  # per key id, its last touch
    resident: np.ndarray
    stranded: np.ndarray  # per key id: resident, off the heap, K below the age
    ksize: np.ndarray
    hv: np.ndarray  # the heap: packed priorities
    hk: np.ndarray  # keys
    hpos: np.ndarray  # per key id, its heap slot (-1: out of the heap)
    base: np.ndarray  # [0]: the heap's first slot
    hcount: np.ndarray  # [keys in the heap]
    scalars: np.ndarray  # [held, age, clock]


@njit(**INLINE)
def _strand_below(age, shift, hv, hk, hpos, base, hcount, stranded):
    """Take the keys whose priority fell below the age off the heap's top (stranded: never
    a victim while a key at or above the age remains)."""
    while hcount[0] > 0 and (hv[0] >> shift) < age:
        stranded[heap_pop(0, hv, hk, hpos, base, hcount)] = True


@njit(**INLINE)
def _lowest_at_or_above(age, shift, hv, hcount, look, prio, s, stop):
    """The lowest priority >= `age` among resident keys: the heap's top (stranded keys
    taken off first) and the batch's hits among ``look[s:stop]`` (off the heap while their
    batch runs); -1 if there is none. Keys entering in this batch (priority -1) do not
    count."""
    low = (hv[0] >> shift) if hcount[0] > 0 else -1
    for i in range(s, stop):
        q = prio[look[i]]
        if q >= age and q >= 0 and (low < 0 or q < low):
            low = q
    return low


def lfuda_libcachesim_state(n_keys: int) -> LibCacheSimLFUDAState:
    """An empty cache of `n_keys` key ids."""
    return LibCacheSimLFUDAState(
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(3, dtype=np.int64),
    )


@njit(ahead=lambda: (lfuda_libcachesim_state(1), 0), **OPTS)
def lfuda_libcachesim_restamp(state, shift):
    """Renumber the touch stamps of the resident keys (in the heap or stranded) 1..m in
    their order and pack the heap priorities with `shift`; the clock restarts at m."""
    keys = np.flatnonzero(state.resident)
    state.scalars[2] = restamp_heap(
        state.prio, state.stamp, keys, state.hv, state.hk, state.base, state.hcount, shift
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8"), 0, 0, lfuda_libcachesim_state(1)), **OPTS)
def lfuda_libcachesim_continue(bounds, look, rec, repeated, size, budget, shift, state):
    """Replay the batches from `state` (updated in place; its priorities packed with
    `shift`). Returns the hits per batch and whether every priority fitted above the touch
    stamps (False: the replay is too long for this policy's growing priorities)."""
    prio, stamp, resident, stranded, ksize, hv, hk, hpos, base, hcount, scalars = state
    n_keys = len(prio)
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    limit = np.int64(1) << (62 - shift)
    held = scalars[0]
    age = scalars[1]
    clock = scalars[2]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            if resident[k]:
                h += 1
                if stranded[k]:
                    stranded[k] = False
                else:
                    heap_remove(k, 0, hv, hk, hpos, base, hcount)
                old = prio[k]
                prio[k] = old + age
                if old == age:  # k was at the bottom: the age rises to the lowest other key
                    _strand_below(age, shift, hv, hk, hpos, base, hcount, stranded)
                    low = _lowest_at_or_above(age, shift, hv, hcount, look, prio, s, i)
                    if low >= 0:
                        age = low
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                prio[k] = -1  # set after the batch's evictions
        order = rec if repeated[b] else look
        for i in range(s, e):
            clock += 1
            stamp[order[i]] = clock
        hits[b] = h
        evicted = False
        while held > budget:
            _strand_below(age, shift, hv, hk, hpos, base, hcount, stranded)
            if hcount[0] > 0:
                k = heap_pop(0, hv, hk, hpos, base, hcount)
                age = prio[k]
            else:  # only stranded keys left: the lowest of them, the age unchanged
                k = -1
                for q in range(n_keys):
                    if stranded[q] and (
                        k < 0 or prio[q] < prio[k] or (prio[q] == prio[k] and stamp[q] < stamp[k])
                    ):
                        k = q
                if k < 0:
                    break
                stranded[k] = False
            resident[k] = False
            held -= ksize[k]
            evicted = True
        if evicted:
            _strand_below(age, shift, hv, hk, hpos, base, hcount, stranded)
            low = _lowest_at_or_above(age, shift, hv, hcount, look, prio, s, e)
            if low >= 0:
                age = low
        for i in range(s, e):
            k = look[i]
            if prio[k] < 0:
                prio[k] = age + 1
            if prio[k] >= limit:
                scalars[0], scalars[1], scalars[2] = held, age, clock
                return hits, False
            heap_push(k, (prio[k] << shift) | stamp[k], 0, hv, hk, hpos, base, hcount)
    scalars[0], scalars[1], scalars[2] = held, age, clock
    return hits, True


def lfuda_libcachesim(
    bounds: Arr, look: Arr, rec: Arr, repeated: Arr, size: Arr, n_keys: int, budget: int, shift: int
) -> tuple[Arr, bool]:
    """The whole-trace call: :func:`lfuda_libcachesim_continue` from an empty cache."""
    state = lfuda_libcachesim_state(n_keys)
    return lfuda_libcachesim_continue(bounds, look, rec, repeated, size, budget, shift, state)


def new_libcachesim(setup: Setup) -> LibCacheSimLFUDAState:
    return lfuda_libcachesim_state(setup.n_keys)


def step_libcachesim(r: Replay, c: Chunk) -> np.ndarray:
    st = r.state
    shift = r.packing(int(st.resident.sum()), int(st.prio.max(initial=0)), c)
    lfuda_libcachesim_restamp(st, shift)
    hits, fitted = lfuda_libcachesim_continue(
        c.bounds, c.look, c.rec, c.repeated, c.size, r.budget, shift, st
    )
    if not fitted:
        raise r.overflow(c)
    return hits


PER_KEY = ("freq", "prio", "stamp", "resident", "ksize", "hv", "hk", "hpos")
PER_KEY_LIBCACHESIM = ("prio", "stamp", "resident", "stranded", "ksize", "hv", "hk", "hpos")
SPECS = (
    KernelSpec(LFUDA, new, step, PER_KEY),
    KernelSpec(LibCacheSimLFUDA, new_libcachesim, step_libcachesim, PER_KEY_LIBCACHESIM),
)
