"""``clock``: its rules worked by hand on the live cache, and its replay against
libCacheSim's own CLOCK request for request."""

from __future__ import annotations

import pytest

from bmoe.analyze import replay as rp
from bmoe.cache import ExpertCache
from bmoe.cache.kernels import clock
from tests.cache.test_libcachesim import (
    libcachesim_hits,
    one_request_per_batch,
    run,
    skewed_requests,
)


def test_clock_by_hand() -> None:
    """Budget 3, 1-byte experts. 1, 2, 3 enter (oldest first). b4 [1]: a hit sets 1's bit.
    b5 [4]: 1 leaves the head with its bit set: back in as the newest, cleared; 2 is the
    victim. b6 [5]: 3 goes. b7 [1]: a hit. b8 [2]: 1 goes round again, 4 goes."""
    seq = [1, 2, 3, 1, 4, 5, 1, 2]
    res = run(ExpertCache(3, "clock"), [[e] for e in seq])
    assert [len(r.hits) for r in res] == [0, 0, 0, 1, 0, 0, 1, 0]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [], [2], [3], [], [4]]


def test_clock_passes_over_the_batch_and_keeps_a_batch_larger_than_the_budget() -> None:
    """Budget 2. b3 [1, 2, 3]: 1 and 2 hit; both go round (bits cleared), then again with
    clear bits: only the batch is left, nothing goes (3 enters after). b4 [4]: 1, then 2."""
    res = run(ExpertCache(2, "clock"), [[1], [2], [1, 2, 3], [4]])
    assert [len(r.hits) for r in res] == [0, 0, 2, 0]
    assert [[e for _, e in r.evicted] for r in res] == [[], [], [], [1, 2]]
    batches = one_request_per_batch([(0, e) for e in (1, 2, 3, 1, 4, 5, 1, 2)])
    whole = clock.clock(batches.bounds, batches.look, batches.size, batches.n_keys, 9)
    assert whole.tolist() == rp.simulate(batches, "clock", 9).tolist() == [0, 0, 0, 1, 0, 0, 1, 0]


@pytest.mark.parametrize(
    ("budget", "n", "seed"), [(17, 200, 0), (24, 300, 0), (30, 300, 1), (52, 500, 33), (70, 800, 0)]
)
def test_clock_equals_libcachesim_request_for_request(budget, n, seed) -> None:
    """One lookup per batch is libCacheSim's request-at-a-time semantics."""
    lcs = pytest.importorskip("libcachesim")
    requests = skewed_requests(n, seed=seed)
    expected = libcachesim_hits(lcs, lcs.Clock(budget), requests)
    batches = one_request_per_batch(requests)
    hits = rp.simulate(batches, "clock", budget)
    assert 0 < sum(expected) < len(expected)
    assert hits.tolist() == expected
    assert hits.tolist() != rp.simulate(batches, "sieve", budget).tolist()
