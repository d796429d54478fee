"""The byte-budgeted expert cache: one implementation for live staging and offline replay.

A *batch* is one load of one layer. Inside a batch each distinct expert is looked up once (a
repeated id only refreshes recency); a miss makes the key resident at the layer's expert bytes
and counts them as read; after the batch the policy evicts until the bytes held fit the
budget, never evicting a key the batch touched. Budget 0 therefore means no cache: every
lookup misses and only the current batch stays resident. (The per-layer policies evict only
the staging layer's keys, so there every layer keeps its last batch, as in the reference.)

``prefetch`` admits keys speculatively (not a lookup). The first demand lookup of a
prefetched key that is still resident is a *prefetch hit*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bmoe.cache.policies import DEFAULT_POLICY, POLICIES, Policy
from bmoe.errors import BmoeError

EXPERT_BITS = 16
EXPERT_MASK = (1 << EXPERT_BITS) - 1


def cache_key(layer: int, expert: int) -> int:
    """The integer key of (layer, expert): ``layer << 16 | expert``."""
    return (int(layer) << EXPERT_BITS) | int(expert)


def key_layer(key: int) -> int:
    return key >> EXPERT_BITS


def key_expert(key: int) -> int:
    return key & EXPERT_MASK


@dataclass
class StageResult:
    """What one batch did: expert ids hit and missed (first-seen order), prefetch hits,
    evicted (layer, expert) pairs and the bytes read for the misses."""

    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    prefetch_hits: list[int] = field(default_factory=list)
    evicted: list[tuple[int, int]] = field(default_factory=list)
    bytes_read: int = 0


def _distinct(keys: list[int]) -> tuple[list[int], list[int] | None]:
    """First-seen order and, when an id repeats, last-touch order (else None)."""
    first = list(dict.fromkeys(keys))
    if len(first) == len(keys):
        return first, None
    last = list(dict.fromkeys(reversed(keys)))
    last.reverse()
    return first, last


def _holds_all(policy: Policy, key_space_bytes: Mapping[int, int]) -> bool:
    """Whether `policy` fits every key of the key space at once (each layer's in its slice,
    for a per-layer policy), so that it can never have to evict."""
    if policy.per_layer:
        return all(b <= policy.capacity(layer) for layer, b in key_space_bytes.items())
    return sum(key_space_bytes.values()) <= policy.budget


class ExpertCache:
    """A byte-budgeted cache over (layer, expert) keys with a named eviction policy.

    ``policy`` is one of :data:`POLICIES`; ``belady`` reads the future, so every staged key
    needs its next batch of use (``next_use``); ``layer`` and ``layerlfu`` split the budget
    into ``n_layer`` equal slices. ``seed`` drives ``random``. ``key_space_bytes`` (layer ->
    the bytes of every key of that layer it may ever be given) lets the cache know when it can
    never evict (:attr:`never_evicts`).
    """

    def __init__(
        self,
        budget_bytes: int,
        policy: str = DEFAULT_POLICY,
        *,
        n_layer: int | None = None,
        seed: int = 0,
        key_space_bytes: Mapping[int, int] | None = None,
    ):
        if policy not in POLICIES:
            raise BmoeError(f"unknown cache policy {policy!r} (choose from {', '.join(POLICIES)})")
        budget_bytes = int(budget_bytes)
        if budget_bytes < 0:
            raise BmoeError(f"cache budget must be >= 0 bytes, not {budget_bytes}")
        self.policy_name = policy
        self._policy: Policy = POLICIES[policy](budget_bytes, n_layer=n_layer, seed=seed)
        self.never_evicts = key_space_bytes is not None and _holds_all(
            self._policy, key_space_bytes
        )
        self._pending: set[int] = set()  # prefetched, not yet looked up
        self._touched: set[int] = set()  # keys touched since the last stage began
        self._stats = dict.fromkeys(
            (
                "lookups",
                "hits",
                "misses",
                "prefetch_hits",
                "prefetched",
                "bytes_read",
                "prefetch_bytes",
                "evictions",
            ),
            0,
        )

    # -- state ------------------------------------------------------------------------
    @property
    def budget_bytes(self) -> int:
        return self._policy.budget

    @property
    def bytes_held(self) -> int:
        return self._policy.held

    @property
    def needs_future(self) -> bool:
        return self._policy.needs_future

    def __contains__(self, item: tuple[int, int]) -> bool:
        layer, expert = item
        return cache_key(layer, expert) in self._policy.resident

    def __len__(self) -> int:
        return len(self._policy.resident)

    def resident(self) -> set[tuple[int, int]]:
        """The resident (layer, expert) pairs."""
        return {(k >> EXPERT_BITS, k & EXPERT_MASK) for k in self._policy.resident}

    @property
    def stats(self) -> dict[str, int]:
        """Counters since creation: lookups, hits, misses, prefetch_hits, prefetched,
        bytes_read (demand reads), prefetch_bytes (speculative reads), evictions."""
        return dict(self._stats)

    # -- staging ----------------------------------------------------------------------
    def stage(
        self,
        layer: int,
        experts: Sequence[int] | np.ndarray,
        expert_bytes: int,
        next_use: Sequence[int] | np.ndarray | None = None,
    ) -> StageResult:
        """Stage one batch: the experts one load of `layer` routed (repeats allowed).

        `next_use` (``belady`` only) gives, per entry of `experts`, the number of the next
        batch that looks the same key up again (any value at least as large as every real
        batch number for "never").
        """
        base = int(layer) << EXPERT_BITS
        ids = np.asarray(experts, dtype=np.int64).tolist()
        if any(e < 0 or e > EXPERT_MASK for e in ids):
            raise BmoeError(f"layer {layer}: expert ids must be in 0..{EXPERT_MASK}")
        keys = [base | e for e in ids]
        lookups, recency = _distinct(keys)
        nu = None
        if next_use is not None:
            by_key = dict(zip(keys, np.asarray(next_use, dtype=np.int64).tolist(), strict=True))
            nu = [by_key[k] for k in lookups]
        hits, misses, pf_hits, evicted = self.stage_keys(layer, lookups, recency, expert_bytes, nu)
        return StageResult(
            hits=[k & EXPERT_MASK for k in hits],
            misses=[k & EXPERT_MASK for k in misses],
            prefetch_hits=[k & EXPERT_MASK for k in pf_hits],
            evicted=[(k >> EXPERT_BITS, k & EXPERT_MASK) for k in evicted],
            bytes_read=len(misses) * int(expert_bytes),
        )

    def stage_keys(
        self,
        layer: int,
        lookups: list[int],
        recency: list[int] | None,
        expert_bytes: int,
        next_use: list[int] | None = None,
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """The lean form of :meth:`stage` that replay drives: already-distinct keys of one
        layer in first-seen order, their last-touch order when it differs (else None), and
        per-lookup next use. Returns (hit keys, missed keys, prefetch-hit keys, victims)."""
        policy = self._policy
        if policy.needs_future and next_use is None:
            raise BmoeError(
                f"policy {self.policy_name!r} needs each key's next use (offline replay only)"
            )
        hits, misses = policy.lookup(lookups, recency, int(expert_bytes), next_use)
        pf_hits: list[int] = []
        pending = self._pending
        if pending and hits:
            pf_hits = [k for k in hits if k in pending]
            pending.difference_update(pf_hits)
        touched = set(lookups)
        self._touched = touched
        victims = (
            policy.evict(layer, touched) if policy.held_in(layer) > policy.capacity(layer) else []
        )
        if victims and pending:
            pending.difference_update(victims)
        st = self._stats
        st["lookups"] += len(lookups)
        st["hits"] += len(hits)
        st["misses"] += len(misses)
        st["prefetch_hits"] += len(pf_hits)
        st["bytes_read"] += len(misses) * int(expert_bytes)
        st["evictions"] += len(victims)
        return hits, misses, pf_hits, victims

    def stage_resident(
        self,
        touches: list[int],
        ends: list[int],
        lookups: int,
        expert_bytes: Mapping[int, int],
    ) -> None:
        """:meth:`stage_keys` for batches the caller knows are all resident (the live engine's
        routings that needed no read), in one call: `touches` holds their keys batch after
        batch in the order touched (repeats allowed), `ends` where each batch ends in it, and
        `lookups` how many distinct keys they have (a batch's distinct keys are each one
        lookup), with each layer's `expert_bytes`. The same counts and recency as staging
        them one by one.

        Where it can, it refreshes recency without going batch by batch. A cache that
        :attr:`never_evicts` never reads its policy's order (a victim is only chosen over the
        budget, and every key fits in it) and a hit changes nothing else, so there it only
        counts, and takes the caller's word that every key is resident (the live engine's
        flags of what is readable, which the eval filter checked). A policy with a bulk
        :meth:`~bmoe.cache.policies.base.Policy.refresh` (LRU, FIFO) takes the whole run of
        hits at once. Otherwise, or with prefetched keys pending, each batch is looked up, and
        their distinct keys must be the caller's count. A key found not resident, or the
        budget overrun afterwards, means the caller was wrong, and raises."""
        if not ends:
            return
        policy = self._policy
        pf_hits = 0
        if self._pending or not (self.never_evicts or policy.bulk_refresh):
            pf_hits = self._stage_resident_each(touches, ends, lookups, expert_bytes)
        elif not self.never_evicts:
            try:
                policy.refresh(touches)
            except KeyError:
                raise BmoeError("experts staged as resident were not cached") from None
        last_batch = touches[ends[-2] if len(ends) > 1 else 0 : ends[-1]]
        last = last_batch[0] >> EXPERT_BITS
        if policy.held_in(last) > policy.capacity(last):  # hits hold no more bytes
            raise BmoeError(f"the cache holds more than its budget after layer {last}")
        self._touched = set(last_batch)
        st = self._stats
        st["lookups"] += lookups
        st["hits"] += lookups
        st["prefetch_hits"] += pf_hits

    def _stage_resident_each(
        self, touches: list[int], ends: list[int], lookups: int, expert_bytes: Mapping[int, int]
    ) -> int:
        """:meth:`stage_resident`'s lookups batch by batch (the general path); returns the
        prefetch hits."""
        policy, pending = self._policy, self._pending
        lookup, per_layer = policy.lookup, policy.per_layer
        pf_hits = looked_up = start = 0
        for end in ends:
            batch = touches[start:end]
            start = end
            layer = batch[0] >> EXPERT_BITS
            distinct, recency = _distinct(batch)
            hits, misses = lookup(distinct, recency, expert_bytes[layer], None)
            if misses or (per_layer and policy.held_in(layer) > policy.capacity(layer)):
                raise BmoeError(f"layer {layer}: experts staged as resident were not cached")
            looked_up += len(distinct)
            if pending:
                found = [k for k in hits if k in pending]
                pending.difference_update(found)
                pf_hits += len(found)
        if looked_up != lookups:
            raise BmoeError(f"{looked_up} distinct experts staged as resident, not {lookups}")
        return pf_hits

    def prefetch(
        self,
        layer: int,
        experts: Sequence[int] | np.ndarray,
        expert_bytes: int,
        next_use: Sequence[int] | np.ndarray | None = None,
    ) -> list[int]:
        """Admit `experts` of `layer` speculatively; return the ids admitted.

        Resident ids are skipped. An id is admitted only while the keys touched since the
        last stage plus the admissions fit the budget (the layer's slice for per-layer
        policies), so a prefetch never pushes out the batch in use or an earlier bet of the
        same round; then the policy evicts as after a stage.
        """
        base = int(layer) << EXPERT_BITS
        ids = list(dict.fromkeys(np.asarray(experts, dtype=np.int64).tolist()))
        nus = None
        if next_use is not None:
            nus = dict(zip(ids, np.asarray(next_use, dtype=np.int64).tolist(), strict=False))
        admitted = self.prefetch_keys(
            layer,
            [base | e for e in ids],
            expert_bytes,
            None if nus is None else [nus[e] for e in ids],
        )
        return [k & EXPERT_MASK for k in admitted]

    def prefetch_keys(
        self,
        layer: int,
        keys: list[int],
        expert_bytes: int,
        next_use: list[int] | None = None,
    ) -> list[int]:
        """The lean form of :meth:`prefetch` over distinct keys; returns the keys admitted."""
        policy = self._policy
        if policy.needs_future and next_use is None:
            raise BmoeError(
                f"policy {self.policy_name!r} needs each key's next use (offline replay only)"
            )
        size = int(expert_bytes)
        res = policy.resident
        touched = self._touched
        capacity = policy.capacity(layer)
        if policy.per_layer:
            protected_bytes = sum(res[k] for k in touched if k in res and k >> EXPERT_BITS == layer)
        else:
            protected_bytes = sum(res[k] for k in touched if k in res)
        admitted: list[int] = []
        admitted_nu: list[int] = []
        for i, k in enumerate(keys):
            if k in res or protected_bytes + size > capacity:
                continue
            admitted.append(k)
            if next_use is not None:
                admitted_nu.append(next_use[i])
            protected_bytes += size
        if not admitted:
            return admitted
        policy.admit(admitted, size, admitted_nu if next_use is not None else None)
        touched.update(admitted)
        self._pending.update(admitted)
        victims = policy.evict(layer, touched) if policy.held_in(layer) > capacity else []
        if victims:
            self._pending.difference_update(victims)
        st = self._stats
        st["prefetched"] += len(admitted)
        st["prefetch_bytes"] += len(admitted) * size
        st["evictions"] += len(victims)
        return admitted
