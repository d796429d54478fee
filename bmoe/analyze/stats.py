"""The statistics every verdict and interval rests on: quantiles of Student's t and of the
normal, and the exact two-sided binomial test.

Student's t and the binomial come from :mod:`scipy.stats`, imported on the first call and not
with this module: the commands that compute no verdict or interval (``bmoe info``, ``bmoe
analyze replay``, ``bmoe analyze route``) never load it. The normal quantile is the standard
library's (exact to double precision, and free to import).
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np


def _scipy_stats() -> Any:
    import scipy.stats

    return scipy.stats


def normal_quantile(p: float) -> float:
    """The `p` quantile of the standard normal (0.975 -> 1.95996)."""
    return NormalDist().inv_cdf(p)


def t_quantile(p: float, dof: float | np.ndarray) -> np.ndarray:
    """The `p` quantile of Student's t at each of `dof` degrees of freedom (fractional ones
    allowed; infinity is the normal's), NaN where `dof` is below 1 or not a number."""
    dof = np.atleast_1d(np.asarray(dof, dtype=np.float64))
    out = np.full(dof.shape, np.nan)
    usable = dof >= 1  # False for NaN
    if usable.any():
        out[usable] = _scipy_stats().t.ppf(p, dof[usable])
    return out


def binomial_two_sided_p(k: int, n: int, p: float | np.ndarray) -> np.ndarray:
    """The exact two-sided p-value of `k` successes in `n` trials at each success probability
    of `p`: the probability of every count no likelier than `k` (the definition and tolerance
    of :func:`scipy.stats.binomtest`, computed for many `p` at once: the test itself takes one
    at a time, 0.5 ms each)."""
    probs = np.atleast_1d(np.asarray(p, dtype=np.float64))
    counts = np.arange(n + 1)
    pmf = _scipy_stats().binom.pmf(counts[None, :], n, probs[:, None])
    observed = pmf[:, k : k + 1]
    return np.minimum(1.0, (pmf * (pmf <= observed * (1 + 1e-7))).sum(axis=1))


__all__ = ["binomial_two_sided_p", "normal_quantile", "t_quantile"]
