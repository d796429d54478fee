"""Speed against fidelity: what each cell of a sweep bought in tok/s for how far its output
moved from the unmodified model."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure


def speed_against_fidelity_plot(table: pd.DataFrame, outcome: str = "tok_s_mean") -> Figure:
    """One dot per cell (:func:`bmoe.analyze.fidelity.speed_fidelity`): fidelity on x, the
    outcome on y; the cells no other cell beats on both are joined (the frontier)."""
    fig, ax = new_figure(6.0, 4.5)
    x = table["fidelity"].to_numpy(dtype=float)
    y = table[outcome].to_numpy(dtype=float)
    front = table["frontier"].to_numpy(dtype=bool)
    ax.scatter(x[~front], y[~front], color="0.6", label="dominated", zorder=2)
    order = np.argsort(x[front])
    ax.plot(x[front][order], y[front][order], marker="o", color="C0", label="frontier", zorder=3)
    ax.set_xlabel("fidelity (top-1 agreement with the unmodified model)")
    ax.set_ylabel(outcome)
    ax.legend(loc="best")
    return fig
