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
highest count plus the chunk's batches fit, so memory follows the counts reached.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from bmoe.cache.kernels.base import Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists
from bmoe.cache.policies.lfu import LFU, InCacheLFU

SHARED_STAMP = "cddfafd4bcf6"  # sha256 of shared.py: see its docstring


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


@njit(**OPTS)
def lfu_state(n_parts, n_keys, room):
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


@njit(**OPTS)
def lfu_regrow(state, n_keys, room):
    """`state` in a new one with room for `n_keys` key ids and `room` count lists per slice,
    every list's keys in their order."""
    old_room = state.room[0]
    n_parts = len(state.low)
    out = lfu_state(n_parts, n_keys, room)
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
    return out


@njit(**OPTS)
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


@njit(**OPTS)
def lfu(bounds, look, rec, repeated, size, part, n_parts, n_keys, capacity, keep_counts):
    """The whole-trace call: :func:`lfu_continue` from an empty cache with a count list for
    every count the batches can reach."""
    most = np.bincount(part, minlength=n_parts).max() if len(part) else 0
    state = lfu_state(n_parts, n_keys, most + 1)
    return lfu_continue(bounds, look, rec, repeated, size, part, capacity, keep_counts, state)


def new(setup: Setup) -> LFUState:
    return lfu_state(setup.n_parts, setup.n_keys, 1)


def fitted(r: Replay, c: Chunk, part: np.ndarray) -> None:
    """Grow `r`'s count lists until the highest count plus the chunk's batches of one slice
    fit (at least doubling, so a stream grows them a few times only)."""
    room = int(r.state.room[0])
    top = int(r.state.counts.max(initial=0))
    need = top + int(np.bincount(part).max()) + 1
    if need > room:
        grown = need if top == 0 else max(need, 2 * room)
        r.state = lfu_regrow(r.state, len(r.state.counts), grown)


def stepper(keep_counts: bool):
    def step(r: Replay, c: Chunk) -> np.ndarray:
        part = r.parts_of(c)
        fitted(r, c, part)
        return lfu_continue(
            c.bounds, c.look, c.rec, c.repeated, c.size, part, r.capacity, keep_counts, r.state
        )

    return step


def grow(state: LFUState, setup: Setup, old: int) -> LFUState:
    return lfu_regrow(state, setup.n_keys, int(state.room[0]))


SPECS = (
    KernelSpec(LFU, new, stepper(True), (), grow),
    KernelSpec(InCacheLFU, new, stepper(False), (), grow),
)
