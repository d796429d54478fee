"""``clock``: CLOCK (FIFO with reinsertion, second chance) as libCacheSim runs it with its
default 1-bit counter. A hit sets a key's bit; to evict, the oldest key leaves the queue
and, if its bit is set, goes back in as the newest with the bit cleared, else it is the
victim. New keys enter as the newest with the bit clear.

Batch-wise: the batch's evictions come before its new keys enter (libCacheSim evicts before
it inserts); a batch key reached with its bit clear goes back in as well, and eviction stops
when only the batch's keys are left. With one lookup per batch this is libCacheSim's
``Clock`` request for request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class Clock(Policy):
    name = "clock"
    summary = "CLOCK, a FIFO whose oldest key goes back in once if it was hit (second chance)."

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.queue: OrderedDict[int, int] = OrderedDict()  # oldest first: key -> bytes
        self.bit: dict[int, bool] = {}
        self.entering: list[int] = []  # the batch's new keys

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
                self.bit[k] = True
            else:
                misses.append(k)
                res[k] = self.queue[k] = size  # where it stays unless this batch evicts
                self.bit[k] = False
        self.entering = misses
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        self.entering = []
        for k in keys:
            self.resident[k] = self.queue[k] = size
            self.bit[k] = False
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        queue = self.queue
        for _ in self.entering:  # the new keys (the newest) enter after the evictions
            queue.popitem()
        victims: list[int] = []
        passed = 0  # the batch's keys gone round in a row, their bit clear
        while self.held > self.budget and queue and passed < len(queue):
            k, size = queue.popitem(last=False)
            if self.bit[k]:
                self.bit[k] = False
                queue[k] = size
                passed = 0
            elif k in protected:
                queue[k] = size
                passed += 1
            else:
                del self.bit[k]
                self.held -= self.resident.pop(k)
                victims.append(k)
                passed = 0
        for k in self.entering:
            queue[k] = self.resident[k]
        self.entering = []
        return victims
