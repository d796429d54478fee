"""``fifo``: the batch form of :class:`bmoe.cache.policies.fifo.FIFO`, step for step: one
queue in admission order (oldest at the head), walked from the head once per batch past the
keys the batch touched."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists, unlink
from bmoe.cache.policies.fifo import FIFO
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class FIFOState(NamedTuple):
    nxt: np.ndarray  # the queue: a node per key id, then its sentinel
    prv: np.ndarray
    resident: np.ndarray  # per key id
    mark: np.ndarray  # per key id, the last batch that touched it
    ksize: np.ndarray
    scalars: np.ndarray  # [held, batches done]


def fifo_state(n_keys: int) -> FIFOState:
    """An empty cache of `n_keys` key ids."""
    nxt, prv = node_lists(n_keys, 1)
    return FIFOState(
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.bool_),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(2, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, fifo_state(1)), **OPTS)
def fifo_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
    nxt, prv, resident, mark, ksize, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held, done = scalars[0], scalars[1]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        gb = done + b
        sz = size[b]
        h = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            if resident[k]:
                h += 1
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                append(k, -1, nxt, prv)  # the newest: no eviction of this batch reaches it
        hits[b] = h
        k = nxt[-1]
        while held > budget and k >= 0:
            newer = nxt[k]
            if mark[k] != gb:
                unlink(k, nxt, prv)
                resident[k] = False
                held -= ksize[k]
            k = newer
    scalars[0], scalars[1] = held, done + n_b
    return hits


def fifo(bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int) -> Arr:
    """The whole-trace call: :func:`fifo_continue` from an empty cache."""
    return fifo_continue(bounds, look, size, budget, fifo_state(n_keys))


def new(setup: Setup) -> FIFOState:
    return fifo_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return fifo_continue(c.bounds, c.look, c.size, r.budget, r.state)


PER_KEY = ("nxt", "prv", "resident", "mark", "ksize")
SPECS = (KernelSpec(FIFO, new, step, PER_KEY),)
