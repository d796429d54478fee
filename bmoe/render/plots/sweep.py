"""Sweep figures: the outcome against the main axis with one line per value of another and
its spread across repeats (the figure that answers the sweep's question), each outcome
against each axis, and where each cell's token time went."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
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


def outcome_lines(
    cells: pd.DataFrame,
    x: str,
    by: str | None = None,
    *,
    outcome: str = "tok_s_mean",
    attempts: pd.DataFrame | None = None,
) -> Figure:
    """An outcome against one axis, one line per value of another: each cell's mean with its
    min-max band across repeats, and every repeat as a dot when `attempts` is given.

    `cells` is :func:`bmoe.analyze.sweep.rank_cells` (one row per cell: the axes, n, mean,
    min, max); `attempts` the sweep's completed attempts (the outcome per repeat).
    """
    fig, ax = new_figure(8.0, 4.8)
    groups = [(None, cells)] if by is None else list(cells.groupby(by, sort=True))
    cmap = colormaps["viridis"]
    for i, (value, part) in enumerate(groups):
        part = part.assign(_x=pd.to_numeric(part[x], errors="coerce")).sort_values("_x")
        color = cmap(i / max(1, len(groups) - 1)) if by is not None else "#1f77b4"
        label = f"{by} = {value}" if by is not None else outcome
        ax.plot(part["_x"], part["mean"], "o-", color=color, label=label)
        ax.fill_between(part["_x"], part["min"], part["max"], color=color, alpha=0.15, linewidth=0)
        if attempts is not None and outcome in attempts:
            mine = attempts if by is None else attempts[attempts[by].astype(str) == str(value)]
            ax.plot(
                pd.to_numeric(mine[x], errors="coerce"), mine[outcome], ".", color=color,
                alpha=0.6, markersize=5,
            )  # fmt: skip
    ax.set_xlabel(x)
    ax.set_ylabel(outcome)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if by is not None:
        ax.legend(fontsize=8)
    spread = "min-max band and each repeat" if attempts is not None else "min-max band"
    ax.set_title(f"{outcome} by {x}" + (f" and {by}" if by else "") + f" (mean, {spread})")
    return fig


def outcome_figures(
    ranked: pd.DataFrame,
    attempts: pd.DataFrame,
    outcome: str,
    x: str,
    by: str | None,
    rest: Sequence[str] = (),
) -> Iterator[tuple[str, Figure]]:
    """The figures that answer a sweep's question: `outcome` against `x`, one line per value
    of `by`, spread across repeats shown (:func:`outcome_lines`); one figure per combination
    of the `rest` of the axes, so no line mixes cells. Yields ``(name, figure)``."""
    stem = f"{outcome}-by-{x}" + (f"-and-{by}" if by else "")
    if not rest:
        yield _safe(stem), outcome_lines(ranked, x, by, outcome=outcome, attempts=attempts)
        return
    keys = list(rest)
    for values, part in ranked.groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        where = "_".join(f"{k}-{v}" for k, v in zip(keys, values, strict=True))
        mask = np.ones(len(attempts), dtype=bool)
        for k, v in zip(keys, values, strict=True):
            mask &= (attempts[k].astype(str) == str(v)).to_numpy()
        fig = outcome_lines(part, x, by, outcome=outcome, attempts=attempts[mask])
        fig.axes[0].set_title(
            fig.axes[0].get_title() + "\n" + ", ".join(
                f"{k} = {v}" for k, v in zip(keys, values, strict=True)),
            fontsize=10,
        )  # fmt: skip
        yield _safe(f"{stem}-{where}"), fig


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


STALL_PARTS = (
    ("compute_ms", "compute", "#4C72B0"),
    ("flash_ms", "flash wait", "#DD8452"),
    ("mgmt_ms", "cache mgmt", "#55A868"),
    ("unattributed_ms", "unattributed", "#BBBBBB"),
)


def stall_bars(table: pd.DataFrame, label: str = "cell") -> Figure:
    """Where each cell's token time went: stacked horizontal bars of compute, flash wait,
    cache mgmt and unattributed ms per token, the wall time as a tick (from
    :func:`bmoe.analyze.sweep.per_cell` over :func:`bmoe.analyze.stall.stall_by_run`)."""
    n = len(table)
    fig, ax = new_figure(9.0, max(2.5, 0.38 * n + 1.4))
    y = np.arange(n)
    left = np.zeros(n)
    for col, name, color in STALL_PARTS:
        if col not in table:
            continue
        width = pd.to_numeric(table[col], errors="coerce").fillna(0.0).to_numpy(float)
        ax.barh(y, width, left=left, color=color, label=name, height=0.7)
        left += width
    if "wall_ms" in table:
        ax.plot(table["wall_ms"].to_numpy(float), y, "|", color="black", markersize=16,
                markeredgewidth=2, label="wall")  # fmt: skip
    labels = [str(v) if len(str(v)) <= 40 else str(v)[:39] + "…" for v in table[label]]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per token (mean over the cell's repeats)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return fig


def trend_lines(lined: pd.DataFrame, outcome: str = "tok_s_mean") -> Figure:
    """The outcome per cell across sweeps, oldest first: each cell's mean per sweep joined by
    a line, its min-max over the repeats as whiskers (from
    :func:`bmoe.analyze.history.line_up`)."""
    order = lined.attrs.get("sweeps") or list(dict.fromkeys(lined["sweep"]))
    position = {s: i for i, s in enumerate(order)}
    cells = list(dict.fromkeys(lined["cell"]))
    fig, ax = new_figure(max(6.0, 1.4 * len(order) + 4.0), 4.8)
    cmap = colormaps["viridis"]
    for i, cell in enumerate(cells):
        part = lined[lined["cell"] == cell]
        offset = 0.3 * (i / max(1, len(cells) - 1) - 0.5) if len(cells) > 1 else 0.0
        x = part["sweep"].map(position).to_numpy(float) + offset
        mean = part["mean"].to_numpy(float)
        low = mean - part["min"].to_numpy(float)
        high = part["max"].to_numpy(float) - mean
        ax.errorbar(x, mean, yerr=[low, high], fmt="o-", capsize=3, lw=1.2, markersize=4,
                    color=cmap(i / max(1, len(cells) - 1)), label=cell)  # fmt: skip
    labels = [s if len(s) <= 28 else s[:27] + "…" for s in order]
    ax.set_xticks(range(len(order)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(outcome)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if len(cells) <= 16:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.set_title(f"{outcome} per cell across sweeps (mean, min-max over repeats)", fontsize=10)
    return fig
