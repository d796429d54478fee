"""``lru``: evict the key touched least recently.

The resident set is an insertion-ordered dict kept in recency order (front = least recent),
so a lookup and a victim are O(1). The keys a batch touched are the most recent ones, so
protected keys only surface once everything else is gone.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class LRU(Policy):
    name = "lru"
    summary = "the least recently used expert."
    bulk_refresh = True

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.resident: OrderedDict[int, int] = OrderedDict()

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res = self.resident
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            if k in res:
                hits.append(k)
                res.move_to_end(k)
            else:
                misses.append(k)
                res[k] = size
        if recency is not None:
            for k in recency:
                res.move_to_end(k)
        self.held += size * len(misses)
        return hits, misses

    def refresh(self, touches: list[int]) -> None:
        """Each touch moves its key to the most recent end, so the keys end up in last-touch
        order: what a batch's lookups and then its recency order leave, batch after batch.
        (The loop runs in C: a deque that keeps nothing consumes the map.)"""
        deque(map(self.resident.move_to_end, touches), maxlen=0)

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        res = self.resident
        for k in keys:
            res[k] = size
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        res = self.resident
        victims: list[int] = []
        aside: list[tuple[int, int]] = []
        while self.held > self.budget and res:
            k, size = res.popitem(last=False)
            if k in protected:
                aside.append((k, size))
                continue
            self.held -= size
            victims.append(k)
        for k, size in reversed(aside):  # back to the front, in their order
            res[k] = size
            res.move_to_end(k, last=False)
        return victims
