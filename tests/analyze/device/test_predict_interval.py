"""Intervals that mean what they say: the model's own error measured by holding out each
configuration a profile's runs measured, added to the terms' spread with Student's t at the
Welch-Satterthwaite degrees of freedom; without it, an interval that says it is the spread's
alone. Serial cells a profile of --overlap runs cannot price, and sweep cells a profile run
measured, are labelled and kept out of the headline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.device import (
    COVERAGE_ALPHA,
    against,
    against_files,
    binomial_p,
    compare_cells,
    coverage_check,
    half_width,
    interval_kind,
    model_error,
    predict,
    profile_runs,
    read_distance,
    t_quantile,
)
from bmoe.analyze.device.build import most_likely_by_distance, most_likely_sd
from bmoe.analyze.device.interval import ModelError
from bmoe.cli import main
from bmoe.formats.profile import read_profile, write_profile
from bmoe.formats.route import read_route_trace, write_route_trace
from bmoe.formats.runfiles import read_recorded_runs
from bmoe.sweep.archive import load_results
from tests.analyze.device.test_predict import DECODE, PREFILL, Z80, make_trace, round_profile
from tests.analyze.device.test_predict_metrics import (
    overlap_rows,
    profile_of,
    route_trace,
    serial_rows,
    write,
)

SMALL = Path(__file__).resolve().parents[3] / "bench-data" / "2026-11-29-small-traces"

# ----------------------------------------------------------------------------- the quantile


@pytest.mark.parametrize(
    ("p", "dof", "table"),
    [  # Student's t, from a printed table (two-sided 80 % and 95 %, one-sided 99.5 %)
        (0.9, 1, 3.078),
        (0.9, 2, 1.886),
        (0.9, 5, 1.476),
        (0.9, 30, 1.310),
        (0.975, 1, 12.706),
        (0.975, 10, 2.228),
        (0.995, 4, 4.604),
    ],
)
def test_t_quantile_is_the_tables(p, dof, table):
    assert t_quantile(p, dof) == pytest.approx(table, abs=1.5e-3)


def test_t_quantile_falls_between_whole_degrees_and_tends_to_the_normal():
    assert t_quantile(0.9, 4) > t_quantile(0.9, 4.5) > t_quantile(0.9, 5)
    assert t_quantile(0.9, float("inf")) == pytest.approx(Z80)
    assert t_quantile(0.9, 1e4) == pytest.approx(Z80, abs=1e-3)


# ----------------------------------------------------------------------------- the width


def test_without_a_model_error_the_width_is_the_spread_at_the_normal_quantile():
    rel, q = half_width(0.8, 0.1, ModelError(None, 0, "one run"))
    assert (rel, q) == (pytest.approx(Z80 * 0.1), pytest.approx(Z80))


def test_the_model_error_adds_in_quadrature_at_student_t_of_its_degrees_of_freedom():
    """Spread 0.1, model error 0.2 from 3 configurations: variance 0.05; Welch-Satterthwaite
    nu = 0.05^2 / (0.2^4 / 3) = 4.69, between 4 (t 1.533) and 5 (t 1.476) degrees."""
    rel, q = half_width(0.8, 0.1, ModelError(0.2, 3))
    assert 1.476 < q < 1.533
    assert rel == pytest.approx(q * math.sqrt(0.05))
    # the more configurations the model error comes from, the nearer the normal quantile
    assert half_width(0.8, 0.1, ModelError(0.2, 30))[1] < q
    # a model error of 0 measured is no wider than the spread
    assert half_width(0.8, 0.1, ModelError(0.0, 3))[0] == pytest.approx(Z80 * 0.1)


def test_most_likely_model_error_hand_worked():
    """Equal spreads s: the likelihood peaks at m^2 = mean(e^2) - s^2 (0.09 - 0.01); errors
    the spreads explain give 0; and one error made with a narrow spread is not hidden by
    another made with a wide one (the moment estimate mean(e^2) - mean(s^2) would be 0)."""
    e, s = np.array([0.3, -0.3]), np.array([0.1, 0.1])
    assert most_likely_sd(e, s) == pytest.approx(math.sqrt(0.08), rel=3e-3)
    assert most_likely_sd(np.array([0.05, -0.05]), s) == 0.0
    e, s = np.array([0.23, -0.18]), np.array([0.05, 0.32])
    assert np.mean(e**2) < np.mean(s**2)
    m = most_likely_sd(e, s)
    assert m > 0.15

    def log_lik(sd):
        var = s**2 + sd**2
        return float(-0.5 * np.sum(np.log(var) + e**2 / var))

    assert log_lik(m) >= max(log_lik(0.0), log_lik(0.9 * m), log_lik(1.1 * m))


# ----------------------------------------------------------------------------- held out


def two_configurations(tmp_path: Path):
    """Two serial runs that read alike (io 9 and 5 ms, mgmt 3 and 2 ms on alternate tokens:
    9.5 ms a token besides compute) at different budgets, one computing 10 ms a token, the
    other 12: 19.5 and 21.5 ms a token."""
    a = write(tmp_path / "a.csv", serial_rows(compute=10.0), cache_mb=3)
    b = write(tmp_path / "b.csv", serial_rows(compute=12.0), cache_mb=5)
    return a, b


def test_each_configuration_held_out_is_predicted_from_the_others_hand_worked(tmp_path):
    """Held out, a (19.5 ms) is predicted from b alone at 21.5 ms: tok/s 9.30 % low; b from a
    at 19.5 ms: 10.26 % high. Every term of a one-run profile of constant tokens has no
    spread, so the model error is their root mean square: 9.79 %, from 2 configurations."""
    a, b = two_configurations(tmp_path)
    prof = profile_of(a, b)
    error = prof.model_error
    assert error["method"] == "leave one configuration out"
    held = {Path(r["run"]).name: r for r in error["held_out"]}
    assert held["a.csv"]["measured_tok_s"] == pytest.approx(1000 / 19.5)
    assert held["a.csv"]["predicted_tok_s"] == pytest.approx(1000 / 21.5)
    assert held["a.csv"]["error_pct"] == pytest.approx(100 * (19.5 / 21.5 - 1))
    assert held["b.csv"]["error_pct"] == pytest.approx(100 * (21.5 / 19.5 - 1))
    assert held["a.csv"]["spread_pct"] == pytest.approx(0.0, abs=1e-9)
    rms = math.sqrt(((19.5 / 21.5 - 1) ** 2 + (21.5 / 19.5 - 1) ** 2) / 2)
    assert error["sd_rel"] == pytest.approx(rms, rel=3e-3)
    assert error["configurations"] == 2 and error["why"] is None
    assert model_error(prof) == ModelError(pytest.approx(rms, rel=3e-3), 2)
    # both read alike at one lane: the error is all at distance 0, none grows with it
    assert error["sd_rel_zero"] == pytest.approx(rms, rel=3e-3) and error["sd_rel_unit"] == 0
    kind, claimed = interval_kind(prof)
    assert claimed and "10 % at its reads a token, 10 % at twice or half them" in kind
    assert "from 2 held-out configurations" in kind
    from bmoe.render.predict import model_error_figure

    figure = model_error_figure(prof)
    assert figure.startswith("9.8 % at the reads a token of the nearest measured configuration")


def test_bmoe_profile_lists_each_held_out_runs_distance(tmp_path, capsys):
    a, b = two_configurations(tmp_path)
    assert main(["profile", str(a), str(b), "-f", "json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    held = data["held_out"]
    assert [row["distance"] for row in held] == [0.0, 0.0]
    assert "inside" not in held[0]
    figures = data["profile"]
    assert figures["model_error_at_reads_pct"] == pytest.approx(9.79, abs=0.02)
    assert figures["model_error_at_twice_pct"] == pytest.approx(9.79, abs=0.02)


def test_the_interval_of_a_profile_with_a_model_error_hand_worked(tmp_path):
    """The two runs are two configurations, run once each: how far their compute (10 and 12
    ms) differs is the model's error, not a repeat's spread, and no token moves within a run,
    so the spread is 0. Both read alike at one lane, so each held out lies at distance 0 from
    the other: the model error at distance 0 is their root mean square, 9.79 %. A cell of
    the profile's reads: 20.5 ms a token, interval t(0.9, 2) x 9.79 % (nu = m^4 / (m^4 / 2))."""
    a, b = two_configurations(tmp_path)
    prof = profile_of(a, b)
    runs = profile_runs(read_recorded_runs([a]))
    cells = against_files(None, prof, runs)["cells"]
    row = cells.iloc[0]
    m = prof.model_error["sd_rel_zero"]
    assert m == pytest.approx(prof.model_error["sd_rel"], rel=3e-3)
    assert [r["distance"] for r in prof.model_error["held_out"]] == [0.0, 0.0]
    rel = t_quantile(0.9, 2.0) * m
    assert row["tok_s_predicted"] == pytest.approx(1000 / 20.5)
    assert row["spread_pct_predicted"] == pytest.approx(0.0, abs=1e-9)
    assert row["interval_pct_predicted"] == pytest.approx(100 * rel)
    assert row["tok_s_low_predicted"] == pytest.approx(1000 / (20.5 * (1 + rel)))
    assert row["tok_s_high_predicted"] == pytest.approx(1000 / (20.5 * (1 - rel)))


def test_a_repeat_of_a_configuration_is_the_spread_a_different_configuration_is_not():
    """Two configurations run twice each, their runs' means 10 and 10.4 ms, 14 and 14.4: a
    repeat moves a run's ratio by +-0.4/20.4 and +-0.4/28.4 about its configuration's mean,
    pooled sqrt(0.0196^2 + 0.0141^2) = 2.41 %; counted across every run, as if the two
    configurations were repeats, it would be 17 %. A single run's quarters (8, 12, 8, 12 ms)
    move its mean by their relative sd over sqrt(4), and a run predicted from it by that
    times sqrt(2): 0.2309 / sqrt(2)."""
    from bmoe.analyze.device.fits import term_spread

    means = {"a1": 10.0, "a2": 10.4, "b1": 14.0, "b2": 14.4}
    per_run = {name: np.full(16, value) for name, value in means.items()}
    configs = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    spread = term_spread(per_run, configs=configs)
    pooled = math.sqrt((0.4 / 20.4) ** 2 + (0.4 / 28.4) ** 2)
    assert spread["sd_rel"] == pytest.approx(pooled, rel=1e-6)
    assert spread["repeat_cv_pct"] == pytest.approx(100 * pooled, rel=1e-6)
    across = term_spread(per_run)
    assert across["sd_rel"] == pytest.approx(np.std(list(means.values()), ddof=1) / 12.2)
    assert across["sd_rel"] > 0.15
    quarters = np.repeat([8.0, 12.0, 8.0, 12.0], 4)
    alone = term_spread({"run": quarters})
    assert alone["repeat_cv_pct"] is None
    assert alone["sd_rel"] == pytest.approx(np.std([0.8, 1.2, 0.8, 1.2], ddof=1) / math.sqrt(2))


def test_read_distance_is_the_log_ratio_to_the_nearest_configuration_at_the_same_lanes():
    points = [(1, 3.0), (1, 12.0), (4, 6.0)]
    assert read_distance(6.0, 1, points) == pytest.approx(math.log(2))
    assert read_distance(3.0, 1, points) == 0.0
    assert read_distance(6.0, 4, points) == 0.0
    assert read_distance(1.5, 4, points) == pytest.approx(math.log(4))
    # no configuration at 2 lanes: the nearest at any
    assert read_distance(7.0, 2, points) == pytest.approx(math.log(7 / 6))
    assert read_distance(24.0, None, points) == pytest.approx(math.log(2))
    assert math.isnan(read_distance(6.0, 1, []))
    assert math.isnan(read_distance(float("nan"), 1, points))
    # reading nothing is a finite distance from reading little
    assert math.isfinite(read_distance(0.0, 1, points))


def test_most_likely_model_error_by_distance_recovers_what_made_the_errors():
    """Errors drawn normal with variance s^2 + z^2 + u^2 d (s 0.03, z 0.05, u 0.2, d from 0
    to 2): the search finds z and u near what made them; errors all at distance 0 give the
    model error without distance as z."""
    rng = np.random.default_rng(7)
    d = rng.uniform(0.0, 2.0, 6000)
    s = np.full_like(d, 0.03)
    e = rng.normal(0.0, np.sqrt(s**2 + 0.05**2 + 0.2**2 * d))
    zero, unit = most_likely_by_distance(e, s, d)
    assert zero == pytest.approx(0.05, rel=0.2)
    assert unit == pytest.approx(0.2, rel=0.05)
    e0, s0 = np.array([0.3, -0.3]), np.array([0.1, 0.1])
    zero, _unit = most_likely_by_distance(e0, s0, np.zeros(2))
    assert zero == pytest.approx(most_likely_sd(e0, s0), rel=0.03)


def test_one_run_or_one_configuration_leaves_the_model_error_unknown(tmp_path, capsys):
    a, b = two_configurations(tmp_path)
    one = profile_of(a)
    assert one.model_error["sd_rel"] is None and "one run" in one.model_error["why"]
    again = write(tmp_path / "a2.csv", serial_rows(compute=11.0), cache_mb=3)
    same = profile_of(a, again)
    assert same.model_error["sd_rel"] is None
    assert "one configuration" in same.model_error["why"]
    # its intervals are the spread's alone and say so: no coverage claimed
    kind, claimed = interval_kind(one)
    assert not claimed and "spread only" in kind
    summary = against_files(None, one, profile_runs(read_recorded_runs([b])))["summary"]
    assert summary["coverage_claimed"] is False and "spread only" in summary["interval"]
    out = tmp_path / "one.json"
    assert main(["profile", str(a), "-o", str(out)]) == 0
    assert "model error" in capsys.readouterr().out
    trace = route_trace(tmp_path / "t.route.csv")
    assert main(["predict", str(trace), "-p", str(out), "-g", "cache_mb=0"]) == 0
    captured = capsys.readouterr()
    assert "spread-only interval" in captured.out
    assert "do not claim 80 % coverage" in " ".join(captured.out.split())


def test_a_profile_written_before_the_model_error_keeps_its_spread_interval():
    """The hand-worked profile of the prediction tests has no model_error section: its
    interval is the spread's, exactly as before (test_no_cache_hand_worked_time)."""
    prof = round_profile()
    assert not model_error(prof).known
    row = predict(make_trace(PREFILL, DECODE), prof, {"cache_mb": [0]}).iloc[0]
    assert row["interval_pct"] == pytest.approx(row["spread_pct"])
    assert row["interval_pct"] == pytest.approx(100 * Z80 * (1 + 2.56) ** 0.5 / 21)


# ----------------------------------------------------------------------------- the summary


def test_the_summary_counts_measurements_within_bounds_apart_from_too_wide_intervals():
    """Four firm cells: one inside a narrow interval, one outside, two within intervals over
    100 % wide (covering nothing): coverage 1 of 4, within the bounds 3 of 4."""
    cells = pd.DataFrame(
        {
            "cell": list("abcd"),
            "tok_s": [10.0, 5.0, 8.0, 8.0],
            "tok_s_predicted": [10.0, 7.0, 8.0, 8.0],
            "tok_s_low_predicted": [9.0, 6.5, 2.0, 3.0],
            "tok_s_high_predicted": [11.0, 7.5, 20.0, 30.0],
            "steady_tok_s": np.nan, "steady_tok_s_predicted": np.nan,
            "steady_tok_s_low_predicted": np.nan, "steady_tok_s_high_predicted": np.nan,
            "mib_per_token": 1.0, "mib_per_token_predicted": 1.0,
            "hit_pct": 50.0, "hit_pct_predicted": 50.0,
        }
    )  # fmt: skip
    summary = compare_cells(cells, round_profile())["summary"]
    assert (summary["inside_interval"], summary["within_bounds"]) == (1, 3)
    assert summary["intervals_too_wide"] == 2
    # the calibration check counts the measurements within the bounds, not the useful ones
    assert summary["coverage_check"].startswith("3 of 4 within their bounds")
    assert summary["coverage_p"] == pytest.approx(_two_sided(3, 4, 0.8))


# ----------------------------------------------------------------------------- the check


def _two_sided(k: int, n: int, p: float) -> float:
    """The exact two-sided binomial p-value, count by count (the oracle)."""
    pmf = [math.comb(n, c) * p**c * (1 - p) ** (n - c) for c in range(n + 1)]
    return min(1.0, sum(x for x in pmf if x <= pmf[k] * (1 + 1e-7)))


@pytest.mark.parametrize(
    ("k", "n", "p"), [(12, 12, 0.8), (6, 12, 0.8), (0, 5, 0.3), (7, 9, 0.5), (20, 20, 1.0)]
)
def test_the_binomial_p_value_is_the_sum_of_the_counts_no_likelier(k, n, p):
    assert binomial_p(k, n, p)[0] == pytest.approx(_two_sided(k, n, p))


def test_the_stated_coverage_is_checked_against_what_so_few_cells_can_tell():
    """12 of 12 inside 80 % intervals is no proof of 100 %: consistent with 80 %, and the
    range says so; 40 of 40 is too many, 15 of 40 too few; the range of coverages holds the
    observed share and every coverage in it passes the test, those just outside do not."""
    few = coverage_check(12, 12, 0.8)
    assert few["p"] > COVERAGE_ALPHA
    assert "the stated 80 % among them" in few["verdict"]
    assert few["consistent_high_pct"] == 100.0 and few["consistent_low_pct"] < 80.0
    assert "wider than they need be" in coverage_check(40, 40, 0.8)["verdict"]
    assert "narrower than the stated 80 %" in coverage_check(15, 40, 0.8)["verdict"]
    for k, n in ((15, 40), (28, 30), (10, 12)):
        check = coverage_check(k, n, 0.8)
        low, high = check["consistent_low_pct"] / 100, check["consistent_high_pct"] / 100
        assert low <= k / n <= high
        assert _two_sided(k, n, low) >= COVERAGE_ALPHA and _two_sided(k, n, high) >= COVERAGE_ALPHA
        if low > 0.002:
            assert _two_sided(k, n, low - 0.002) < COVERAGE_ALPHA
        if high < 0.998:
            assert _two_sided(k, n, high + 0.002) < COVERAGE_ALPHA
    assert coverage_check(0, 0, 0.8)["p"] is None


# ----------------------------------------------------------------------------- unpriced


def test_a_serial_cell_from_an_overlap_only_profile_is_unpriced_and_left_out(tmp_path):
    """Lane busy time under --overlap is a request's service time, not a serial batch's wait
    for its slowest lane: the serial file is predicted but labelled, out of the headline."""
    ov = write(tmp_path / "ov.csv", overlap_rows(), overlap=1, io_threads=2)
    ov2 = write(tmp_path / "ov2.csv", overlap_rows(), overlap=1, io_threads=2, cache_mb=5)
    serial = write(tmp_path / "serial.csv", serial_rows(), io_threads=2)
    prof = profile_of(ov, ov2)
    out = against_files(None, prof, profile_runs(read_recorded_runs([serial, ov])))
    cells = out["cells"].set_index("cell")
    assert "--overlap runs only" in cells.loc["serial", "unpriced"]
    assert np.isfinite(cells.loc["serial", "tok_s_predicted"])
    assert pd.isna(cells.loc["ov", "unpriced"])
    assert out["summary"]["compared"] == 0  # ov is in sample, serial unpriced
    assert out["summary"]["labelled"] == 2


def test_a_serial_and_an_overlap_run_cannot_measure_each_others_error(tmp_path):
    ov = write(tmp_path / "ov.csv", overlap_rows(), overlap=1, io_threads=2)
    serial = write(tmp_path / "serial.csv", serial_rows(), io_threads=2)
    error = profile_of(ov, serial).model_error
    assert error["sd_rel"] is None and error["configurations"] == 0
    why = {Path(r["run"]).name: r["why"] for r in error["held_out"]}
    assert "no --overlap" in why["ov.csv"]
    assert "--overlap runs only" in why["serial.csv"]


def test_a_configuration_at_lanes_the_others_never_ran_is_held_out_with_the_lane_row(tmp_path):
    """Two serial configurations, one at 1 lane and 8 MiB, one at 4 lanes and 2 MiB (the
    laptop's design): holding either out leaves a profile that never ran its lane count. The
    held-out prediction takes the whole profile's flash row at those lanes (a lever the
    profile measured), so what it tests is the rest, and the profile has a model error from
    both configurations; it is not the error of carrying one lane count's latency to another
    (a prediction that does that is unpriced: the io_threads lever)."""
    one = write(tmp_path / "one.csv", serial_rows(), io_threads=1, cache_mb=8)
    four = write(tmp_path / "four.csv", serial_rows(latency=1.0), io_threads=4, cache_mb=2)
    prof = profile_of(one, four)
    error = prof.model_error
    assert error["configurations"] == 2 and error["sd_rel"] is not None
    assert all(r.get("lanes_from_profile") for r in error["held_out"])
    assert all(abs(r["error_pct"]) < 1.0 for r in error["held_out"])  # the same tokens
    only_one = profile_of(one)
    trace = read_route_trace(route_trace(tmp_path / "r.route.csv"))
    cell = predict(trace, only_one, {"cache_mb": [8], "io_threads": [4]}).iloc[0]
    assert cell["unpriced_levers"] == "io_threads"


# ----------------------------------------------------------------------------- sweeps


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_a_sweep_cell_a_profile_run_measured_is_in_sample(tmp_path, capsys):
    """A profile of one run of the archived sweep, compared with the sweep: that run's cell
    is labelled in sample and kept out of the headline; the other three are not."""

    run_dir = sorted((SMALL / "cells").glob("*/r1"))[0]
    prof = profile_of(run_dir / "run.csv", allow_traced=True)
    trace = run_dir / "run.route.csv"

    out = against(read_route_trace(trace), prof, load_results(SMALL), sweep_dir=SMALL)
    labels = dict(zip(out["cells"]["cell"], out["cells"]["measurement"], strict=True))
    inside = [c for c, why in labels.items() if isinstance(why, str) and "in sample" in why]
    assert inside == [run_dir.parent.name]
    assert out["summary"]["compared"] <= 3
    # the command finds the runs under the sweep folder it is given
    path = tmp_path / "p.json"

    write_profile(prof, path)
    args = ["predict", str(trace), "-p", str(path), "--against", str(SMALL), "-f", "json"]
    assert main(args) == 0
    assert capsys.readouterr().out.count("a profile run (in sample)") == 1


# ----------------------------------------------------------------------------- --model


def test_the_model_file_is_checked_against_the_runs(tiny_model, tmp_path, capsys):
    """The tiny model: 4 layers of 8 experts, 196,608 bytes each (one token's routed bytes at
    top-2: 4 x 2 x 0.1875 = 1.5 MiB). A run that says so is accepted; one of 2 layers, or of
    experts twice that size, is refused naming both; a v0 file says nothing to check."""
    shape = {"n_layer": 4, "n_expert": 8, "cache_cycle_mb": 1.5}
    good = write(tmp_path / "good.csv", serial_rows(), **shape)
    out = tmp_path / "p.json"
    assert main(["profile", str(good), "--model", str(tiny_model), "-o", str(out)]) == 0

    prof = read_profile(out)
    assert prof.expert_bytes() == {i: 196608 for i in range(4)}
    assert prof.model["sizes_from"] == f"the model file {tiny_model}"
    capsys.readouterr()
    layers = write(tmp_path / "layers.csv", serial_rows(), **{**shape, "n_layer": 2})
    assert main(["profile", str(layers), "--model", str(tiny_model)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "(n_layer=4)" in err and "layers.csv (n_layer=2)" in err
    sizes = write(tmp_path / "sizes.csv", serial_rows(), **{**shape, "cache_cycle_mb": 3})
    assert main(["profile", str(sizes), "--model", str(tiny_model)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "0.188 MiB on average" in err and "summed is 1.500 MiB" in err
    assert "sizes.csv says cache_cycle_mb=3.000" in err
    v0 = write(tmp_path / "v0.csv", serial_rows(), version=0)
    assert main(["profile", str(v0), "--model", str(tiny_model), "-o", str(out), "--force"]) == 0
    assert "not checked" in read_profile(out).model["sizes_from"]


TINY_SWEEPS = sorted((SMALL.parent).glob("*-tiny-cache-lanes"))


def tiny_routing(tmp_path: Path) -> Path:
    """A route trace of the ``tiny`` preset's shape (4 MoE layers, 8 experts of 196,608 bytes,
    top-2): the routing the archived tiny sweeps are predicted from."""
    rng = np.random.default_rng(0)
    ids = [[list(rng.choice(8, 2, replace=False)) for _ in range(4)] for _ in range(40)]
    trace = make_trace(ids[:8], ids[8:], size=196_608)
    trace.meta["n_layer"] = 4
    path = tmp_path / "tiny.route.csv"
    write_route_trace(trace, path)
    return path


@pytest.mark.skipif(len(TINY_SWEEPS) < 2, reason="bench-data tiny sweeps absent")
def test_against_the_profiles_own_sweep_and_another_days_runs_clean(tmp_path, capsys):
    """The profile of a whole sweep predicted against that sweep (every cell in sample) and
    against the sweep of another day: both run clean, no label reads nan, and where every
    cell is left out of the headline the summary says why in one sentence."""
    own, other = TINY_SWEEPS[0], TINY_SWEEPS[1]
    path = tmp_path / "tiny.json"
    assert main(["profile", str(own), "-o", str(path)]) == 0
    trace = tiny_routing(tmp_path)
    capsys.readouterr()
    for sweep, all_in_sample in ((own, True), (other, False)):
        assert main(["predict", str(trace), "-p", str(path), "--against", str(sweep)]) == 0
        table = capsys.readouterr().out
        assert "nan" not in table.lower()
        assert ("No cell counts in the headline" in table) == all_in_sample
        assert main(["predict", str(trace), "-p", str(path), "--against", str(sweep),
                     "-f", "json"]) == 0  # fmt: skip
        views = json.loads(capsys.readouterr().out)
        for cell in views["cells"]:
            for column in {"measurement", "unpriced", "comparable"} & set(cell):
                assert cell[column] is None or "nan" not in cell[column]
        why = views["summary"]["no_headline"]
        if all_in_sample:
            assert why == (
                "No cell counts in the headline: 15 of 15 measured by the profile's own runs "
                "(in sample)."
            )
        else:
            assert why is None and views["summary"]["compared"] > 0


def _two_volumes(tmp_path: Path, compute_small: float, compute_large: float):
    """Two serial configurations: one reading 3 MiB a token (4 and 2 on alternate tokens), one
    four times that (its io four times as long), their compute `compute_small` and
    `compute_large` ms a token."""
    small = serial_rows(compute=compute_small)
    large = [
        {**row, "read_bytes": 4 * row["read_bytes"], "io_ms": 4 * row["io_ms"],
         "wall_ms": row["wall_ms"] + 3 * row["io_ms"] + compute_large - compute_small,
         "compute_ms": compute_large, "cpu_ms": 2 * compute_large}
        for row in serial_rows(compute=compute_small)
    ]  # fmt: skip
    a = write(tmp_path / "a.csv", small, cache_mb=8)
    b = write(tmp_path / "b.csv", large, cache_mb=2)
    return profile_of(a, b)


def test_two_configurations_whose_compute_moves_with_the_reads_say_their_error_is_the_gap(
    tmp_path,
):
    """Compute 10 ms a token at 3 MiB read and 40 at 12: the profile prices compute by read
    volume, but each configuration held out is predicted from the other alone, which cannot;
    the profile says its model error is that gap's, and where a third configuration would
    measure the error between them (sqrt(3 x 12) = 6 MiB a token). Compute that hardly moves
    (10 and 11 ms) leaves nothing to say."""
    prof = _two_volumes(tmp_path, 10.0, 40.0)
    points = prof.compute["by_read"]
    assert [round(p["read_mib"]) for p in points] == [3, 12]
    assert prof.model_error["configurations"] == 2 and prof.model_error["sd_rel"] > 0.2
    said = [c for c in prof.caveats if c.startswith("model error:")]
    assert len(said) == 1
    assert "10 ms a token at 3 MiB read, 40 ms at 12" in said[0]
    assert "about 6 MiB a token" in said[0]
    assert f"{100 * prof.model_error['sd_rel']:.0f} % from 2 configurations" in said[0]
    (tmp_path / "flat").mkdir()
    flat = _two_volumes(tmp_path / "flat", 10.0, 11.0)
    assert not [c for c in flat.caveats if c.startswith("model error:")]


def test_bmoe_profile_puts_the_two_configuration_gap_among_what_to_weigh(tmp_path, capsys):
    prof = _two_volumes(tmp_path, 10.0, 40.0)
    assert prof.caveats
    assert main(["profile", str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "caveat: model error:" in out and "a third configuration reading about 6 MiB" in out
