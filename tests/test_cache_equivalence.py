"""The fast policies against the plain scan-per-victim semantics, and the fused replay loop
against staging batch by batch, on generated batch sequences."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from bmoe.cache import NEVER, POLICIES, ExpertCache
from bmoe.cache.naive import naive_replay

SIZES = {0: 3, 1: 5, 2: 4}

batch_lists = st.lists(
    st.tuples(
        st.sampled_from(sorted(SIZES)),
        st.lists(st.integers(0, 7), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=40,
)
budgets = st.integers(0, 40)


def replay_inputs(batches):
    """The lean replay form: distinct keys, last-touch order, next uses (straightforward)."""
    layers, lookups, recency, sizes, nus = [], [], [], [], []
    keyed = [[(layer << 16) | e for e in experts] for layer, experts in batches]
    for i, ((layer, _), keys) in enumerate(zip(batches, keyed, strict=True)):
        first = list(dict.fromkeys(keys))
        last = list(reversed(list(dict.fromkeys(reversed(keys)))))
        layers.append(layer)
        lookups.append(first)
        recency.append(None if last == first else last)
        sizes.append(SIZES[layer])
        row = []
        for k in first:
            row.append(next((j for j in range(i + 1, len(keyed)) if k in keyed[j]), NEVER))
        nus.append(row)
    return layers, lookups, recency, sizes, nus


@settings(max_examples=80, deadline=None)
@given(batch_lists, budgets)
def test_deterministic_policies_match_the_plain_semantics(batches, budget) -> None:
    layers, lookups, recency, sizes, nus = replay_inputs(batches)
    plain = [(layer, experts, SIZES[layer]) for layer, experts in batches]
    for policy in ("belady", "lru", "lfu", "layer", "layerlfu"):
        fast = ExpertCache(budget, policy, n_layer=3).replay(layers, lookups, recency, sizes, nus)
        assert fast == naive_replay(plain, policy, budget, n_layer=3), policy


@settings(max_examples=50, deadline=None)
@given(batch_lists, budgets)
def test_fused_replay_equals_staging_batch_by_batch(batches, budget) -> None:
    layers, lookups, recency, sizes, nus = replay_inputs(batches)
    for policy in POLICIES:
        fused = ExpertCache(budget, policy, n_layer=3, seed=3)
        hits = fused.replay(layers, lookups, recency, sizes, nus)
        staged = ExpertCache(budget, policy, n_layer=3, seed=3)
        one_by_one = []
        for (layer, experts), nu_row, look in zip(batches, nus, lookups, strict=True):
            by_key = dict(zip(look, nu_row, strict=True))
            nu = [by_key[(layer << 16) | e] for e in experts]
            r = staged.stage(layer, experts, SIZES[layer], next_use=nu)
            one_by_one.append(len(r.hits))
        assert hits == one_by_one, policy
        assert fused.resident() == staged.resident(), policy
        assert fused.bytes_held == staged.bytes_held, policy
        assert fused.stats == staged.stats, policy
