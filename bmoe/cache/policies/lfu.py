"""``lfu``: evict the key with the fewest lookups so far, ties by least recent touch.

Counts survive eviction (a key re-admitted carries on from its old count). Victims come from
a min-heap with lazy deletion: every touch pushes a fresh entry, and an entry is live only
while it is the key's latest. Entries are single integers ``count | touch | key`` (packed,
so the heap compares ints, not tuples); a key touched since the current batch began has a
touch stamp at or after the batch's first one, which is how protection is checked.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from heapq import heapify, heappop, heappush

from bmoe.cache.policies.base import Policy

KEY_BITS = 32
KEY_MASK = (1 << KEY_BITS) - 1
TOUCH_BITS = 40
TOUCH_MASK = (1 << TOUCH_BITS) - 1
COUNT_SHIFT = KEY_BITS + TOUCH_BITS


class LFU(Policy):
    name = "lfu"

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.count: dict[int, int] = {}  # lookups since the replay began (kept on eviction)
        self.entry: dict[int, int] = {}  # resident key -> its live heap entry
        self.heap: list[int] = []
        self.clock = 0
        self.batch_start = 1  # touch stamp of the current batch's first touch

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
        self.batch_start = self.clock + 1
        self._touch(lookups if recency is None else recency)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        res = self.resident
        for k in keys:
            res[k] = size
        self.held += size * len(keys)
        self._touch(keys)

    def _touch(self, keys: Sequence[int]) -> None:
        count, entry, heap = self.count, self.entry, self.heap
        clock = self.clock
        for k in keys:
            clock += 1
            e = (count.get(k, 0) << COUNT_SHIFT) | (clock << KEY_BITS) | k
            entry[k] = e
            heappush(heap, e)
        self.clock = clock
        if len(heap) > 4 * len(entry) + 256:
            self._compact()

    def _compact(self) -> None:
        self.heap = list(self.entry.values())
        heapify(self.heap)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        heap, entry, res = self.heap, self.entry, self.resident
        victims: list[int] = []
        aside = []
        while self.held > self.budget and heap:
            e = heappop(heap)
            k = e & KEY_MASK
            if entry.get(k) != e:
                continue  # stale
            if k in protected:
                aside.append(e)
                continue
            del entry[k]
            self.held -= res.pop(k)
            victims.append(k)
        for e in aside:
            heappush(heap, e)
        return victims

    def run(self, layers, lookups, recency, sizes, next_use) -> list[int]:
        """:meth:`Policy.run`, fused: the same steps as :meth:`lookup` + :meth:`evict`.

        A batch's fresh heap entries are pushed after its eviction: while it runs, the
        batch's keys only have stale entries in the heap, so they cannot be chosen.
        """
        res, count, entry, heap = self.resident, self.count, self.entry, self.heap
        held, budget, clock = self.held, self.budget, self.clock
        hits = [0] * len(layers)
        for i, look in enumerate(lookups):
            size = sizes[i]
            h = 0
            fresh = []
            rec = recency[i]
            for k in look:
                c = count.get(k, 0) + 1
                count[k] = c
                if k in res:
                    h += 1
                else:
                    res[k] = size
                    held += size
                if rec is None:  # touched in lookup order
                    clock += 1
                    e = (c << COUNT_SHIFT) | (clock << KEY_BITS) | k
                    entry[k] = e
                    fresh.append(e)
            if rec is not None:
                for k in rec:
                    clock += 1
                    e = (count[k] << COUNT_SHIFT) | (clock << KEY_BITS) | k
                    entry[k] = e
                    fresh.append(e)
            hits[i] = h
            while held > budget and heap:
                e = heappop(heap)
                k = e & KEY_MASK
                if entry.get(k) != e:
                    continue
                del entry[k]
                held -= res.pop(k)
            for e in fresh:
                heappush(heap, e)
            if len(heap) > 4 * len(entry) + 256:
                heap = list(entry.values())
                heapify(heap)
        self.held, self.clock, self.heap = held, clock, heap
        self.batch_start = clock + 1
        return hits
