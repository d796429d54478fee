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
import pandas as pd

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


def speed_fidelity(results: pd.DataFrame, outcome: str = "tok_s_mean") -> pd.DataFrame:
    """Per cell of a sweep with the fidelity column: the mean `outcome` over its completed
    runs, the worst ``fidelity`` (and ``fidelity_kl``) of any of them, and ``frontier``: no
    other cell is both at least as fast and at least as faithful (and better in one)."""
    cols = ["cell", outcome, "fidelity", "fidelity_kl", "runs", "frontier"]
    if results.empty or "fidelity" not in results or outcome not in results:
        return pd.DataFrame(columns=cols)
    ok = results[results["status"] == "ok"] if "status" in results else results
    frame = pd.DataFrame({
        "cell": ok["cell"].astype(str),
        outcome: pd.to_numeric(ok[outcome], errors="coerce"),
        "fidelity": pd.to_numeric(ok["fidelity"], errors="coerce"),
        "fidelity_kl": pd.to_numeric(ok["fidelity_kl"], errors="coerce")
        if "fidelity_kl" in ok else np.nan,
    })  # fmt: skip
    frame = frame[frame["fidelity"].notna()]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    cells = frame.groupby("cell", sort=False).agg(
        **{outcome: (outcome, "mean")}, fidelity=("fidelity", "min"),
        fidelity_kl=("fidelity_kl", "max"), runs=(outcome, "count"),
    ).reset_index()  # fmt: skip
    speed = cells[outcome].to_numpy(float)
    fid = cells["fidelity"].to_numpy(float)
    no_worse = (speed[None, :] >= speed[:, None]) & (fid[None, :] >= fid[:, None])
    better = (speed[None, :] > speed[:, None]) | (fid[None, :] > fid[:, None])
    cells["frontier"] = ~(no_worse & better).any(axis=1)
    return cells.sort_values(outcome, ascending=False, ignore_index=True)[cols]
