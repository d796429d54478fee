"""``s3fifo`` and ``s3fifo-libcachesim``: the batch forms of
:class:`bmoe.cache.policies.s3fifo.S3FIFO` and
:class:`~bmoe.cache.policies.s3fifo.LibCacheSimS3FIFO`, step for step: the queues S (small),
M (main) and G (the ghosts of S's victims), 2-bit counters."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bmoe.cache.kernels.base import Arr, Chunk, KernelSpec, Replay, Setup
from bmoe.cache.kernels.shared import INLINE, OPTS, append, node_lists, prepend, unlink
from bmoe.cache.policies.s3fifo import S3FIFO, LibCacheSimS3FIFO
from bmoe.compiled import arrays, njit

SHARED_STAMP = "0a4de18bed56"  # sha256 of shared.py: see its docstring

_SMALL, _MAIN, _GHOST = 0, 1, 2


@njit(**INLINE)
def _trim_ghost(nxt, prv, where, ksize, ghost_bytes, ghost_limit):
    """Drop G's oldest keys while it holds more than `ghost_limit` bytes; G's bytes left."""
    while nxt[-1 - _GHOST] >= 0 and ghost_bytes > ghost_limit:
        k = nxt[-1 - _GHOST]
        unlink(k, nxt, prv)
        where[k] = -1
        ghost_bytes -= ksize[k]
    return ghost_bytes


class S3FIFOState(NamedTuple):
    nxt: np.ndarray  # the queues S, M and G: a node per key id, then their sentinels
    prv: np.ndarray
    where: np.ndarray  # per key id, its queue (-1: none)
    mark: np.ndarray  # per key id, the last batch that touched it
    freq: np.ndarray  # per key id, its 2-bit counter
    ksize: np.ndarray
    stuck: np.ndarray  # room for the keys a batch sets aside
    scalars: np.ndarray  # [held, S bytes, G bytes, M keys, batches done]


def s3fifo_state(n_keys: int) -> S3FIFOState:
    """An empty S3-FIFO cache of `n_keys` key ids (S a tenth of the budget, G at most the
    rest)."""
    nxt, prv = node_lists(n_keys, 3)
    return S3FIFOState(
        nxt,
        prv,
        np.full(n_keys, -1, dtype=np.int8),
        np.full(n_keys, -1, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int8),
        np.zeros(n_keys, dtype=np.int64),
        np.zeros(n_keys, dtype=np.int32),
        np.zeros(5, dtype=np.int64),
    )


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, s3fifo_state(1)), **OPTS)
def s3fifo_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
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
                unlink(k, nxt, prv)
                ksize[k] = sz
                append(k, -1 - _MAIN, nxt, prv)
                where[k] = _MAIN
                main_len += 1
            else:
                ksize[k] = sz
                append(k, -1 - _SMALL, nxt, prv)
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
                unlink(k, nxt, prv)
                small_bytes -= ksize[k]
                if freq[k] >= 1:
                    append(k, -1 - _MAIN, nxt, prv)
                    where[k] = _MAIN
                    main_len += 1
                    main_skips = 0
                    continue
                if mark[k] == gb:
                    where[k] = -1
                    stuck[n_stuck] = k
                    n_stuck += 1
                    continue
                append(k, -1 - _GHOST, nxt, prv)
                where[k] = _GHOST
                ghost_bytes += ksize[k]
            elif main_open:
                k = nxt[-1 - _MAIN]
                unlink(k, nxt, prv)
                if freq[k] >= 1:
                    freq[k] -= 1
                    append(k, -1 - _MAIN, nxt, prv)
                    main_skips = 0
                    continue
                if mark[k] == gb:
                    append(k, -1 - _MAIN, nxt, prv)
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
            prepend(k, -1 - _SMALL, nxt, prv)
            where[k] = _SMALL
            small_bytes += ksize[k]
        ghost_bytes = _trim_ghost(nxt, prv, where, ksize, ghost_bytes, ghost_limit)
    scalars[0] = held
    scalars[1] = small_bytes
    scalars[2] = ghost_bytes
    scalars[3] = main_len
    scalars[4] = done + n_b
    return hits


def s3fifo(bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int) -> Arr:
    """The whole-trace call: :func:`s3fifo_continue` from an empty cache."""
    return s3fifo_continue(bounds, look, size, budget, s3fifo_state(n_keys))


def new(setup: Setup) -> S3FIFOState:
    return s3fifo_state(setup.n_keys)


def step(r: Replay, c: Chunk) -> np.ndarray:
    return s3fifo_continue(c.bounds, c.look, c.size, r.budget, r.state)


# ----------------------------------------------------------------------------- s3fifo-libcachesim

# the counters of an s3fifo-libcachesim state, kept in its last array
_HELD, _S_BYTES, _M_BYTES, _G_BYTES, _M_KEYS, _DONE, _EVICTED = 0, 1, 2, 3, 4, 5, 6


class LibCacheSimS3FIFOState(NamedTuple):
    nxt: np.ndarray  # the queues S, M and G: a node per key id, then their sentinels
    prv: np.ndarray
    where: np.ndarray  # per key id, its queue (-1: none)
    mark: np.ndarray  # per key id, the last batch that touched it
    freq: np.ndarray  # per key id, its 2-bit counter
    ksize: np.ndarray
    stuck: np.ndarray  # room for the keys a batch sets aside
    entering: np.ndarray  # room for the keys a batch admits
    from_ghost: np.ndarray  # and whether each came from G
    counters: np.ndarray  # [held, S bytes, M bytes, G bytes, M keys, batches done, evicted yet]


def s3fifo_libcachesim_state(n_keys: int) -> LibCacheSimS3FIFOState:
    """An empty cache of `n_keys` key ids."""
    nxt, prv = node_lists(n_keys, 3)
    return LibCacheSimS3FIFOState(
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


@njit(**INLINE)
def _step_main(nxt, prv, where, freq, mark, ksize, gb, counters):
    """One eviction step on M: keys with hits go round again (the counter decremented), the
    batch's keys are passed over, the first other key is evicted. False: none may go."""
    m_list = -1 - _MAIN
    skips = 0
    while skips < counters[_M_KEYS]:
        k = nxt[m_list]
        unlink(k, nxt, prv)
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
        append(k, m_list, nxt, prv)
    return False


@njit(**INLINE)
def _step_small(nxt, prv, where, freq, mark, ksize, gb, stuck, n_stuck, counters):
    """One eviction step on S: keys with two hits move to M (their counter restarting), the
    batch's other keys are set aside in `stuck`, the first other key is evicted into G.
    Returns (whether one was, the keys set aside so far)."""
    s_list = -1 - _SMALL
    while nxt[s_list] >= 0:
        k = nxt[s_list]
        unlink(k, nxt, prv)
        counters[_S_BYTES] -= ksize[k]
        if freq[k] >= 2:
            append(k, -1 - _MAIN, nxt, prv)
            where[k] = _MAIN
            freq[k] = 0
            counters[_M_BYTES] += ksize[k]
            counters[_M_KEYS] += 1
        elif mark[k] == gb:
            where[k] = -1
            stuck[n_stuck] = k
            n_stuck += 1
        else:
            append(k, -1 - _GHOST, nxt, prv)
            where[k] = _GHOST
            counters[_G_BYTES] += ksize[k]
            counters[_HELD] -= ksize[k]
            return True, n_stuck
    return False, n_stuck


@njit(ahead=lambda: (*arrays("i8 i4 i8"), 0, s3fifo_libcachesim_state(1)), **OPTS)
def s3fifo_libcachesim_continue(bounds, look, size, budget, state):
    """Replay the batches from `state` (updated in place)."""
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
                unlink(k, nxt, prv)
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
            prepend(k, s_list, nxt, prv)
            where[k] = _SMALL
            counters[_S_BYTES] += ksize[k]
        for i in range(n_new):  # the new keys enter
            k = entering[i]
            freq[k] = 0
            if from_ghost[i] or (counters[_EVICTED] == 0 and counters[_S_BYTES] >= small_size):
                append(k, -1 - _MAIN, nxt, prv)
                where[k] = _MAIN
                counters[_M_BYTES] += sz
                counters[_M_KEYS] += 1
            else:
                append(k, s_list, nxt, prv)
                where[k] = _SMALL
                counters[_S_BYTES] += sz
        counters[_G_BYTES] = _trim_ghost(nxt, prv, where, ksize, counters[_G_BYTES], ghost_limit)
    counters[_DONE] += n_b
    return hits


def s3fifo_libcachesim(bounds: Arr, look: Arr, size: Arr, n_keys: int, budget: int) -> Arr:
    """The whole-trace call: :func:`s3fifo_libcachesim_continue` from an empty cache."""
    state = s3fifo_libcachesim_state(n_keys)
    return s3fifo_libcachesim_continue(bounds, look, size, budget, state)


def new_libcachesim(setup: Setup) -> LibCacheSimS3FIFOState:
    return s3fifo_libcachesim_state(setup.n_keys)


def step_libcachesim(r: Replay, c: Chunk) -> np.ndarray:
    return s3fifo_libcachesim_continue(c.bounds, c.look, c.size, r.budget, r.state)


PER_KEY = ("nxt", "prv", "where", "mark", "freq", "ksize", "stuck")
PER_KEY_LIBCACHESIM = (*PER_KEY, "entering", "from_ghost")
SPECS = (
    KernelSpec(S3FIFO, new, step, PER_KEY),
    KernelSpec(LibCacheSimS3FIFO, new_libcachesim, step_libcachesim, PER_KEY_LIBCACHESIM),
)
