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


GLOBAL_POLICIES = sorted(set(POLICIES) - {"layer", "layerlfu"})


@pytest.mark.parametrize("policy", GLOBAL_POLICIES)
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


def next_uses(batches) -> list[list[int]]:
    """For each batch and each of its ids, the index of the next batch of the same layer
    routing that id again (a large number for never), by a plain forward scan."""
    out = []
    for i, (layer, experts) in enumerate(batches):
        row = []
        for e in experts:
            nxt = next(
                (j for j in range(i + 1, len(batches)) if batches[j][0] == layer
                 and e in batches[j][1]),
                10**9,
            )  # fmt: skip
            row.append(nxt)
        out.append(row)
    return out


def run_future(cache: ExpertCache, batches, size: int = 1):
    return [
        cache.stage(layer, experts, size, next_use=nu)
        for (layer, experts), nu in zip(batches, next_uses(batches), strict=True)
    ]


def test_belady_by_hand() -> None:
    """Budget 2. b0 [1,2]: misses. b1 [3]: miss; next uses 1 -> b2, 2 -> b3: evict 2 (the
    furthest). b2 [1]: hit. b3 [2]: miss; 3 -> b4, 1 -> never: evict 1. b4 [3]: hit."""
    batches = [(0, [1, 2]), (0, [3]), (0, [1]), (0, [2]), (0, [3])]
    res = run_future(ExpertCache(2, "belady"), batches)
    assert [r.hits for r in res] == [[], [], [1], [], [3]]
    assert [r.evicted for r in res] == [[], [(0, 2)], [], [(0, 1)], []]


def test_belady_ties_go_to_the_earliest_admitted() -> None:
    """Budget 2. b0 [2,1] admits 2 then 1; none is used again. b1 [3]: both never again,
    2 was admitted first: evict 2. b2 [4]: 1 (admitted in b0) goes before 3 (b1)."""
    res = run_future(ExpertCache(2, "belady"), [(0, [2, 1]), (0, [3]), (0, [4])])
    assert [r.evicted for r in res] == [[], [(0, 2)], [(0, 1)]]


def test_belady_needs_the_future() -> None:
    with pytest.raises(BmoeError, match="next use"):
        ExpertCache(2, "belady").stage(0, [1], 1)


def test_lfu_by_hand() -> None:
    """Budget 2. b0 [1], b1 [1]: hit, count(1) = 2. b2 [2]. b3 [3]: evict the fewest
    lookups, 2 (count 1). b4 [2]: miss, count(2) = 2 (kept across its eviction); candidates
    1 (2) and 3 (1): evict 3. b5 [3]: miss, count(3) = 2; 1 and 2 both have 2 lookups, 1 was
    touched less recently (b1 < b4): evict 1."""
    res = run(ExpertCache(2, "lfu"), [(0, [1]), (0, [1]), (0, [2]), (0, [3]), (0, [2]), (0, [3])])
    assert [len(r.hits) for r in res] == [0, 1, 0, 0, 0, 0]
    assert [r.evicted for r in res] == [[], [], [], [(0, 2)], [(0, 3)], [(0, 1)]]


def test_random_is_seeded_and_never_takes_the_batch() -> None:
    batches = [(0, list(range(i, i + 3))) for i in range(0, 60, 2)]
    runs = []
    for seed in (1, 1, 2):
        cache = ExpertCache(5, "random", seed=seed)
        res = run(cache, batches)
        for (_, experts), r in zip(batches, res, strict=True):
            assert not {e for _, e in r.evicted} & set(experts)
            assert cache.bytes_held <= 5
        runs.append([r.evicted for r in res])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_layer_slices_by_hand() -> None:
    """n_layer 2, budget 4: slices of 2. b0 L0 [1,2]. b1 L1 [1,2,3]: L1 holds 3 > 2 but
    only its own batch, so nothing goes. b2 L0 [3]: L0 evicts its LRU key 1. b3 L1 [4]:
    L1 evicts 1 then 2. b4 L0 [2]: hit. b5 L1 [1]: miss, L1 evicts 3 (LRU)."""
    batches = [(0, [1, 2]), (1, [1, 2, 3]), (0, [3]), (1, [4]), (0, [2]), (1, [1])]
    res = run(ExpertCache(4, "layer", n_layer=2), batches)
    assert [r.evicted for r in res] == [[], [], [(0, 1)], [(1, 1), (1, 2)], [], [(1, 3)]]
    assert [r.hits for r in res] == [[], [], [], [], [2], []]


def test_layerlfu_evicts_by_count_inside_the_layer() -> None:
    """n_layer 2, budget 4 (slices of 2). L0: [1], [1], [2], [3]. At [3], layer LRU evicts
    1 (touched before 2) but layer LFU evicts 2 (one lookup against 1's two)."""
    batches = [(0, [1]), (0, [1]), (0, [2]), (0, [3])]
    assert run(ExpertCache(4, "layer", n_layer=2), batches)[-1].evicted == [(0, 1)]
    assert run(ExpertCache(4, "layerlfu", n_layer=2), batches)[-1].evicted == [(0, 2)]


def test_layer_policies_need_the_layer_count() -> None:
    with pytest.raises(BmoeError, match="n_layer"):
        ExpertCache(4, "layer")


def test_lfuda_by_hand() -> None:
    """Budget 2, one layer; priority K = L + F (F lookups since admission), L = K of the
    last victim, ties by least recent touch.

    b1 [3]: K3 = 1. b2 [2]: K2 = 1. b3 [1]: K1 = 1; evict the least recent K=1 key, 3;
    L = 1. b4 [3]: miss, F restarts: K3 = L + 1 = 2; candidates 2 (1), 1 (1): evict 2
    (touched earlier), L = 1. b5 [0]: K0 = 2; candidates 1 (1), 3 (2): evict 1, L = 1.
    b6 [2]: K2 = 2; candidates 3 (2, touched b4), 0 (2, b5): evict 3, L = 2. b7 [0]: hit.

    Plain LFU differs at b6: key 3 kept its count 2 from b1 while 0 has 1, so LFU evicts 0
    and misses at b7. Aging lets the newcomer compete with an old count.
    """
    seq = [3, 2, 1, 3, 0, 2, 0]
    batches = [(0, [e]) for e in seq]
    res = run(ExpertCache(2, "lfuda"), batches)
    assert [r.evicted for r in res] == [
        [], [], [(0, 3)], [(0, 2)], [(0, 1)], [(0, 3)], [],
    ]  # fmt: skip
    assert [len(r.hits) for r in res] == [0, 0, 0, 0, 0, 0, 1]
    lfu = run(ExpertCache(2, "lfu"), batches)
    assert lfu[5].evicted == [(0, 0)] and sum(len(r.hits) for r in lfu) == 0


def test_arc_by_hand() -> None:
    """Budget 4, one layer. T1/T2 recency lists (LRU first), B1/B2 ghosts, target p.

    b1 [1]: T1 [1]. b2 [1]: hit -> T2 [1]. b3..b5 [2] [3] [4]: T1 [2,3,4], held 4.
    b6 [5]: T1 [2,3,4,5], held 5; T1 holds 4 > p = 0: evict T1's LRU 2 into B1 [2].
    b7 [2]: a B1 ghost: p += 1 x max(1, 0/1) -> 1; 2 enters T2 [1,2]; held 5; T1 (3) > p:
      evict 3 -> B1 [3].
    b8 [6]: T1 [4,5,6]; evict 4 -> B1 [3,4] (T1 + B1 = 4 fits the budget).
    b9 [1]: hit (LRU would have evicted 1 at b6 and missed here); T2 [2,1].
    b10 [7]: T1 [5,6,7]; evict 5 -> B1 [3,4,5]; T1 + B1 = 5 > 4: drop ghost 3.
    b11 [8,9]: T1 [6,7,8,9], held 6: evict 6, then 7 (8 and 9 are the batch's) -> B1
      [4,5,6,7]; T1 + B1 = 6: drop ghosts 4 and 5 -> B1 [6,7].
    b12 [6]: a B1 ghost: p += 1 x max(1, 0/2) -> 2; T2 [2,1,6], held 5; T1 holds 2, not
      above p: evict T2's LRU 2 into B2 [2].
    b13 [2]: a B2 ghost: p -= 1 x max(1, 1/1) -> 1; T2 [1,6,2]; T1 (2) > p: evict 8 ->
      B1 [7,8].
    Hits: b2 and b9.
    """
    seq = [[1], [1], [2], [3], [4], [5], [2], [6], [1], [7], [8, 9], [6], [2]]
    cache = ExpertCache(4, "arc")
    res = run(cache, [(0, s) for s in seq])
    assert [r.hits for r in res] == [[], [1], [], [], [], [], [], [], [1], [], [], [], []]
    assert [[e for _, e in r.evicted] for r in res] == [
        [], [], [], [], [], [2], [3], [4], [], [5], [6, 7], [2], [8],
    ]  # fmt: skip
    arc = cache._policy
    assert list(arc.t1) == [9] and [k & 0xFFFF for k in arc.t2] == [1, 6, 2]
    assert [k & 0xFFFF for k in arc.b1] == [7, 8] and not arc.b2 and arc.p == 1


def test_s3fifo_by_hand() -> None:
    """Budget 3, one layer: S's share is 3 // 10 = 0 bytes, so S is evicted from whenever
    it holds anything; counters start at 0 and grow with hits.

    b1 [1], b2 [1] (hit, c=1), b3 [2], b4 [2] (hit), b5 [3], b6 [3] (hit): S [1,2,3].
    b7 [4]: S [1,2,3,4], held 4. S's oldest 1, 2, 3 have hits: they move to M [1,2,3]. 4
      is the batch's own: kept. S has nothing else, so M: 1, 2, 3 each spend their counter
      going round (M [1,2,3] with counters 0), then 1 is evicted (not into G).
    b8 [1]: a fresh miss (1 is in no ghost) -> S [4,1]; evict S's oldest 4 (no hit) -> G [4].
    b9 [4]: a ghost: enters M [2,3,4]; S's 1 (no hit) is evicted -> G [1].
    b10 [2]: hit, counter 1.
    b11 [5]: S [5], protected; M: 2 spends its counter (M [3,4,2]), 3 is evicted.
    Hits: b2, b4, b6, b10.
    """
    seq = [1, 1, 2, 2, 3, 3, 4, 1, 4, 2, 5]
    cache = ExpertCache(3, "s3fifo")
    res = run(cache, [(0, [e]) for e in seq])
    assert [len(r.hits) for r in res] == [0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0]
    assert [[e for _, e in r.evicted] for r in res] == [
        [], [], [], [], [], [], [1], [4], [1], [], [3],
    ]  # fmt: skip
    s3 = cache._policy
    assert [k for k in s3.main] == [4, 2] and list(s3.small) == [5] and list(s3.ghost) == [1]


def test_policy_name_reads_the_engines_spellings() -> None:
    from bmoe.cache import POLICIES, policy_name

    assert policy_name("layer-lfu") == "layerlfu"
    assert policy_name("Layer_LRU") == "layer"
    assert policy_name("S3-FIFO") == "s3fifo"
    assert policy_name("lfu-incache") == "lfu-incache"
    assert all(policy_name(name) == name for name in POLICIES)
    assert policy_name("no-such-policy") == "no-such-policy"
