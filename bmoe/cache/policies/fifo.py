"""``fifo``: first in, first out. Keys queue in the order they were admitted and a hit moves
nothing; the victim is the oldest key. The baseline that SIEVE, CLOCK and S3-FIFO refine.

Batch-wise: the victim is the oldest key the batch did not touch (the batch's keys keep their
place in the queue), and the batch's new keys are the newest, so no eviction of the batch
reaches them. With one lookup per batch this is libCacheSim's ``FIFO`` request for request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class FIFO(Policy):
    name = "fifo"
    summary = "the oldest expert to enter the cache (first in, first out; a hit moves nothing)."
    bulk_refresh = True

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.queue: OrderedDict[int, int] = OrderedDict()  # oldest first: key -> bytes

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
            else:
                misses.append(k)
                res[k] = self.queue[k] = size
        self.held += size * len(misses)
        return hits, misses

    def refresh(self, touches: list[int]) -> None:
        """A hit moves nothing: only check that every key is resident."""
        if not self.resident.keys() >= set(touches):
            raise KeyError(next(k for k in touches if k not in self.resident))

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        for k in keys:
            self.resident[k] = self.queue[k] = size
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        victims: list[int] = []
        freed = 0
        for k, size in self.queue.items():  # oldest first
            if self.held - freed <= self.budget:
                break
            if k not in protected:
                victims.append(k)
                freed += size
        for k in victims:
            del self.queue[k]
            del self.resident[k]
        self.held -= freed
        return victims
