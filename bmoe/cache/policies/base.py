"""What every eviction policy provides to the expert cache.

A policy owns the resident set (key -> bytes) and the structures that order its victims. Keys
are ``(layer << 16) | expert`` integers (see :func:`bmoe.cache.expert_cache.cache_key`), so a
batch's layer is ``key >> 16``. The cache calls, per batch:

* :meth:`Policy.lookup` with the batch's distinct keys in first-seen order (each one lookup)
  and, when a repeated id reordered them, the same keys in last-touch order (recency);
* :meth:`Policy.admit` for speculative admissions (prefetch: not lookups);
* :meth:`Policy.evict` once afterwards, never choosing a key in ``protected``.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

NEVER = 1 << 62  # "next use": never again, infinitely far

# Heap policies pack an entry into one int, ordering fields above the key so that a plain
# int comparison orders entries: ... | touch << KEY_BITS | key.
KEY_BITS = 32
KEY_MASK = (1 << KEY_BITS) - 1
TOUCH_BITS = 40
TOUCH_MASK = (1 << TOUCH_BITS) - 1


class Policy:
    """Base class: budget, resident set and bytes held. Subclasses order the victims."""

    name = ""
    #: the policy needs each key's next batch of use (it reads the future: replay only)
    needs_future = False
    #: the budget is split into equal per-layer slices (eviction stays inside a layer)
    per_layer = False

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        self.budget = budget
        self.resident: dict[int, int] = {}
        self.held = 0

    # -- the three operations ---------------------------------------------------------
    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None,
    ) -> tuple[list[int], list[int]]:
        """Look up each key once, admit the misses at `size` bytes, refresh recency.

        `recency` is None when it equals `lookups` (no id repeated in the batch).
        Returns (hit keys, missed keys), both in lookup order.
        """
        raise NotImplementedError

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None) -> None:
        """Make `keys` (none of them resident) resident without counting a lookup."""
        raise NotImplementedError

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        """Evict until the bytes held fit (the budget, or `layer`'s slice for per-layer
        policies), never a key in `protected`; return the victims in eviction order."""
        raise NotImplementedError

    # -- a whole sequence at once (replay) ---------------------------------------------
    def run(
        self,
        layers: Sequence[int],
        lookups: Sequence[Sequence[int]],
        recency: Sequence[Sequence[int] | None],
        sizes: Sequence[int],
        next_use: Sequence[Sequence[int] | None],
    ) -> list[int]:
        """Stage every batch in turn (lookups then eviction, as one ``stage`` each) and
        return the hits per batch. The same operations as batch-by-batch staging, without
        the per-batch bookkeeping of the cache facade."""
        lookup, evict, capacity, held_in = self.lookup, self.evict, self.capacity, self.held_in
        per_layer = self.per_layer
        budget = self.budget
        hits = [0] * len(layers)
        for i, look in enumerate(lookups):
            layer = layers[i]
            h, _ = lookup(look, recency[i], sizes[i], next_use[i])
            hits[i] = len(h)
            if (held_in(layer) > capacity(layer)) if per_layer else (self.held > budget):
                evict(layer, set(look))
        return hits

    # -- the room a speculative admission may take ---------------------------------------
    def capacity(self, layer: int) -> int:
        return self.budget

    def held_in(self, layer: int) -> int:
        return self.held
