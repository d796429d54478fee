"""``lfuda``: LFU with dynamic aging (Arlitt et al.), byte budget.

Each resident key has a priority K = L + F, where F counts its lookups since it was admitted
(reset when evicted, unlike ``lfu``) and L is the cache's age: the priority of the last
victim. A hit sets K = L + F with the current L, so keys that were popular long ago age out
instead of squatting. Victim: lowest K, ties by least recent touch. A prefetched key enters
with F = 0 (K = L). Min-heap with lazy deletion of packed ``K | touch | key`` integers.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from heapq import heapify, heappop, heappush

from bmoe.cache.policies.base import KEY_BITS, KEY_MASK, TOUCH_BITS, Policy

PRIORITY_SHIFT = KEY_BITS + TOUCH_BITS


class LFUDA(Policy):
    name = "lfuda"

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.freq: dict[int, int] = {}  # resident key -> lookups since admission
        self.priority: dict[int, int] = {}
        self.entry: dict[int, int] = {}  # resident key -> its live heap entry
        self.heap: list[int] = []
        self.age = 0  # L
        self.clock = 0

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, freq, prio = self.resident, self.freq, self.priority
        age = self.age
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            if k in res:
                hits.append(k)
                f = freq[k] + 1
            else:
                misses.append(k)
                res[k] = size
                f = 1
            freq[k] = f
            prio[k] = age + f
        self.held += size * len(misses)
        self._touch(lookups if recency is None else recency)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        for k in keys:
            self.resident[k] = size
            self.freq[k] = 0
            self.priority[k] = self.age
        self.held += size * len(keys)
        self._touch(keys)

    def _touch(self, keys: Sequence[int]) -> None:
        prio, entry, heap = self.priority, self.entry, self.heap
        clock = self.clock
        for k in keys:
            clock += 1
            e = (prio[k] << PRIORITY_SHIFT) | (clock << KEY_BITS) | k
            entry[k] = e
            heappush(heap, e)
        self.clock = clock
        if len(heap) > 4 * len(entry) + 256:
            self.heap = list(entry.values())
            heapify(self.heap)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        heap, entry, res = self.heap, self.entry, self.resident
        victims: list[int] = []
        aside = []
        while self.held > self.budget and heap:
            e = heappop(heap)
            k = e & KEY_MASK
            if entry.get(k) != e:
                continue
            if k in protected:
                aside.append(e)
                continue
            self.age = e >> PRIORITY_SHIFT
            del entry[k], self.freq[k], self.priority[k]
            self.held -= res.pop(k)
            victims.append(k)
        for e in aside:
            heappush(heap, e)
        return victims
