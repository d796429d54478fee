"""Prediction figures: predicted against measured tok/s, with the identity line."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure


def predicted_vs_measured_plot(
    table: pd.DataFrame,
    measured: str = "tok_s_measured",
    predicted: str = "tok_s_predicted",
    label: str | None = "cell",
) -> Figure:
    """One dot per cell, measured on x and predicted on y; on the identity line a
    prediction is exact, the shaded band is +-15 %."""
    fig, ax = new_figure(5.5, 5.0)
    x = table[measured].to_numpy(dtype=float)
    y = table[predicted].to_numpy(dtype=float)
    finite = np.isfinite(x) & np.isfinite(y)
    top = float(max(x[finite].max(initial=0), y[finite].max(initial=0))) * 1.1 or 1.0
    line = np.array([0.0, top])
    ax.fill_between(line, line * 0.85, line * 1.15, color="0.9", label="±15 %")
    ax.plot(line, line, color="0.4", lw=1, label="predicted = measured")
    ax.scatter(x, y, zorder=3)
    if label and label in table and len(table) <= 24:
        for xi, yi, text in zip(x, y, table[label].astype(str), strict=True):
            ax.annotate(text[:24], (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured tok/s")
    ax.set_ylabel("predicted tok/s")
    ax.legend(loc="upper left")
    return fig
