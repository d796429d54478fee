"""``belady``: evict the furthest next use, ties to the earliest admitted; the live class is
:class:`bmoe.cache.policies.belady.Belady`, which reads the future: every chunk comes with
its lookups' next uses (:func:`bmoe.cache.kernels.batches.next_uses`).

Priority ``(batches - next use) << shift | admission``, the lowest the victim; a next use at
or past the number of batches means never. The keys a batch admits wait one batch in a small
buffer before they enter the heap: Belady often evicts a key it has just admitted (its next
use is far), and a victim taken from the buffer costs a scan of a few entries instead of a
push and a pop. The victim is the lowest priority of the heap's top and the buffer, so the
order is the heap's alone. A hit key still in the heap takes its new priority with one sift
up (its old next use was this batch, so the new priority is lower); a hit key in the buffer
stays there with its new priority. A key looked up here has priority at least
``(batches - this batch) << shift``, above every other key's: eviction stops there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup, counter_bits
from bmoe.cache.kernels.shared import OPTS, sift_down, sift_up
from bmoe.cache.policies.belady import Belady
from bmoe.compiled import arrays, njit
from bmoe.errors import BmoeError

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class BeladyState(NamedTuple):
    admitted: np.ndarray  # per key id, its admission number
    resident: np.ndarray
    ksize: np.ndarray
    hv: np.ndarray  # the heap: priorities
    hk: np.ndarray  # keys
    hpos: np.ndarray  # per key id, its heap slot (-1: out of the heap)
    bk: np.ndarray  # the buffer of the last batch's admissions: keys
    bv: np.ndarray  # their priorities
    scalars: np.ndarray  # [held, admissions, heap size, buffer size]


def belady_state(n_keys: int) -> BeladyState:
    """An empty cache of `n_keys` key ids."""
    return BeladyState(
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


@njit(ahead=lambda: (*arrays("i8 i4 i8 i4"), 0, 0, 0, 0, belady_state(1)), **OPTS)
def belady_continue(bounds, look, size, next_use, n_total, b0, budget, shift, state):
    """Replay the batches numbered from `b0` on of a replay of `n_total`, their next uses
    numbered so, from `state` (updated in place)."""
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
                    sift_down(hv, hk, hpos, 0, n_heap, 0)
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
                sift_up(hv, hk, hpos, 0, n_heap - 1)
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
                sift_up(hv, hk, hpos, 0, j)
    scalars[0] = held
    scalars[1] = admissions
    scalars[2] = n_heap
    scalars[3] = n_buf
    return hits


def belady(
    bounds: Arr, look: Arr, size: Arr, next_use: Arr, n_keys: int, budget: int, shift: int
) -> Arr:
    """The whole-trace call: :func:`belady_continue` of every batch from an empty cache."""
    n_b = len(bounds) - 1
    return belady_continue(
        bounds, look, size, next_use, n_b, 0, budget, shift, belady_state(n_keys)
    )


def new(setup: Setup) -> BeladyState:
    return belady_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    if c.next_use is None:
        raise BmoeError(f"policy {r.name!r} needs each lookup's next use")
    shift = counter_bits(c.total_lookups)
    if 2 * shift > 62:
        raise BmoeError(f"{c.total_lookups:,} lookups are more than one replay can count")
    return belady_continue(
        c.bounds, c.look, c.size, c.next_use, c.n_total, c.first, r.budget, shift, r.state
    )


PER_KEY = ("admitted", "resident", "ksize", "hv", "hk", "hpos", "bk", "bv")
SPECS = (KernelSpec(Belady, new, step, PER_KEY),)
