"""Plots of a routing trace: one function per figure, data in, Figure out.

Each takes the DataFrame the matching analysis function returns (``bmoe.analyze.route``),
so a notebook can compute once and draw many times.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from bmoe.render.plots import new_figure
from bmoe.units import MIB

ALL_STYLE: dict[str, Any] = {"color": "black", "linewidth": 2.2}
RESIDENCY_COLORS = ("#d62728", "#2ca02c", "#1f77b4")  # miss, hit, prefetch hit
RESIDENCY_NAMES = ("miss", "hit", "prefetch hit")


def _layer_colors(layers: np.ndarray):
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    lo, hi = (layers.min(), layers.max()) if len(layers) else (0, 1)
    span = max(hi - lo, 1)
    return cmap, lambda layer: cmap((layer - lo) / span), (lo, hi)


def _layer_colorbar(fig: Figure, ax, cmap, lo: int, hi: int) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = fig.colorbar(ScalarMappable(Normalize(lo, max(hi, lo + 1)), cmap), ax=ax, pad=0.01)
    bar.set_label("MoE layer")


def _log_bins(values: np.ndarray, integers: bool, per_decade: int = 12) -> np.ndarray:
    """Log-spaced bin edges; for integer data, edges sit between integers so no bin is empty
    by construction."""
    lo = max(float(values.min()), 1e-9 if not integers else 1.0)
    hi = max(float(values.max()), lo * 1.01)
    n = max(int(np.ceil(np.log10(hi / lo) * per_decade)), 1)
    edges = np.logspace(np.log10(lo), np.log10(hi), n + 1)
    if integers:
        edges = np.unique(np.round(edges)) - 0.5
        edges = np.append(edges, edges[-1] + 1) if edges[-1] < hi else edges
    return edges


def _plain_log_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(fmt)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def reuse_distance_plot(
    distances: pd.DataFrame, unit: str = "steps", budget_mib: float | None = None
) -> Figure:
    """Reuse-distance distribution per layer: histogram (left) and CDF (right), log x.

    `distances` is ``reuse_distances()`` (unit ``steps``: the ``distance`` column) or
    ``reuse_bytes_distances()`` (unit ``bytes``: ``distance_bytes``, drawn in MiB; the CDF
    at x is then the share of reuses an LRU cache of x MiB would keep resident)."""
    if unit == "bytes":
        values = distances["distance_bytes"].to_numpy(np.float64) / MIB
        xlabel = "reuse distance (MiB of distinct experts looked up in between)"
        what = "in bytes (LRU stack distance)"
    else:
        values = distances["distance"].to_numpy(np.float64)
        xlabel = "reuse distance (steps of the layer's sequence)"
        what = "in steps"
    layers = distances["layer"].to_numpy()
    fig, (hist_ax, cdf_ax) = new_figure(12, 4.8, ncols=2)
    fig.suptitle(f"Expert reuse distance per layer, {what}")
    positive = values > 0
    if not positive.any():
        for ax in (hist_ax, cdf_ax):
            ax.text(0.5, 0.5, "no reuse to show", ha="center", va="center", transform=ax.transAxes)
        return fig
    bins = _log_bins(values[positive], integers=unit != "bytes")
    uniq = np.unique(layers)
    cmap, color, (lo, hi) = _layer_colors(uniq)
    for layer in uniq:
        v = values[(layers == layer) & positive]
        counts, _ = np.histogram(v, bins=bins)
        share = 100 * counts / max(len(v), 1)
        hist_ax.stairs(share, bins, color=color(layer), alpha=0.45, linewidth=0.8)
        x = np.sort(values[layers == layer])
        cdf_ax.step(
            x,
            np.arange(1, len(x) + 1) / len(x) * 100,
            where="post",
            color=color(layer),
            alpha=0.45,
            linewidth=0.8,
        )
    counts, _ = np.histogram(values[positive], bins=bins)
    hist_ax.stairs(100 * counts / positive.sum(), bins, label="all layers", **ALL_STYLE)
    x = np.sort(values)
    cdf_ax.step(
        x, np.arange(1, len(x) + 1) / len(x) * 100, where="post", label="all layers", **ALL_STYLE
    )
    hist_ax.set(
        xscale="log",
        xlabel=xlabel,
        ylabel="share of the layer's reuses (%)",
        title="Histogram (log-spaced bins)",
    )
    cdf_ax.set(
        xscale="log",
        xlabel=xlabel,
        ylabel="reuses at or below this distance (%)",
        title="Cumulative distribution",
        ylim=(0, 100),
    )
    if unit == "bytes" and budget_mib:
        cdf_ax.axvline(
            budget_mib, color="#ff7f0e", linestyle="--", label=f"budget {budget_mib:g} MiB"
        )
    for ax in (hist_ax, cdf_ax):
        _plain_log_axis(ax)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    _layer_colorbar(fig, cdf_ax, cmap, lo, hi)
    return fig


def routing_heatmap(grid: pd.DataFrame, value: str = "residency") -> Figure:
    """Step x layer heatmap from ``routing_grid()``: each layer is a band of k slot columns
    (slot 0 = the router's top choice on the left); colour = miss/hit/prefetch hit, or the
    expert id."""
    n_steps = len(grid)
    fig, ax = new_figure(12, min(max(3.5, 1.5 + n_steps * 0.06), 9))
    if not n_steps:
        ax.text(0.5, 0.5, "nothing routed", ha="center", va="center", transform=ax.transAxes)
        return fig
    data = np.ma.masked_less(grid.to_numpy(), 0)
    layers = grid.columns.get_level_values("layer").to_numpy()
    k = grid.columns.get_level_values("slot").max() + 1
    steps = grid.index.to_numpy()
    extent = (0, data.shape[1], n_steps, 0)
    if value == "residency":
        cmap = ListedColormap(RESIDENCY_COLORS).with_extremes(bad="white")
        ax.imshow(
            data,
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            vmin=-0.5,
            vmax=2.5,
            extent=extent,
        )
        ax.legend(
            handles=[
                Patch(color=c, label=n)
                for c, n in zip(RESIDENCY_COLORS, RESIDENCY_NAMES, strict=True)
            ],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize="small",
            title="routing",
        )
        title = "Cache outcome of every routing (step x layer x slot)"
    else:
        import matplotlib

        cmap = matplotlib.colormaps["turbo"].with_extremes(bad="white")
        im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, extent=extent)
        fig.colorbar(im, ax=ax, pad=0.01).set_label("expert id")
        title = "Routed expert ids (step x layer x slot)"
    uniq = layers[::k]
    stride = max(1, int(np.ceil(len(uniq) / 24)))
    ax.set_xticks(np.arange(len(uniq))[::stride] * k + k / 2, [str(x) for x in uniq[::stride]])
    if len(uniq) <= 64:
        for i in range(1, len(uniq)):
            ax.axvline(i * k, color="white", linewidth=0.6)
    ticks = np.linspace(0, n_steps - 1, min(n_steps, 10)).astype(int)
    ax.set_yticks(ticks + 0.5, [str(steps[t]) for t in ticks])
    ax.set(
        xlabel=f"MoE layer (each band: {k} slots, top choice first)",
        ylabel="step (token position)",
        title=title,
    )
    return fig


def workset_growth_plot(curve: pd.DataFrame, budget_mib: float | None = None) -> Figure:
    """Working-set growth from ``workset_curve()``: distinct experts per layer (left) and the
    MiB of the union over all layers (right) against the cache budget."""
    fig, (count_ax, bytes_ax) = new_figure(12, 4.8, ncols=2)
    fig.suptitle("Working-set growth: distinct experts routed so far")
    layers = curve["layer"].to_numpy()
    uniq = np.unique(layers)
    cmap, color, (lo, hi) = _layer_colors(uniq)
    for layer, part in curve.groupby("layer", sort=True):
        count_ax.plot(part["steps"], part["distinct"], color=color(layer), linewidth=0.9, alpha=0.7)
    count_ax.set(
        xlabel="steps of the layer's sequence", ylabel="distinct experts routed", title="Per layer"
    )
    count_ax.grid(True, alpha=0.3)
    _layer_colorbar(fig, count_ax, cmap, lo, hi)
    wide = curve.pivot(index="steps", columns="layer", values="mib").ffill()
    total = wide.sum(axis=1, min_count=1)
    if total.notna().any():
        bytes_ax.plot(total.index, total.to_numpy(), label="union of all layers", **ALL_STYLE)
        if budget_mib:
            bytes_ax.axhline(
                budget_mib,
                color="#ff7f0e",
                linestyle="--",
                label=f"cache budget {budget_mib:g} MiB",
            )
        bytes_ax.legend(loc="upper left", fontsize="small")
    else:
        bytes_ax.text(
            0.5,
            0.5,
            "the preamble has no expert sizes",
            ha="center",
            va="center",
            transform=bytes_ax.transAxes,
        )
    bytes_ax.set(
        xlabel="steps",
        ylabel="expert weights touched (MiB)",
        title="All layers, against the budget",
    )
    bytes_ax.grid(True, alpha=0.3)
    return fig


def hot_concentration_plot(counts: pd.DataFrame, n_expert: int | None = None) -> Figure:
    """Hot-expert concentration from ``expert_counts()``: cumulative share of activations
    carried by the hottest experts against the share of experts, per layer; the diagonal is
    a router that spreads evenly over every expert."""
    fig, ax = new_figure(7.5, 5.5)
    uniq = np.unique(counts["layer"].to_numpy())
    cmap, color, (lo, hi) = _layer_colors(uniq)
    n_expert = n_expert or int(counts["expert"].max()) + 1
    for layer, part in counts.groupby("layer", sort=True):
        part = part.sort_values("rank")
        x = np.r_[0, (part["rank"].to_numpy() + 1) / n_expert * 100]
        y = np.r_[0, np.cumsum(part["share_pct"].to_numpy())]
        ax.plot(x, y, color=color(layer), linewidth=0.9, alpha=0.7)
    pooled = counts.groupby("rank")["activations"].sum().sort_index()
    x = np.r_[0, (pooled.index.to_numpy() + 1) / n_expert * 100]
    y = np.r_[0, np.cumsum(pooled.to_numpy()) / pooled.sum() * 100]
    ax.plot(x, y, label="all layers (rank-wise)", **ALL_STYLE)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", label="even spread")
    ax.set(
        xlim=(0, 100),
        ylim=(0, 100),
        xlabel="hottest experts, share of the layer's experts (%)",
        ylabel="share of the layer's activations (%)",
        title="Hot-expert concentration per layer",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    _layer_colorbar(fig, ax, cmap, lo, hi)
    return fig


def overlap_plot(overlap: pd.DataFrame, chance_pct: float | None = None) -> Figure:
    """Routing overlap by lag from ``overlap()``: mean share of a cell's experts also routed
    `lag` steps earlier, per layer and pooled (``ALL``); `chance_pct` (100 k / n_expert)
    draws what a router picking uniformly at random would share."""
    fig, ax = new_figure(8, 5)
    lag_cols = [c for c in overlap.columns if c.startswith("lag_")]
    lags = np.array([int(c.split("_")[1]) for c in lag_cols])
    per_layer = overlap[overlap["layer"] != "ALL"]
    layers = per_layer["layer"].to_numpy(np.int64)
    cmap, color, (lo, hi) = _layer_colors(layers)
    for layer, rec in zip(layers, per_layer[lag_cols].to_numpy(np.float64), strict=True):
        ax.plot(lags, rec, color=color(layer), linewidth=0.9, alpha=0.6, marker=".")
    pooled = overlap[overlap["layer"] == "ALL"]
    if len(pooled):
        ax.plot(
            lags,
            pooled[lag_cols].to_numpy(np.float64)[0],
            marker="o",
            label="all layers",
            **ALL_STYLE,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lags, [str(g) for g in lags])
    ax.set(
        xlabel="lag (steps back in the layer's sequence)",
        ylabel="experts shared with the earlier step (% of top-k)",
        title="Routing overlap with earlier steps",
        ylim=(0, None),
    )
    ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], marker="o", **ALL_STYLE, label="all layers")]
    if chance_pct:
        ax.axhline(chance_pct, color="grey", linestyle=":")
        handles.append(Line2D([], [], color="grey", linestyle=":", label="uniform random router"))
    ax.legend(handles=handles, loc="upper right", fontsize="small")
    _layer_colorbar(fig, ax, cmap, lo, hi)
    return fig
