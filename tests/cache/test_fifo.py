"""``fifo``: its rules worked by hand on the live cache, and its replay against libCacheSim's
own FIFO request for request."""

from __future__ import annotations

import pytest

from bmoe.analyze import replay as rp
from bmoe.cache import ExpertCache
from bmoe.cache.kernels import fifo
from tests.cache.test_libcachesim import (
    libcachesim_hits,
    one_request_per_batch,
    run,
    skewed_requests,
)


def test_fifo_by_hand() -> None:
    """Budget 3, 1-byte experts. 1, 2, 3 enter (oldest first). b4 [1]: a hit, which moves
    nothing. b5 [4]: 1, the oldest, goes (LRU would take 2). b6 [1]: a miss, 1 enters as the
    newest and 2 goes. b7 [3]: a hit. b8 [5]: 3 goes, hit or not."""
    seq = [1, 2, 3, 1, 4, 1, 3, 5]
    res = run(ExpertCache(3, "fifo"), [[e] for e in seq])
    assert [len(r.hits) for r in res] == [0, 0, 0, 1, 0, 0, 1, 0]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [], [1], [2], [], [3]]
    lru = run(ExpertCache(3, "lru"), [[e] for e in seq])
    assert [e for _, e in lru[4].evicted] == [2]


def test_fifo_passes_over_the_batch_and_keeps_a_batch_larger_than_the_budget() -> None:
    """Budget 2. b3 [1, 2, 3]: 1 and 2 hit, 3 enters; the batch's keys stay where they are
    and nothing else is left: nothing goes (held 3). b4 [4, 1]: 2 goes, the oldest the
    batch did not touch, then 3; 1, older than both, stays (held 2)."""
    res = run(ExpertCache(2, "fifo"), [[1], [2], [1, 2, 3], [4, 1]])
    assert [len(r.hits) for r in res] == [0, 0, 2, 1]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [2, 3]]
    batches = one_request_per_batch([(0, e) for e in (1, 2, 3, 1, 4, 1, 3, 5)])
    whole = fifo.fifo(batches.bounds, batches.look, batches.size, batches.n_keys, 9)
    assert whole.tolist() == rp.simulate(batches, "fifo", 9).tolist() == [0, 0, 0, 1, 0, 0, 1, 0]


@pytest.mark.parametrize(
    ("budget", "n", "seed"), [(17, 200, 0), (24, 300, 0), (30, 300, 1), (52, 500, 33), (70, 800, 0)]
)
def test_fifo_equals_libcachesim_request_for_request(budget, n, seed) -> None:
    """One lookup per batch is libCacheSim's request-at-a-time semantics."""
    lcs = pytest.importorskip("libcachesim")
    requests = skewed_requests(n, seed=seed)
    expected = libcachesim_hits(lcs, lcs.FIFO(budget), requests)
    batches = one_request_per_batch(requests)
    hits = rp.simulate(batches, "fifo", budget)
    assert 0 < sum(expected) < len(expected)
    assert hits.tolist() == expected
    assert hits.tolist() != rp.simulate(batches, "clock", budget).tolist()
