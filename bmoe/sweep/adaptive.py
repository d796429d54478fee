"""Adaptive repeats (``repeats = "auto"``): more rounds for the cells whose mean is not yet
known well enough, as hyperfine and pyperf do.

After the first ``min_repeats`` rounds, a cell gets another run while the 95 % interval of
its mean outcome (Student's t over its completed runs) is wider than ``target_interval``
times the mean, up to ``max_repeats`` runs attempted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bmoe.analyze.stats import t_quantile

#: The outcome whose interval decides (tokens per second, the sweep's main figure).
OUTCOME = "tok_s_mean"


def t95(dof: np.ndarray) -> np.ndarray:
    """Two-sided 95 % Student's t quantiles at each of `dof` degrees of freedom (>= 1)."""
    return t_quantile(0.975, np.asarray(dof, dtype=np.float64))


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
