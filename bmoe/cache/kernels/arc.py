"""``arc``: the batch form of :class:`bmoe.cache.policies.arc.ARC`, step for step: the lists
T1, T2 (resident) and their ghosts B1, B2, a byte target ``p`` for T1."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists, unlink
from bmoe.cache.policies.arc import ARC
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring

_T1, _T2, _B1, _B2 = 0, 1, 2, 3


class ARCState(NamedTuple):
    nxt: np.ndarray  # the lists T1, T2, B1, B2: a node per key id, then their sentinels
    prv: np.ndarray
    where: np.ndarray  # per key id, its list (-1: none)
    mark: np.ndarray  # per key id, the last batch that touched it
    ksize: np.ndarray
    scalars: np.ndarray  # [held, T1 bytes, B1 bytes, B2 bytes, batches done]
    p_now: np.ndarray  # [p]


def arc_state(n_keys: int) -> ARCState:
    """An empty ARC cache of `n_keys` key ids."""
    nxt, prv = node_lists(n_keys, 4)
    return ARCState(
        nxt,
        prv,
        np.full(n_keys, -1, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(5, dtype=np.int64),
        np.zeros(1, dtype=np.float64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i4 b1 i8"), 0, arc_state(1)), **OPTS)
def arc_continue(bounds, look, rec, repeated, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
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
                unlink(k, nxt, prv)
                ksize[k] = sz
                append(k, -1 - _T2, nxt, prv)
                where[k] = _T2
            elif w == _T2:
                h += 1
                unlink(k, nxt, prv)
                append(k, -1 - _T2, nxt, prv)
            else:
                held += sz
                if w == _B1:
                    delta = sz * max(1.0, b2_bytes / b1_bytes)
                    p = min(fbudget, p + delta)
                    b1_bytes -= ksize[k]
                    unlink(k, nxt, prv)
                    ksize[k] = sz
                    append(k, -1 - _T2, nxt, prv)
                    where[k] = _T2
                elif w == _B2:
                    delta = sz * max(1.0, b1_bytes / b2_bytes)
                    p = max(0.0, p - delta)
                    b2_bytes -= ksize[k]
                    unlink(k, nxt, prv)
                    ksize[k] = sz
                    append(k, -1 - _T2, nxt, prv)
                    where[k] = _T2
                else:
                    ksize[k] = sz
                    append(k, -1 - _T1, nxt, prv)
                    where[k] = _T1
                    t1_bytes += sz
        hits[b] = h
        if repeated[b]:
            for i in range(s, e):
                k = rec[i]
                w = where[k]
                unlink(k, nxt, prv)
                append(k, -1 - w, nxt, prv)
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
                unlink(k1, nxt, prv)
                t1_bytes -= ksize[k1]
                append(k1, -1 - _B1, nxt, prv)
                where[k1] = _B1
                b1_bytes += ksize[k1]
                held -= ksize[k1]
            else:
                unlink(k2, nxt, prv)
                append(k2, -1 - _B2, nxt, prv)
                where[k2] = _B2
                b2_bytes += ksize[k2]
                held -= ksize[k2]
        while nxt[-1 - _B1] >= 0 and t1_bytes + b1_bytes > budget:
            k = nxt[-1 - _B1]
            unlink(k, nxt, prv)
            where[k] = -1
            b1_bytes -= ksize[k]
        while nxt[-1 - _B2] >= 0 and held + b1_bytes + b2_bytes > 2 * budget:
            k = nxt[-1 - _B2]
            unlink(k, nxt, prv)
            where[k] = -1
            b2_bytes -= ksize[k]
    scalars[0] = held
    scalars[1] = t1_bytes
    scalars[2] = b1_bytes
    scalars[3] = b2_bytes
    scalars[4] = done + n_b
    p_now[0] = p
    return hits


def arc(
    bounds: Arr, look: Arr, rec: Arr, repeated: Arr, size: Arr, n_keys: int, budget: int
) -> Arr:
    """The whole-trace call: :func:`arc_continue` from an empty cache."""
    return arc_continue(bounds, look, rec, repeated, size, budget, arc_state(n_keys))


def new(setup: Setup) -> ARCState:
    return arc_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return arc_continue(c.bounds, c.look, c.rec, c.repeated, c.size, r.budget, r.state)


SPECS = (KernelSpec(ARC, new, step, ("nxt", "prv", "where", "mark", "ksize")),)
