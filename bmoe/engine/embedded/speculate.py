"""``--ngram`` self-speculation: drafts read off the token history, verified in one decode.

The draft source is prompt lookup. The corpus is the turn's prompt plus every token confirmed
since, followed by the token about to be decoded; its suffix is the pattern. Every earlier
position where the pattern's last token occurs is a candidate match end; the candidate whose
common suffix with the pattern is longest wins (at most ``max_match`` tokens are compared),
the most recent one among equal lengths, and a match may overlap the pattern (so a run of one
repeated token predicts itself). Below ``min_match`` nothing is drafted and the step is an
ordinary one-token decode; otherwise the tokens that followed the match are proposed, at most
``n_max`` of them.

The loop in :mod:`bmoe.engine.embedded.run` decodes ``[token, *drafts]`` in one batch with
logits at every position and keeps each draft while it equals the model's own greedy choice at
that position, so the output is the greedy output (up to the last bits a wider batch may move).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def ngram_draft(
    history: Sequence[int],
    last: int,
    n_max: int,
    min_match: int,
    max_match: int,
) -> list[int]:
    """The continuation of the longest earlier match of ``history + [last]``'s suffix.

    Empty when no candidate matches at least `min_match` tokens (or `n_max` < 1)."""
    min_match = max(1, min_match)
    if n_max < 1 or max_match < min_match or len(history) < min_match:
        return []
    corpus = np.fromiter((*history, last), dtype=np.int64, count=len(history) + 1)
    end = len(corpus) - 1
    ends = np.flatnonzero(corpus[:end] == last)
    ends = ends[ends >= min_match - 1]
    if not ends.size:
        return []
    length = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    cap = np.minimum(max_match, ends + 1)  # no further back than the corpus start
    for k in range(1, min(max_match, end + 1)):
        alive &= k < cap
        alive &= corpus[np.maximum(ends - k, 0)] == corpus[end - k]
        if not alive.any():
            break
        length += alive
    best = int(length.max())
    if best < min_match:
        return []
    start = int(ends[np.flatnonzero(length == best)[-1]]) + 1  # the most recent of the longest
    return corpus[start : start + min(n_max, end + 1 - start)].tolist()


@dataclass
class SpecCounters:
    """What speculation did over one turn (the ``mtp_*`` summary and protocol keys)."""

    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of which the verify decode confirmed
    decodes: int = 0  # decodes the turn cost (verify or plain)
    drafted_steps: int = 0  # decodes that verified at least one draft
    draft_ns: int = 0  # time spent drafting, outside the decodes


class NgramDrafter:
    """The n-gram source over one turn's history (its prompt, then each confirmed token)."""

    def __init__(self, prompt: Sequence[int], n_max: int, min_match: int, max_match: int):
        self.history = list(prompt)
        self.n_max = n_max
        self.min_match = min_match
        self.max_match = max_match

    def draft(self, token: int, room: int) -> list[int]:
        """Drafts to verify after `token` (not yet in the history), at most `room`."""
        return ngram_draft(
            self.history, token, min(self.n_max, room), self.min_match, self.max_match
        )

    def confirm(self, tokens: Sequence[int]) -> None:
        """`tokens` were emitted: they join the corpus."""
        self.history.extend(tokens)


def timed_draft(drafter: NgramDrafter | None, token: int, room: int) -> tuple[list[int], int]:
    """(drafts, ns spent) for the step after `token`; none without a drafter or room."""
    if drafter is None or room < 1:
        return [], 0
    t0 = time.perf_counter_ns()
    drafts = drafter.draft(token, room)
    return drafts, time.perf_counter_ns() - t0


__all__ = ["NgramDrafter", "SpecCounters", "ngram_draft", "timed_draft"]
