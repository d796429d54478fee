"""How wide a prediction's interval is: the terms' spread (how much a run's mean of each term
moves) and the model's own error (how far the profile's runs, each held out and predicted
from the others, fell from their prediction), at the profile's stated coverage.

The model error's variance is estimated from the profile's held-out configurations, so it is
uncertain with few of them: the interval uses Student's t at the Welch-Satterthwaite degrees
of freedom of the sum (the spread taken as known, the model error's from ``k`` held-out
configurations): ``nu = (s^2 + m^2)^2 / (m^4 / k)``. Without a model error (one run, one
configuration, or none of the held-out runs predictable) the interval is the spread's alone
and says so: it does not claim the stated coverage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from bmoe.formats.profile import DeviceProfile


def interval_z(coverage: float) -> float:
    """The normal quantile of a two-sided interval of `coverage` (0.8 -> 1.2816)."""
    return NormalDist().inv_cdf(0.5 + coverage / 2.0)


@lru_cache(maxsize=256)
def t_quantile(p: float, dof: float) -> float:
    """The `p` quantile (p >= 0.5) of Student's t at `dof` degrees of freedom (fractional
    allowed, >= 1; the normal's past 1e6): the density integrated numerically, between 0 and
    the Cauchy quantile, which bounds every t quantile of one degree of freedom or more."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"t_quantile: p {p} is not in [0.5, 1)")
    if not math.isfinite(dof) or dof > 1e6:
        return NormalDist().inv_cdf(p)
    dof = max(float(dof), 1.0)
    top = math.tan(math.pi * (p - 0.5)) * 1.01 + 1.0
    x = np.linspace(0.0, top, 200_001)
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    density = np.exp(log_c - (dof + 1) / 2 * np.log1p(x * x / dof))
    steps = np.diff(x) * (density[1:] + density[:-1]) / 2
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum(steps)])
    return float(np.interp(p, cdf, x))


@dataclass(frozen=True)
class ModelError:
    """A profile's own error: the relative sd of a prediction's token time beyond the terms'
    spread (``sd_rel``) and how many held-out configurations it was estimated from (``k``);
    ``sd_rel`` None when unknown (``why`` says why)."""

    sd_rel: float | None
    k: int
    why: str | None = None

    @property
    def known(self) -> bool:
        return self.sd_rel is not None and self.k > 0


def model_error(profile: DeviceProfile) -> ModelError:
    """The profile's model error as its ``model_error`` section records it (unknown for a
    profile written before it was measured)."""
    section: dict[str, Any] = profile.model_error or {}
    sd = section.get("sd_rel")
    k = int(section.get("configurations") or 0)
    if sd is None or k < 1:
        why = section.get("why") or "not measured (a profile written before it was)"
        return ModelError(None, 0, str(why))
    return ModelError(float(sd), k)


def half_width(coverage: float, spread_sd: float, error: ModelError) -> tuple[float, float]:
    """(the interval's relative half-width, its quantile): the spread's sd and the model
    error's in quadrature, times Student's t at the coverage (the normal's when the model
    error is unknown or zero)."""
    p = 0.5 + coverage / 2.0
    if not error.known or not error.sd_rel:
        z = interval_z(coverage)
        return z * spread_sd, z
    m2 = float(error.sd_rel) ** 2
    total = spread_sd**2 + m2
    dof = total**2 / (m2**2 / error.k)
    q = t_quantile(p, dof)
    return q * math.sqrt(total), q


__all__ = ["ModelError", "half_width", "interval_z", "model_error", "t_quantile"]
