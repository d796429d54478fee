"""``clock``: the batch form of :class:`bmoe.cache.policies.clock.Clock`, step for step: one
FIFO queue (oldest at the head) and a bit per key."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists, unlink
from bmoe.cache.policies.clock import Clock
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class ClockState(NamedTuple):
    nxt: np.ndarray  # the queue: a node per key id, then its sentinel
    prv: np.ndarray
    resident: np.ndarray  # per key id
    bit: np.ndarray  # per key id
    mark: np.ndarray  # per key id, the last batch that touched it
    ksize: np.ndarray
    entering: np.ndarray  # room for the keys a batch admits
    scalars: np.ndarray  # [held, batches done, keys in the queue]


def clock_state(n_keys: int) -> ClockState:
    """An empty cache of `n_keys` key ids."""
    nxt, prv = node_lists(n_keys, 1)
    return ClockState(
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(3, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, clock_state(1)), **OPTS)
def clock_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
    nxt, prv, resident, bit, mark, ksize, entering, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held, done, queued = scalars[0], scalars[1], scalars[2]
    for b in range(n_b):
        s, e = bounds[b], bounds[b + 1]
        gb = done + b
        sz = size[b]
        h = 0
        n_new = 0
        for i in range(s, e):
            k = look[i]
            mark[k] = gb
            if resident[k]:
                h += 1
                bit[k] = 1
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                entering[n_new] = k
                n_new += 1
        hits[b] = h
        passed = 0  # the batch's keys gone round in a row, their bit clear
        while held > budget and queued > 0 and passed < queued:
            k = nxt[-1]
            unlink(k, nxt, prv)
            if bit[k]:
                bit[k] = 0
                append(k, -1, nxt, prv)
                passed = 0
            elif mark[k] == gb:
                append(k, -1, nxt, prv)
                passed += 1
            else:
                resident[k] = False
                held -= ksize[k]
                queued -= 1
                passed = 0
        for i in range(n_new):  # the new keys enter after the evictions
            k = entering[i]
            append(k, -1, nxt, prv)
            bit[k] = 0
        queued += n_new
    scalars[0], scalars[1], scalars[2] = held, done + n_b, queued
    return hits


def clock(bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int) -> Arr:
    """The whole-trace call: :func:`clock_continue` from an empty cache."""
    return clock_continue(bounds, look, size, budget, clock_state(n_keys))


def new(setup: Setup) -> ClockState:
    return clock_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return clock_continue(c.bounds, c.look, c.size, r.budget, r.state)


PER_KEY = ("nxt", "prv", "resident", "bit", "mark", "ksize", "entering")
SPECS = (KernelSpec(Clock, new, step, PER_KEY),)
