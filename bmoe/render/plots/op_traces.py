"""Decode-trace figures: read latency CDF per lane, the lane timeline, time by op class per
layer. Each function takes analysis results and returns a Figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bmoe.analyze.opclass import OP_CLASSES
from bmoe.analyze.timeline import Timeline
from bmoe.render.plots import new_figure

#: One fixed colour per op class, so figures of different runs read alike.
CLASS_COLOURS = {
    "attention": "#4C72B0",
    "router": "#DD8452",
    "expert matmul": "#C44E52",
    "dense FFN": "#8172B3",
    "norm": "#55A868",
    "other": "#9A9A9A",
}


def latency_cdf(cdf: pd.DataFrame, quantiles: dict[str, float] | None = None) -> Figure:
    """Read latency CDF, one line per lane plus all lanes (from
    :func:`bmoe.analyze.op_traces.io_latency_cdf`), with the p50/p90/p99 of all reads marked."""
    fig, ax = new_figure(8.0, 4.8)
    lanes = sorted(int(v) for v in cdf["lane"].unique() if v >= 0)
    cmap = colormaps["tab10"]
    for i, lane in enumerate(lanes):
        part = cdf[cdf["lane"] == lane]
        ax.step(
            part["latency_us"],
            part["fraction"],
            where="post",
            lw=1.2,
            color=cmap(i % 10),
            label=f"lane {lane} ({len(part)} reads)",
        )
    allp = cdf[cdf["lane"] == -1]
    if len(allp):
        ax.step(
            allp["latency_us"],
            allp["fraction"],
            where="post",
            lw=2.2,
            color="black",
            label=f"all lanes ({len(allp)} reads)",
        )
    for name, value in (quantiles or {}).items():
        if name == "max" or value is None or not np.isfinite(value):
            continue
        ax.axvline(value, color="0.4", ls=":", lw=1)
        ax.annotate(
            f"{name} {value:.0f} µs",
            (value, 0.02),
            xytext=(3, 0),
            textcoords="offset points",
            rotation=90,
            va="bottom",
            fontsize=8,
            color="0.3",
        )
    lat = cdf["latency_us"].to_numpy()
    tail = len(lat) and lat.min() > 0 and lat.max() > 20 * float(np.median(lat))
    if tail:  # a heavy tail would squash the body of the distribution against the axis
        ax.set_xscale("log")
        ax.set_xlabel("read latency (µs, log scale)")
    else:
        ax.set_xlabel("read latency (µs)")
        ax.set_xlim(left=0)
    ax.set_ylabel("fraction of reads ≤ latency")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center right", fontsize=8)
    ax.set_title("Flash read latency by lane")
    return fig


def lane_timeline(timeline: Timeline, title: str | None = None) -> Figure:
    """Each read a bar on its lane's row (colour = layer), the compute track above when the
    timeline has one, thin lines at step boundaries. Says so when times were reconstructed."""
    io = timeline.io if timeline.io is not None else pd.DataFrame()
    comp = timeline.compute
    lanes = sorted(int(v) for v in io["lane"].unique()) if len(io) else []
    rows = len(lanes) + (1 if comp is not None and len(comp) else 0)
    fig, ax = new_figure(11.0, 1.2 + 0.55 * max(rows, 1))
    origin = int(timeline.steps["start_ns"].min()) if len(timeline.steps) else 0
    layers = sorted(int(v) for v in io["layer"].unique()) if "layer" in io else []
    cmap = colormaps["viridis"]
    colour_of = {lay: cmap(i / max(len(layers) - 1, 1)) for i, lay in enumerate(layers)}
    labels = []
    ends = [f["start_ns"] + f["dur_ns"] for f in (io, comp) if f is not None and len(f)]
    span_ms = (max(float(e.max()) for e in ends) - origin) / 1e6 if ends else 1.0
    thin = len(io) and float(np.median(io["dur_ns"])) / 1e6 < 0.004 * span_ms
    edge = 0.0 if thin else 0.3  # white gaps between bars only when bars are wide enough
    for y, lane in enumerate(lanes):
        part = io[io["lane"] == lane]
        left = (part["start_ns"].to_numpy() - origin) / 1e6
        width = part["dur_ns"].to_numpy() / 1e6
        colours = [colour_of.get(int(v), "0.5") for v in part["layer"]] if layers else "C0"
        ax.barh(y, width, left=left, height=0.7, color=colours, edgecolor="white", lw=edge)
        spec = part["spec"].to_numpy() != 0 if "spec" in part else np.zeros(len(part), bool)
        if spec.any():
            ax.barh(
                y,
                width[spec],
                left=left[spec],
                height=0.7,
                fill=False,
                hatch="///",
                edgecolor="black",
                lw=0.3,
            )
        labels.append(f"lane {lane}")
    if comp is not None and len(comp):
        y = len(lanes)
        left = (comp["start_ns"].to_numpy() - origin) / 1e6
        width = comp["dur_ns"].to_numpy() / 1e6
        if "op_class" in comp:
            colours = [CLASS_COLOURS.get(c, "0.5") for c in comp["op_class"]]
        else:
            colours = "0.55"
        ax.barh(y, width, left=left, height=0.7, color=colours, lw=0)
        labels.append("compute")
    for start in (timeline.steps["start_ns"].to_numpy() - origin) / 1e6:
        ax.axvline(start, color="0.25", lw=0.6, ls="--", alpha=0.6)
    for _, st in timeline.steps.iterrows() if len(timeline.steps) <= 12 else []:
        ax.annotate(
            f"step {int(st['step'])}",
            ((st["start_ns"] - origin) / 1e6, rows - 0.45),
            xytext=(2, 0),
            textcoords="offset points",
            fontsize=7,
            color="0.25",
            va="bottom",
        )
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(-0.6, max(rows, 1) - 0.4 + 0.35)
    ax.set_xlabel("time (ms)" + (" — reconstructed" if timeline.reconstructed else ""))
    ax.set_xlim(left=0)
    handles = [Patch(color=colour_of[lay], label=f"layer {lay}") for lay in layers[:12]]
    if comp is not None and len(comp) and "op_class" in comp:
        present = set(comp["op_class"])
        handles += [Patch(color=CLASS_COLOURS[c], label=c) for c in OP_CLASSES if c in present]
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize=7, frameon=False)
    heading = title or "Flash reads by lane"
    if timeline.io is not None and not timeline.io_measured:
        heading += "\nreconstructed: no start_ns in the trace, each lane's reads laid end to end"
    ax.set_title(heading, fontsize=10)
    return fig


def class_by_layer(table: pd.DataFrame) -> Figure:
    """Stacked bars: ms/token by op class for each layer (from
    :func:`bmoe.analyze.op_traces.compute_class_by_layer`); layer -1 shows as "none"."""
    classes = [c for c in OP_CLASSES if c in table and table[c].sum() > 0]
    fig, ax = new_figure(max(6.0, 0.35 * len(table) + 3.0), 4.8)
    x = np.arange(len(table))
    bottom = np.zeros(len(table))
    for c in classes:
        values = table[c].to_numpy(np.float64)
        ax.bar(x, values, bottom=bottom, color=CLASS_COLOURS[c], label=c, width=0.8)
        bottom += values
    names = ["none" if int(v) < 0 else str(int(v)) for v in table["layer"]]
    step = max(1, len(names) // 24)
    ax.set_xticks(x[::step], names[::step])
    ax.set_xlabel("layer")
    ax.set_ylabel("ms / token")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right center", fontsize=8, frameon=False)
    ax.set_title("Compute time by op class per layer (measured, traced run)")
    return fig


def segments_bar(segments: pd.DataFrame) -> Figure:
    """Layer-granular traces: ms/token per segment (pre, blk.N, post)."""
    fig, ax = new_figure(max(6.0, 0.3 * len(segments) + 3.0), 4.5)
    x = np.arange(len(segments))
    ax.bar(x, segments["ms_per_token"], color="#4C72B0")
    step = max(1, len(segments) // 24)
    ax.set_xticks(x[::step], list(segments["segment"])[::step], rotation=45, ha="right")
    ax.set_ylabel("ms / token")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Compute time per layer segment (layer-granular trace)")
    return fig
