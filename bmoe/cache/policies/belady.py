"""``belady``: evict the key whose next batch of use is furthest (never again = infinitely
far), ties to the key resident longest (earliest admitted). It reads the future, so it is
an upper bound for replay, not a policy an engine can run.

A min-heap with lazy deletion; entries are single integers packing ``(NEVER - next use,
admission order, key)`` so the heap compares ints. Next uses come from the caller (replay
precomputes them all in one vectorised pass); any value >= NEVER means never.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from heapq import heapify, heappop, heappush

from bmoe.cache.policies.base import KEY_BITS, KEY_MASK, NEVER, Policy

ADMIT_SHIFT = KEY_BITS
DIST_SHIFT = 2 * KEY_BITS


class Belady(Policy):
    name = "belady"
    summary = "the expert used again furthest in the future (it knows the future: the bound)."
    needs_future = True

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.admitted: dict[int, int] = {}  # resident key -> admission order
        self.entry: dict[int, int] = {}  # resident key -> its live heap entry
        self.heap: list[int] = []
        self.admissions = 0

    def _entries(self, keys: Sequence[int], next_use: Sequence[int], size: int) -> int:
        """Admit the non-resident `keys`, push a fresh entry for every key; return the
        number admitted."""
        res, admitted, entry, heap = self.resident, self.admitted, self.entry, self.heap
        n_admitted = 0
        for k, nu in zip(keys, next_use, strict=True):
            a = admitted.get(k)
            if a is None:
                res[k] = size
                self.admissions += 1
                a = admitted[k] = self.admissions
                n_admitted += 1
            e = ((NEVER - min(nu, NEVER)) << DIST_SHIFT) | (a << ADMIT_SHIFT) | k
            entry[k] = e
            heappush(heap, e)
        if len(heap) > 4 * len(entry) + 256:
            self.heap = list(entry.values())
            heapify(self.heap)
        return n_admitted

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        assert next_use is not None
        res = self.resident
        hits = [k for k in lookups if k in res]
        misses = [k for k in lookups if k not in res]
        self.held += size * self._entries(lookups, next_use, size)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        assert next_use is not None
        self.held += size * self._entries(keys, next_use, size)

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
            del entry[k], self.admitted[k]
            self.held -= res.pop(k)
            victims.append(k)
        for e in aside:
            heappush(heap, e)
        return victims
