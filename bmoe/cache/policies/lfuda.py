"""``lfuda``: LFU with dynamic aging (Arlitt et al.), byte budget.

Each resident key has a priority K = L + F, where F counts its lookups since it was admitted
(reset when evicted, unlike ``lfu``) and L is the cache's age: the priority of the last
victim. A hit sets K = L + F with the current L, so keys that were popular long ago age out
instead of squatting. Victim: lowest K, ties by least recent touch. A prefetched key enters
with F = 0 (K = L). Min-heap with lazy deletion of packed ``K | touch | key`` integers.

``lfuda-libcachesim`` (:class:`LibCacheSimLFUDA`) is libCacheSim's different reading of the
policy, offered so that its figures can be reproduced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from heapq import heapify, heappop, heappush

from bmoe.cache.policies.base import KEY_BITS, KEY_MASK, TOUCH_BITS, TOUCH_MASK, Policy

PRIORITY_SHIFT = KEY_BITS + TOUCH_BITS


class LFUDA(Policy):
    name = "lfuda"
    summary = "LFU with dynamic aging (priority = lookups since admission + the age)."

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


class LibCacheSimLFUDA(LFUDA):
    """``lfuda-libcachesim``: LFUDA as libCacheSim (0.3) implements it, for comparing figures.

    Its rules, where they differ from ``lfuda``: a hit adds the age to the key's priority
    (K = K + L, where Arlitt et al. recompute K = L + F). The age L tracks the bottom: 0
    until the first eviction, then the last victim's K, raised to the lowest K at or above
    it among the other resident keys when a victim or a hit leaves it alone; a key entering
    the cache takes K = L + 1 with the age after its batch's evictions. A hit key left
    below the raised age is stranded: no victim while a key at or above the age remains
    (libCacheSim looks for victims from the age upward), until its next hit. Victim: the
    lowest K at or above the age, ties by least recent touch. With one lookup per batch the
    hits equal libCacheSim's request for request; the first rule carries nearly all of the
    difference to ``lfuda``.
    """

    name = "lfuda-libcachesim"
    summary = "libCacheSim's LFUDA, rule for rule (its hit adds the age)."

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.entering: list[int] = []  # the last lookup's misses: priority set by evict
        self.stranded: dict[int, int] = {}  # resident key below the age -> its heap entry

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, prio, entry = self.resident, self.priority, self.entry
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            if k in res:
                old = prio[k]
                prio[k] = old + self.age
                if self.stranded.pop(k, None) is None:
                    del entry[k]  # off the heap while its batch runs
                if old == self.age:  # k was at the bottom: the age rises to the lowest other
                    self.age = self._lowest_at_or_above(prio[h] for h in hits)
                hits.append(k)
            else:
                misses.append(k)
                res[k] = size
        for k in misses:  # stays unless this batch evicts
            prio[k] = self.age + 1
        self.entering = misses
        self.held += size * len(misses)
        self._touch(lookups if recency is None else recency)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        self.entering = []
        super().admit(keys, size, next_use)

    def _heap_top(self) -> int | None:
        """The heap's lowest live entry at or above the age: stale entries dropped from the
        top, entries below the age stranded."""
        heap, entry, age = self.heap, self.entry, self.age
        while heap:
            e = heap[0]
            k = e & KEY_MASK
            if entry.get(k) == e:
                if e >> PRIORITY_SHIFT >= age:
                    return e
                self.stranded[k] = entry.pop(k)
            heappop(heap)
        return None

    def _lowest_at_or_above(self, others: Iterable[int] = ()) -> int:
        """The lowest priority at or above the age in the heap and among `others`; the age
        itself when there is none."""
        age = self.age
        low = min((q for q in others if q >= age), default=-1)
        top = self._heap_top()
        if top is not None and (low < 0 or top >> PRIORITY_SHIFT < low):
            low = top >> PRIORITY_SHIFT
        return age if low < 0 else low

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        heap, entry, res, prio = self.heap, self.entry, self.resident, self.priority
        # keys entering in this batch stay off the heap until their priority is known
        stamps = {k: (entry.pop(k) >> KEY_BITS) & TOUCH_MASK for k in self.entering}
        victims: list[int] = []
        aside = []
        while self.held > self.budget:
            e = self._heap_top()
            if e is not None:
                heappop(heap)
                k = e & KEY_MASK
                if k in protected:
                    aside.append(e)
                    continue
                del entry[k]
                self.age = e >> PRIORITY_SHIFT
            else:  # only stranded keys left: the lowest of them, the age unchanged
                outside = [e for k, e in self.stranded.items() if k not in protected]
                if not outside:
                    break
                k = min(outside) & KEY_MASK
                del self.stranded[k]
            del prio[k]
            self.freq.pop(k, None)  # counted only for prefetched keys (admit)
            self.held -= res.pop(k)
            victims.append(k)
        for e in aside:
            heappush(heap, e)
        if victims:  # the age after the evictions, raised to the lowest other key
            self.age = self._lowest_at_or_above()
        for k, touch in stamps.items():
            if victims:
                prio[k] = self.age + 1
            e = (prio[k] << PRIORITY_SHIFT) | (touch << KEY_BITS) | k
            entry[k] = e
            heappush(heap, e)
        self.entering = []
        return victims
