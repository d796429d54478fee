"""Fidelity figures: how far a run's output moved from an unmodified run of the same prompt.

Two measurements give the same column, ``fidelity`` (a share, 1.0 = unchanged):

* the embedded engine's teacher-forced comparison (``bmoe run --fidelity-ref``): the share of
  steps whose most likely next token is the reference's, with ``fidelity_kl`` (mean KL
  divergence of the next-token distributions, nats) and ``fidelity_first_miss`` from the
  run's ``# summary``;
* generated tokens against an unmodified run's (:func:`token_agreement`, for engines that
  cannot be teacher-forced, such as the native one): the identical-token share and the first
  step where they part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: The results columns fidelity adds (None where a run did not measure it).
FIDELITY_COLUMNS = ("fidelity", "fidelity_kl", "fidelity_steps", "fidelity_first_miss")


def fidelity_figures(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The fidelity columns from a run's ``# summary`` trailer(s) (the last one that has
    them); all None when the run was not compared with a reference."""
    for summary in reversed(list(summaries)):
        if "fidelity" in summary:
            out: dict[str, float | None] = {}
            for key in FIDELITY_COLUMNS:
                try:
                    out[key] = float(summary[key]) if key in summary else None
                except (TypeError, ValueError):
                    out[key] = None
            return out
    return dict.fromkeys(FIDELITY_COLUMNS)


def token_agreement(reference: Sequence[Any], run: Sequence[Any]) -> dict[str, float | None]:
    """Generated tokens (ids or text pieces, step by step) against a reference run's: the share
    of the reference's steps the run reproduced at the same position (``fidelity``) and the
    first step (1-based) where they differ (``fidelity_first_miss``; 0 when none does)."""
    n = len(reference)
    if n == 0:
        return {"fidelity": None, "fidelity_first_miss": None, "fidelity_steps": 0}
    ref = np.asarray([str(t) for t in reference], dtype=object)
    got = np.full(n, None, dtype=object)
    m = min(n, len(run))
    got[:m] = [str(t) for t in run[:m]]
    same = ref == got
    differ = np.flatnonzero(~same)
    return {
        "fidelity": float(same.mean()),
        "fidelity_first_miss": float(differ[0] + 1) if len(differ) else 0.0,
        "fidelity_steps": float(n),
    }
