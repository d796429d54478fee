"""Comparisons: every refusal and warning, and the bootstrap on hand-worked cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from runs_factory import rows, write_run

from bmoe.analyze.compare import (
    REFUSE,
    WARN,
    NotComparable,
    bootstrap_rates,
    compare_many,
    compare_runs,
    concerns,
)
from bmoe.errors import BmoeError
from bmoe.formats.runfiles import load_run_files


def pair(tmp_path: Path, a_params=None, b_params=None, a_rows=None, b_rows=None, **kw):
    a = write_run(tmp_path / "a.csv", a_rows, **(a_params or {}), **kw)
    b = write_run(tmp_path / "b.csv", b_rows, **(b_params or {}), **kw)
    return load_run_files(a), load_run_files(b)


def reasons(found, level: str) -> list[str]:
    return list(found.loc[found["level"] == level, "reason"])


def test_clean_pair_has_no_concerns(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    assert concerns(a, b).empty
    result = compare_runs(a, b)
    assert result.concerns.empty


@pytest.mark.parametrize(
    ("a_params", "b_params", "expected"),
    [
        ({"model": "qwen.gguf"}, {"model": "gemma.gguf"}, "different model"),
        ({"model": "/a/x.gguf"}, {"model": "/b/y.gguf"}, "different model"),
        ({"n_expert_used": 8}, {"n_expert_used": 4}, "different n_expert_used"),
        ({"spec": "mtp"}, {"spec": "off"}, "speculation on one side only"),
        ({"spec": "mtp"}, {"spec": "ngram"}, "different draft sources"),
        ({}, {"predict_log": True}, "instrumented run (predict_log)"),
        ({}, {"prefetch_sync": True}, "instrumented run (prefetch_sync)"),
        ({}, {"compute_trace_layers": 1}, "compute_trace_layers=1"),
    ],
)
def test_refusals(tmp_path: Path, a_params, b_params, expected) -> None:
    a, b = pair(tmp_path, a_params, b_params)
    with pytest.raises(NotComparable) as err:
        compare_runs(a, b)
    assert expected in str(err.value)
    forced = compare_runs(a, b, force=True)  # overridable: the figures still come out
    assert any(expected in r for r in reasons(forced.concerns, REFUSE))
    assert forced.table["figure"].iloc[0] == "tok/s mean (steady)"


def test_same_model_in_different_folders_is_fine(tmp_path: Path) -> None:
    a, b = pair(tmp_path, {"model": "/sdcard/m.gguf"}, {"model": "/data/local/tmp/m.gguf"})
    assert reasons(concerns(a, b), REFUSE) == []


def test_trace_recorded_alongside_refuses(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    (tmp_path / "b.route.csv").write_text(
        "# route_trace v1\nturn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
        "0,1,5,0,0,3,0.5,1,0\n"
    )
    b = load_run_files(tmp_path / "b.csv")
    with pytest.raises(NotComparable, match=r"trace\(s\) recorded alongside \(b.route.csv\)"):
        compare_runs(a, b)


def test_traced_corpus_run_refuses(corpus: Path) -> None:
    a = load_run_files(corpus / "native-tiny/mmap.csv")
    b = load_run_files(corpus / "native-tiny/ct.csv")  # ct.compute.csv beside it
    with pytest.raises(NotComparable, match=r"ct\.compute\.csv"):
        compare_runs(a, b)


def test_partial_runs_refuse(tmp_path: Path, corpus: Path) -> None:
    killed = rows(64, steps=128)
    a, b = pair(tmp_path, b_rows=killed)
    b = load_run_files(write_run(tmp_path / "k.csv", killed, summary=False))
    with pytest.raises(NotComparable, match=r"64 of 128 steps \(no summary: the run was killed\)"):
        compare_runs(a, b)
    lying = load_run_files(write_run(tmp_path / "l.csv", killed, summary={"tokens": 128}))
    with pytest.raises(NotComparable, match=r"64 of 128 steps \(its summary says tokens=128\)"):
        compare_runs(a, lying)
    # ended by the model at 1354 of 2048 steps: a finished run
    v1 = load_run_files(corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv")
    assert compare_runs(v1, v1) is not None


@pytest.mark.parametrize(
    ("b_params", "b_summary", "expected"),
    [
        ({"temp": 0.7}, {}, "temp=0.7: stochastic"),
        ({"load_all": True}, {}, "load_all=1"),
        ({"drop_cold_frac": 0.5}, {}, "does not record its drop rate"),
        ({"drop_cold_frac": 0.5}, {"experts_routed": 1000, "experts_dropped": 100},
         "dropping on one side only"),
    ],
)  # fmt: skip
def test_warnings_do_not_refuse(tmp_path: Path, b_params, b_summary, expected) -> None:
    a = load_run_files(write_run(tmp_path / "a.csv"))
    b = load_run_files(write_run(tmp_path / "b.csv", summary=b_summary or True, **b_params))
    result = compare_runs(a, b)
    assert any(expected in r for r in reasons(result.concerns, WARN))
    assert reasons(result.concerns, REFUSE) == []


def test_drop_rate_is_shown_next_to_the_hit_rate(tmp_path: Path) -> None:
    drop = {"experts_routed": 1000, "experts_dropped": 150}
    a = load_run_files(write_run(tmp_path / "a.csv", summary=drop, drop_cold_frac=0.5))
    b = load_run_files(write_run(tmp_path / "b.csv", summary=drop, drop_cold_frac=0.5))
    table = compare_runs(a, b).table.set_index("figure")
    assert table.loc["drop %", "a"] == pytest.approx(15.0)


def test_short_and_preamble_less_runs_warn(corpus: Path) -> None:
    a = load_run_files(corpus / "metrics/2026-07-14-warmup/baseline_qwen_k8.csv")
    b = load_run_files(corpus / "metrics/2026-07-14-warmup/warmup_qwen_k8.csv")
    result = compare_runs(a, b)
    assert sum("no preamble" in r for r in reasons(result.concerns, WARN)) == 2


def test_constant_runs_give_an_exact_interval(tmp_path: Path) -> None:
    # every token of A takes 100 ms (10 tok/s), every token of B 50 ms (20 tok/s)
    a, b = pair(tmp_path, a_rows=rows(64, wall=100.0), b_rows=rows(64, wall=50.0))
    table = compare_runs(a, b).table.set_index("figure")
    for fig in ("tok/s mean (steady)", "tok/s median (steady)"):
        assert table.loc[fig, "delta"] == pytest.approx(10.0)
        assert table.loc[fig, "ci_low"] == pytest.approx(10.0)
        assert table.loc[fig, "ci_high"] == pytest.approx(10.0)
        assert table.loc[fig, "delta_pct"] == pytest.approx(100.0)
    assert table.loc["wall ms/token", "delta"] == pytest.approx(-50.0)


def test_identical_runs_interval_contains_zero_and_is_seeded(tmp_path: Path) -> None:
    walls = [float(100 + (i * 37) % 61) for i in range(64)]
    a, b = pair(tmp_path, a_rows=rows(64, wall_ms=walls), b_rows=rows(64, wall_ms=walls))
    one = compare_runs(a, b).table.set_index("figure")
    two = compare_runs(a, b).table.set_index("figure")
    row = one.loc["tok/s mean (steady)"]
    assert row["delta"] == 0.0 and row["ci_low"] < 0.0 < row["ci_high"]
    assert one.equals(two)


def test_bootstrap_against_a_plain_loop() -> None:
    rng = np.random.default_rng(3)
    wall_a = rng.uniform(80, 120, 50)
    wall_b = rng.uniform(60, 100, 40)
    got = bootstrap_rates(wall_a, wall_b, n_boot=400, seed=11)
    # the same resampling written as a loop, from the same generator stream
    gen = np.random.default_rng(11)
    ia = gen.integers(0, 50, size=(400, 50))
    ib = gen.integers(0, 40, size=(400, 40))
    diffs = []
    for k in range(400):
        sa, sb = wall_a[ia[k]], wall_b[ib[k]]
        diffs.append(40 / (sb.sum() / 1000) - 50 / (sa.sum() / 1000))
    assert got["mean"] == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))


def test_compare_many_needs_two(tmp_path: Path) -> None:
    a = load_run_files(write_run(tmp_path / "a.csv"))
    with pytest.raises(BmoeError, match="at least two"):
        compare_many([a])
    assert len(compare_many([a, a, a])) == 2


def test_two_tokens_give_no_interval(tmp_path: Path) -> None:
    # two tokens a run: a bootstrap would resample them into three values at most
    a, b = pair(tmp_path, a_rows=rows(2, wall=100.0), b_rows=rows(2, wall=50.0))
    result = compare_runs(a, b)
    table = result.table.set_index("figure")
    row = table.loc["tok/s mean (steady)"]
    assert row["delta"] == pytest.approx(10.0)  # 20 tok/s against 10: still a fact
    assert row["ci_low"] is None and row["ci_high"] is None
    assert "too few tokens (n = 2) in a window for an interval" in reasons(result.concerns, WARN)
    assert result.method["interval"] == "none: too few tokens (n = 2)"
