"""``ExpertCache.stage_resident``: runs of all-resident batches in one call leave the cache as
staging them one by one does, on every path it takes (a cache that never evicts only counts,
LRU and FIFO refresh in bulk, the other policies and pending prefetches go batch by batch)."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.cache import EXPERT_BITS, POLICIES, ExpertCache
from bmoe.errors import BmoeError

LIVE_POLICIES = sorted(name for name, cls in POLICIES.items() if not cls.needs_future)
N_LAYER, N_EXPERT, K, SIZE = 4, 12, 3, 10
KEY_SPACE = {layer: N_EXPERT * SIZE for layer in range(N_LAYER)}
SIZES = dict.fromkeys(range(N_LAYER), SIZE)


def _token(rng: np.random.Generator) -> list[list[int]]:
    """One token's routing: per layer K distinct experts, hot ones likelier, and now and then
    a slot repeating the first (as a dropped slot repeats its token's top expert)."""
    weights = 1.0 / np.arange(1, N_EXPERT + 1)
    token = []
    for _layer in range(N_LAYER):
        ids = rng.choice(N_EXPERT, K, replace=False, p=weights / weights.sum()).tolist()
        if rng.random() < 0.3:
            ids[-1] = ids[0]
        token.append(ids)
    return token


def _keys(layer: int, ids: list[int]) -> list[int]:
    return [layer << EXPERT_BITS | e for e in ids]


def _one_by_one(cache: ExpertCache, layer: int, ids: list[int]) -> list[int]:
    """Stage one batch as the live engine's Python path does; returns the victims."""
    keys = _keys(layer, ids)
    lookups = list(dict.fromkeys(keys))
    recency = None if len(lookups) == len(keys) else list(dict.fromkeys(keys[::-1]))[::-1]
    return cache.stage_keys(layer, lookups, recency, SIZE)[3]


def _replay(
    cache: ExpertCache, tokens: list[list[list[int]]], in_runs: bool, prefetch: bool = False
) -> tuple[list[list[int]], int]:
    """Stage `tokens`; with `in_runs`, every all-resident batch waits in a run that goes to
    :meth:`ExpertCache.stage_resident` before the next batch that misses and at the token's
    end, as the eval filter's log does. With `prefetch`, each batch that misses bets on the
    next layer's experts. Returns each missing batch's victims and how many batches went
    through runs."""
    victims = []
    in_a_run = 0
    for token in tokens:
        touches: list[int] = []
        ends: list[int] = []
        lookups = 0
        for layer, ids in enumerate(token):
            if in_runs and all((layer, e) in cache for e in ids):
                touches += _keys(layer, ids)
                ends.append(len(touches))
                lookups += len(set(ids))
                in_a_run += 1
                continue
            cache.stage_resident(touches, ends, lookups, SIZES)
            touches, ends, lookups = [], [], 0
            if not in_runs and all((layer, e) in cache for e in ids):
                _one_by_one(cache, layer, ids)
                continue
            victims.append(_one_by_one(cache, layer, ids))
            if prefetch:  # a bet on the next layer, after a batch that missed (in both)
                cache.prefetch((layer + 1) % N_LAYER, ids, SIZE)
        cache.stage_resident(touches, ends, lookups, SIZES)
    return victims, in_a_run


def _state(cache: ExpertCache) -> tuple:
    return cache.stats, cache.resident(), cache.bytes_held


@pytest.mark.parametrize("prefetch", [False, True], ids=["", "prefetch"])
@pytest.mark.parametrize("budget", [N_LAYER * N_EXPERT * SIZE, 28 * SIZE], ids=["all", "evicts"])
@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_runs_of_resident_batches_stage_as_one_by_one(
    policy: str, budget: int, prefetch: bool
) -> None:
    """The same victims batch after batch, counts and resident set as staging each batch,
    on a cache that holds every key (told so) and on one that evicts."""
    rng = np.random.default_rng(7)
    tokens = [_token(rng) for _ in range(200)]
    one = ExpertCache(budget, policy, n_layer=N_LAYER, key_space_bytes=KEY_SPACE)
    runs = ExpertCache(budget, policy, n_layer=N_LAYER, key_space_bytes=KEY_SPACE)
    assert runs.never_evicts == (budget == N_LAYER * N_EXPERT * SIZE)
    want, _ = _replay(one, tokens, in_runs=False, prefetch=prefetch)
    got, in_a_run = _replay(runs, tokens, in_runs=True, prefetch=prefetch)
    assert got == want
    assert _state(runs) == _state(one)
    st = runs.stats
    assert in_a_run > len(tokens) * N_LAYER // 8  # a hundred batches and more
    if not runs.never_evicts:
        assert st["evictions"] > 0
    if prefetch:
        assert st["prefetch_hits"] > 0


def test_lru_victims_follow_the_bulk_refresh() -> None:
    """LRU refreshed in bulk: the keys a run touched are the most recent, in last-touch order
    (a repeat counts as a touch), so the next misses evict the keys it left alone."""
    cache = ExpertCache(4 * SIZE, "lru")
    for e in range(4):  # (0,0) is the least recent
        cache.stage_keys(0, [e], None, SIZE)
    cache.stage_resident(_keys(0, [0, 1, 0]), [3], 2, SIZES)  # order now: 2, 3, 1, 0
    assert cache.stage_keys(1, _keys(1, [0, 1]), None, SIZE)[3] == _keys(0, [2, 3])
    assert cache.stage_keys(1, _keys(1, [2]), None, SIZE)[3] == _keys(0, [1])
    st = cache.stats
    assert (st["lookups"], st["hits"], st["misses"]) == (9, 2, 7)


def test_a_cache_that_holds_everything_knows_it() -> None:
    """``never_evicts`` only when every key of the key space fits: the budget for a global
    policy, each layer's slice for a per-layer one, and never without a key space."""
    whole = sum(KEY_SPACE.values())
    assert ExpertCache(whole, "lru", key_space_bytes=KEY_SPACE).never_evicts
    assert not ExpertCache(whole - 1, "lru", key_space_bytes=KEY_SPACE).never_evicts
    assert not ExpertCache(whole, "lru").never_evicts
    uneven = {0: 3 * N_EXPERT * SIZE, 1: SIZE}  # fits the budget, not layer 0's slice
    assert ExpertCache(whole, "lru", key_space_bytes=uneven).never_evicts
    assert not ExpertCache(whole, "layer", n_layer=2, key_space_bytes=uneven).never_evicts
    assert ExpertCache(whole, "layer", n_layer=N_LAYER, key_space_bytes=KEY_SPACE).never_evicts


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_run_with_a_key_not_resident_raises(policy: str) -> None:
    cache = ExpertCache(4 * SIZE, policy)
    cache.stage_keys(0, [1, 2], None, SIZE)
    with pytest.raises(BmoeError, match="not cached"):
        cache.stage_resident(_keys(0, [1, 3]), [2], 2, SIZES)


def test_a_run_with_a_wrong_lookup_count_raises_on_the_general_path() -> None:
    cache = ExpertCache(4 * SIZE, "lfu")
    cache.stage_keys(0, [1, 2], None, SIZE)
    with pytest.raises(BmoeError, match="distinct"):
        cache.stage_resident(_keys(0, [1, 2, 1]), [3], 3, SIZES)
