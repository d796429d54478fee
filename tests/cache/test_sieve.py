"""``sieve``: its rules worked by hand on the live cache, and its replay against
libCacheSim's own SIEVE request for request."""

from __future__ import annotations

import pytest

from bmoe.analyze import replay as rp
from bmoe.cache import ExpertCache
from bmoe.cache.kernels import sieve
from tests.cache.test_libcachesim import (
    SIZES,
    libcachesim_hits,
    one_request_per_batch,
    run,
    skewed_requests,
)


def test_sieve_by_hand() -> None:
    """Budget 3, 1-byte experts. 1, 2, 3 enter (oldest first). b4 [4]: the hand starts at
    the oldest, 1, unvisited: evicted; the hand stays at 2. b5 [2]: a hit, 2 is visited.
    b6 [5]: the hand clears 2's bit and passes on to 3, unvisited: evicted; the hand at 4.
    b7 [3]: 4 goes (the hand at 5). b8 [4]: 5 goes (the hand at 3, newest before 4 entered).
    b9 [1]: 3 goes. 2, hit once, outlives everything after it (LRU evicts it at b8)."""
    seq = [1, 2, 3, 4, 2, 5, 3, 4, 1]
    res = run(ExpertCache(3, "sieve"), [[e] for e in seq])
    assert [len(r.hits) for r in res] == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [1], [], [3], [4], [5], [3]]
    lru = run(ExpertCache(3, "lru"), [[e] for e in seq])
    assert [e for _, e in lru[7].evicted] == [2]


def test_sieve_passes_over_the_batch_and_keeps_a_batch_larger_than_the_budget() -> None:
    """Budget 2. b3 [1, 2, 3]: 1 and 2 hit (visited); the hand clears both bits, wraps to
    the oldest and finds only the batch's keys: nothing goes and the batch stays whole
    (3 enters after). b4 [4]: the bits are clear: 1 goes, then 2 (held 2); 4 enters."""
    res = run(ExpertCache(2, "sieve"), [[1], [2], [1, 2, 3], [4]])
    assert [len(r.hits) for r in res] == [0, 0, 2, 0]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [1, 2]]
    cells = [(0, 1, s, 0, slot, e) for s, b in enumerate([[1], [2], [1, 2, 3], [4]])
             for slot, e in enumerate(b)]  # fmt: skip
    batches = rp.prepare_batches(make_trace_rows(cells))
    assert rp.simulate(batches, "sieve", 6).tolist() == [0, 0, 2, 0]  # 3 bytes an expert
    whole = sieve.sieve(batches.bounds, batches.look, batches.size, batches.n_keys, 6)
    assert whole.tolist() == [0, 0, 2, 0]


def make_trace_rows(cells):
    import pandas as pd

    from bmoe.formats.route import RouteTrace

    frame = pd.DataFrame(cells, columns=["turn", "phase", "step", "layer", "slot", "expert"])
    table = pd.DataFrame({"layer": list(SIZES), "expert_bytes": list(SIZES.values())})
    return RouteTrace(None, 1, {"n_layer": 3, "n_expert": 8}, table, frame)


@pytest.mark.parametrize(
    ("budget", "n", "seed"), [(17, 200, 0), (24, 300, 0), (30, 300, 1), (52, 500, 33), (70, 800, 0)]
)
def test_sieve_equals_libcachesim_request_for_request(budget, n, seed) -> None:
    """One lookup per batch is libCacheSim's request-at-a-time semantics."""
    lcs = pytest.importorskip("libcachesim")
    requests = skewed_requests(n, seed=seed)
    expected = libcachesim_hits(lcs, lcs.Sieve(budget), requests)
    batches = one_request_per_batch(requests)
    hits = rp.simulate(batches, "sieve", budget)
    assert 0 < sum(expected) < len(expected)
    assert hits.tolist() == expected
    assert hits.tolist() != rp.simulate(batches, "lru", budget).tolist()
