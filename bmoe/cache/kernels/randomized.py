"""``random``: evict a uniformly drawn resident key not touched by the batch (a draw on a
batch key is redrawn), over a swap-remove list of the resident keys; the live class is
:class:`bmoe.cache.policies.randomized.Random`, whose generator (Python's MT19937) the
kernel draws from word for word."""

from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import OPTS
from bmoe.cache.policies.randomized import Random
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring


@njit(**OPTS)
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


@njit(**OPTS)
def draw(mt, state):
    """``random.random()``: 53 random bits from two words."""
    a = _genrand(mt, state) >> 5
    b = _genrand(mt, state) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


def mt_state(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The state of ``random.Random(seed)`` as arrays the random kernel continues from."""
    words = random.Random(seed).getstate()[1]
    return np.array(words[:624], dtype=np.int64), np.array([words[624]], dtype=np.int64)


class RandomState(NamedTuple):
    pos: np.ndarray  # per key id, its slot in ``lst`` (-1: not resident)
    mark: np.ndarray  # per key id, the last batch that touched it
    ksize: np.ndarray
    lst: np.ndarray  # the resident keys
    mt: np.ndarray  # the generator's words
    mt_at: np.ndarray  # [the generator's index into its words]
    scalars: np.ndarray  # [resident keys, held, batches done]


def random_state(n_keys: int, mt: Arr, index: Arr) -> RandomState:
    """An empty cache of `n_keys` key ids drawing from the generator (`mt`, `index`) of
    :func:`mt_state`."""
    return RandomState(
        np.full(n_keys, -1, dtype=np.int64),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        mt,
        index,
        np.zeros(3, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, random_state(1, *mt_state(0))), **OPTS)
def randomized_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
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


def randomized(
    bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int, mt: Arr, index: Arr
) -> Arr:
    """The whole-trace call: :func:`randomized_continue` from an empty cache."""
    return randomized_continue(bounds, look, size, budget, random_state(n_keys, mt, index))


def new(setup: Setup) -> RandomState:
    return random_state(setup.n_keys, *mt_state(setup.seed))


def step(r: Replay, c: Chunk) -> np.ndarray:
    return randomized_continue(c.bounds, c.look, c.size, r.budget, r.state)


SPECS = (KernelSpec(Random, new, step, ("pos", "mark", "ksize", "lst")),)
