"""Sweep figures: each outcome against each axis."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure


def plot_axis_effects(effects: pd.DataFrame) -> Iterator[tuple[str, Figure]]:
    """One figure per (outcome, axis): the mean with min-max whiskers at each axis value.

    `effects` is :func:`bmoe.analyze.sweep.axis_effects`; yields ``(<outcome>-by-<axis>,
    figure)`` one at a time (save and close each before the next is drawn).
    """
    for (axis, outcome), part in effects.groupby(["axis", "outcome"], sort=False):
        fig, ax = new_figure(7.0, 4.0)
        labels = part["value"].astype(str).tolist()
        positions = range(len(labels))
        mean = part["mean"].to_numpy(dtype=float)
        low = mean - part["min"].to_numpy(dtype=float)
        high = part["max"].to_numpy(dtype=float) - mean
        ax.errorbar(list(positions), mean, yerr=[low, high], fmt="o-", capsize=4)
        short = [lbl if len(lbl) <= 16 else lbl[:15] + "…" for lbl in labels]
        ax.set_xticks(list(positions), short)
        ax.set_xlabel(str(axis))
        ax.set_ylabel(str(outcome))
        ax.set_title(f"{outcome} by {axis} (mean, min-max over attempts)")
        ax.grid(True, alpha=0.3)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{outcome}-by-{axis}")
        yield name, fig
