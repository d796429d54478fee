"""LRU at several budgets in one pass (:func:`bmoe.cache.kernels.lru.lru_budgets_continue`)
gives each budget the hits of its own replay, whole or chunk by chunk, and the replay driver
uses it for the lru cells of a curve with the same figures."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.analyze import replay as rp
from bmoe.analyze.replay_run import Replays
from bmoe.cache import kernels
from bmoe.cache.kernels import Chunk, ReplayBudgets, Setup, lru


def batches(seed: int, n_keys: int = 200, n_b: int = 3000):
    """Batches of 1-8 distinct keys of one of two layers (keys below n_keys/2 of 3 bytes,
    the others of 5), a fifth with a repeated id (``rec`` reversed)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, size=n_b)
    bounds = np.zeros(n_b + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    layer = rng.integers(0, 2, size=n_b)
    half = n_keys // 2
    drawn = [rng.choice(half, size=c, replace=False) + g * half
             for c, g in zip(counts.tolist(), layer.tolist(), strict=True)]  # fmt: skip
    look = np.concatenate(drawn).astype(np.int32)
    rec = look.copy()
    repeated = rng.random(n_b) < 0.2
    for b in np.flatnonzero(repeated).tolist():
        rec[bounds[b] : bounds[b + 1]] = rec[bounds[b] : bounds[b + 1]][::-1]
    size = np.where(layer == 0, 3, 5).astype(np.int64)
    decode = np.ones(n_b, dtype=bool)
    return Chunk(bounds, look, rec, repeated, size, np.zeros(n_b, dtype=np.int64), decode)


def alone(c: Chunk, budget: int, n_keys: int = 200) -> np.ndarray:
    state = lru.lru_state(1, n_keys)
    return lru.lru_continue(c.bounds, c.look, c.rec, c.repeated, c.size, c.part, budget, state)


@pytest.mark.parametrize("seed", range(12))
def test_every_budget_gets_the_hits_of_its_own_replay(seed: int) -> None:
    c = batches(seed)
    rng = np.random.default_rng(seed)
    budgets = [0, 3, 5000] if seed % 4 == 0 else rng.integers(0, 700, size=5).tolist()
    together = ReplayBudgets(kernels.kernel_spec("lru"), budgets, Setup(200, 1))
    hits = together.feed(c)
    assert hits.shape == (len(budgets), len(c))
    for row, budget in enumerate(budgets):
        np.testing.assert_array_equal(hits[row], alone(c, budget), err_msg=str(budget))
    assert hits[-1].sum() > 0 or max(budgets) < 8


def test_chunk_by_chunk_with_keys_growing_as_whole() -> None:
    c = batches(3)
    whole = ReplayBudgets(kernels.kernel_spec("lru"), [40, 200, 9], Setup(200, 1)).feed(c)
    parts = ReplayBudgets(kernels.kernel_spec("lru"), [40, 200, 9], Setup(100, 1))
    got = []
    for lo, hi in ((0, 700), (700, 701), (701, 3000)):
        b0, b1 = int(c.bounds[lo]), int(c.bounds[hi])
        part = Chunk(c.bounds[lo : hi + 1] - b0, c.look[b0:b1], c.rec[b0:b1],
                     c.repeated[lo:hi], c.size[lo:hi], c.part[lo:hi], c.decode[lo:hi])  # fmt: skip
        need = int(part.look.max(initial=0)) + 1
        if need > parts.setup.n_keys:
            parts.grow(max(need, 200))
        got.append(parts.feed(part))
    np.testing.assert_array_equal(np.concatenate(got, axis=1), whole)


def test_a_curve_replays_its_lru_cells_in_one_pass_with_the_same_figures(corpus) -> None:
    from bmoe.formats.route import read_route_trace

    trace = read_route_trace(corpus / "route-trace/gemma.route.csv")
    b = rp.prepare_batches(trace)
    cells = [(300, "lru"), (300, "arc"), (1000, "lru"), (676, "lru"), (1000, "layer")]
    replays = Replays(cells, b.n_keys, b.n_parts, b.n_layer, part_keys=rp._part_keys(b))
    assert [task[0] for task in replays.tasks] == [[0, 2, 3], [1], [4]]
    out = replays.feed(rp.whole_chunk(b))
    for i, (budget, policy) in enumerate(cells):
        expect = rp.simulate(b, policy, round(budget * 2**20))
        np.testing.assert_array_equal(out[i], expect, err_msg=f"{policy} {budget}")
