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
        while ghost and self.ghost_bytes > self.ghost_limit:
            self.ghost_bytes -= ghost.popitem(last=False)[1]
        return victims
