"""Prediction figures: predicted against measured tok/s, with the identity line, each
prediction's interval as an error bar and labels placed where they overlap nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure

#: Where a label may go around its dot, in points (dx, dy, horizontal alignment), in order.
LABEL_SPOTS = (
    (4, 3, "left"), (4, -9, "left"), (-4, 3, "right"), (-4, -9, "right"),
    (0, 7, "center"), (0, -13, "center"), (8, -3, "left"), (-8, -3, "right"),
    (10, 10, "left"), (-10, 10, "right"), (10, -16, "left"), (-10, -16, "right"),
)  # fmt: skip


def _labels(table: pd.DataFrame, label: str | None) -> list[str] | None:
    if not label or label not in table:
        return None
    if label == "cell" and "cache_mb" in table and "file" not in table:  # sweep cells
        from bmoe.render.predict import cell_label

        return [cell_label(row) for row in table.to_dict("records")]
    return [str(v) if len(str(v)) <= 18 else str(v)[:17] + "~" for v in table[label]]


def place_labels(
    fig: Figure, ax, x, y, texts: list[str], fontsize: float = 7, avoid: tuple = ()
) -> list:
    """Annotate each (x, y) with its text at the first spot of :data:`LABEL_SPOTS` whose box
    is inside the axes and overlaps no label placed before it, no dot and no artist of
    `avoid` (the legend); a text with no such spot is left out. Returns the annotations
    placed."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    dots = ax.transData.transform(np.column_stack([x, y]))
    placed: list = []
    boxes: list = [artist.get_window_extent(renderer) for artist in avoid]
    for xi, yi, text in zip(x, y, texts, strict=True):
        if not (np.isfinite(xi) and np.isfinite(yi)):
            continue
        for dx, dy, ha in LABEL_SPOTS:
            note = ax.annotate(
                text, (xi, yi), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                ha=ha, va="bottom", annotation_clip=True,
            )  # fmt: skip
            box = note.get_window_extent(renderer).expanded(1.02, 1.05)
            inside = (
                box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                and box.y1 <= frame.y1
            )  # fmt: skip
            clear = not any(box.overlaps(other) for other in boxes) and not any(
                box.contains(px, py) for px, py in dots
            )
            if inside and clear:
                placed.append(note)
                boxes.append(box)
                break
            note.remove()
    return placed


def predicted_vs_measured_plot(
    table: pd.DataFrame,
    measured: str = "tok_s_measured",
    predicted: str = "tok_s_predicted",
    label: str | None = "cell",
) -> Figure:
    """One dot per cell, measured on x and predicted on y, the prediction's interval as an
    error bar where the table has one (``tok_s_low_predicted`` / ``tok_s_high_predicted``, or
    ``tok_s_low`` / ``tok_s_high``); on the identity line a prediction is exact, the shaded
    band is +-15 %. Labels sit inside the axes and overlap nothing (see :func:`place_labels`);
    the ones that find no room are counted in the title."""
    fig, ax = new_figure(5.5, 5.0)
    x = table[measured].to_numpy(dtype=float)
    y = table[predicted].to_numpy(dtype=float)
    finite = np.isfinite(x) & np.isfinite(y)
    low = high = None
    for lo, hi in (("tok_s_low_predicted", "tok_s_high_predicted"), ("tok_s_low", "tok_s_high")):
        if lo in table and hi in table:
            low = table[lo].to_numpy(dtype=float)
            high = table[hi].to_numpy(dtype=float)
            break
    tops = [x[finite].max(initial=0), y[finite].max(initial=0)]
    if high is not None:
        tops.append(np.nanmax(np.where(finite, high, np.nan), initial=0))
    top = float(max(tops)) * 1.12 or 1.0
    line = np.array([0.0, top])
    ax.fill_between(line, line * 0.85, line * 1.15, color="0.9", label="±15 %")
    ax.plot(line, line, color="0.4", lw=1, label="predicted = measured")
    ax.scatter(x, y, zorder=3)
    if low is not None and high is not None:
        has = finite & np.isfinite(low) & np.isfinite(high)
        if has.any():
            yerr = np.vstack([np.maximum(y - low, 0.0), np.maximum(high - y, 0.0)])[:, has]
            ax.errorbar(
                x[has], y[has], yerr=yerr, fmt="none", ecolor="C0", elinewidth=1, capsize=2,
                alpha=0.7, label="prediction interval", zorder=2,
            )  # fmt: skip
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured tok/s")
    ax.set_ylabel("predicted tok/s")
    legend = ax.legend(loc="upper left", fontsize=8)
    texts = _labels(table, label)
    if texts is not None:
        placed = place_labels(fig, ax, x, y, texts, avoid=(legend,))
        missing = int(finite.sum()) - len(placed)
        if missing > 0:
            ax.set_title(f"{missing} of {int(finite.sum())} labels left out (no room)",
                         fontsize=8)  # fmt: skip
    return fig


__all__ = ["LABEL_SPOTS", "place_labels", "predicted_vs_measured_plot"]
