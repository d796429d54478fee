"""The compiled replay kernels against the plain scan-per-victim semantics and against the
live cache staging batch by batch, on generated batch sequences."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pandas as pd
from hypothesis import given, settings

from bmoe.analyze import replay as rp
from bmoe.cache import NEVER, POLICIES, ExpertCache, kernels
from bmoe.formats.route import RouteTrace
from tests.oracles.replay import naive_replay

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
    """Per batch: layer, distinct keys, last-touch order, size, next uses (straightforward)."""
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
    """The replay kernels against the scan-per-victim oracle."""
    prepared = rp.prepare_batches(trace_of(batches))
    plain = [(layer, experts, SIZES[layer]) for layer, experts in batches]
    for policy in ("belady", "lru", "lfu", "layer", "layerlfu"):
        fast = rp.simulate(prepared, policy, budget).tolist()
        assert fast == naive_replay(plain, policy, budget, n_layer=3), policy


def trace_of(batches) -> RouteTrace:
    """A decode trace with one step per generated batch (so every batch is one cell)."""
    rows = [
        (0, 1, step, layer, slot, e)
        for step, (layer, experts) in enumerate(batches)
        for slot, e in enumerate(experts)
    ]
    frame = pd.DataFrame(rows, columns=["turn", "phase", "step", "layer", "slot", "expert"])
    table = pd.DataFrame({"layer": list(SIZES), "expert_bytes": list(SIZES.values())})
    meta = {"n_layer": 3, "n_expert": 8, "n_expert_used": 6}
    return RouteTrace(None, 1, meta, table, frame)


@settings(max_examples=60, deadline=None)
@given(batch_lists, budgets, st.integers(0, 5))
def test_replay_kernels_equal_staging_batch_by_batch(batches, budget, seed) -> None:
    """The compiled replay of every policy gives, batch for batch, the hits of the live
    cache staging the same batches one ``stage`` at a time."""
    prepared = rp.prepare_batches(trace_of(batches))
    assert len(prepared) == len(batches)
    nus = replay_inputs(batches)[4]
    for policy in POLICIES:
        staged = ExpertCache(budget, policy, n_layer=3, seed=seed)
        one_by_one = []
        for (layer, experts), nu_row in zip(batches, nus, strict=True):
            first = list(dict.fromkeys((layer << 16) | e for e in experts))
            by_key = dict(zip(first, nu_row, strict=True))
            nu = [by_key[(layer << 16) | e] for e in experts]
            one_by_one.append(len(staged.stage(layer, experts, SIZES[layer], next_use=nu).hits))
        hits = rp.simulate(prepared, policy, budget, seed=seed)
        assert hits.tolist() == one_by_one, policy


def test_the_random_kernel_draws_what_python_random_draws() -> None:
    rng = random.Random(11)
    mt, state = kernels.mt_state(11)
    assert [kernels.draw(mt, state) for _ in range(2000)] == [rng.random() for _ in range(2000)]
