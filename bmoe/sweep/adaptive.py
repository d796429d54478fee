"""Adaptive repeats (``repeats = "auto"``): more rounds for the cells whose mean is not yet
known well enough, as hyperfine and pyperf do.

After the first ``min_repeats`` rounds, a cell gets another run while the 95 % interval of
its mean outcome (Student's t over its completed runs) is wider than ``target_interval``
times the mean, up to ``max_repeats`` runs attempted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Two-sided 95 % quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip

#: The outcome whose interval decides (tokens per second, the sweep's main figure).
OUTCOME = "tok_s_mean"


def t95(dof: np.ndarray) -> np.ndarray:
    """Two-sided 95 % Student's t quantiles for integer degrees of freedom (>= 1)."""
    dof = np.asarray(dof, dtype=np.int64)
    table = np.asarray(_T95)
    return np.where(dof > len(table), 1.96, table[np.clip(dof, 1, len(table)) - 1])


def mean_intervals(results: pd.DataFrame, outcome: str = OUTCOME) -> pd.DataFrame:
    """Per cell: completed runs ``n``, ``mean`` of `outcome`, the 95 % interval's half-width
    ``half_width`` and ``relative`` (half-width / mean; NaN with fewer than two runs)."""
    columns = ["cell", "n", "mean", "half_width", "relative"]
    if results.empty or outcome not in results or "status" not in results:
        return pd.DataFrame(columns=columns)
    ok = results[results["status"] == "ok"]
    values = pd.to_numeric(ok[outcome], errors="coerce")
    grouped = values.groupby(ok["cell"])
    out = grouped.agg(["count", "mean", "std"]).rename(columns={"count": "n"})
    n = out["n"].to_numpy()
    half = np.where(n >= 2, t95(np.maximum(n - 1, 1)) * out["std"] / np.sqrt(np.maximum(n, 1)),
                    np.nan)  # fmt: skip
    out["half_width"] = half
    out["relative"] = half / out["mean"].abs().replace(0, np.nan)
    return out.reset_index()[columns]


def cells_needing_more(
    results: pd.DataFrame, cells: list[str], target: float, outcome: str = OUTCOME
) -> list[str]:
    """The cells (of `cells`) whose interval is wider than `target` (relative), or unknown."""
    intervals = mean_intervals(results, outcome).set_index("cell")["relative"]
    relative = intervals.reindex(cells)
    settled = relative.notna() & (relative <= target)
    return [cell for cell, done in zip(cells, settled, strict=True) if not done]
