"""Least-squares fits with non-negative coefficients, as the profile's terms need them, and
the grouping of runs by the volume they read a token that the per-volume figures share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a + b x by least squares, with a, b >= 0 (a constant when x does not vary)."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return 0.0, 0.0
    if np.ptp(x) == 0:
        if x[0] > 0:
            return 0.0, float(np.mean(y) / x[0])
        return float(max(np.mean(y), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(np.mean(y), 0.0)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)


def fit_two(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a x1 + b x2 by least squares with a, b >= 0 (no intercept); where the two do not
    separate (collinear), all of it on x2."""
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    if not len(y) or not np.any(x2 > 0):
        return 0.0, 0.0
    design = np.column_stack([x1, x2])
    if np.linalg.matrix_rank(design) == 2 and np.linalg.cond(design) < 1e6:
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if a >= 0 and b >= 0:
            return float(a), float(b)
        if b > 0 and a < 0:
            return 0.0, float(np.sum(x2 * y) / np.sum(x2 * x2))
    return 0.0, float(max(np.sum(y), 0.0) / np.sum(x2))


#: Runs whose read volumes a token are within this factor count as one volume.
SAME_VOLUME = 1.25


def volume_groups(points: Sequence[tuple[float, T]]) -> list[list[tuple[float, T]]]:
    """`points` (MiB read a token, anything) in ascending volume, cut where a volume is more
    than :data:`SAME_VOLUME` times the first of its group (volumes under 1 MiB count as 1)."""
    groups: list[list[tuple[float, T]]] = []
    for mib, item in sorted(points, key=lambda point: point[0]):
        if groups and mib <= max(groups[-1][0][0], 1.0) * SAME_VOLUME:
            groups[-1].append((mib, item))
        else:
            groups.append([(mib, item)])
    return groups


__all__ = ["SAME_VOLUME", "fit_line", "fit_two", "volume_groups"]
