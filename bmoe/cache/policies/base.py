"""What every eviction policy provides to the expert cache.

A policy owns the resident set (key -> bytes) and the structures that order its victims. Keys
are ``(layer << 16) | expert`` integers (see :func:`bmoe.cache.expert_cache.cache_key`), so a
batch's layer is ``key >> 16``. The cache calls, per batch:

* :meth:`Policy.lookup` with the batch's distinct keys in first-seen order (each one lookup)
  and, when a repeated id reordered them, the same keys in last-touch order (recency);
* :meth:`Policy.admit` for speculative admissions (prefetch: not lookups);
* :meth:`Policy.evict` once afterwards, never choosing a key in ``protected``.

These are the live cache's operations and the definition of the batch semantics; offline
replay runs the same semantics as compiled whole-trace loops (:mod:`bmoe.cache.kernels`),
tested equal batch for batch.
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
    #: what it evicts, in a sentence (the replay's help lists every policy with it)
    summary = ""
    #: other spellings the engine uses for this policy (its preamble's ``cache_policy``)
    engine_names: tuple[str, ...] = ()
    #: the policy needs each key's next batch of use (it reads the future: replay only)
    needs_future = False
    #: the budget is split into equal per-layer slices (eviction stays inside a layer)
    per_layer = False
    #: :meth:`refresh` takes a run of hits in one call (else the cache looks each batch up)
    bulk_refresh = False

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

    def refresh(self, touches: list[int]) -> None:
        """What :meth:`lookup` does to hits, for a run of batches whose every key is resident,
        in one call: `touches` are their keys batch after batch in the order touched (a repeat
        is a touch again). Raises KeyError for a key not resident. Only where
        :attr:`bulk_refresh` says so: the order of a run of hits must not depend on where its
        batches begin."""
        raise NotImplementedError

    # -- the room a speculative admission may take ---------------------------------------
    def capacity(self, layer: int) -> int:
        return self.budget

    def held_in(self, layer: int) -> int:
        return self.held
