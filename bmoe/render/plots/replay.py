"""Plots of a cache replay: hit rate against budget per policy, and the exact LRU curve.

Each takes the DataFrames :mod:`bmoe.analyze.replay` returns, so a notebook computes once
and draws many times.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

import pandas as pd
from matplotlib.figure import Figure

from bmoe.render.plots import new_figure
from bmoe.render.replay import t_text

POLICY_STYLES = {
    "belady": {"color": "black", "linestyle": "--"},
    "lru": {"color": "#1f77b4"},
    "lfu": {"color": "#ff7f0e"},
    "random": {"color": "#7f7f7f", "linestyle": ":"},
    "layer": {"color": "#2ca02c"},
    "layerlfu": {"color": "#98df8a"},
    "arc": {"color": "#d62728"},
    "s3fifo": {"color": "#9467bd"},
    "lfuda": {"color": "#8c564b"},
}


def _t_line(ax, t_mib: float | None) -> None:
    if t_mib is None:
        return
    ax.axvline(t_mib, color="#444444", linewidth=1.0, linestyle="-.")
    ax.annotate(
        f"T = {t_text(t_mib)} MiB\n(one token cycle)",
        xy=(t_mib, 0.02),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=8,
        color="#444444",
    )


Point = tuple[float, float]


def _points(recorded: Point | Sequence[Point] | None) -> list[Point]:
    """One recorded (budget MiB, hit %) point or several (one per run of a sweep)."""
    if recorded is None:
        return []
    if len(recorded) == 2 and all(isinstance(v, Real) for v in recorded):
        return [(float(recorded[0]), float(recorded[1]))]
    return [(float(b), float(h)) for b, h in recorded]


def replay_curve_plot(
    curve: pd.DataFrame,
    *,
    t_mib: float | None = None,
    recorded: Point | Sequence[Point] | None = None,
    mrc: pd.DataFrame | None = None,
    value: str = "hit_pct_decode",
) -> Figure:
    """Hit % against cache budget, one line per policy; the one-token-cycle line T (a budget
    below it cannot hold one token's experts), the hit rate the run recorded at its budget
    (or several runs' points), and, when given, the exact LRU curve as steps."""
    fig, ax = new_figure()
    for policy, part in curve.groupby("policy", sort=False):
        part = part.sort_values("budget_mib")
        style = POLICY_STYLES.get(str(policy), {})
        ax.plot(part["budget_mib"], part[value], marker="o", markersize=3.5, label=policy, **style)
    if mrc is not None and len(mrc):
        ax.step(
            mrc["budget_mib"],
            mrc[value],
            where="post",
            color="#1f77b4",
            linewidth=0.8,
            alpha=0.6,
            label="lru (exact, every budget)",
        )
    _t_line(ax, t_mib)
    points = _points(recorded)
    if points:
        ax.plot(
            [b for b, _ in points], [h for _, h in points], marker="*", markersize=13,
            color="gold", markeredgecolor="black", linestyle="none", label="recorded", zorder=5,
        )  # fmt: skip
    kind = "decode-only" if value == "hit_pct_decode" else "cumulative"
    ax.set_xlabel("cache budget (MiB)")
    ax.set_ylabel(f"hit rate, {kind} (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    ax.set_title("cache replay: hit rate by budget and policy")
    return fig


def mrc_plot(
    mrc: pd.DataFrame,
    *,
    t_mib: float | None = None,
    recorded: Point | Sequence[Point] | None = None,
) -> Figure:
    """The exact LRU miss-ratio curve: miss % (cumulative and decode-only) at every budget
    from 0 to the whole expert set, with the decode hit rate each run recorded at its budget
    (one point or several) as stars."""
    fig, ax = new_figure()
    ax.step(mrc["budget_mib"], 100.0 - mrc["hit_pct_cum"], where="post", label="all lookups")
    ax.step(mrc["budget_mib"], 100.0 - mrc["hit_pct_decode"], where="post", label="decode lookups")
    _t_line(ax, t_mib)
    points = _points(recorded)
    if points:
        ax.plot(
            [b for b, _ in points], [100.0 - h for _, h in points], marker="*", markersize=13,
            color="gold", markeredgecolor="black", linestyle="none", label="recorded (decode)",
            zorder=5,
        )  # fmt: skip
    ax.set_xlabel("LRU cache budget (MiB)")
    ax.set_ylabel("miss ratio (%)")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("exact LRU miss-ratio curve")
    return fig
