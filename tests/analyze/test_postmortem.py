"""The analyses post-mortems add: stall attribution over many runs and per cell, the budgets
a replay spans, and a run's recorded hit rate against its own replay."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from runs_factory import rows, write_run

from bmoe.analyze import replay as rp
from bmoe.analyze.stall import stall_by_run
from bmoe.analyze.sweep import per_cell
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import RouteTrace, read_route_trace

MIB = 1 << 20


def test_stall_by_run_by_hand(tmp_path):
    """wall 100 ms, io 40, mgmt 10, cpu 200 over 4 threads -> compute 50, unattributed 0;
    the second run: wall 200, io 20, mgmt 0, cpu 120/4 = 30 -> unattributed 150."""
    a = read_metrics(write_run(tmp_path / "a.csv"))
    b = read_metrics(
        write_run(tmp_path / "b.csv", rows(wall=200.0, io_ms=20.0, mgmt_ms=0.0, cpu_ms=120.0))
    )
    table = stall_by_run({"a": a, "b": b}).set_index("run")
    assert table.loc[
        "a", ["wall_ms", "compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms"]
    ].tolist() == pytest.approx([100, 50, 40, 10, 0])
    assert table.loc[
        "b", ["wall_ms", "compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms"]
    ].tolist() == pytest.approx([200, 30, 20, 0, 150])
    assert table.loc["b", "unattributed_pct"] == pytest.approx(75.0)
    assert table.loc["a", "compute_source"] == "cpu_ms / threads"
    assert table.loc["a", "tokens"] == 64 and not table.loc["a", "overlap"]


def test_per_cell_averages_completed_repeats():
    results = pd.DataFrame(
        {"run": ["x/r1", "x/r2", "y/r1", "y/r2", "y/r3"],
         "cell": ["x", "x", "y", "y", "y"], "cache_mb": [0, 0, 8, 8, 8],
         "status": ["ok", "ok", "ok", "crashed", "ok"]}
    )  # fmt: skip
    results.attrs["axes"] = ["cache_mb"]
    by_run = pd.DataFrame(
        {"run": ["x/r1", "x/r2", "y/r1", "y/r2", "y/r3"], "wall_ms": [10.0, 20.0, 5.0, 99.0, 7.0],
         "overlap": [False] * 5, "compute_source": ["cpu_ms / threads"] * 5,
         "cache_mb": [1, 1, 1, 1, 1]}  # a column named like an axis is not averaged
    )  # fmt: skip
    table = per_cell(results, by_run).set_index("cell")
    assert table.loc["x", "wall_ms"] == 15.0 and table.loc["y", "wall_ms"] == 6.0
    assert table.loc["x", "n"] == 2 and table.loc["y", "n"] == 2  # the crashed attempt is out
    assert table.loc["y", "cache_mb"] == 8
    assert "overlap" not in table and "compute_source" not in table


def test_budgets_span_the_expert_set():
    """2 layers x 8 experts x 1 MiB = 16 MiB: 1/32 .. 1 of it, plus the run's budget."""
    frame = pd.DataFrame({"turn": [0], "phase": [1], "step": [0], "layer": [0], "slot": [0],
                          "expert": [1], "weight": [1.0], "residency": [0]})  # fmt: skip
    layers = pd.DataFrame({"layer": [0, 1], "expert_bytes": [MIB, MIB]})
    trace = RouteTrace(None, 1, {"n_expert": 8, "n_layer": 2}, layers, frame)
    assert rp.budgets_for(trace, [3]) == [0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    big = RouteTrace(None, 1, {"n_expert": 128, "n_layer": 30}, pd.DataFrame(
        {"layer": range(30), "expert_bytes": [3_778_560] * 30}), frame)  # fmt: skip
    # 30 x 128 x 3778560 B = 13837.5 MiB: /32 = 432.4, /16 = 864.8 -> whole MiB
    assert rp.budgets_for(big)[:2] == [432.0, 865.0] and rp.budgets_for(big)[-1] == 13838.0


def test_default_budgets_scale_with_the_model():
    """16 MiB of experts, k = 3: the token cycle T is 2 layers x 3 x 1 MiB = 6 MiB, so T/2 = 3
    joins the fractions of the expert set (T and 2T are among them, 4T is past the whole
    set); no sizes: the fixed list."""
    frame = pd.DataFrame({"turn": [0, 0], "phase": [1, 1], "step": [0, 0], "layer": [0, 0],
                          "slot": [0, 1], "expert": [1, 2], "weight": [0.5, 0.5],
                          "residency": [0, 0]})  # fmt: skip
    layers = pd.DataFrame({"layer": [0, 1], "expert_bytes": [MIB, MIB]})
    meta = {"n_expert": 8, "n_layer": 2, "n_expert_used": 3}
    trace = RouteTrace(None, 1, meta, layers, frame)
    assert rp.default_budgets(trace) == [0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    assert 5.0 in rp.default_budgets(trace, [5])
    bigger = RouteTrace(None, 1, meta, layers.assign(expert_bytes=[64 * MIB] * 2), frame)
    assert rp.default_budgets(bigger) == [64 * b for b in rp.default_budgets(trace)]
    unsized = RouteTrace(None, 1, meta, pd.DataFrame({"layer": [0, 1]}), frame)
    assert rp.default_budgets(unsized) == list(map(float, rp.DEFAULT_BUDGETS_MIB))


def test_recorded_against_replay_matches_the_reference(corpus):
    """The reference replay of the native prefetch-off run: 'validation @ 3 MiB: LRU replay =
    32.9% cumulative (35.2% decode-only)', and the run's summary said 32.9 %."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        route = read_route_trace(corpus / "native-tiny" / "pf.route.csv")
        run = read_metrics(corpus / "native-tiny" / "pf.csv")
    figures = rp.recorded_vs_replay(route, 3, run.summary)
    assert f"{figures['lru_hit_pct_cum']:.1f}" == "32.9"
    assert f"{figures['lru_hit_pct_decode']:.1f}" == "35.2"
    assert figures["mrc_hit_pct_decode"] == pytest.approx(figures["lru_hit_pct_decode"])
    assert figures["recorded_hit_pct_cum"] == pytest.approx(figures["lru_hit_pct_cum"])
    assert figures["metrics_cache_hit_pct"] == 32.9 and figures["budget_mib"] == 3.0


def test_per_cell_stall_parts_add_up_to_the_wall(tmp_path):
    """The sweep's stacked bars end at the wall tick: means over repeats keep the partition."""
    over = read_metrics(write_run(tmp_path / "o.csv", rows(cpu_ms=480.0)))  # 120 > 100 - 50
    under = read_metrics(write_run(tmp_path / "u.csv", rows(wall=300.0, cpu_ms=40.0)))
    results = pd.DataFrame({"run": ["x/r1", "x/r2"], "cell": ["x", "x"], "status": ["ok", "ok"]})
    table = per_cell(results, stall_by_run({"x/r1": over, "x/r2": under})).set_index("cell")
    parts = table.loc["x", ["compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms"]].sum()
    assert parts == pytest.approx(table.loc["x", "wall_ms"]) == pytest.approx(200.0)
    assert table.loc["x", "overlapped_ms"] == pytest.approx((120 - 50) / 2)
