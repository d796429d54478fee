"""The structures the policy kernels share: linked lists over key ids and an indexed heap.

Every helper is compiled inline into the kernel that calls it. numba's on-disk cache is
invalidated per source file only, so a kernel module that uses these helpers also carries
:data:`SHARED_STAMP` (a digest of this file, checked by ``tests/test_cache_kernels.py``):
changing this file means changing the stamp in each of them, which recompiles them.
"""

from __future__ import annotations

import numpy as np

from bmoe.compiled import njit

#: the options every kernel is compiled with: cached on disk, releasing the GIL
OPTS = {"cache": True, "nogil": True, "boundscheck": False}
#: the same, for a helper inlined into its callers
INLINE = {**OPTS, "inline": "always"}

# ----------------------------------------------------------------------------- linked lists
# Doubly linked lists over key ids, each circular through a sentinel node: ``nxt``/``prv`` hold
# a slot per key (``0..n_keys-1``) and then a slot per list, list ``l``'s sentinel being node
# ``-1 - l`` (numba wraps negative indices, so it is the arrays' ``l``-th slot from the end).
# ``nxt[s]`` is list ``s``'s head and ``prv[s]`` its tail, the sentinel itself (negative) when
# it is empty; walking ``nxt`` off a list's end meets a negative id. Every operation is free of
# branches. A key is in at most one list at a time.


def node_lists(n_keys: int, n_lists: int) -> tuple[np.ndarray, np.ndarray]:
    """``nxt, prv`` of `n_lists` empty lists over `n_keys` key ids (plain numpy: the state
    factories run in Python, which spares numba a compiled function to load each)."""
    nxt = np.full(n_keys + n_lists, -1, dtype=np.int32)
    nxt[n_keys:] = np.arange(-n_lists, 0, dtype=np.int32)
    return nxt, nxt.copy()


@njit(**INLINE)
def unlink(k, nxt, prv):
    """Take key `k` out of its list."""
    p = prv[k]
    n = nxt[k]
    nxt[p] = n
    prv[n] = p


@njit(**INLINE)
def append(k, s, nxt, prv):
    """Put key `k` at the tail of list `s` (its sentinel node, negative)."""
    t = prv[s]
    nxt[t] = k
    prv[k] = t
    nxt[k] = s
    prv[s] = k


@njit(**INLINE)
def prepend(k, s, nxt, prv):
    """Put key `k` at the head of list `s`."""
    h = nxt[s]
    prv[h] = k
    nxt[k] = h
    prv[k] = s
    nxt[s] = k


# ----------------------------------------------------------------------------- indexed heap
# A 4-ary min-heap per part of (priority, key) pairs, the priority one packed int64 (unique: its
# low bits are a touch or admission counter), with each key's position kept (``hpos``, -1 when
# absent) so a key can leave the heap from anywhere. Part ``j`` owns the slots
# ``base[j] .. base[j] + count[j]`` of ``hv`` (priorities) and ``hk`` (keys).


@njit(**INLINE)
def sift_up(hv, hk, hpos, base, i):
    """Move the entry at heap slot `i` up to its place."""
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


@njit(**INLINE)
def sift_down(hv, hk, hpos, base, n, i):
    """Move the entry at heap slot `i` (of `n`) down to its place."""
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


@njit(**INLINE)
def heap_push(k, v, j, hv, hk, hpos, base, count):
    """Add key `k` at priority `v` to part `j`'s heap."""
    n = count[j]
    hv[base[j] + n] = v
    hk[base[j] + n] = k
    count[j] = n + 1
    sift_up(hv, hk, hpos, base[j], n)


@njit(**INLINE)
def heap_remove(k, j, hv, hk, hpos, base, count):
    """Take key `k` out of part `j`'s heap, wherever it is."""
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
        sift_up(hv, hk, hpos, b0, i)
    else:
        sift_down(hv, hk, hpos, b0, n, i)


@njit(**INLINE)
def heap_pop(j, hv, hk, hpos, base, count):
    """Take the lowest priority's key off part `j`'s heap."""
    k = hk[base[j]]
    heap_remove(k, j, hv, hk, hpos, base, count)
    return k


@njit(**INLINE)
def restamp_heap(prio, stamp, keys, hv, hk, base, hcount, shift):
    """Renumber the touch stamps of `keys` 1..m in their order and repack the priorities
    of every heap entry as ``prio << shift | stamp`` (each heap's order unchanged): between
    chunks, so the stamps stay bounded by the keys and the next chunk's lookups. Returns m."""
    order = np.argsort(stamp[keys], kind="stable")
    for r in range(len(keys)):
        stamp[keys[order[r]]] = r + 1
    for j in range(len(base)):
        for i in range(hcount[j]):
            k = hk[base[j] + i]
            hv[base[j] + i] = (prio[k] << shift) | stamp[k]
    return len(keys)
