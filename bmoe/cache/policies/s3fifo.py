"""``s3fifo``: S3-FIFO (Yang et al., SOSP 2023), byte-weighted, batch-wise.

Three FIFO queues: S (small, a tenth of the budget in bytes), M (main) and G (ghost keys, no
data, at most M's share of the budget in bytes). Each resident key has a 2-bit counter:
0 on entry, +1 per lookup hit (capped at 3). A miss whose key is in G enters M, any other
miss enters S; a repeated id in a batch changes nothing (FIFO ignores recency).

After the batch, while over budget: when S holds at least its share (or M has nothing
evictable) take S's oldest key: with a counter >= 1 it moves to M's newest end (counter
kept), else it is evicted into G. Otherwise take M's oldest key: with a counter >= 1 it
goes back to M's newest end with the counter decremented, else it is evicted. Keys the
batch touched are never evicted (they still move between queues). A prefetched key enters S.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from bmoe.cache.policies.base import Policy


class S3FIFO(Policy):
    name = "s3fifo"
    summary = "S3-FIFO, a small FIFO (a tenth of the budget) in front of a main FIFO, with ghosts."
    engine_names = ("s3-fifo",)

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.small: OrderedDict[int, int] = OrderedDict()  # front = oldest
        self.main: OrderedDict[int, int] = OrderedDict()
        self.ghost: OrderedDict[int, int] = OrderedDict()
        self.freq: dict[int, int] = {}
        self.small_bytes = 0
        self.ghost_bytes = 0
        self.small_target = budget // 10
        self.ghost_limit = budget - self.small_target

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, freq, ghost = self.resident, self.freq, self.ghost
        hits: list[int] = []
        misses: list[int] = []
        for k in lookups:
            if k in res:
                hits.append(k)
                f = freq[k]
                if f < 3:
                    freq[k] = f + 1
                continue
            misses.append(k)
            res[k] = size
            freq[k] = 0
            if k in ghost:
                self.ghost_bytes -= ghost.pop(k)
                self.main[k] = size
            else:
                self.small[k] = size
                self.small_bytes += size
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        for k in keys:
            self.resident[k] = size
            self.freq[k] = 0
            if k in self.ghost:
                self.ghost_bytes -= self.ghost.pop(k)
            self.small[k] = size
            self.small_bytes += size
        self.held += size * len(keys)

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        res, small, main, ghost, freq = self.resident, self.small, self.main, self.ghost, self.freq
        victims: list[int] = []
        small_stuck: list[tuple[int, int]] = []  # protected keys with no hit, kept in order
        main_skips = 0  # consecutive protected zero-counter keys passed over in M
        while self.held > self.budget:
            main_open = bool(main) and main_skips < len(main)
            if small and (self.small_bytes >= self.small_target or not main_open):
                k, size = small.popitem(last=False)
                self.small_bytes -= size
                if freq[k] >= 1:
                    main[k] = size
                    main_skips = 0
                    continue
                if k in protected:
                    small_stuck.append((k, size))
                    continue
                ghost[k] = size
                self.ghost_bytes += size
            elif main_open:
                k, size = main.popitem(last=False)
                if freq[k] >= 1:
                    freq[k] -= 1
                    main[k] = size
                    main_skips = 0
                    continue
                if k in protected:
                    main[k] = size
                    main_skips += 1
                    continue
            else:
                break
            del res[k], freq[k]
            self.held -= size
            victims.append(k)
            main_skips = 0
        for k, size in reversed(small_stuck):  # back at the old end, in order
            small[k] = size
            small.move_to_end(k, last=False)
            self.small_bytes += size
        self._trim_ghost()
        return victims

    def _trim_ghost(self) -> None:
        """Drop G's oldest keys while it holds more than its limit."""
        while self.ghost and self.ghost_bytes > self.ghost_limit:
            self.ghost_bytes -= self.ghost.popitem(last=False)[1]


class LibCacheSimS3FIFO(S3FIFO):
    """``s3fifo-libcachesim``: S3-FIFO as libCacheSim (0.3) implements it, for comparing
    figures.

    Its rules, where they differ from ``s3fifo``: S is ``int(budget * 0.1)`` bytes, M the rest
    and G ``int(budget * 0.9)``. Until the first eviction a new key enters M once S is full
    (the warm-up: M starts out filled with the first keys seen). Evictions come before the
    batch's new keys enter: while the bytes held (new keys counted) exceed the budget, one
    eviction step takes M when M holds more than its share or S is empty, else S. A step
    on S moves S's oldest keys with at least 2 hits to M (their counter restarting at 0)
    until one with fewer goes to G; a step on M reinserts M's oldest keys that have hits
    (the counter decremented) until one without goes. Keys the batch touched are never
    evicted. Then the new keys enter: G's keys into M, the others into S (or M, under the
    warm-up rule). With one lookup per batch the hits equal libCacheSim's request for
    request, where an expert is smaller than S (libCacheSim admits nothing larger; here
    every batch stays resident); the warm-up carries nearly all of the difference to
    ``s3fifo``.
    """

    name = "s3fifo-libcachesim"
    summary = "libCacheSim's S3FIFO, rule for rule (two hits to move to main)."
    #: hits an S key needs to move to M (libCacheSim's move-to-main-threshold)
    MOVE_TO_MAIN = 2

    def __init__(self, budget: int, *, n_layer: int | None = None, seed: int = 0):
        super().__init__(budget)
        self.small_target = int(budget * 0.1)  # S's size
        self.main_size = budget - self.small_target
        self.ghost_limit = int(budget * 0.9)
        self.main_bytes = 0
        self.has_evicted = False
        self.entering: list[tuple[int, int, bool]] = []  # (key, bytes, from G) of the batch

    def _enter(self, k: int, size: int, from_ghost: bool) -> None:
        if from_ghost or (not self.has_evicted and self.small_bytes >= self.small_target):
            self.main[k] = size
            self.main_bytes += size
        else:
            self.small[k] = size
            self.small_bytes += size
        self.freq[k] = 0

    def lookup(
        self,
        lookups: Sequence[int],
        recency: Sequence[int] | None,
        size: int,
        next_use: Sequence[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        res, freq, ghost = self.resident, self.freq, self.ghost
        hits: list[int] = []
        misses: list[int] = []
        entering = []
        for k in lookups:
            if k in res:
                hits.append(k)
                freq[k] = min(freq[k] + 1, 3)
                continue
            misses.append(k)
            res[k] = size
            from_ghost = k in ghost
            if from_ghost:
                self.ghost_bytes -= ghost.pop(k)
            entering.append((k, size, from_ghost))
        for k, sz, from_ghost in entering:  # where they stay unless this batch evicts
            self._enter(k, sz, from_ghost)
        self.entering = entering
        self.held += size * len(misses)
        return hits, misses

    def admit(self, keys: Sequence[int], size: int, next_use: Sequence[int] | None = None) -> None:
        self.entering = []
        for k in keys:
            self.resident[k] = size
            from_ghost = k in self.ghost
            if from_ghost:
                self.ghost_bytes -= self.ghost.pop(k)
            self._enter(k, size, from_ghost)
        self.held += size * len(keys)

    def _step_small(self, protected: Set[int], stuck: list[tuple[int, int]]) -> int | None:
        """One eviction step on S: the victim, or None when S ran out first."""
        small, freq = self.small, self.freq
        while small:
            k, size = small.popitem(last=False)
            self.small_bytes -= size
            if freq[k] >= self.MOVE_TO_MAIN:
                self.main[k] = size
                self.main_bytes += size
                freq[k] = 0
            elif k in protected:
                stuck.append((k, size))
            else:
                self.ghost[k] = size
                self.ghost_bytes += size
                return k
        return None

    def _step_main(self, protected: Set[int]) -> int | None:
        """One eviction step on M: the victim, or None when every key left is the batch's."""
        main, freq = self.main, self.freq
        skips = 0
        while skips < len(main):
            k, size = main.popitem(last=False)
            if freq[k] >= 1:
                freq[k] -= 1
                main[k] = size
                skips = 0
            elif k in protected:
                main[k] = size
                skips += 1
            else:
                self.main_bytes -= size
                return k
        return None

    def evict(self, layer: int, protected: Set[int]) -> list[int]:
        small, main = self.small, self.main
        for k, size, _ in reversed(self.entering):  # the new keys enter after the evictions
            if small and next(reversed(small)) == k:
                small.popitem()
                self.small_bytes -= size
            else:
                main.popitem()
                self.main_bytes -= size
        self.has_evicted = True
        victims: list[int] = []
        stuck: list[tuple[int, int]] = []  # the batch's S keys with too few hits, in order
        while self.held > self.budget:
            victim: int | None
            if self.main_bytes > self.main_size or not small:
                victim = self._step_main(protected)
                if victim is None and small:
                    victim = self._step_small(protected, stuck)
                if victim is None:
                    break
            else:
                victim = self._step_small(protected, stuck)
                if victim is None:
                    continue  # S ran out: the next step takes M
            del self.freq[victim]
            self.held -= self.resident.pop(victim)
            victims.append(victim)
        for k, size in reversed(stuck):  # back at the old end, in order
            small[k] = size
            small.move_to_end(k, last=False)
            self.small_bytes += size
        for k, size, from_ghost in self.entering:
            self._enter(k, size, from_ghost)
        self.entering = []
        self._trim_ghost()
        return victims
