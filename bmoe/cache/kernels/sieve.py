"""``sieve``: the batch form of :class:`bmoe.cache.policies.sieve.Sieve`, step for step: one
FIFO queue (oldest at the head), a visited bit per key and the hand (a key id; negative: the
oldest key)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS, append, node_lists, unlink
from bmoe.cache.policies.sieve import Sieve
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


class SieveState(NamedTuple):
    nxt: np.ndarray  # the queue: a node per key id, then its sentinel
    prv: np.ndarray
    resident: np.ndarray  # per key id
    visited: np.ndarray  # per key id, its bit
    mark: np.ndarray  # per key id, the last batch that touched it
    ksize: np.ndarray
    entering: np.ndarray  # room for the keys a batch admits
    scalars: np.ndarray  # [held, hand, batches done, keys in the queue]


def sieve_state(n_keys: int) -> SieveState:
    """An empty cache of `n_keys` key ids."""
    nxt, prv = node_lists(n_keys, 1)
    scalars = np.zeros(4, dtype=np.int64)
    scalars[1] = -1
    return SieveState(
        nxt,
        prv,
        np.zeros(n_keys, dtype=np.bool_),
        np.zeros(n_keys, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        scalars,
    )


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, sieve_state(1)), **OPTS)
def sieve_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
    nxt, prv, resident, visited, mark, ksize, entering, scalars = state
    n_b = len(bounds) - 1
    hits = np.zeros(n_b, dtype=np.int64)
    held, hand, done, queued = scalars[0], scalars[1], scalars[2], scalars[3]
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
                visited[k] = 1
            else:
                resident[k] = True
                ksize[k] = sz
                held += sz
                entering[n_new] = k
                n_new += 1
        hits[b] = h
        k = hand
        passed = 0  # the batch's keys passed over in a row, their bit clear
        while held > budget and queued > 0 and passed < queued:
            if k < 0:
                k = nxt[-1]
            if visited[k]:
                visited[k] = 0
                passed = 0
                k = nxt[k]
            elif mark[k] == gb:
                passed += 1
                k = nxt[k]
            else:
                newer = nxt[k]
                unlink(k, nxt, prv)
                resident[k] = False
                held -= ksize[k]
                queued -= 1
                hand = newer
                k = newer
                passed = 0
        for i in range(n_new):  # the new keys enter after the evictions
            k = entering[i]
            append(k, -1, nxt, prv)
            visited[k] = 0
        queued += n_new
    scalars[0], scalars[1], scalars[2], scalars[3] = held, hand, done + n_b, queued
    return hits


def sieve(bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int) -> Arr:
    """The whole-trace call: :func:`sieve_continue` from an empty cache."""
    return sieve_continue(bounds, look, size, budget, sieve_state(n_keys))


def new(setup: Setup) -> SieveState:
    return sieve_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return sieve_continue(c.bounds, c.look, c.size, r.budget, r.state)


PER_KEY = ("nxt", "prv", "resident", "visited", "mark", "ksize", "entering")
SPECS = (KernelSpec(Sieve, new, step, PER_KEY),)
