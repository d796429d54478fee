"""``arc``: Adaptive Replacement Cache (Megiddo and Modha), byte-weighted, batch-wise.

T1 holds keys seen once since they entered, T2 keys seen again; B1 and B2 remember (without
data) keys recently evicted from T1 and T2. The target p (bytes of T1) adapts: a miss on a B1
ghost grows it by the key's bytes x max(1, B2 bytes / B1 bytes), a miss on a B2 ghost shrinks
it by the key's bytes x max(1, B1 bytes / B2 bytes), both clamped to [0, budget].

Batch form of the reference semantics: per lookup, a T1 or T2 hit moves the key to T2's MRU
end, a ghost miss moves it to T2, a fresh miss enters T1; a repeated id moves the key to
its list's MRU end. After the batch, while over budget: evict T1's LRU key into B1 if T1
holds more than p bytes, else T2's LRU key into B2 (the other list when the chosen one has
nothing evictable). Then ghosts are trimmed from their LRU ends until T1 + B1 <= budget and
T1 + T2 + B1 + B2 <= 2 x budget (bytes). A prefetched key enters T1 like a fresh miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class ARC(Policy):
    name = "arc"
    summary = "ARC, recency and frequency lists with ghosts, sizes in bytes."

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.t1: OrderedDict[int, int] = OrderedDict()
        self.t2: OrderedDict[int, int] = OrderedDict()
        self.b1: OrderedDict[int, int] = OrderedDict()
        self.b2: OrderedDict[int, int] = OrderedDict()
        self.t1_bytes = 0
        self.b1_bytes = 0
        self.b2_bytes = 0
        self.p = 0.0  # target bytes of T1

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, t1, t2, b1, b2 = self.resident, self.t1, self.t2, self.b1, self.b2
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            if k in res:
                hits.append(k)
                if k in t1:
                    self.t1_bytes -= t1.pop(k)
                    t2[k] = size
                else:
                    t2.move_to_end(k)
                continue
            misses.append(k)
            res[k] = size
            if k in b1:
                delta = size * max(1.0, self.b2_bytes / self.b1_bytes)
                self.p = min(float(self.budget), self.p + delta)
                self.b1_bytes -= b1.pop(k)
                t2[k] = size
            elif k in b2:
                delta = size * max(1.0, self.b1_bytes / self.b2_bytes)
                self.p = max(0.0, self.p - delta)
                self.b2_bytes -= b2.pop(k)
                t2[k] = size
            else:
                t1[k] = size
                self.t1_bytes += size
        if recency is not None:
            for k in recency:
                (t1 if k in t1 else t2).move_to_end(k)
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        for k in keys:
            self.resident[k] = size
            if k in self.b1:
                self.b1_bytes -= self.b1.pop(k)
            elif k in self.b2:
                self.b2_bytes -= self.b2.pop(k)
            self.t1[k] = size
            self.t1_bytes += size
        self.held += size * len(keys)

    @staticmethod
    def _lru_evictable(lst: OrderedDict[int, int], protected: Set[int]) -> int | None:
        """The least recent key of `lst` that may go (protected keys sit at the MRU end)."""
        for k in lst:
            if k not in protected:
                return k
        return None

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        res, t1, t2, b1, b2 = self.resident, self.t1, self.t2, self.b1, self.b2
        victims: list[int] = []
        t1_done = t2_done = False  # nothing evictable left in that list
        while self.held > self.budget:
            k1 = None if t1_done else self._lru_evictable(t1, protected)
            t1_done = k1 is None
            from_t1 = k1 is not None and self.t1_bytes > self.p
            if not from_t1:
                k2 = None if t2_done else self._lru_evictable(t2, protected)
                t2_done = k2 is None
                if k2 is None and k1 is None:
                    break
                from_t1 = k2 is None
            if from_t1:
                assert k1 is not None
                size = t1.pop(k1)
                self.t1_bytes -= size
                b1[k1] = size
                self.b1_bytes += size
                victim = k1
            else:
                assert k2 is not None
                size = t2.pop(k2)
                b2[k2] = size
                self.b2_bytes += size
                victim = k2
            del res[victim]
            self.held -= size
            victims.append(victim)
        budget = self.budget
        while b1 and self.t1_bytes + self.b1_bytes > budget:
            self.b1_bytes -= b1.popitem(last=False)[1]
        while b2 and self.held + self.b1_bytes + self.b2_bytes > 2 * budget:
            self.b2_bytes -= b2.popitem(last=False)[1]
        return victims
