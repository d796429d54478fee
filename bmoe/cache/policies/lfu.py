"""``lfu``: evict the key with the fewest lookups so far, ties by least recent touch.

Counts survive eviction (a key re-admitted carries on from its old count): "perfect LFU",
the reference's. ``lfu-incache`` is the other common variant, counting only while cached.

Victims come from a min-heap of packed ``count | touch | key`` integers, updated lazily: a
key's priority only grows (its count and its last touch both increase), so the heap keeps one
entry per resident key, possibly stale (lower than the key's priority now). A popped entry
that is stale goes back at the key's current priority; one that is current is the true
minimum. A hit costs no heap operation at all.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from heapq import heappop, heappush

from bmoe.cache.policies.base import KEY_BITS, KEY_MASK, TOUCH_BITS, Policy

COUNT_SHIFT = KEY_BITS + TOUCH_BITS


class LFU(Policy):
    name = "lfu"
    summary = "the least often used, counting every lookup since the start (perfect LFU)."
    #: counts survive eviction ("perfect LFU"); False counts only while a key is cached
    keep_counts = True

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.count: dict[int, int] = {}  # lookups since the replay began (kept on eviction)
        self.stamp: dict[int, int] = {}  # resident key -> its last touch
        self.heap: list[int] = []  # one entry per resident key, at or below its priority
        self.clock = 0

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res = self.resident
        count = self.count
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            count[k] = count.get(k, 0) + 1
            if k in res:
                hits.append(k)
            else:
                misses.append(k)
                res[k] = size
        self.held += size * len(misses)
        self._touch(lookups if recency is None else recency)
        self._enter(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        res = self.resident
        for k in keys:
            res[k] = size
        self.held += size * len(keys)
        self._touch(keys)
        self._enter(keys)

    def _touch(self, keys: Sequence[int]) -> None:
        stamp = self.stamp
        clock = self.clock
        for k in keys:
            clock += 1
            stamp[k] = clock
        self.clock = clock

    def _enter(self, keys: Sequence[int]) -> None:
        """Push the first heap entry of newly resident keys."""
        count, stamp, heap = self.count, self.stamp, self.heap
        for k in keys:
            heappush(heap, (count.get(k, 0) << COUNT_SHIFT) | (stamp[k] << KEY_BITS) | k)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        heap, stamp, count, res = self.heap, self.stamp, self.count, self.resident
        victims: list[int] = []
        aside = []
        while self.held > self.budget and heap:
            e = heappop(heap)
            k = e & KEY_MASK
            now = (count.get(k, 0) << COUNT_SHIFT) | (stamp[k] << KEY_BITS) | k
            if e != now:
                heappush(heap, now)  # stale: back at the key's priority now
                continue
            if k in protected:
                aside.append(e)
                continue
            del stamp[k]
            if not self.keep_counts:
                count.pop(k, None)  # a prefetched key never looked up has no count
            self.held -= res.pop(k)
            victims.append(k)
        for e in aside:
            heappush(heap, e)
        return victims


class InCacheLFU(LFU):
    """``lfu-incache``: LFU whose counts start again when a key is evicted (counts only
    while cached, the variant most simulators call LFU, libCacheSim's among them)."""

    name = "lfu-incache"
    summary = "LFU counting only while an expert is cached."
    keep_counts = False
