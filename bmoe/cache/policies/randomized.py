"""``random``: evict a key drawn uniformly from the evictable ones (seeded).

Resident keys live in a list with an index map (swap-remove), so a draw is O(1); a draw
that lands on a protected key is redrawn, which keeps the choice uniform over the rest.
"""

from __future__ import annotations

import random
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class Random(Policy):
    name = "random"
    summary = "one at random (--seed)."

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.keys: list[int] = []
        self.pos: dict[int, int] = {}
        self.rng = random.Random(seed)

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
                res[k] = size
        if misses:
            self._add(misses)
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        for k in keys:
            self.resident[k] = size
        self._add(keys)
        self.held += size * len(keys)

    def _add(self, keys: Sequence[int]) -> None:
        pos, lst = self.pos, self.keys
        for k in keys:
            pos[k] = len(lst)
            lst.append(k)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        res, lst, pos = self.resident, self.keys, self.pos
        evictable = len(lst) - sum(1 for k in protected if k in res)
        draw = self.rng.random
        victims: list[int] = []
        while self.held > self.budget and evictable > 0:
            i = int(draw() * len(lst))
            k = lst[i]
            if k in protected:
                continue
            last = lst.pop()
            if last != k:
                lst[i] = last
                pos[last] = i
            del pos[k]
            self.held -= res.pop(k)
            victims.append(k)
            evictable -= 1
        return victims
