"""Contamination tells: each one fires on a constructed case and stays quiet on a clean one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from runs_factory import rows, write_run

from bmoe.analyze.contamination import contamination_flags, position_beyond_config
from bmoe.errors import BmoeError
from bmoe.sweep.results import runs_table

PRESSURE = {"peak_rss_kb": 5_000_000, "mem_avail_before_kb": 6_000 * 1024,
            "cpu_temp_before_mC": 40_000, "cpu_temp_max_mC": 60_000}  # fmt: skip


def sweep(tmp_path: Path, specs: list[dict]) -> pd.DataFrame:
    """Write one metrics file per spec (in execution order) and build the cells table."""
    for i, spec in enumerate(specs):
        spec = dict(spec)
        name = spec.pop("name", f"cell{i:02d}")
        wall = spec.pop("wall", 100.0)
        summary = spec.pop("summary", {})
        pressure = spec.pop("pressure", PRESSURE)
        state = spec.pop("state", None)
        path = write_run(
            tmp_path / f"{name}.csv", rows(64, wall=wall), summary=summary, pressure=pressure,
            mtime=1_700_000_000 + 60 * i, **spec,
        )  # fmt: skip
        if state is not None:
            path.with_suffix(".state").write_text(state)
    return runs_table([tmp_path])


def flags_of(cells: pd.DataFrame, tell: str) -> pd.DataFrame:
    flags = contamination_flags(cells)
    return flags[flags["tell"] == tell]


def clean_specs(repeats: int = 2) -> list[dict]:
    """A 2x2 grid (cache_mb x n_expert_used) run `repeats` times in order: nothing wrong."""
    specs = []
    for rep in range(repeats):
        for cache in (2000, 4000):
            for k in (4, 8):
                wall = 100.0 * (1.2 if k == 8 else 1.0) * (0.9 if cache == 4000 else 1.0)
                wall *= 1.0 + 0.01 * ((rep + cache // 2000 + k) % 3 - 1)  # small, unordered
                compute = 0.05 * (k / 4)
                specs.append(
                    {"name": f"r{rep}_c{cache}_k{k}", "cache_mb": cache, "n_expert_used": k,
                     "wall": wall,
                     "summary": {"compute_s/tok": compute, "majflt/tok": 3.0 + rep,
                                 "cpu_s/tok": 0.2}}
                )  # fmt: skip
    return specs


def test_clean_sweep_is_not_flagged(tmp_path: Path) -> None:
    cells = sweep(tmp_path, clean_specs())
    assert len(cells) == 8
    assert cells.sort_values("order")["cell"].iloc[0] == "r0_c2000_k4.csv"
    flags = contamination_flags(cells)
    assert flags.empty, flags.to_dict("records")
    assert flags.attrs["not_checked"] == []  # every tell was evaluated, none fired


def test_compute_rising_while_topk_falls(tmp_path: Path) -> None:
    specs = clean_specs()
    specs[0]["summary"] = {**specs[0]["summary"], "compute_s/tok": 0.2}  # k=4 slower than k=8
    flags = flags_of(sweep(tmp_path, specs), "compute_vs_topk")
    assert len(flags) == 1
    flag = flags.iloc[0]
    assert flag["cells"] == ["r0_c2000_k4.csv", "r1_c2000_k4.csv", "r0_c2000_k8.csv",
                             "r1_c2000_k8.csv"]  # fmt: skip
    assert "n_expert_used 4" in flag["evidence"] and "cache_mb=2000" in flag["evidence"]


def test_major_faults_an_order_of_magnitude_above_peers(tmp_path: Path) -> None:
    specs = clean_specs()
    specs[5]["summary"] = {**specs[5]["summary"], "majflt/tok": 80.0}  # peers: 3 or 4
    flags = flags_of(sweep(tmp_path, specs), "majflt")
    assert list(flags["cells"]) == [[specs[5]["name"] + ".csv"]]
    assert "majflt/token 80" in flags.iloc[0]["evidence"]
    # 9x the peers' median (3 faults/token) is not an order of magnitude
    specs[5]["summary"] = {**specs[5]["summary"], "majflt/tok": 9 * 3.0}
    assert flags_of(sweep(tmp_path / "b", specs), "majflt").empty


def test_entry_state_hot_short_and_capped(tmp_path: Path) -> None:
    specs = clean_specs()
    specs[2]["pressure"] = {**PRESSURE, "cpu_temp_before_mC": 52_000}
    specs[4]["pressure"] = {**PRESSURE, "mem_avail_before_kb": 3_000 * 1024}
    state = (
        "--- BEFORE ---\npolicy0: scaling_max={} hw_max=3000000\n"
        "policy6: scaling_max=3800000 hw_max=3800000\n"
    )
    for spec in specs:
        spec["state"] = state.format(3000000)
    specs[6]["state"] = state.format(1900800)
    flags = flags_of(sweep(tmp_path, specs), "entry_state")
    by_cell = {c[0]: e for c, e in zip(flags["cells"], flags["evidence"], strict=True)}
    assert set(by_cell) == {specs[2]["name"] + ".csv", specs[4]["name"] + ".csv",
                            specs[6]["name"] + ".csv"}  # fmt: skip
    assert "52.0 °C" in by_cell[specs[2]["name"] + ".csv"]
    assert "MemAvailable 3000 MiB" in by_cell[specs[4]["name"] + ".csv"]
    assert "5700800 kHz" in by_cell[specs[6]["name"] + ".csv"]


def test_throughput_tracking_execution_order(tmp_path: Path) -> None:
    specs = clean_specs(repeats=3)
    for i, spec in enumerate(specs):  # each cell 4 % slower than the one before
        spec["wall"] *= 1.04**i
    flags = flags_of(sweep(tmp_path, specs), "execution_order")
    assert len(flags) == 1
    flag = flags.iloc[0]
    assert flag["cells"] == [s["name"] + ".csv" for s in specs]  # in execution order
    # 1/1.04 - 1 = -3.85 % per position, blurred a little by the grid's +-1 % noise
    per_position = float(flag["evidence"].split(" % per execution position")[0].split()[-1])
    assert -4.2 < per_position < -3.5
    # two passes of the same grid cannot reach p < 0.01 by permutation: not flagged
    few = clean_specs(repeats=2)
    for i, spec in enumerate(few):
        spec["wall"] *= 1.04**i
    assert flags_of(sweep(tmp_path / "few", few), "execution_order").empty


def test_position_beyond_config_needs_repeats() -> None:
    # every cell a distinct config: position cannot be told apart from configuration
    cells = pd.DataFrame(
        {"cell": list("abcde"), "order": range(5), "cache_mb": [1, 2, 3, 4, 5],
         "tok_s_mean": [5, 4, 3, 2, 1.0]}
    )  # fmt: skip
    flags, why = position_beyond_config(cells, ["cache_mb"])
    assert flags == [] and "confounded" in why
    assert "execution_order" in " ".join(contamination_flags(cells).attrs["not_checked"])


def test_position_beyond_config_by_hand() -> None:
    # two configs alternating; a 5 % per-position decline on top: the fit recovers it exactly
    n = 12
    config = np.array([0, 1] * (n // 2))
    tok_s = np.where(config == 1, 8.0, 4.0) * 0.95 ** np.arange(n)
    cells = pd.DataFrame({"cell": [f"c{i}" for i in range(n)], "order": np.arange(n),
                          "cache_mb": config, "tok_s_mean": tok_s})  # fmt: skip
    flags, why = position_beyond_config(cells, ["cache_mb"])
    assert why is None and len(flags) == 1
    assert "-5.00 % per execution position" in flags[0]["evidence"]
    assert f"{100 * (0.95**11 - 1):+.0f} % from first to last" in flags[0]["evidence"]


def test_sweep_folder_results_parquet(tmp_path: Path) -> None:
    table = pd.DataFrame(
        {"cell": ["a", "b", "c"], "model": "m", "n_expert_used": [8, 8, 8],
         "majflt_per_token": [2.0, 2.5, 40.0], "tok_s_mean": [4.0, 4.1, 3.0]}
    )  # fmt: skip
    table.to_parquet(tmp_path / "results.parquet")
    write_run(tmp_path / "cells" / "a.csv")  # ignored: the parquet is the sweep's record
    cells = runs_table([tmp_path])
    assert list(cells["cell"]) == ["a", "b", "c"]
    flags = contamination_flags(cells)
    assert list(flags["tell"]) == ["majflt"] and flags.iloc[0]["cells"] == ["c"]


def test_no_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BmoeError, match="no metrics files"):
        runs_table([tmp_path])
