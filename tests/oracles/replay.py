"""The reference replay semantics written as plainly as possible.

No heaps, no ordered dicts: every victim is found by scanning the resident set. It is slow
on purpose and shares no code with the policies in :mod:`bmoe.cache.policies`; it is the
oracle they are tested against and the baseline ``benchmarks/bench_replay.py`` measures
them against. Reference policies only: belady, lru, lfu, random, layer, layerlfu.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Sequence

NAIVE_POLICIES = ("belady", "lru", "lfu", "random", "layer", "layerlfu")


def naive_replay(
    batches: Sequence[tuple[int, Sequence[int], int]],
    policy: str,
    budget_bytes: int,
    *,
    n_layer: int | None = None,
    seed: int = 0,
) -> list[int]:
    """Hits per batch of `batches` = [(layer, expert ids with repeats, expert bytes)]."""
    if policy not in NAIVE_POLICIES:
        raise ValueError(f"naive replay has no policy {policy!r}")
    # the batches that look each key up, for belady's "next batch of use"
    uses: dict[tuple[int, int], list[int]] = {}
    for i, (layer, experts, _) in enumerate(batches):
        for e in dict.fromkeys(experts):
            uses.setdefault((layer, e), []).append(i)

    def next_use(key: tuple[int, int], now: int) -> float:
        later = uses[key]
        j = bisect_right(later, now)
        return later[j] if j < len(later) else float("inf")

    rng = random.Random(seed)
    per_layer = policy in ("layer", "layerlfu")
    slice_bytes = budget_bytes // n_layer if per_layer and n_layer else 0
    resident: dict[tuple[int, int], dict[str, int]] = {}
    count: dict[tuple[int, int], int] = {}
    clock = 0
    admissions = 0
    hits = []
    for i, (layer, experts, size) in enumerate(batches):
        touched: set[tuple[int, int]] = set()
        h = 0
        for e in experts:
            key = (layer, e)
            clock += 1
            if key not in touched:
                touched.add(key)
                count[key] = count.get(key, 0) + 1
                if key in resident:
                    h += 1
                else:
                    admissions += 1
                    resident[key] = {"size": size, "admitted": admissions}
            resident[key]["last"] = clock
        hits.append(h)

        while True:
            if per_layer:
                scope = [k for k in resident if k[0] == layer]
                limit = slice_bytes
            else:
                scope = list(resident)
                limit = budget_bytes
            if sum(resident[k]["size"] for k in scope) <= limit:
                break
            candidates = [k for k in scope if k not in touched]
            if not candidates:
                break
            if policy in ("lru", "layer"):
                victim = min(candidates, key=lambda k: resident[k]["last"])
            elif policy in ("lfu", "layerlfu"):
                victim = min(candidates, key=lambda k: (count[k], resident[k]["last"]))
            elif policy == "belady":
                victim = min(candidates, key=lambda k: (-next_use(k, i), resident[k]["admitted"]))
            else:
                victim = rng.choice(candidates)
            del resident[victim]
    return hits
