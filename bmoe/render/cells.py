"""Short cell ids for terminal tables.

A sweep's cell folder (``cache_mb-8_io_threads-4-1dd19ea1``) is the name to find its files by,
but in a table it is a column of hashes nobody reads, too wide for a terminal. A terminal
table shows ``c1``, ``c2``, ... instead, and one legend table names each id's axis values and
folder. CSV, JSON and markdown keep the folder names (scripts and pages look them up).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

#: The title of the legend table.
LEGEND = "cell ids"


def short_ids(cells: Iterable[Any], prefix: str = "c") -> dict[str, str]:
    """``c1``, ``c2``, ... (`prefix` and a number) for each distinct cell in the order first
    seen."""
    ids: dict[str, str] = {}
    for cell in cells:
        name = str(cell)
        if name not in ids:
            ids[name] = f"{prefix}{len(ids) + 1}"
    return ids


def legend(ids: Mapping[str, str], axes: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell: its short id, its axis values (from `axes`: a ``cell`` column and one
    column per axis) and its folder."""
    table = pd.DataFrame({"id": list(ids.values()), "cell": list(ids.keys())})
    if axes is not None and len(axes.columns) > 1:
        values = axes.drop_duplicates("cell").assign(cell=lambda f: f["cell"].astype(str))
        table = table.merge(values, on="cell", how="left")
    return table[[c for c in table.columns if c != "cell"] + ["cell"]].rename(
        columns={"cell": "folder"}
    )


def _mapped(value: Any, ids: Mapping[str, str]) -> Any:
    if isinstance(value, list | tuple):
        return ", ".join(ids.get(str(v), str(v)) for v in value)
    if isinstance(value, str) and ", " in value and value not in ids:
        return ", ".join(ids.get(v, v) for v in value.split(", "))
    return ids.get(str(value), value) if value is not None else value


def with_short_ids(
    views: Mapping[str, Any],
    cells: Sequence[Any],
    axes: Sequence[str] = (),
    *,
    columns: Sequence[str] = ("cell", "cells"),
    after: str | None = None,
) -> dict[str, Any]:
    """`views` with every cell name in the tables' `columns` replaced by its short id, and
    the legend (:func:`legend`, axis values from the first table holding `axes`) inserted
    after the view `after` (default: before the first table that uses an id)."""
    ids = short_ids(cells)
    if not ids:
        return dict(views)
    out: dict[str, Any] = {}
    axis_values = None
    for frame in views.values():
        if isinstance(frame, pd.DataFrame) and axes and {"cell", *axes} <= set(frame.columns):
            axis_values = frame[["cell", *axes]]
            break
    table = legend(ids, axis_values)
    placed = False
    for name, view in views.items():
        uses = isinstance(view, pd.DataFrame) and any(c in view.columns for c in columns)
        if not placed and after is None and uses:
            out[LEGEND] = table
            placed = True
        if uses:
            view = view.copy()
            for col in columns:
                if col in view.columns:
                    view[col] = [_mapped(v, ids) for v in view[col]]
        out[name] = view
        if not placed and name == after:
            out[LEGEND] = table
            placed = True
    if not placed:
        out[LEGEND] = table
    return out


__all__ = ["LEGEND", "legend", "short_ids", "with_short_ids"]
