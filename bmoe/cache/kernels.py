"""Compiled replay kernels: every policy's whole-sequence loop over flat arrays.

The live cache (:class:`bmoe.cache.ExpertCache`, one ``stage`` per layer load) is the
definition of the batch semantics; these kernels replay a whole trace under the same
semantics at compiled speed (the equivalence is tested batch for batch, see
``tests/test_cache_equivalence.py``). They work on dense key ids ``0..n_keys-1`` instead of
hashed keys, so every structure is an array indexed by key:

* ``bounds`` (int64, one more than the batches): batch ``b``'s lookups are
  ``look[bounds[b]:bounds[b+1]]`` (distinct keys, first-seen order) and its last-touch order
  is ``rec`` over the same range (read only where ``repeated[b]``);
* ``size`` (int64 per batch): the bytes of one expert of the batch's layer;
* ``part`` (int64 per batch): the budget slice the batch stages into (all 0 for the global
  policies, the layer's index for ``layer`` and ``layerlfu``).

Each kernel returns the hits per batch. They release the GIL, so budgets and policies can
run in threads. Compiled once and cached on disk by numba.

Each kernel is also a state and a continue step (``lru_state`` / ``lru_continue``, ...): the
cache lives in the state, so batches given chunk by chunk replay as if given at once (the
streamed replay of :mod:`bmoe.analyze.replay_stream`); the whole-trace function is the
one-chunk call. ``lfu`` streams through ``lfu_heap_continue`` (the same victims from a heap,
in memory bounded by the keys rather than by the counts).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

NEVER = 1 << 62
_OPTS = {"cache": True, "nogil": True, "boundscheck": False}

# ----------------------------------------------------------------------------- linked lists
# Doubly linked lists over key ids, each circular through a sentinel node: ``nxt``/``prv`` hold
# a slot per key (``0..n_keys-1``) and then a slot per list, list ``l``'s sentinel being node
# ``-1 - l`` (numba wraps negative indices, so it is the arrays' ``l``-th slot from the end).
# ``nxt[s]`` is list ``s``'s head and ``prv[s]`` its tail, the sentinel itself (negative) when
# it is empty; walking ``nxt`` off a list's end meets a negative id. Every operation is free of
# branches. A key is in at most one list at a time (``where`` names it, -1 for none).


@njit(**_OPTS)
def _node_lists(n_keys, n_lists):
    nxt = np.full(n_keys + n_lists, -1, dtype=np.int32)
    for lst in range(n_lists):
        nxt[n_keys + n_lists - 1 - lst] = -1 - lst
    return nxt, nxt.copy()


@njit(inline="always", **_OPTS)
def _unlink(k, nxt, prv):
    p = prv[k]
    n = nxt[k]
    nxt[p] = n
    prv[n] = p


@njit(inline="always", **_OPTS)
def _append(k, s, nxt, prv):
    t = prv[s]
    nxt[t] = k
    prv[k] = t
    nxt[k] = s
    prv[s] = k


@njit(inline="always", **_OPTS)
def _prepend(k, s, nxt, prv):
    h = nxt[s]
    prv[h] = k
    nxt[k] = h
    prv[k] = s
    nxt[s] = k


# ----------------------------------------------------------------------------- indexed heap
# A 4-ary min-heap per part of (priority, key) pairs, the priority one packed int64 (unique: its low
# bits are a touch or admission counter), with each key's position kept (``hpos``, -1 when
# absent) so a key can leave the heap from anywhere. Part ``j`` owns the slots
# ``base[j] .. base[j] + count[j]`` of ``hv`` (priorities) and ``hk`` (keys).


@njit(inline="always", **_OPTS)
def _sift_up(hv, hk, hpos, base, i):
    v = hv[base + i]
    k = hk[base + i]
    while i > 0:
        parent = (i - 1) >> 2
        pv = hv[base + parent]
        if pv < v:
            break
        q = hk[base + parent]
        hv[base + i] = pv
        hk[base + i] = q
        hpos[q] = i
        i = parent
    hv[base + i] = v
    hk[base + i] = k
    hpos[k] = i


@njit(inline="always", **_OPTS)
def _sift_down(hv, hk, hpos, base, n, i):
    v = hv[base + i]
    k = hk[base + i]
    while True:
        first = 4 * i + 1
        if first + 3 < n:  # four children: the least of two pairs (ties to the first, as below)
            v0 = hv[base + first]
            v1 = hv[base + first + 1]
            v2 = hv[base + first + 2]
            v3 = hv[base + first + 3]
            c01 = first if v0 <= v1 else first + 1
            m01 = min(v0, v1)
            c23 = first + 2 if v2 <= v3 else first + 3
            m23 = min(v2, v3)
            c = c01 if m01 <= m23 else c23
            cv = min(m01, m23)
        elif first < n:
            c = first
            cv = hv[base + c]
            for x in range(first + 1, n):
                xv = hv[base + x]
                if xv < cv:
                    c = x
                    cv = xv
        else:
            break
        if v < cv:
            break
        q = hk[base + c]
        hv[base + i] = cv
        hk[base + i] = q
        hpos[q] = i
        i = c
    hv[base + i] = v
    hk[base + i] = k
    hpos[k] = i


@njit(inline="always", **_OPTS)
def _heap_push(k, v, j, hv, hk, hpos, base, count):
    n = count[j]
    hv[base[j] + n] = v
    hk[base[j] + n] = k
    count[j] = n + 1
    _sift_up(hv, hk, hpos, base[j], n)


@njit(inline="always", **_OPTS)
def _heap_remove(k, j, hv, hk, hpos, base, count):
    i = hpos[k]
    hpos[k] = -1
    n = count[j] - 1
    count[j] = n
    if i == n:
        return
    b0 = base[j]
    hv[b0 + i] = hv[b0 + n]
    hk[b0 + i] = hk[b0 + n]
    if i > 0 and hv[b0 + i] < hv[b0 + ((i - 1) >> 2)]:
        _sift_up(hv, hk, hpos, b0, i)
    else:
        _sift_down(hv, hk, hpos, b0, n, i)


@njit(inline="always", **_OPTS)
def _heap_pop(j, hv, hk, hpos, base, count):
    k = hk[base[j]]
    _heap_remove(k, j, hv, hk, hpos, base, count)
    return k


def counter_bits(n: int) -> int:
    """Bits that hold a counter up to `n` (the low field of a packed priority)."""
    return max(1, int(n).bit_length())


# ----------------------------------------------------------------------------- lru / layer


@njit(**_OPTS)
def lru(bounds, look, rec, repeated, size, part, n_parts, n_keys, capacity):
    """``lru`` (one part) and ``layer`` (a part per layer, each its own LRU of `capacity`).

    Per part a recency list (head = least recent). A batch's keys end at the tail, so
    while more keys are resident in the part than the batch holds, the head is not the
    batch's."""
    state = lru_state(n_parts, n_keys)
    return lru_continue(bounds, look, rec, repeated, size, part, capacity, state)


@njit(**_OPTS)
def lru_state(n_parts, n_keys):
    """An empty LRU cache of `n_keys` key ids in `n_parts` parts, for :func:`lru_continue`:
    (nxt, prv, resident, ksize, held, count), a recency list per part."""
    nxt, prv = _node_lists(n_keys, n_parts)
    return (
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
    )


@njit(**_OPTS)
def lru_continue(bounds, look, rec, repeated, size, part, capacity, state):
    """:func:`lru` from the cache `state` (:func:`lru_state`, updated in place): batches
    given chunk by chunk replay as if given at once."""
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
                _unlink(k, nxt, prv)
            else:
                resident[k] = True
                ksize[k] = sz
                held[j] += sz
                count[j] += 1
            _append(k, lst, nxt, prv)
        if repeated[b]:
            for i in range(s, e):
                k = rec[i]
                _unlink(k, nxt, prv)
                _append(k, lst, nxt, prv)
        hits[b] = h
        keep = e - s
        while held[j] > capacity and count[j] > keep:
            k = nxt[lst]
            _unlink(k, nxt, prv)
            resident[k] = False
            held[j] -= ksize[k]
            count[j] -= 1
    return hits


# ----------------------------------------------------------------------------- lfu / layerlfu
# Count buckets: per part, a list per lookup count holding the part's evictable keys with that
# count in touch order (head = least recent), and a bitmap of the non-empty lists, 64 to a
# word (the top one is the sign bit: only ``&``, ``|``, ``== 0`` and the trailing zeros are
# used). A count is at most the part's batches.


@njit(**_OPTS)
def lfu(bounds, look, rec, repeated, size, part, part_batches, n_keys, capacity, keep_counts):
    """``lfu`` and ``layerlfu``: evict the fewest lookups so far (counts kept across
    eviction), ties by least recent touch; `part_batches` is the number of batches of each
    part. A batch's resident keys leave their count list while it is staged and join the
    tail of their new count's list afterwards (in touch order: theirs are the newest
    touches), so a list's head is its least recent key and the lowest non-empty list's
    head is the victim. Without `keep_counts` a victim's count restarts (``lfu-incache``)."""
    n_b = len(bounds) - 1
    n_parts = len(part_batches)
    hits = np.zeros(n_b, dtype=np.int64)
    counts = np.zeros(n_keys, dtype=np.int64)
    resident = np.zeros(n_keys, dtype=np.bool_)
    ksize = np.zeros(n_keys, dtype=np.int64)
    cbase = np.zeros(n_parts, dtype=np.int64)  # part j's count-c list is cbase[j] + c
    wbase = np.zeros(n_parts, dtype=np.int64)  # part j's bitmap words start here
    total_lists = 0
    total_words = 0
    for j in range(n_parts):
        cbase[j] = total_lists
        total_lists += part_batches[j] + 1
        wbase[j] = total_words
        total_words += ((part_batches[j] + 1) >> 6) + 1
    nxt, prv = _node_lists(n_keys, total_lists)
    bits = np.zeros(total_words, dtype=np.int64)
    low = np.zeros(n_parts, dtype=np.int64)  # no non-empty list of part j below low[j]
    held = np.zeros(n_parts, dtype=np.int64)
    listed = np.zeros(n_parts, dtype=np.int64)  # part j's keys in its count lists
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        j = part[b]
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
                    bits[wbase[j] + (c >> 6)] &= ~(np.int64(1) << (c & 63))
            else:
                resident[k] = True
                ksize[k] = sz
                held[j] += sz
        hits[b] = h
        while held[j] > capacity and listed[j] > 0:
            w = wbase[j] + (low[j] >> 6)
            word = bits[w] & (np.int64(-1) << (low[j] & 63))
            while word == 0:
                w += 1
                word = bits[w]
            c = ((w - wbase[j]) << 6) + trailing_zeros(word)
            low[j] = c
            lst = -1 - (cbase[j] + c)
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
            _append(k, -1 - (cbase[j] + c), nxt, prv)
            bits[wbase[j] + (c >> 6)] |= np.int64(1) << (c & 63)
            if c < low[j]:
                low[j] = c
        listed[j] += e - s
    return hits


@njit(**_OPTS)
def lfu_heap_state(n_parts, n_keys):
    """An empty LFU cache of `n_keys` key ids in `n_parts` parts (part ``j`` holds the ids
    ``j, j + n_parts, ...``), for :func:`lfu_heap_continue`: (counts, resident, ksize, stamp,
    hv, hk, hpos, base, hcount, held, scalars = [clock])."""
    per_part = n_keys // n_parts
    return (
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.full(n_keys, -1, dtype=np.int64),
        np.arange(n_parts).astype(np.int64) * per_part,
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(n_parts, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
    )


@njit(**_OPTS)
def lfu_heap_continue(bounds, look, rec, repeated, size, part, capacity, keep_counts, shift, state):
    """:func:`lfu` over a heap of (count, last touch) per part instead of count lists, from
    `state` (:func:`lfu_heap_state`, updated in place, priorities packed with `shift`): the
    same victims, in memory bounded by the keys whatever the counts reach, for replays that
    go on chunk after chunk (the count lists take a slot per count)."""
    counts, resident, ksize, stamp, hv, hk, hpos, base, hcount, held, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    clock = scalars[0]
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
                _heap_remove(k, j, hv, hk, hpos, base, hcount)
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
            k = _heap_pop(j, hv, hk, hpos, base, hcount)
            resident[k] = False
            held[j] -= ksize[k]
            if not keep_counts:
                counts[k] = 0
        for i in range(s, e):
            k = look[i]
            _heap_push(k, (counts[k] << shift) | stamp[k], j, hv, hk, hpos, base, hcount)
    scalars[0] = clock
    return hits


@njit(**_OPTS)
def lfu_heap_restamp(state, shift):
    """Renumber the touch stamps of the keys in `state`'s heaps 1..m in their order and pack
    the priorities with `shift` (each heap's order unchanged): between chunks, so the stamps
    stay bounded by the keys and the next chunk's lookups."""
    counts, stamp, hv, hk, base, hcount, scalars = (
        state[0],
        state[3],
        state[4],
        state[5],
        state[7],
        state[8],
        state[10],
    )
    m = hcount.sum()
    keys = np.empty(m, dtype=np.int64)
    n = 0
    for j in range(len(base)):
        for i in range(hcount[j]):
            keys[n] = hk[base[j] + i]
            n += 1
    order = np.argsort(stamp[keys])
    for r in range(m):
        stamp[keys[order[r]]] = r + 1
    for j in range(len(base)):
        for i in range(hcount[j]):
            k = hk[base[j] + i]
            hv[base[j] + i] = (counts[k] << shift) | stamp[k]
    scalars[0] = m


# ----------------------------------------------------------------------------- belady


@njit(**_OPTS)
def next_uses(bounds, look, n_keys):
    """For each lookup, the next batch looking the same key up; the number of batches
    (one past the last) if none."""
    n_b = len(bounds) - 1
    return next_uses_continue(bounds, look, np.full(n_keys, n_b, dtype=np.int32), 0)


@njit(**_OPTS)
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


@njit(**_OPTS)
def belady(bounds, look, size, next_use, n_keys, budget, shift):
    """``belady``: evict the furthest next use, ties to the earliest admitted (priority
    ``(batches - next use) << shift | admission``, the lowest the victim; a next use at or
    past the number of batches means never).

    The keys a batch admits wait one batch in a small buffer before they enter the heap:
    Belady often evicts a key it has just admitted (its next use is far), and a victim
    taken from the buffer costs a scan of a few entries instead of a push and a pop. The
    victim is the lowest priority of the heap's top and the buffer, so the order is the
    heap's alone. A hit key still in the heap takes its new priority with one sift up (its
    old next use was this batch, so the new priority is lower); a hit key in the buffer
    stays there with its new priority. A key looked up here has priority at least
    ``(batches - this batch) << shift``, above every other key's: eviction stops there."""
    state = belady_state(n_keys)
    n_b = len(bounds) - 1
    return belady_continue(bounds, look, size, next_use, n_b, 0, budget, shift, state)


@njit(**_OPTS)
def belady_state(n_keys):
    """An empty Belady cache of `n_keys` key ids, for :func:`belady_continue`: (admitted,
    resident, ksize, heap values, heap keys, heap slots (-1 out of the heap), buffer keys,
    buffer values, scalars = [held, admissions, heap size, buffer size])."""
    return (
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(4, dtype=np.int64),
    )


@njit(**_OPTS)
def belady_continue(bounds, look, size, next_use, n_total, b0, budget, shift, state):
    """:func:`belady` of the batches numbered from `b0` on of a replay of `n_total`, their
    next uses numbered so, from the cache `state` (:func:`belady_state`, updated in place):
    batches given chunk by chunk replay as if given at once."""
    admitted, resident, ksize, hv, hk, hpos, bk, bv, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held = scalars[0]
    admissions = scalars[1]
    n_heap = scalars[2]
    n_buf = scalars[3]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            if resident[k]:
                h += 1
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                admissions += 1
                admitted[k] = admissions
        hits[b] = h
        looked_up_here = np.int64(n_total - b0 - b) << shift  # the lowest priority of a hit
        while held > budget:
            lowest = looked_up_here
            at = -1
            for x in range(n_buf):
                if bv[x] < lowest:
                    lowest = bv[x]
                    at = x
            if n_heap > 0 and hv[0] < lowest:
                k = hk[0]
                hpos[k] = -1
                n_heap -= 1
                if n_heap > 0:
                    hv[0] = hv[n_heap]
                    hk[0] = hk[n_heap]
                    _sift_down(hv, hk, hpos, 0, n_heap, 0)
            elif at >= 0:
                k = bk[at]
                n_buf -= 1
                bk[at] = bk[n_buf]
                bv[at] = bv[n_buf]
            else:
                break
            resident[k] = False
            held -= ksize[k]
        # the buffer's keys not looked up here enter the heap; the others are refreshed below
        for x in range(n_buf):
            if bv[x] < looked_up_here:
                hv[n_heap] = bv[x]
                hk[n_heap] = bk[x]
                n_heap += 1
                _sift_up(hv, hk, hpos, 0, n_heap - 1)
        n_buf = 0
        for i in range(s, e):
            k = look[i]
            v = ((n_total - min(np.int64(next_use[i]), n_total)) << shift) | admitted[k]
            j = hpos[k]
            if j < 0:
                bk[n_buf] = k
                bv[n_buf] = v
                n_buf += 1
            else:
                hv[j] = v
                _sift_up(hv, hk, hpos, 0, j)
    scalars[0] = held
    scalars[1] = admissions
    scalars[2] = n_heap
    scalars[3] = n_buf
    return hits


# ----------------------------------------------------------------------------- lfuda


@njit(**_OPTS)
def lfuda(bounds, look, rec, repeated, size, n_keys, budget, shift):
    """``lfuda``: priority K = L + F (F lookups since admission, L the last victim's K),
    ties by least recent touch (heap priority ``K << shift | touch``)."""
    return lfuda_continue(bounds, look, rec, repeated, size, budget, shift, lfuda_state(n_keys))


@njit(**_OPTS)
def lfuda_state(n_keys):
    """An empty LFUDA cache of `n_keys` key ids, for :func:`lfuda_continue`: (freq, prio,
    stamp, resident, ksize, hv, hk, hpos, base, hcount, scalars = [held, age, clock])."""
    return (
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


@njit(**_OPTS)
def lfuda_restamp(state, shift):
    """Renumber the touch stamps of `state`'s resident keys 1..m in their order and pack
    the heap priorities with `shift` (the heap's order is unchanged): between chunks, so
    that the stamps, and the bits they need, stay bounded by the keys and the next chunk's
    lookups instead of growing with the trace."""
    prio, stamp, hv, hk, hcount, scalars = (
        state[1],
        state[2],
        state[5],
        state[6],
        state[9],
        state[10],
    )
    m = hcount[0]
    keys = hk[:m].copy()
    order = np.argsort(stamp[keys])
    for r in range(m):
        stamp[keys[order[r]]] = r + 1
    for i in range(m):
        k = hk[i]
        hv[i] = (prio[k] << shift) | stamp[k]
    scalars[2] = m


@njit(**_OPTS)
def lfuda_continue(bounds, look, rec, repeated, size, budget, shift, state):
    """:func:`lfuda` from the cache `state` (:func:`lfuda_state`, updated in place; its
    priorities packed with `shift`): batches given chunk by chunk replay as if given at once."""
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
                _heap_remove(k, 0, hv, hk, hpos, base, hcount)
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
            k = _heap_pop(0, hv, hk, hpos, base, hcount)
            age = prio[k]
            resident[k] = False
            held -= ksize[k]
        for i in range(s, e):
            k = look[i]
            _heap_push(k, (prio[k] << shift) | stamp[k], 0, hv, hk, hpos, base, hcount)
    scalars[0] = held
    scalars[1] = age
    scalars[2] = clock
    return hits


# ----------------------------------------------------------------------------- random


@njit(**_OPTS)
def _genrand(mt, state):
    """MT19937's next 32-bit word (the generator of Python's ``random``); ``state[0]`` is
    the index into ``mt``."""
    if state[0] >= 624:
        for kk in range(624):
            y = (mt[kk] & 0x80000000) | (mt[(kk + 1) % 624] & 0x7FFFFFFF)
            v = mt[(kk + 397) % 624] ^ (y >> 1)
            if y & 1:
                v ^= 0x9908B0DF
            mt[kk] = v
        state[0] = 0
    y = mt[state[0]]
    state[0] += 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y


@njit(**_OPTS)
def draw(mt, state):
    """``random.random()``: 53 random bits from two words."""
    a = _genrand(mt, state) >> 5
    b = _genrand(mt, state) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


def mt_state(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The state of ``random.Random(seed)`` as arrays the random kernel continues from."""
    import random

    words = random.Random(seed).getstate()[1]
    return np.array(words[:624], dtype=np.int64), np.array([words[624]], dtype=np.int64)


@njit(**_OPTS)
def randomized(bounds, look, size, n_keys, budget, mt, state):
    """``random``: evict a uniformly drawn resident key not touched by the batch (a draw
    on a batch key is redrawn), over a swap-remove list of the resident keys."""
    return randomized_continue(bounds, look, size, budget, random_state(n_keys, mt, state))


@njit(**_OPTS)
def random_state(n_keys, mt, index):
    """An empty random cache of `n_keys` key ids drawing from the generator (`mt`, `index`)
    of :func:`mt_state`, for :func:`randomized_continue`: (pos, mark, ksize, lst, mt, index,
    scalars = [resident keys, held, batches done])."""
    return (
        np.full(n_keys, -1, dtype=np.int64),
        np.full(n_keys, -1, dtype=np.int64),  # mark: the last batch that touched the key
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        mt,
        index,
        np.zeros(3, dtype=np.int64),
    )


@njit(**_OPTS)
def randomized_continue(bounds, look, size, budget, state):
    """:func:`randomized` from the cache `state` (:func:`random_state`, updated in place):
    batches given chunk by chunk replay as if given at once."""
    pos, mark, ksize, lst, mt, index, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    n = scalars[0]
    held = scalars[1]
    done = scalars[2]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        sz = size[b]
        gb = done + b
        h = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            if pos[k] >= 0:
                h += 1
            else:
                ksize[k] = sz
                held += sz
                pos[k] = n
                lst[n] = k
                n += 1
        hits[b] = h
        if held > budget:
            evictable = n - (e - s)
            while held > budget and evictable > 0:
                j = np.int64(draw(mt, index) * n)
                k = lst[j]
                if mark[k] == gb:
                    continue
                n -= 1
                last = lst[n]
                if last != k:
                    lst[j] = last
                    pos[last] = j
                pos[k] = -1
                held -= ksize[k]
                evictable -= 1
    scalars[0] = n
    scalars[1] = held
    scalars[2] = done + n_b
    return hits


# ----------------------------------------------------------------------------- arc

_T1, _T2, _B1, _B2 = 0, 1, 2, 3


@njit(**_OPTS)
def arc(bounds, look, rec, repeated, size, n_keys, budget):
    """``arc``: the batch form of :class:`bmoe.cache.policies.arc.ARC`, step for step."""
    return arc_continue(bounds, look, rec, repeated, size, budget, arc_state(n_keys))


@njit(**_OPTS)
def arc_state(n_keys):
    """An empty ARC cache of `n_keys` key ids, for :func:`arc_continue`: (nxt, prv, where,
    mark, ksize, scalars = [held, t1 bytes, b1 bytes, b2 bytes, batches done], [p]); the
    lists T1, T2, B1, B2."""
    nxt, prv = _node_lists(n_keys, 4)
    return (
        nxt,
        prv,
        np.full(n_keys, -1, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(5, dtype=np.int64),
        np.zeros(1, dtype=np.float64),
    )


@njit(**_OPTS)
def arc_continue(bounds, look, rec, repeated, size, budget, state):
    """:func:`arc` from the cache `state` (:func:`arc_state`, updated in place): batches
    given chunk by chunk replay as if given at once."""
    nxt, prv, where, mark, ksize, scalars, p_now = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held = scalars[0]
    t1_bytes = scalars[1]
    b1_bytes = scalars[2]
    b2_bytes = scalars[3]
    done = scalars[4]
    p = p_now[0]
    fbudget = float(budget)
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        gb = done + b
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            w = where[k]
            if w == _T1:
                h += 1
                t1_bytes -= ksize[k]
                _unlink(k, nxt, prv)
                ksize[k] = sz
                _append(k, -1 - _T2, nxt, prv)
                where[k] = _T2
            elif w == _T2:
                h += 1
                _unlink(k, nxt, prv)
                _append(k, -1 - _T2, nxt, prv)
            else:
                held += sz
                if w == _B1:
                    delta = sz * max(1.0, b2_bytes / b1_bytes)
                    p = min(fbudget, p + delta)
                    b1_bytes -= ksize[k]
                    _unlink(k, nxt, prv)
                    ksize[k] = sz
                    _append(k, -1 - _T2, nxt, prv)
                    where[k] = _T2
                elif w == _B2:
                    delta = sz * max(1.0, b1_bytes / b2_bytes)
                    p = max(0.0, p - delta)
                    b2_bytes -= ksize[k]
                    _unlink(k, nxt, prv)
                    ksize[k] = sz
                    _append(k, -1 - _T2, nxt, prv)
                    where[k] = _T2
                else:
                    ksize[k] = sz
                    _append(k, -1 - _T1, nxt, prv)
                    where[k] = _T1
                    t1_bytes += sz
        hits[b] = h
        if repeated[b]:
            for i in range(s, e):
                k = rec[i]
                w = where[k]
                _unlink(k, nxt, prv)
                _append(k, -1 - w, nxt, prv)
        if held <= budget:
            continue
        t1_done = False
        t2_done = False
        while held > budget:
            k1 = -1
            if not t1_done:
                k1 = nxt[-1 - _T1]
                while k1 >= 0 and mark[k1] == gb:
                    k1 = nxt[k1]
            t1_done = k1 < 0
            from_t1 = k1 >= 0 and t1_bytes > p
            k2 = -1
            if not from_t1:
                if not t2_done:
                    k2 = nxt[-1 - _T2]
                    while k2 >= 0 and mark[k2] == gb:
                        k2 = nxt[k2]
                t2_done = k2 < 0
                if k2 < 0 and k1 < 0:
                    break
                from_t1 = k2 < 0
            if from_t1:
                _unlink(k1, nxt, prv)
                t1_bytes -= ksize[k1]
                _append(k1, -1 - _B1, nxt, prv)
                where[k1] = _B1
                b1_bytes += ksize[k1]
                held -= ksize[k1]
            else:
                _unlink(k2, nxt, prv)
                _append(k2, -1 - _B2, nxt, prv)
                where[k2] = _B2
                b2_bytes += ksize[k2]
                held -= ksize[k2]
        while nxt[-1 - _B1] >= 0 and t1_bytes + b1_bytes > budget:
            k = nxt[-1 - _B1]
            _unlink(k, nxt, prv)
            where[k] = -1
            b1_bytes -= ksize[k]
        while nxt[-1 - _B2] >= 0 and held + b1_bytes + b2_bytes > 2 * budget:
            k = nxt[-1 - _B2]
            _unlink(k, nxt, prv)
            where[k] = -1
            b2_bytes -= ksize[k]
    scalars[0] = held
    scalars[1] = t1_bytes
    scalars[2] = b1_bytes
    scalars[3] = b2_bytes
    scalars[4] = done + n_b
    p_now[0] = p
    return hits


# ----------------------------------------------------------------------------- s3fifo

_SMALL, _MAIN, _GHOST = 0, 1, 2


@njit(inline="always", **_OPTS)
def _trim_ghost(nxt, prv, where, ksize, ghost_bytes, ghost_limit):
    """Drop G's oldest keys while it holds more than `ghost_limit` bytes; G's bytes left."""
    while nxt[-1 - _GHOST] >= 0 and ghost_bytes > ghost_limit:
        k = nxt[-1 - _GHOST]
        _unlink(k, nxt, prv)
        where[k] = -1
        ghost_bytes -= ksize[k]
    return ghost_bytes


@njit(**_OPTS)
def s3fifo(bounds, look, size, n_keys, budget):
    """``s3fifo``: the batch form of :class:`bmoe.cache.policies.s3fifo.S3FIFO`, step for
    step (S a tenth of the budget, G at most the rest, 2-bit counters)."""
    return s3fifo_continue(bounds, look, size, budget, s3fifo_state(n_keys))


@njit(**_OPTS)
def s3fifo_state(n_keys):
    """An empty S3-FIFO cache of `n_keys` key ids, for :func:`s3fifo_continue`: (nxt, prv,
    where, mark, freq, ksize, stuck, scalars = [held, S bytes, G bytes, M keys, batches
    done]); the queues S, M and G."""
    nxt, prv = _node_lists(n_keys, 3)
    return (
        nxt,
        prv,
        np.full(n_keys, -1, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int8),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(5, dtype=np.int64),
    )


@njit(**_OPTS)
def s3fifo_continue(bounds, look, size, budget, state):
    """:func:`s3fifo` from the cache `state` (:func:`s3fifo_state`, updated in place):
    batches given chunk by chunk replay as if given at once."""
    nxt, prv, where, mark, freq, ksize, stuck, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held = scalars[0]
    small_bytes = scalars[1]
    ghost_bytes = scalars[2]
    main_len = scalars[3]
    done = scalars[4]
    small_target = budget // 10
    ghost_limit = budget - small_target
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        gb = done + b
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            w = where[k]
            if 0 <= w <= _MAIN:  # resident: in S or M
                h += 1
                if freq[k] < 3:
                    freq[k] += 1
                continue
            held += sz
            freq[k] = 0
            if w == _GHOST:
                ghost_bytes -= ksize[k]
                _unlink(k, nxt, prv)
                ksize[k] = sz
                _append(k, -1 - _MAIN, nxt, prv)
                where[k] = _MAIN
                main_len += 1
            else:
                ksize[k] = sz
                _append(k, -1 - _SMALL, nxt, prv)
                where[k] = _SMALL
                small_bytes += sz
        hits[b] = h
        if held <= budget:
            continue
        n_stuck = 0
        main_skips = 0
        while held > budget:
            main_open = main_len > 0 and main_skips < main_len
            if nxt[-1 - _SMALL] >= 0 and (small_bytes >= small_target or not main_open):
                k = nxt[-1 - _SMALL]
                _unlink(k, nxt, prv)
                small_bytes -= ksize[k]
                if freq[k] >= 1:
                    _append(k, -1 - _MAIN, nxt, prv)
                    where[k] = _MAIN
                    main_len += 1
                    main_skips = 0
                    continue
                if mark[k] == gb:
                    where[k] = -1
                    stuck[n_stuck] = k
                    n_stuck += 1
                    continue
                _append(k, -1 - _GHOST, nxt, prv)
                where[k] = _GHOST
                ghost_bytes += ksize[k]
            elif main_open:
                k = nxt[-1 - _MAIN]
                _unlink(k, nxt, prv)
                if freq[k] >= 1:
                    freq[k] -= 1
                    _append(k, -1 - _MAIN, nxt, prv)
                    main_skips = 0
                    continue
                if mark[k] == gb:
                    _append(k, -1 - _MAIN, nxt, prv)
                    main_skips += 1
                    continue
                where[k] = -1
                main_len -= 1
            else:
                break
            held -= ksize[k]
            main_skips = 0
        for i in range(n_stuck - 1, -1, -1):  # back at the old end, in order
            k = stuck[i]
            _prepend(k, -1 - _SMALL, nxt, prv)
            where[k] = _SMALL
            small_bytes += ksize[k]
        ghost_bytes = _trim_ghost(nxt, prv, where, ksize, ghost_bytes, ghost_limit)
    scalars[0] = held
    scalars[1] = small_bytes
    scalars[2] = ghost_bytes
    scalars[3] = main_len
    scalars[4] = done + n_b
    return hits


# ----------------------------------------------------------------------------- s3fifo-libcachesim


@njit(**_OPTS)
def s3fifo_libcachesim(bounds, look, size, n_keys, budget):
    """``s3fifo-libcachesim``: the batch form of
    :class:`bmoe.cache.policies.s3fifo.LibCacheSimS3FIFO`, step for step."""
    state = s3fifo_libcachesim_state(n_keys)
    return s3fifo_libcachesim_continue(bounds, look, size, budget, state)


# the counters of an s3fifo-libcachesim state, kept in its last array
_HELD, _S_BYTES, _M_BYTES, _G_BYTES, _M_KEYS, _DONE, _EVICTED = 0, 1, 2, 3, 4, 5, 6


@njit(**_OPTS)
def s3fifo_libcachesim_state(n_keys):
    """An empty cache of `n_keys` key ids for :func:`s3fifo_libcachesim_continue`: (nxt,
    prv, where, mark, freq, ksize, stuck, entering, from_ghost, counters = [held, S bytes,
    M bytes, G bytes, M keys, batches done, evicted yet]); the queues S, M and G."""
    nxt, prv = _node_lists(n_keys, 3)
    return (
        nxt,
        prv,
        np.full(n_keys, -1, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int8),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(7, dtype=np.int64),
    )


@njit(inline="always", **_OPTS)
def _step_main(nxt, prv, where, freq, mark, ksize, gb, counters):
    """One eviction step on M: keys with hits go round again (the counter decremented), the
    batch's keys are passed over, the first other key is evicted. False: none may go."""
    m_list = -1 - _MAIN
    skips = 0
    while skips < counters[_M_KEYS]:
        k = nxt[m_list]
        _unlink(k, nxt, prv)
        if freq[k] >= 1:
            freq[k] -= 1
            skips = 0
        elif mark[k] == gb:
            skips += 1
        else:
            where[k] = -1
            counters[_M_BYTES] -= ksize[k]
            counters[_M_KEYS] -= 1
            counters[_HELD] -= ksize[k]
            return True
        _append(k, m_list, nxt, prv)
    return False


@njit(inline="always", **_OPTS)
def _step_small(nxt, prv, where, freq, mark, ksize, gb, stuck, n_stuck, counters):
    """One eviction step on S: keys with two hits move to M (their counter restarting), the
    batch's other keys are set aside in `stuck`, the first other key is evicted into G.
    Returns (whether one was, the keys set aside so far)."""
    s_list = -1 - _SMALL
    while nxt[s_list] >= 0:
        k = nxt[s_list]
        _unlink(k, nxt, prv)
        counters[_S_BYTES] -= ksize[k]
        if freq[k] >= 2:
            _append(k, -1 - _MAIN, nxt, prv)
            where[k] = _MAIN
            freq[k] = 0
            counters[_M_BYTES] += ksize[k]
            counters[_M_KEYS] += 1
        elif mark[k] == gb:
            where[k] = -1
            stuck[n_stuck] = k
            n_stuck += 1
        else:
            _append(k, -1 - _GHOST, nxt, prv)
            where[k] = _GHOST
            counters[_G_BYTES] += ksize[k]
            counters[_HELD] -= ksize[k]
            return True, n_stuck
    return False, n_stuck


@njit(**_OPTS)
def s3fifo_libcachesim_continue(bounds, look, size, budget, state):
    """:func:`s3fifo_libcachesim` from the cache `state`
    (:func:`s3fifo_libcachesim_state`, updated in place): batches given chunk by chunk
    replay as if given at once."""
    nxt, prv, where, mark, freq, ksize, stuck, entering, from_ghost, counters = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    small_size = np.int64(float(budget) * 0.1)
    main_size = budget - small_size
    ghost_limit = np.int64(float(budget) * 0.9)
    s_list = -1 - _SMALL
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        gb = counters[_DONE] + b
        sz = size[b]
        h = 0
        n_new = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            w = where[k]
            if 0 <= w <= _MAIN:
                h += 1
                if freq[k] < 3:
                    freq[k] += 1
                continue
            counters[_HELD] += sz
            from_ghost[n_new] = w == _GHOST
            if w == _GHOST:
                counters[_G_BYTES] -= ksize[k]
                _unlink(k, nxt, prv)
                where[k] = -1
            ksize[k] = sz
            entering[n_new] = k
            n_new += 1
        hits[b] = h
        n_stuck = 0
        if counters[_HELD] > budget:  # the evictions come before the new keys enter
            counters[_EVICTED] = 1
        while counters[_HELD] > budget:
            if counters[_M_BYTES] > main_size or nxt[s_list] < 0:
                if _step_main(nxt, prv, where, freq, mark, ksize, gb, counters):
                    continue
                if nxt[s_list] < 0:
                    break
                evicted, n_stuck = _step_small(
                    nxt, prv, where, freq, mark, ksize, gb, stuck, n_stuck, counters
                )
                if not evicted:
                    break
            else:  # when S runs out, the next step takes M
                _, n_stuck = _step_small(
                    nxt, prv, where, freq, mark, ksize, gb, stuck, n_stuck, counters
                )
        for i in range(n_stuck - 1, -1, -1):  # back at the old end, in order
            k = stuck[i]
            _prepend(k, s_list, nxt, prv)
            where[k] = _SMALL
            counters[_S_BYTES] += ksize[k]
        for i in range(n_new):  # the new keys enter
            k = entering[i]
            freq[k] = 0
            if from_ghost[i] or (counters[_EVICTED] == 0 and counters[_S_BYTES] >= small_size):
                _append(k, -1 - _MAIN, nxt, prv)
                where[k] = _MAIN
                counters[_M_BYTES] += sz
                counters[_M_KEYS] += 1
            else:
                _append(k, s_list, nxt, prv)
                where[k] = _SMALL
                counters[_S_BYTES] += sz
        counters[_G_BYTES] = _trim_ghost(nxt, prv, where, ksize, counters[_G_BYTES], ghost_limit)
    counters[_DONE] += n_b
    return hits


# ----------------------------------------------------------------------------- stack distances


@njit(**_OPTS)
def lru_byte_distances(bounds, look, rec, repeated, size, n_keys, batch_semantics):
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


@njit(**_OPTS)
def distances_state(n_keys, room):
    """No key touched yet, a tree with room for `room` touches, for
    :func:`lru_byte_distances_continue`: (tree, last, prevb, scalars = [bytes of the keys
    touched, clock, batches done])."""
    return (
        np.zeros(room + 1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),  # last touch (1-based), 0 = never
        np.full(n_keys, -1, dtype=np.int64),  # the last batch that looked the key up
        np.zeros(3, dtype=np.int64),
    )


@njit(**_OPTS)
def distances_restart(state, key_bytes, room):
    """`state` (:func:`distances_state`) with its touched keys renumbered 1..m in touch
    order and a new tree holding their `key_bytes` with room for `room` more touches:
    between chunks, so the tree is bounded by the keys and a chunk, not the trace."""
    _, last, prevb, scalars = state
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
    return new, last, prevb, scalars


@njit(**_OPTS)
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


@njit(**_OPTS)
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


# ----------------------------------------------------------------------------- batches


@njit(**_OPTS)
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


@njit(**_OPTS)
def _row(order, i):
    return order[i] if len(order) else i


@njit(**_OPTS)
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


@njit(**_OPTS)
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


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_heap() -> None:
    """Give the C heap's free memory back to the system. The kernels allocate their state
    and results with malloc; run from worker threads, glibc keeps what they freed in one
    arena per thread, which on a 10 M-row curve holds ~100 MiB nobody uses."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# ----------------------------------------------------------------------------- lfuda-libcachesim


@njit(inline="always", **_OPTS)
def _strand_below(age, shift, hv, hk, hpos, base, hcount, stranded):
    """Take the keys whose priority fell below the age off the heap's top (stranded: never
    a victim while a key at or above the age remains)."""
    while hcount[0] > 0 and (hv[0] >> shift) < age:
        stranded[_heap_pop(0, hv, hk, hpos, base, hcount)] = True


@njit(inline="always", **_OPTS)
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


@njit(**_OPTS)
def lfuda_libcachesim(bounds, look, rec, repeated, size, n_keys, budget, shift):
    """``lfuda-libcachesim``: the batch form of
    :class:`bmoe.cache.policies.lfuda.LibCacheSimLFUDA`, step for step. Returns the hits per
    batch and whether every priority fitted above the touch counter (False: the replay is
    too long for this policy's growing priorities)."""
    state = lfuda_libcachesim_state(n_keys)
    return lfuda_libcachesim_continue(bounds, look, rec, repeated, size, budget, shift, state)


@njit(**_OPTS)
def lfuda_libcachesim_state(n_keys):
    """An empty cache of `n_keys` key ids for :func:`lfuda_libcachesim_continue`: (prio,
    stamp, resident, stranded, ksize, hv, hk, hpos, base, hcount, scalars = [held, age,
    clock])."""
    return (
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


@njit(**_OPTS)
def lfuda_libcachesim_restamp(state, shift):
    """Renumber the touch stamps of the resident keys (in the heap or stranded) 1..m in
    their order and pack the heap priorities with `shift`, as :func:`lfuda_restamp`."""
    prio, stamp, resident, hv, hk, hcount, scalars = (
        state[0], state[1], state[2], state[5], state[6], state[9], state[10],
    )  # fmt: skip
    keys = np.flatnonzero(resident)
    order = np.argsort(stamp[keys], kind="stable")
    for r in range(len(keys)):
        stamp[keys[order[r]]] = r + 1
    for i in range(hcount[0]):
        k = hk[i]
        hv[i] = (prio[k] << shift) | stamp[k]
    scalars[2] = len(keys)


@njit(**_OPTS)
def lfuda_libcachesim_continue(bounds, look, rec, repeated, size, budget, shift, state):
    """:func:`lfuda_libcachesim` from the cache `state` (:func:`lfuda_libcachesim_state`,
    updated in place; its priorities packed with `shift`): batches given chunk by chunk
    replay as if given at once."""
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
                    _heap_remove(k, 0, hv, hk, hpos, base, hcount)
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
                k = _heap_pop(0, hv, hk, hpos, base, hcount)
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
            _heap_push(k, (prio[k] << shift) | stamp[k], 0, hv, hk, hpos, base, hcount)
    scalars[0], scalars[1], scalars[2] = held, age, clock
    return hits, True
