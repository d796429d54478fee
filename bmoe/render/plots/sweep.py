"""Sweep figures: the outcome against the main axis with one line per value of another and
its spread across repeats (the figure that answers the sweep's question), each outcome
against each axis, and where each cell's token time went."""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterator, Sequence

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


#: How far along viridis the last line's colour goes (its end is a pale yellow).
VIRIDIS_END = 0.75
#: An axis with at most this many values is ticked at its values.
MAX_VALUE_TICKS = 12


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
        # viridis in order, stopping short of its pale yellow end (unreadable on white)
        shade = VIRIDIS_END * i / max(1, len(groups) - 1)
        color = cmap(shade) if by is not None else "#1f77b4"
        label = f"{by} = {value}" if by is not None else outcome
        ax.plot(part["_x"], part["mean"], "o-", color=color, label=label)
        ax.fill_between(part["_x"], part["min"], part["max"], color=color, alpha=0.15, linewidth=0)
        if attempts is not None and outcome in attempts:
            mine = attempts if by is None else attempts[attempts[by].astype(str) == str(value)]
            ax.plot(
                pd.to_numeric(mine[x], errors="coerce"), mine[outcome], ".", color=color,
                alpha=0.6, markersize=5,
            )  # fmt: skip
    values = sorted(set(pd.to_numeric(cells[x], errors="coerce").dropna()))
    if 0 < len(values) <= MAX_VALUE_TICKS:  # the axis's own values, not steps between them
        ax.set_xticks(values, [f"{v:g}" for v in values])
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


#: Line colours and markers of the trend plot: qualitative (tab10), so neighbours differ.
TREND_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
TREND_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")
#: Most lines one panel of the trend plot carries.
TREND_LINES_PER_PANEL = 5


def _trend_panels(cells: list[str], axes: Sequence[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The trend plot's panels: ``(title, [(cell, legend label), ...])``. With two or more
    axes, one panel per value of the others and one line per value of the axis with the
    fewest values (the same colour for that value in every panel); else the cells in panels
    of :data:`TREND_LINES_PER_PANEL`."""
    axes = [a for a in axes if any(f"{a}=" in c for c in cells)]
    if len(axes) >= 2:
        split = re.compile(r" (?=(?:" + "|".join(re.escape(a) for a in axes) + r")=)")
        parts = {c: dict(p.split("=", 1) for p in split.split(c) if "=" in p) for c in cells}
        if all(set(p) == set(axes) for p in parts.values()):
            colour = min(axes, key=lambda a: len({p[a] for p in parts.values()}))
            if len({p[colour] for p in parts.values()}) <= len(TREND_COLOURS):
                others = [a for a in axes if a != colour]
                panels: dict[str, list[tuple[str, str]]] = {}
                for cell in cells:
                    title = " ".join(f"{a}={parts[cell][a]}" for a in others)
                    panels.setdefault(title, []).append((cell, f"{colour}={parts[cell][colour]}"))
                return list(panels.items())
    size = TREND_LINES_PER_PANEL
    return [("", [(c, c) for c in cells[i : i + size]]) for i in range(0, len(cells), size)]


def trend_lines(
    lined: pd.DataFrame,
    outcome: str = "tok_s_mean",
    breaks: Collection[tuple[str, str]] = (),
) -> Figure:
    """The outcome per cell across sweeps, oldest first: each cell's mean per sweep joined by
    a line, its min-max over the repeats as whiskers (from
    :func:`bmoe.analyze.history.line_up`). Small multiples, so every line can be told apart:
    one panel per value of all axes but one, one line per value of that one, each value with
    its own colour and marker (:func:`_trend_panels`). Consecutive sweeps in `breaks`
    (``(before, after)`` labels: not comparable) are not joined; a dotted line marks them."""
    order = lined.attrs.get("sweeps") or list(dict.fromkeys(lined["sweep"]))
    position = {s: i for i, s in enumerate(order)}
    cells = list(dict.fromkeys(lined["cell"]))
    panels = _trend_panels(cells, lined.attrs.get("axes", []))
    columns = min(3, max(1, len(panels)))
    rows = -(-len(panels) // columns) if panels else 1
    width = max(4.0, 1.0 * len(order) + 2.6)
    fig, grid = new_figure(width * columns, 3.2 * rows + 0.8, nrows=rows, ncols=columns,
                           squeeze=False)  # fmt: skip
    axes_list = list(grid.flat)
    styles: dict[str, int] = {}
    for label_list in (labels for _, labels in panels):
        for _, label in label_list:
            styles.setdefault(label, len(styles))
    gaps = [i for i in range(len(order) - 1) if (order[i], order[i + 1]) in set(breaks)]
    labels_x = [s if len(s) <= 22 else s[:21] + "…" for s in order]
    for ax, (title, members) in zip(axes_list, panels, strict=False):
        for j, (cell, label) in enumerate(members):
            part = lined[lined["cell"] == cell]
            k = styles[label]
            colour, marker = TREND_COLOURS[k % len(TREND_COLOURS)], TREND_MARKERS[k % len(
                TREND_MARKERS)]  # fmt: skip
            offset = 0.12 * (j - (len(members) - 1) / 2) if len(members) > 1 else 0.0
            pos = part["sweep"].map(position).to_numpy(int)
            mean = part["mean"].to_numpy(float)
            low = mean - part["min"].to_numpy(float)
            high = part["max"].to_numpy(float) - mean
            ax.errorbar(pos + offset, mean, yerr=[low, high], fmt=marker, capsize=3,
                        markersize=5, color=colour, label=label)  # fmt: skip
            segment = [0]  # join consecutive sweeps only where no break lies between them
            for i in range(1, len(pos)):
                if any(pos[i - 1] <= g < pos[i] for g in gaps):
                    segment.append(i)
            segment.append(len(pos))
            for a, b in itertools.pairwise(segment):
                ax.plot(pos[a:b] + offset, mean[a:b], "-", color=colour, lw=1.3)
        for g in gaps:
            ax.axvline(g + 0.5, color="#444444", ls=":", lw=1)
        ax.set_xticks(range(len(order)), labels_x, rotation=20, ha="right", fontsize=7)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_ylim(bottom=0)  # after the data: each panel scaled to its own cells
        ax.grid(True, alpha=0.3)
        if title:
            ax.set_title(title, fontsize=9)
        if not title or len(panels) == 1:
            ax.legend(fontsize=7, frameon=False)
    for ax in axes_list[len(panels) :]:
        ax.set_visible(False)
    for ax in axes_list[::columns]:
        ax.set_ylabel(outcome)
    if panels and panels[0][0]:  # one legend for every panel: the same colour, the same value
        handles, names = [], []
        for ax in axes_list[: len(panels)]:
            for h, n in zip(*ax.get_legend_handles_labels(), strict=True):
                if n not in names:
                    handles.append(h)
                    names.append(n)
        fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 6),
                   fontsize=8, frameon=False)  # fmt: skip
    note = "; dotted: not comparable" if gaps else ""
    fig.suptitle(f"{outcome} per cell across sweeps (mean, min-max over repeats{note})",
                 fontsize=10)  # fmt: skip
    return fig
