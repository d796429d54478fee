"""``layer`` and ``layerlfu``: every layer gets an equal slice of the budget
(budget // n_layer) and, after a batch, only the staging layer's keys are evicted, by LRU or
LFU, until that layer fits its slice. Each slice is an ordinary policy instance."""

from __future__ import annotations

from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy
from bmoe.cache.policies.lfu import LFU
from bmoe.cache.policies.lru import LRU
from bmoe.errors import BmoeError


class LayerSliced(Policy):
    per_layer = True
    inner: type[Policy] = LRU

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        if not n_layer or n_layer < 1:
            raise BmoeError(f"policy {self.name!r} needs the model's layer count (n_layer)")
        self.n_layer = int(n_layer)
        self.slice = budget // self.n_layer
        self.parts: dict[int, Policy] = {}
        self.seed = seed

    def _part(self, layer: int) -> Policy:
        part = self.parts.get(layer)
        if part is None:
            part = self.parts[layer] = self.inner(self.slice, seed=self.seed)
        return part

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        part = self._part(lookups[0] >> 16) if lookups else None
        if part is None:
            return [], []
        hits, misses = part.lookup(lookups, recency, size, next_use)
        res = self.resident
        for k in misses:
            res[k] = size
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        if not keys:
            return
        self._part(keys[0] >> 16).admit(keys, size, next_use)
        res = self.resident
        for k in keys:
            res[k] = size
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        part = self.parts.get(layer)
        if part is None:
            return []
        victims = part.evict(layer, protected)
        res = self.resident
        for k in victims:
            self.held -= res.pop(k)
        return victims

    def capacity(self, layer: int) -> int:
        return self.slice

    def held_in(self, layer: int) -> int:
        part = self.parts.get(layer)
        return part.held if part is not None else 0


class LayerLRU(LayerSliced):
    name = "layer"
    summary = (
        "each layer gets budget / layers and evicts its own least recently used; it keeps its "
        "current batch whatever the budget, so below T it holds more than the budget."
    )
    engine_names = ("layer-lru",)
    inner = LRU


class LayerLFU(LayerSliced):
    name = "layerlfu"
    summary = "layer with the least often used in place of the least recently used."
    engine_names = ("layer-lfu",)
    inner = LFU
