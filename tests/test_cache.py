"""The expert cache: reference batch semantics, worked by hand on tiny sequences.

Sizes are 1 byte per expert unless a test says otherwise, so budgets count experts.
"""

from __future__ import annotations

import pytest

from bmoe.cache import POLICIES, ExpertCache
from bmoe.errors import BmoeError


def run(cache: ExpertCache, batches, size: int = 1):
    """Stage (layer, experts) batches; return the StageResults."""
    return [cache.stage(layer, experts, size) for layer, experts in batches]


def test_lru_by_hand() -> None:
    """Budget 3.

    b1 L0 [1,2]: miss 1,2 (held 2). b2 L1 [1]: miss (held 3).
    b3 L0 [3,1]: miss 3, hit 1; held 4; recency LRU->MRU: (0,2) (1,1) (0,3) (0,1);
      evict (0,2).
    b4 L0 [2,2,1]: miss 2, hit 1; the repeat of 2 only refreshes recency; last touches put
      2 before 1: (1,1) (0,3) (0,2) (0,1); evict (1,1).
    b5 L1 [1]: miss; evict (0,3), the least recent.
    """
    cache = ExpertCache(3, "lru")
    res = run(cache, [(0, [1, 2]), (1, [1]), (0, [3, 1]), (0, [2, 2, 1]), (1, [1])])
    assert [r.hits for r in res] == [[], [], [1], [1], []]
    assert [r.misses for r in res] == [[1, 2], [1], [3], [2], [1]]
    assert [r.evicted for r in res] == [[], [], [(0, 2)], [(1, 1)], [(0, 3)]]
    assert [r.bytes_read for r in res] == [2, 1, 1, 1, 1]
    assert cache.resident() == {(0, 2), (0, 1), (1, 1)}
    assert cache.bytes_held == 3 and (0, 1) in cache and (0, 3) not in cache
    st = cache.stats
    assert (st["lookups"], st["hits"], st["misses"], st["evictions"]) == (8, 2, 6, 3)
    assert st["bytes_read"] == 6


def test_recency_within_a_batch_follows_the_last_touch() -> None:
    """Budget 3. b1 L0 [1,2,1]: last touches order 2 before 1. b2 L0 [3]: evicts (0,2)."""
    cache = ExpertCache(3, "lru")
    res = run(cache, [(0, [1, 2, 1]), (0, [3]), (0, [4])])
    assert res[0].misses == [1, 2] and res[0].bytes_read == 2
    assert res[1].evicted == []  # 3 bytes fit
    assert res[2].evicted == [(0, 2)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budget_zero_keeps_only_the_current_batch(policy: str) -> None:
    cache = ExpertCache(0, policy, n_layer=2)
    nu = [[9, 9], [9, 9], [9, 9]]
    batches = [(0, [1, 2]), (1, [1, 2]), (0, [1, 2])]
    for (layer, experts), n in zip(batches, nu, strict=True):
        r = cache.stage(layer, experts, 5, next_use=n if cache.needs_future else None)
        assert r.hits == [] and r.misses == experts
        assert cache.resident() == {(layer, e) for e in experts}
        assert cache.bytes_held == 10


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_batch_larger_than_the_budget_stays_whole(policy: str) -> None:
    cache = ExpertCache(2, policy, n_layer=1)
    nu = [7, 7, 7, 7]
    cache.stage(0, [1, 2], 1, next_use=nu[:2] if cache.needs_future else None)
    r = cache.stage(0, [3, 4, 1, 5], 1, next_use=nu if cache.needs_future else None)
    assert r.hits == [1] and r.misses == [3, 4, 5]
    assert r.evicted == [(0, 2)]
    assert cache.resident() == {(0, 1), (0, 3), (0, 4), (0, 5)}


def test_unknown_policy_is_an_error_naming_it() -> None:
    with pytest.raises(BmoeError, match="'fifo-ish'"):
        ExpertCache(10, "fifo-ish")


def test_prefetch_admits_what_fits_beside_the_batch_in_use() -> None:
    """Budget 3. Stage L0 [1,2] (2 bytes in use). Prefetch L1 [5,6]: 5 fits beside the
    batch (3 bytes), 6 would need the batch's room, so it is not admitted. Stage L1 [5,7]:
    5 is a prefetch hit; 7 misses; held 4 -> evict the least recent unprotected, (0,1)."""
    cache = ExpertCache(3, "lru")
    cache.stage(0, [1, 2], 1)
    assert cache.prefetch(1, [5, 6], 1) == [5]
    assert cache.prefetch(1, [5], 1) == []  # resident: skipped
    r = cache.stage(1, [5, 7], 1)
    assert r.hits == [5] and r.prefetch_hits == [5] and r.misses == [7]
    assert r.evicted == [(0, 1)]
    st = cache.stats
    assert st["prefetched"] == 1 and st["prefetch_hits"] == 1 and st["prefetch_bytes"] == 1
    assert st["bytes_read"] == 3  # demand reads only


def test_prefetch_evicts_old_keys_and_a_later_hit_is_no_prefetch_hit() -> None:
    """Budget 4. L0 [1,2], L1 [1,2] fill it. Stage L0 [3]: held 5, evict (0,1), leaving
    (0,2) (1,1) (1,2) (0,3). Prefetch L1 [4]: admitted, evicts the
    least recent unprotected (0,2). Stage L1 [4]: prefetch hit. Stage L1 [4] again: a hit,
    but no longer a prefetch hit."""
    cache = ExpertCache(4, "lru")
    run(cache, [(0, [1, 2]), (1, [1, 2])])
    r = cache.stage(0, [3], 1)
    assert r.evicted == [(0, 1)]
    assert cache.prefetch(1, [4], 1) == [4]
    assert (0, 2) not in cache and (1, 4) in cache
    assert cache.stage(1, [4], 1).prefetch_hits == [4]
    r = cache.stage(1, [4], 1)
    assert r.hits == [4] and r.prefetch_hits == []
