"""Figures for single runs: the per-token stall attribution and the memory picture."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure

#: Bar colours (colour-blind friendly, fixed so two plots read the same).
COMPONENT_STYLE = {
    "compute_ms": ("compute", "#4C72B0"),
    "flash_ms": ("flash wait", "#DD8452"),
    "mgmt_ms": ("cache mgmt", "#55A868"),
    "unattributed_ms": ("unattributed", "#8C8C8C"),
}

MEMORY_STYLE = {
    # anonymous memory is the expert cache and everything else the process allocated (KV
    # cache, compute buffers, the interpreter): far above the budget on a small cache
    "rss_anon_mib": ("RSS anon (cache, KV, buffers, heap)", "#4C72B0", "-"),
    "rss_file_mib": ("RSS file (mmap'd model)", "#55A868", "-"),
    "swap_mib": ("swap (zram)", "#C44E52", "-"),
    "mem_available_mib": ("MemAvailable", "#937860", "-."),  # brown: apart from RSS blue
    "cache_budget_mib": ("cache budget", "#000000", "--"),
}


def _legend_above(ax, ncol: int) -> None:
    """The legend in one row above the axes, right-aligned, clear of the data."""
    ax.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=ncol,
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
        handlelength=1.5,
        columnspacing=1.0,
    )


def _stack(ax, x: np.ndarray, tokens: pd.DataFrame, compute_label: str) -> None:
    base = np.zeros(len(tokens))
    for col, (label, colour) in COMPONENT_STYLE.items():
        values = np.nan_to_num(tokens[col].to_numpy(dtype=float))
        if col == "compute_ms":
            label = f"{label} ({compute_label})"
        if not values.any() and col != "compute_ms":
            continue
        ax.fill_between(
            x, base, base + values, step="mid", color=colour, alpha=0.85, lw=0, label=label
        )
        base = base + values
    width = 0.9 if len(tokens) <= 400 else 0.5
    ax.step(x, tokens["wall_ms"].to_numpy(), where="mid", color="black", lw=width, label="wall")
    if "overlapped_ms" in tokens:
        overlapped = float(np.nan_to_num(tokens["overlapped_ms"].to_numpy(dtype=float)).mean())
        if overlapped > 0:  # a legend entry only: it is not wall time
            ax.plot([], [], " ", label=f"overlapped (not stacked): {overlapped:.3g} ms/token")


def stall_figure(
    tokens: pd.DataFrame,
    memory: pd.DataFrame | None = None,
    *,
    title: str = "",
    compute_label: str = "cpu_ms / threads",
) -> Figure:
    """Stacked per-token attribution (compute, flash wait, mgmt, unattributed) with the wall
    time as a line; below it, when `memory` has columns beyond ``step``, the memory picture
    over the same steps. The parts partition the wall (:func:`bmoe.analyze.stall.
    partition_wall`), so the stack meets the wall line and never rises above it; busy time
    that overlapped the waits is stated under the axes instead of stacked."""
    has_memory = memory is not None and any(c in memory for c in MEMORY_STYLE)
    if has_memory:
        fig, (ax, mem_ax) = new_figure(
            10, 7.5, nrows=2, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
        )
    else:
        fig, ax = new_figure(10, 4.8)
        mem_ax = None
    x = np.arange(1, len(tokens) + 1)
    _stack(ax, x, tokens, compute_label)
    ax.set_ylabel("ms per token")
    ax.set_xlim(0.5, len(tokens) + 0.5)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    _legend_above(ax, ncol=3)
    ax.set_title(title or "Where each token's time went", loc="left", fontsize=11, pad=22)
    if mem_ax is not None:
        memory_axes(mem_ax, memory)
        mem_ax.set_xlabel("token")
    else:
        ax.set_xlabel("token")
    return fig


def memory_axes(ax, memory: pd.DataFrame) -> None:
    """Draw the memory picture (GiB, or MiB for small runs, over tokens) on `ax`.

    MemAvailable shares the axis with the process's own figures, since the gap between them is
    the story; when it dwarfs them (a host with far more RAM than the run uses) it moves to a
    right-hand axis of its own so the process's lines stay readable.
    """
    x = np.arange(1, len(memory) + 1)
    own = [c for c in MEMORY_STYLE if c in memory and c != "mem_available_mib"]
    own_max = max((float(memory[c].max()) for c in own), default=0.0)
    avail = "mem_available_mib" in memory
    separate = avail and own_max > 0 and float(memory["mem_available_mib"].max()) > 4 * own_max
    top = (
        own_max if separate or not avail else max(own_max, float(memory["mem_available_mib"].max()))
    )
    scale, unit = (1024.0, "GiB") if top >= 1024 else (1.0, "MiB")
    handles = []
    for col, (label, colour, style) in MEMORY_STYLE.items():
        if col not in memory or (col == "mem_available_mib" and separate):
            continue
        (line,) = ax.plot(
            x, memory[col].to_numpy() / scale, style, color=colour, lw=1.2, label=label
        )
        handles.append(line)
    if separate:
        right = ax.twinx()
        label, colour, style = MEMORY_STYLE["mem_available_mib"]
        (line,) = right.plot(x, memory["mem_available_mib"].to_numpy() / 1024.0, style,
                             color=colour, lw=1.2, label=f"{label} (right axis)")  # fmt: skip
        right.set_ylabel("MemAvailable, GiB", color=colour)
        right.tick_params(axis="y", colors=colour)
        right.set_ylim(bottom=0)
        handles.append(line)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=5, fontsize=8,
              frameon=False, borderaxespad=0.2, handlelength=1.5, columnspacing=1.0)  # fmt: skip
    ax.set_title("Memory picture", loc="left", fontsize=10, pad=22)


def memory_figure(memory: pd.DataFrame, *, title: str = "") -> Figure:
    """The memory picture alone: RSS anon/file, swap, MemAvailable and the cache budget."""
    fig, ax = new_figure(10, 4)
    memory_axes(ax, memory)
    ax.set_xlabel("token")
    if title:
        ax.set_title(title, loc="left", fontsize=11)
    return fig


__all__ = ["memory_axes", "memory_figure", "stall_figure"]
