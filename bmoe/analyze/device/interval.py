"""How wide a prediction's interval is: the terms' spread and the model's own error.

How wide a prediction's interval is: the terms' spread (how much a repeat moves the mean of
each term) and the model's own error (how far the profile's runs, each configuration held
out and predicted from the others, fell from their prediction), at the profile's stated
coverage.

The model error grows with a configuration's distance from the configurations the profile
measured (see :mod:`bmoe.analyze.device.build`): ``m = sqrt(z^2 + u^2 d)``, ``d`` the
distance (:func:`read_distance`), ``z`` and ``u`` the profile's ``sd_rel_zero`` and
``sd_rel_unit``. A configuration that reads what a measured one read, at its lanes, has the
spread and ``z`` alone. A configuration whose reads are not known, or a profile written
before distance was measured, has the model error without distance (``sd_rel``; an older
profile's ``sd_rel_inside`` inside its read range).

The model error's variance is estimated from the profile's held-out configurations, so it is
uncertain with few of them: the interval uses Student's t at the Welch-Satterthwaite degrees
of freedom of the sum (the spread taken as known, the model error's from ``k`` held-out
configurations): ``nu = (s^2 + m^2)^2 / (m^4 / k)``. Without a model error (one run, one
configuration, or none of the held-out runs predictable) the interval is the spread's alone
and says so: it does not claim the stated coverage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bmoe.analyze import stats
from bmoe.formats.profile import DeviceProfile


def interval_z(coverage: float) -> float:
    """The normal quantile of a two-sided interval of `coverage` (0.8 -> 1.2816)."""
    return stats.normal_quantile(0.5 + coverage / 2.0)


def t_quantile(p: float, dof: float) -> float:
    """The `p` quantile (p >= 0.5) of Student's t at `dof` degrees of freedom (fractional
    allowed; below 1 taken as 1; infinity is the normal's)."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"t_quantile: p {p} is not in [0.5, 1)")
    if not math.isfinite(dof):
        return stats.normal_quantile(p)
    return float(stats.t_quantile(p, max(float(dof), 1.0))[0])


@dataclass(frozen=True)
class ModelError:
    """A profile's own error: the relative sd of a prediction's token time beyond the terms'
    spread (``sd_rel``) and how many held-out configurations it was estimated from (``k``);
    ``sd_rel`` None when unknown (``why`` says why)."""

    sd_rel: float | None
    k: int
    why: str | None = None
    inside: bool = False  # an older profile's, from the configurations inside its read range
    distance: float | None = None  # from the nearest measured configuration, where known

    @property
    def known(self) -> bool:
        return self.sd_rel is not None and self.k > 0


def read_distance(read_mib: float, lanes: int | None, points: Sequence[tuple[int, float]]) -> float:
    """How far a configuration reading `read_mib` a token at `lanes` io lanes lies from the
    measured configurations `points` ((lanes, read MiB a token) each): ``|ln(read_mib /
    nearest)|`` over the points at the same lanes (every point when none is; NaN without
    points or reads). 0 reads the same as ln of a tenth of a KiB, not minus infinity."""
    if not points or read_mib is None or not np.isfinite(read_mib):
        return float("nan")
    same = [mib for n, mib in points if lanes is not None and int(n) == int(lanes)]
    volumes = np.asarray(same or [mib for _n, mib in points], dtype=np.float64)
    floor = 1e-4  # MiB: a configuration that reads nothing is near one that reads little
    gaps = np.abs(np.log(max(read_mib, floor)) - np.log(np.maximum(volumes, floor)))
    return float(gaps.min())


def error_at_distance(section: dict[str, Any] | None, distance: float) -> float | None:
    """A profile's model error (relative sd) at `distance` from its nearest measured
    configuration, from its ``model_error`` section (None: not measured by distance)."""
    zero, unit = (section or {}).get("sd_rel_zero"), (section or {}).get("sd_rel_unit")
    if zero is None or unit is None:
        return None
    return math.sqrt(float(zero) ** 2 + float(unit) ** 2 * distance)


#: Twice or half the reads a token of the nearest measured configuration: the distance a
#: profile's model error is quoted at.
DOUBLE = math.log(2.0)


def model_error(
    profile: DeviceProfile, read_mib: float | None = None, lanes: int | None = None
) -> ModelError:
    """The profile's model error as its ``model_error`` section records it (unknown for a
    profile written before it was measured): for a configuration reading `read_mib` a token
    at `lanes` io lanes, the one at its distance from the measured configurations; without
    them (or in an older profile), the one without distance."""
    section: dict[str, Any] = profile.model_error or {}
    sd = section.get("sd_rel")
    k = int(section.get("configurations") or 0)
    if sd is None or k < 1:
        why = section.get("why") or "not measured (a profile written before it was)"
        return ModelError(None, 0, str(why))
    points = [(int(p["io_threads"]), float(p["read_mib"]))
              for p in section.get("configurations_at") or []]  # fmt: skip
    if points and read_mib is not None and error_at_distance(section, 0.0) is not None:
        d = read_distance(read_mib, lanes, points)
        if np.isfinite(d):
            return ModelError(error_at_distance(section, d), k, distance=d)
    inside_sd = section.get("sd_rel_inside")
    inside_k = int(section.get("configurations_inside") or 0)
    span = read_range(profile)
    if (
        inside_sd is not None
        and inside_k >= MIN_INSIDE
        and read_mib is not None
        and span is not None
        and span[0] <= read_mib <= span[1]
    ):
        return ModelError(float(inside_sd), inside_k, inside=True)
    return ModelError(float(sd), k)


#: Held-out configurations inside the others' read range it took an older profile to give
#: the model error of a configuration inside its range.
MIN_INSIDE = 2


def read_range(profile: DeviceProfile) -> tuple[float, float] | None:
    """The MiB read per token a profile's compute points span (None: one read volume)."""
    points: list[Any] = list((profile.compute or {}).get("by_read") or [])  # type: ignore[arg-type]
    if len(points) < 2:
        return None
    mib = [float(p["read_mib"]) for p in points]
    return min(mib), max(mib)


def half_width(
    coverage: float, spread_sd: float, error: ModelError, extra_sd: float = 0.0
) -> tuple[float, float]:
    """(the interval's relative half-width, its quantile): the spread's sd, the model
    error's and `extra_sd` (what unpriced levers have been seen to do, taken as known) in
    quadrature, times Student's t at the coverage (the normal's when the model error is
    unknown or zero)."""
    p = 0.5 + coverage / 2.0
    if not error.known or not error.sd_rel:
        z = interval_z(coverage)
        return z * math.hypot(spread_sd, extra_sd), z
    m2 = float(error.sd_rel) ** 2
    total = spread_sd**2 + extra_sd**2 + m2
    dof = total**2 / (m2**2 / error.k)
    q = t_quantile(p, dof)
    return q * math.sqrt(total), q


def binomial_p(k: int, n: int, p: float | np.ndarray) -> np.ndarray:
    """The exact two-sided p-value of `k` successes in `n` trials at success probability
    `p` (an array of them allowed): the probability of every count no likelier than `k`."""
    return stats.binomial_two_sided_p(k, n, p)


#: A stated coverage is called wrong when the cells it was checked on make it less likely
#: than this (the exact two-sided binomial test).
COVERAGE_ALPHA = 0.05


def coverage_check(within: int, n: int, stated: float) -> dict[str, Any]:
    """Whether `within` of `n` measurements inside intervals that state coverage `stated`
    (0.8) is consistent with it: the two-sided binomial p-value, the coverages the count is
    consistent with (every coverage its test would not reject), and a sentence: consistent,
    narrower than stated, or wider than they need be. Few cells are consistent with almost
    any coverage, and the sentence gives the range so that nobody reads 12 of 12 as proof
    of 100 %."""
    if n <= 0:
        return {"p": None, "consistent_low_pct": None, "consistent_high_pct": None,
                "verdict": "no firm cell to check the intervals on"}  # fmt: skip
    grid = np.linspace(0.0, 1.0, 1001)
    keep = grid[binomial_p(within, n, grid) >= COVERAGE_ALPHA]
    low, high = 100.0 * float(keep.min()), 100.0 * float(keep.max())
    p_value = float(binomial_p(within, n, stated)[0])
    share = f"{within} of {n} within their bounds"
    span = f"consistent with any coverage from {low:.0f} to {high:.0f} %"
    if p_value >= COVERAGE_ALPHA:
        verdict = f"{share}: {span}, the stated {100 * stated:.0f} % among them"
    elif within / n < stated:
        verdict = f"{share}: narrower than the stated {100 * stated:.0f} % ({span})"
    else:
        verdict = f"{share}: wider than they need be for {100 * stated:.0f} % ({span})"
    return {"p": p_value, "consistent_low_pct": low, "consistent_high_pct": high,
            "verdict": verdict}  # fmt: skip


__all__ = [
    "COVERAGE_ALPHA",
    "DOUBLE",
    "MIN_INSIDE",
    "ModelError",
    "binomial_p",
    "coverage_check",
    "error_at_distance",
    "half_width",
    "interval_z",
    "model_error",
    "read_distance",
    "read_range",
    "t_quantile",
]
