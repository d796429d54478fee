"""The grid of configurations to predict: its axes, parsed from ``--grid`` and expanded."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from bmoe.errors import BmoeError

MIB = 1 << 20

GRID_AXES = ("cache_mb", "io_threads", "prefetch", "overlap")


def parse_grid(text: str | Iterable[str]) -> dict[str, list[float]]:
    """``cache_mb=64,128,io_threads=1,4`` (or the axes apart: ``;``, spaces, several
    strings) -> {"cache_mb": [64, 128], "io_threads": [1, 4]}. Unknown axes are errors."""
    parts = [text] if isinstance(text, str) else list(text)
    tokens = [t for p in parts for t in p.replace(";", ",").replace(" ", ",").split(",") if t]
    grid: dict[str, list[float]] = {}
    axis = None
    for token in tokens:
        if "=" in token:
            axis, _, token = token.partition("=")
            axis = axis.strip().replace("-", "_")
            if axis not in GRID_AXES:
                raise BmoeError(f"--grid: unknown axis {axis!r} (axes: {', '.join(GRID_AXES)})")
            grid.setdefault(axis, [])
            if not token:
                continue
        if axis is None:
            raise BmoeError(f"--grid: {token!r} comes before any axis=")
        try:
            value = float(token)
        except ValueError:
            raise BmoeError(f"--grid: {axis}={token!r} is not a number") from None
        if value < 0 or (axis != "cache_mb" and not value.is_integer()):
            raise BmoeError(f"--grid: {axis}={token} is not a valid value")
        grid[axis].append(value)
    for axis, values in grid.items():
        if not values:
            raise BmoeError(f"--grid: {axis}= names no value")
    if "cache_mb" not in grid:
        raise BmoeError("--grid needs cache_mb=...")
    return grid


def grid_cells(grid: Mapping[str, Sequence[float]], defaults: Mapping[str, float]) -> pd.DataFrame:
    """Every combination of the grid's values (axes it lacks take `defaults`)."""
    axes = {a: list(grid.get(a, [defaults[a]])) for a in GRID_AXES}
    rows = list(itertools.product(*axes.values()))
    cells = pd.DataFrame(rows, columns=list(axes))
    cells["io_threads"] = cells["io_threads"].astype(int)
    cells["prefetch"] = cells["prefetch"].astype(int)
    return cells


__all__ = ["GRID_AXES", "MIB", "grid_cells", "parse_grid"]
