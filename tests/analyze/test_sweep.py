"""Sweep analysis on hand-built results tables (one row per attempt)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.sweep import (
    analyze_sweep,
    axis_effects,
    axis_influence,
    axis_table,
    rank_cells,
    reversed_rounds,
    within_cell_drift,
)


def results(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame.attrs["axes"] = ["cache_mb", "io_threads"]
    return frame


def grid_rows(drift: float = 0.0) -> list[dict]:
    """2x2 grid, two rounds (the second reversed); tok/s = 10 * (1 + cache_mb/8) + io_threads,
    plus `drift` per execution position."""
    cells = [(0, 1), (0, 2), (8, 1), (8, 2)]
    rows = []
    order = 0
    for rnd, seq in ((1, cells), (2, cells[::-1])):
        for cache, io in seq:
            rows.append({
                "cell": f"c{cache}-{io}", "cache_mb": cache, "io_threads": io, "order": order,
                "round": rnd, "reversed": rnd == 2, "status": "ok", "target": "t",
                "tok_s_mean": 10 * (1 + cache / 8) + io + drift * order, "ttft_s": 0.5 + io,
            })  # fmt: skip
            order += 1
    return rows


def test_rank_cells_orders_by_the_outcome_and_its_direction():
    crashed = {"cell": "c0-1", "cache_mb": 0, "io_threads": 1, "status": "crashed",
               "target": "t", "order": 8}  # fmt: skip
    frame = results([*grid_rows(), crashed])
    ranked = rank_cells(frame)
    assert ranked["cell"].tolist() == ["c8-2", "c8-1", "c0-2", "c0-1"]
    assert ranked["mean"].tolist() == [22.0, 21.0, 12.0, 11.0]
    assert ranked["n"].tolist() == [2, 2, 2, 2]  # the crashed attempt does not count
    assert ranked["rank"].tolist() == [1, 2, 3, 4]
    by_ttft = rank_cells(frame, "ttft_s")  # less is better
    assert by_ttft["cell"].tolist()[:2] in (["c0-1", "c8-1"], ["c8-1", "c0-1"])


def test_axis_effects_means_per_value():
    effects = axis_effects(results(grid_rows()), ["tok_s_mean"])
    cache = effects[effects["axis"] == "cache_mb"].set_index("value")
    assert cache.loc["0", "mean"] == pytest.approx(11.5) and cache.loc["8", "mean"] == 21.5
    assert cache.loc["0", "n"] == 4 and cache.loc["8", "min"] == 21.0
    wide = axis_table(results(grid_rows()), ["tok_s_mean", "ttft_s"])
    row = wide[(wide["axis"] == "io_threads") & (wide["value"] == "2")].iloc[0]
    assert row["tok_s_mean"] == pytest.approx(17.0) and row["ttft_s"] == pytest.approx(2.5)


def test_within_cell_drift_finds_drift_and_not_its_absence():
    clean = within_cell_drift(results(grid_rows()))
    assert clean["spearman_rho"] is None or abs(clean["spearman_rho"]) < 1e-9
    drifting = within_cell_drift(results(grid_rows(drift=-0.5)))
    assert drifting["spearman_rho"] < -0.9
    assert drifting["p_value"] < 0.05
    # Hand-worked: each cell's two attempts differ by 0.5 * (position gap); ratios to the cell
    # mean fall linearly with position, so first-to-last change is negative.
    assert drifting["change_pct_first_to_last"] < 0


def test_reversed_rounds_compare_each_cell_forward_and_backward():
    table = reversed_rounds(results(grid_rows(drift=-0.5)))
    assert table["cell"].tolist() == ["c0-1", "c0-2", "c8-1", "c8-2"]
    # c0-1 runs at position 0 then 7: 11 then 11 - 3.5.
    first = table.iloc[0]
    assert first["forward"] == 11.0 and first["reversed"] == 7.5
    assert first["diff_pct"] == pytest.approx(100 * (7.5 / 11 - 1))
    assert np.isclose(table.iloc[3]["diff_pct"], 100 * ((22 - 2.0) / (22 - 1.5) - 1))


def test_axis_influence_by_hand():
    # tok/s by cell: (0,1) 11, (0,2) 12, (8,1) 21, (8,2) 22, each run twice; overall 16.5
    table = axis_influence(results(grid_rows()), "tok_s_mean")
    assert table["axis"].tolist() == ["cache_mb", "io_threads"]  # the larger gap first
    cache, io = table.to_dict("records")
    assert (cache["values"], cache["best"], cache["worst"]) == (2, "8", "0")
    assert (cache["best_mean"], cache["worst_mean"]) == (21.5, 11.5)
    assert cache["range_pct"] == pytest.approx(100 * 10 / 16.5)
    assert (io["best"], io["worst"], io["range_pct"]) == ("2", "1", pytest.approx(100 / 16.5))
    # less is better for ttft_s (0.5 + io_threads): the smaller value is the best
    ttft = axis_influence(results(grid_rows()), "ttft_s").set_index("axis")
    assert ttft.loc["io_threads", ["best", "worst"]].tolist() == ["1", "2"]
    assert ttft.loc["io_threads", "range_pct"] == pytest.approx(100 * 1.0 / 2.0)
    assert ttft.loc["cache_mb", "range_pct"] == 0.0 and ttft.index[0] == "io_threads"
    assert axis_influence(results(grid_rows()), "no_such_outcome").empty


def test_analyze_sweep_views():
    views = analyze_sweep(results(grid_rows()))
    assert {"attempts", "ranking", "order_effect", "reversed_rounds", "verdict"} <= set(views)
    assert "contamination" in views
    assert views["axis_influence"]["axis"].tolist() == ["cache_mb", "io_threads"]
