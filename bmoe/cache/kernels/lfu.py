"""``lfu`` and ``lfu-incache``: evict the fewest lookups so far, ties by least recent touch;
the live classes are :class:`bmoe.cache.policies.lfu.LFU` (counts kept across eviction) and
:class:`~bmoe.cache.policies.lfu.InCacheLFU` (a victim's count restarts). ``layerlfu`` runs
the same kernel a slice per layer (:mod:`bmoe.cache.kernels.layered`).

Count buckets: per slice, a list per lookup count holding the slice's evictable keys with
that count in touch order (head = least recent), and a bitmap of the non-empty lists, 64 to a
word (the top one is the sign bit: only ``&``, ``|``, ``== 0`` and the trailing zeros are
used). A batch's resident keys leave their count list while it is staged and join the tail
of their new count's list afterwards (in touch order: theirs are the newest touches), so a
list's head is its least recent key and the lowest non-empty list's head is the victim.
Every slice has ``room`` lists: before a chunk the state grows (:func:`lfu_regrow`) until the
highest count plus the chunk's batches fit, so memory follows the counts reached, up to
:data:`LIST_SLOTS`; a stream whose counts go beyond moves to a heap per slice (the same
victims, in memory bounded by the keys).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup, counter_bits
from bmoe.cache.kernels.shared import (
    OPTS,
    append,
    heap_pop,
    heap_push,
    heap_remove,
    node_lists,
    restamp_heap,
)
from bmoe.cache.policies.lfu import LFU, InCacheLFU
from bmoe.compiled import arrays, njit, numba_global

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring

trailing_zeros = numba_global("numba.cpython.unsafe.numbers", "trailing_zeros")


class LFUState(NamedTuple):
    nxt: np.ndarray  # the count lists: a node per key id, then ``room`` sentinels per slice
    prv: np.ndarray
    counts: np.ndarray  # per key id, its lookups
    resident: np.ndarray  # per key id
    ksize: np.ndarray  # per key id, its bytes while resident
    bits: np.ndarray  # per slice, a bit per count list: non-empty
    low: np.ndarray  # per slice, no non-empty list below it
    held: np.ndarray  # per slice, bytes held
    listed: np.ndarray  # per slice, keys in its count lists
    room: np.ndarray  # [count lists per slice]


def lfu_state(n_parts: int, n_keys: int, room: int) -> LFUState:
    """An empty cache of `n_keys` key ids in `n_parts` slices of `room` count lists."""
    nxt, prv = node_lists(n_keys, n_parts * room)
    return LFUState(
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_parts * ((room >> 6) + 1), dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.full(1, room, dtype=np.int64),
    )


def lfu_regrow(state: LFUState, n_keys: int, room: int) -> LFUState:
    """`state` in a new one with room for `n_keys` key ids and `room` count lists per slice,
    every list's keys in their order."""
    out = lfu_state(len(state.low), n_keys, room)
    _relink(state, out)
    return out


@njit(ahead=lambda: (lfu_state(1, 1, 1), lfu_state(1, 1, 2)), **OPTS)
def _relink(state, out):
    """Copy `state` into the larger `out`, relinking its count lists there."""
    old_room = state.room[0]
    room = out.room[0]
    n_parts = len(state.low)
    old_keys = len(state.counts)
    out.counts[:old_keys] = state.counts
    out.resident[:old_keys] = state.resident
    out.ksize[:old_keys] = state.ksize
    out.low[:] = state.low
    out.held[:] = state.held
    out.listed[:] = state.listed
    words = (room >> 6) + 1
    for j in range(n_parts):
        for c in range(old_room):
            old_list = -1 - (j * old_room + c)
            k = state.nxt[old_list]
            if k < 0:
                continue
            new_list = -1 - (j * room + c)
            while k >= 0:
                append(k, new_list, out.nxt, out.prv)
                k = state.nxt[k]
            out.bits[j * words + (c >> 6)] |= np.int64(1) << (c & 63)


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8 i8"), 0, True, lfu_state(1, 1, 1)), **OPTS)
def lfu_continue(bounds, look, rec, repeated, size, part, capacity, keep_counts, state):
    """Replay the batches from `state` (updated in place; its room enough for every count
    the batches reach), each slice holding `capacity` bytes. Without `keep_counts` a victim's
    count restarts."""
    nxt, prv, counts, resident, ksize, bits, low, held, listed, dims = state
    room = dims[0]
    words = (room >> 6) + 1
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        j = part[b]
        cb = j * room  # slice j's count-c list is cb + c
        wb = j * words  # slice j's bitmap words start here
        h = 0
        for i in range(s, e):
            k = look[i]
            c = counts[k]
            counts[k] = c + 1
            if resident[k]:
                h += 1
                n = nxt[k]
                p = prv[k]
                nxt[p] = n
                prv[n] = p
                listed[j] -= 1
                if n == p:  # both neighbours are the list's sentinel: it is empty now
                    bits[wb + (c >> 6)] &= ~(np.int64(1) << (c & 63))
            else:
                resident[k] = True
                ksize[k] = sz
                held[j] += sz
        hits[b] = h
        while held[j] > capacity and listed[j] > 0:
            w = wb + (low[j] >> 6)
            word = bits[w] & (np.int64(-1) << (low[j] & 63))
            while word == 0:
                w += 1
                word = bits[w]
            c = ((w - wb) << 6) + trailing_zeros(word)
            low[j] = c
            lst = -1 - (cb + c)
            k = nxt[lst]
            n = nxt[k]
            nxt[lst] = n
            prv[n] = lst
            listed[j] -= 1
            if n == lst:
                bits[w] &= ~(np.int64(1) << (c & 63))
            resident[k] = False
            held[j] -= ksize[k]
            if not keep_counts:
                counts[k] = 0
        order = rec if repeated[b] else look
        for i in range(s, e):
            k = order[i]
            c = counts[k]
            append(k, -1 - (cb + c), nxt, prv)
            bits[wb + (c >> 6)] |= np.int64(1) << (c & 63)
            if c < low[j]:
                low[j] = c
        listed[j] += e - s
    return hits


def lfu(
    bounds: Arr,
    look: Arr,
    rec: Arr,
    repeated: Arr,
    size: Arr,
    part: Arr,
    n_parts: int,
    n_keys: int,
    capacity: int,
    keep_counts: bool,
) -> Arr:
    """The whole-trace call: :func:`lfu_continue` from an empty cache with a count list for
    every count the batches can reach."""
    most = int(np.bincount(part, minlength=n_parts).max()) if len(part) else 0
    state = lfu_state(n_parts, n_keys, most + 1)
    return lfu_continue(bounds, look, rec, repeated, size, part, capacity, keep_counts, state)


# ----------------------------------------------------------------------------- the heap form
# The count lists take a slot per count reached, per slice: a stream whose counts grow past
# LIST_SLOTS moves to a heap of (count, last touch) per slice instead, in memory bounded by
# the keys whatever the counts reach (the same victims: tested against the lists).

#: the most count-list slots (all slices) a cache keeps before it moves to the heap form
LIST_SLOTS = 1 << 22


class LFUHeapState(NamedTuple):
    counts: np.ndarray  # per key id, its lookups
    resident: np.ndarray
    ksize: np.ndarray
    stamp: np.ndarray  # per key id, its last touch
    hv: np.ndarray  # per slice a heap (slots base[j]..): priorities count << shift | stamp
    hk: np.ndarray  # their keys
    hpos: np.ndarray  # per key id, its heap slot (-1: out of the heaps)
    base: np.ndarray  # per slice, its heap's first slot
    hcount: np.ndarray  # per slice, keys in its heap
    held: np.ndarray  # per slice, bytes held
    clock: np.ndarray  # [the last touch stamp]


def lfu_heap_state(n_parts: int, n_keys: int, part_keys: int) -> LFUHeapState:
    """An empty heap-form cache of `n_keys` key ids in `n_parts` slices of at most
    `part_keys` keys each."""
    return LFUHeapState(
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_parts * part_keys, dtype=np.int64),
        np.zeros(n_parts * part_keys, dtype=np.int32),
        np.full(n_keys, -1, dtype=np.int64),
        np.arange(n_parts, dtype=np.int64) * part_keys,
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )


@njit(ahead=lambda: (lfu_state(1, 1, 1), lfu_heap_state(1, 1, 1), 0), **OPTS)
def _lists_to_heap(lists, heap, shift):
    """Move the count lists of `lists` into the empty heaps of `heap`: each list's keys
    stamped in its order (ties within a count go to the least recent touch, as there)."""
    n_keys = len(lists.counts)
    heap.counts[:n_keys] = lists.counts
    heap.resident[:n_keys] = lists.resident
    heap.ksize[:n_keys] = lists.ksize
    heap.held[:] = lists.held
    room = lists.room[0]
    clock = 0
    for j in range(len(lists.low)):
        for c in range(room):
            k = lists.nxt[-1 - (j * room + c)]
            while k >= 0:
                clock += 1
                heap.stamp[k] = clock
                heap_push(k, (np.int64(c) << shift) | clock, j, heap.hv, heap.hk, heap.hpos,
                          heap.base, heap.hcount)  # fmt: skip
                k = lists.nxt[k]
    heap.clock[0] = clock


@njit(ahead=lambda: (lfu_heap_state(1, 1, 1), 0), **OPTS)
def lfu_heap_restamp(state, shift):
    """Renumber the touch stamps of the keys in the heaps 1..m in their order and pack their
    priorities with `shift`; the clock restarts at m."""
    m = state.hcount.sum()
    keys = np.empty(m, dtype=np.int64)
    n = 0
    for j in range(len(state.base)):
        for i in range(state.hcount[j]):
            keys[n] = state.hk[state.base[j] + i]
            n += 1
    state.clock[0] = restamp_heap(
        state.counts, state.stamp, keys, state.hv, state.hk, state.base, state.hcount, shift
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8 i8"), 0, True, 0, lfu_heap_state(1, 1, 1)), **OPTS)
def lfu_heap_continue(bounds, look, rec, repeated, size, part, capacity, keep_counts, shift, state):
    """:func:`lfu_continue` over the heap form (its priorities packed with `shift`)."""
    counts, resident, ksize, stamp, hv, hk, hpos, base, hcount, held, clocks = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    clock = clocks[0]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        j = part[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            counts[k] += 1
            if resident[k]:
                h += 1
                heap_remove(k, j, hv, hk, hpos, base, hcount)
            else:
                resident[k] = True
                ksize[k] = sz
                held[j] += sz
        order = rec if repeated[b] else look
        for i in range(s, e):
            clock += 1
            stamp[order[i]] = clock
        hits[b] = h
        while held[j] > capacity and hcount[j] > 0:
            k = heap_pop(j, hv, hk, hpos, base, hcount)
            resident[k] = False
            held[j] -= ksize[k]
            if not keep_counts:
                counts[k] = 0
        for i in range(s, e):
            k = look[i]
            heap_push(k, (counts[k] << shift) | stamp[k], j, hv, hk, hpos, base, hcount)
    clocks[0] = clock
    return hits


def lfu_heap_regrow(state: LFUHeapState, n_keys: int, part_keys: int) -> LFUHeapState:
    """`state` with room for `n_keys` key ids and `part_keys` per slice, each slice's heap
    moved to its new slots."""
    out = lfu_heap_state(len(state.base), n_keys, part_keys)
    old = len(state.counts)
    for name in ("counts", "resident", "ksize", "stamp", "hpos"):
        getattr(out, name)[:old] = getattr(state, name)
    for j in range(len(state.base)):
        at, to, n = int(state.base[j]), int(out.base[j]), int(state.hcount[j])
        out.hv[to : to + n] = state.hv[at : at + n]
        out.hk[to : to + n] = state.hk[at : at + n]
    out.hcount[:] = state.hcount
    out.held[:] = state.held
    out.clock[:] = state.clock
    return out


# ----------------------------------------------------------------------------- the spec


def new(setup: Setup) -> LFUState:
    return lfu_state(setup.n_parts, setup.n_keys, 1)


def fitted(r: Replay, c: Chunk, part: np.ndarray) -> None:
    """Grow `r`'s count lists until the highest count plus the chunk's batches of one slice
    fit (at least doubling, so a stream grows them a few times only; an empty cache is made
    anew with just the room); past :data:`LIST_SLOTS` move to the heap form."""
    st = r.state
    room = int(st.room[0])
    top = int(st.counts.max(initial=0))
    need = top + int(np.bincount(part).max()) + 1
    if need <= room:
        return
    n_parts, n_keys = len(st.low), len(st.counts)
    if n_parts * need > LIST_SLOTS:
        heap = lfu_heap_state(n_parts, n_keys, r.setup.part_keys)
        _lists_to_heap(st, heap, counter_bits(n_keys))
        r.state = heap
    elif top == 0:
        r.state = lfu_state(n_parts, n_keys, need)
    else:
        r.state = lfu_regrow(st, n_keys, max(need, 2 * room))


def stepper(keep_counts: bool):
    def step(r: Replay, c: Chunk) -> np.ndarray:
        part = r.parts_of(c)
        if isinstance(r.state, LFUState):
            fitted(r, c, part)
        st = r.state
        if isinstance(st, LFUState):
            return lfu_continue(
                c.bounds, c.look, c.rec, c.repeated, c.size, part, r.capacity, keep_counts, st
            )
        shift = r.packing(int(st.hcount.sum()), int(st.counts.max(initial=0)), c)
        lfu_heap_restamp(st, shift)
        return lfu_heap_continue(
            c.bounds, c.look, c.rec, c.repeated, c.size, part, r.capacity, keep_counts, shift, st
        )

    return step


def grow(state: LFUState | LFUHeapState, setup: Setup, old: int) -> LFUState | LFUHeapState:
    if isinstance(state, LFUHeapState):
        return lfu_heap_regrow(state, setup.n_keys, setup.part_keys)
    return lfu_regrow(state, setup.n_keys, int(state.room[0]))


SPECS = (
    KernelSpec(LFU, new, stepper(True), (), grow),
    KernelSpec(InCacheLFU, new, stepper(False), (), grow),
)
