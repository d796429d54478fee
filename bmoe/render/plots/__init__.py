"""Matplotlib figures, one function per plot, each returning the Figure (never showing it).

Plots for each area live in their own module (``route``, ``replay``, ``runs``, ``decode``);
this package holds what they share. Everything runs headless.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bmoe.errors import BmoeError

SUFFIXES = (".png", ".svg", ".pdf")


def new_figure(width: float = 8.0, height: float = 4.5, **kwargs) -> tuple[Figure, object]:
    """A figure and its axes, sized for a screen and a report page."""
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
