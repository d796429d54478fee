"""``sieve``: SIEVE (Zhang et al., NSDI 2024), as libCacheSim runs it. A FIFO queue with a
visited bit per key and a hand: a hit sets the bit; to evict, the hand walks from the oldest
key towards the newest (wrapping to the oldest), clearing set bits and taking the first key
whose bit is clear; it stays where the victim was, one key newer. New keys enter at the
newest end with the bit clear.

Batch-wise: the batch's evictions come before its new keys enter (libCacheSim evicts before
it inserts), so a key a batch admits is never under the hand in that batch; the batch's hit
keys are passed over (their bit cleared as any other's). With one lookup per batch this is
libCacheSim's ``Sieve`` request for request.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class Sieve(Policy):
    name = "sieve"
    summary = "SIEVE, a FIFO with a visited bit and a hand that passes over visited keys."

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.newer: dict[int, int | None] = {}  # the queue, towards the newest end
        self.older: dict[int, int | None] = {}
        self.oldest: int | None = None
        self.newest: int | None = None
        self.visited: dict[int, bool] = {}
        self.hand: int | None = None  # None: the oldest key
        self.entering: list[int] = []  # the batch's new keys

    def _push(self, k: int) -> None:
        self.older[k] = self.newest
        self.newer[k] = None
        if self.newest is None:
            self.oldest = k
        else:
            self.newer[self.newest] = k
        self.newest = k
        self.visited[k] = False

    def _unlink(self, k: int) -> None:
        older, newer = self.older.pop(k), self.newer.pop(k)
        if older is None:
            self.oldest = newer
        else:
            self.newer[older] = newer
        if newer is None:
            self.newest = older
        else:
            self.older[newer] = older

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
                self.visited[k] = True
            else:
                misses.append(k)
                res[k] = size
                self._push(k)  # where it stays unless this batch evicts
        self.entering = misses
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        self.entering = []
        for k in keys:
            self.resident[k] = size
            self._push(k)
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        for new in self.entering:  # the new keys enter after the evictions
            self._unlink(new)
        victims: list[int] = []
        at: int | None = self.hand
        passed = 0  # protected keys passed over in a row, their bit clear
        while self.held > self.budget and self.newer and passed < len(self.newer):
            k = self.oldest if at is None else at
            assert k is not None  # the queue is not empty
            if self.visited[k]:
                self.visited[k] = False
                passed = 0
                at = self.newer[k]
            elif k in protected:
                passed += 1
                at = self.newer[k]
            else:
                at = self.hand = self.newer[k]
                self._unlink(k)
                del self.visited[k]
                self.held -= self.resident.pop(k)
                victims.append(k)
                passed = 0
        for new in self.entering:
            self._push(new)
        self.entering = []
        return victims
