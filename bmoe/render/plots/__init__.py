"""Matplotlib figures, one function per plot, each returning the Figure (never showing it).

Plots for each area live in their own module (``route``, ``replay``, ``runs``, ``op_traces``);
this package holds what they share. Everything runs headless.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bmoe.errors import BmoeError

SUFFIXES = (".png", ".svg", ".pdf")


@overload
def new_figure(width: float = 8.0, height: float = 4.5) -> tuple[Figure, Axes]: ...


@overload
def new_figure(width: float = 8.0, height: float = 4.5, **kwargs: Any) -> tuple[Figure, Any]: ...


def new_figure(width: float = 8.0, height: float = 4.5, **kwargs: Any) -> tuple[Figure, Any]:
    """A figure and its axes, sized for a screen and a report page: one :class:`Axes`, or
    with ``nrows``/``ncols`` (:func:`matplotlib.pyplot.subplots`' keywords) their array."""
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained", **kwargs)
    return fig, ax


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write `fig` to `path` (.png, .svg or .pdf) and release it."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise BmoeError(f"{path}: plot files must end in {', '.join(SUFFIXES)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
