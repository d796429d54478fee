"""Routing ids outside the preamble's declared range, named before an analysis counts them.

``validate`` reports expert ids outside 0 .. ``n_expert``-1 as errors; the analyses still run on
such a trace (their views follow the rows), so they name the first offending row and value
in a warning rather than let figures measured against ``n_expert`` pass unremarked."""

from __future__ import annotations

import numpy as np

from bmoe.formats.route import RouteColumns, RouteTrace


def declared_n_expert(trace: RouteTrace | RouteColumns) -> int | None:
    """The preamble's ``n_expert`` when it is a positive integer, else None."""
    n = trace.meta.get("n_expert")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n <= 0:
        return None
    return int(n)


def experts_beyond_declared(trace: RouteTrace | RouteColumns) -> str | None:
    """One sentence naming the file, the first routing row (1-based) whose expert id is
    outside 0 .. n_expert-1 (the preamble's ``n_expert``; below 0 when it is not declared),
    its value and how many rows are outside; None when every id is inside."""
    expert = trace.column("expert")
    if expert is None or not len(expert):
        return None
    n_expert = declared_n_expert(trace)
    lo, hi = int(expert.min()), int(expert.max())  # the common case: no temporary
    if lo >= 0 and (n_expert is None or hi < n_expert):
        return None
    outside = expert < 0
    if n_expert is not None:
        outside |= expert >= n_expert
    beyond = np.flatnonzero(outside)
    first = int(beyond[0])
    rows = f"; {len(beyond)} rows in all" if len(beyond) > 1 else ""
    where = (
        f"{trace.path or 'trace'}: expert id {int(expert[first])} (routing row {first + 1}{rows})"
    )
    if n_expert is None:
        return f"{where} is negative, not an expert"
    return (
        f"{where} is outside 0..{n_expert - 1} (the preamble's n_expert={n_expert}); "
        "figures against n_expert (shares of the expert set, its size) do not hold"
    )
