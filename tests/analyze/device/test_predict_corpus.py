"""The real engine's files: a profile of a run's own columns predicts the run's own figures,
and files without what a profile needs are refused with the reason."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from bmoe.analyze.device import build_profile, predict, profile_runs, run_config
from bmoe.analyze.metrics import run_summary
from bmoe.errors import BmoeError
from bmoe.formats.runfiles import read_recorded_runs


def own_prediction(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = profile_runs(read_recorded_runs([path]))
    run = runs[0]
    config = run_config(run)
    profile = build_profile(runs)
    cell = {
        "cache_mb": [config.cache_mb],
        "io_threads": [config.io_threads],
        "prefetch": [config.prefetch],
    }
    return profile, predict(run.route, profile, cell).iloc[0], run.metrics.summary


@pytest.mark.parametrize(
    ("name", "mode", "mib_tolerance"),
    [
        # the phone run: --overlap, no io trace (reads priced at expert_bytes, alignment unknown)
        ("route-trace/gemma.metrics", "overlap", 0.005),
        # the native engine on a host, serial, with io traces (alignment measured)
        ("native-tiny/run.csv", "serial", 0.005),
        ("native-tiny/pf.csv", "serial", 0.005),
    ],
)
def test_a_runs_own_profile_predicts_its_own_figures(corpus: Path, name, mode, mib_tolerance):
    profile, row, summary = own_prediction(corpus / name)
    assert profile.mode == mode
    measured_mib = summary["read_MiB"] / summary["tokens"]
    assert row["mib_per_token"] == pytest.approx(measured_mib, rel=mib_tolerance)
    assert row["hit_pct"] == pytest.approx(summary["cache_hit_pct"], abs=0.051)
    # times: the profile holds this run's own means, so the sum comes back (consistency)
    assert row["tok_s"] == pytest.approx(summary["tok/s"], rel=0.01)
    assert row["tok_s_low"] < row["tok_s"] < row["tok_s_high"]


@pytest.mark.parametrize(
    "name", ["route-trace/gemma.metrics", "native-tiny/run.csv", "native-tiny/pf.csv"]
)
def test_predicted_warm_up_is_the_run_analysis_one(corpus: Path, name):
    """The steady-state rule on the predicted tokens finds the warm-up the run analysis finds
    on the measured ones (none in a 24-token run), and the steady rates agree within 1 %."""
    _, row, _ = own_prediction(corpus / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = run_summary(profile_runs(read_recorded_runs([corpus / name]))[0].metrics)
    if measured["warmup_tokens"] is None:
        assert np.isnan(row["warmup_tokens"]) and np.isnan(row["steady_tok_s"])
        return
    assert row["warmup_tokens"] == measured["warmup_tokens"]
    assert row["steady_tok_s"] == pytest.approx(measured["steady_tok_s_mean"], rel=0.01)
    assert row["steady_tok_s_low"] < row["steady_tok_s"] < row["steady_tok_s_high"]


def test_every_streaming_phone_file_gives_a_profile_that_says_what_it_lacks(corpus: Path):
    """Metrics-only phone files of every version make a profile: v1 files take their expert
    sizes from the preamble, v0 files have none and price MiB; 8-column v0 files have no
    mgmt_ms (named absent), none but the v1 ones record majflt with memory; the plain-mmap
    run is refused with the reason."""
    for path in sorted((corpus / "metrics").rglob("*.csv")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = profile_runs(read_recorded_runs([path]))
        if path.stem == "qwen_mmap":
            with pytest.raises(BmoeError, match="without expert streaming"):
                build_profile(runs)
            continue
        profile = build_profile(runs)
        version = runs[0].metrics.version
        assert profile.sized == (version >= 1), path
        if version == 0:
            assert any("expert sizes unknown" in c for c in profile.caveats)
        if "mgmt_ms" not in runs[0].metrics.rows:
            assert "mgmt" in profile.absent
        assert ("memory" in profile.absent) == ("rss_mib" not in runs[0].metrics.rows)
        assert set(profile.terms) >= {"compute", "flash"}
        for term in profile.terms.values():
            assert term["runs"] == [str(path)] and term["columns"]


def test_phone_matrix_two_run_profiles_predict_the_other_runs(corpus: Path):
    """THE figure: in the corpus's phone matrix of one model (v0 files varying cache budget,
    lanes' mode, prefetch and overlap), every profile of two files predicts the other files'
    decode tok/s (each file's own reads priced); the median |error| of those out-of-sample
    predictions is at most 15 %. The plain-mmap run is never compared, in-sample files never
    count, nor do predictions that change a lever the profile did not measure (prefetch from
    profiles without it, more memory than its runs asked): those are labelled unpriced
    (benchmarks/bench_predict_corpus.py prints the table)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.bench_predict_corpus import phone_table

    table = phone_table(corpus)
    firm = table[table["left out"].isna() & table["predicted"].notna()]
    two = firm[firm["runs"] == 2]
    assert len(two) >= 10
    assert firm["unpriced"].isna().all()
    unpriced = table[table["unpriced"].notna()]
    assert unpriced["file"].eq("qwen_pf2").any()  # prefetch from prefetch-0 profiles
    assert not two["file"].eq("qwen_mmap").any()
    for row in two.itertuples():
        assert row.file not in row.profile.split("+")
    assert two["error_pct"].abs().median() <= 15.0


def test_native_tiny_profile_of_two_runs_predicts_the_others(corpus: Path):
    """The host runs: a profile of run and pf; ct and ctl (same prompt as pf, compute-traced:
    labelled, out of the headline) replayed through pf's routing read what they read
    (MiB/token within 2 %: the replay, not the time model); drop replayed with --drop 1.0
    through its own trace reads what it read."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.bench_predict_corpus import native_tiny

    cells = native_tiny(corpus).set_index("cell")
    for name in ("ct", "ctl", "drop"):
        assert cells.loc[name, "mib_per_token_predicted"] == pytest.approx(
            cells.loc[name, "mib_per_token"], rel=0.02
        )
        assert cells.loc[name, "measurement"] == "traced"
    assert "plain mmap" in cells.loc["mmap", "comparable"]


@pytest.mark.parametrize(
    "name", ["route-trace/gemma.metrics", "native-tiny/run.csv", "native-tiny/pf.csv"]
)
def test_first_half_profile_predicts_the_second_half(corpus: Path, name):
    """Out of sample: a profile of the run's first half of tokens predicts the second half's
    tok/s from the replayed misses, within the 15 % the prediction aims at."""
    from dataclasses import replace

    from bmoe.analyze import replay
    from bmoe.analyze.device import cell_reads, token_times

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = profile_runs(read_recorded_runs([corpus / name]))[0]
    rows = run.metrics.rows
    config = run_config(run)
    half = len(rows) // 2
    first = replace(run, metrics=replace(run.metrics, rows=rows.iloc[:half].reset_index(drop=True)))
    profile = build_profile([first])
    reads = cell_reads(
        run.route, replay.prepare_batches(run.route), "lru", config.cache_mb, config.prefetch
    )
    times = token_times(profile, reads, config.io_threads, compute_ms=profile.compute["token_ms"])
    predicted = (len(rows) - half) / times["wall_ms"].iloc[half:].sum()
    measured = (len(rows) - half) / rows["wall_ms"].iloc[half:].sum()
    assert predicted == pytest.approx(measured, rel=0.15)


def test_drop_replay_reproduces_the_dropping_runs_hit_rate(corpus: Path):
    """native-tiny/drop ran --drop-cold-experts 1.0 at 3 MiB: the replay with --drop 1.0
    gives its recorded hit rate (dropped routings are never looked up); without it, not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = profile_runs(read_recorded_runs([corpus / "native-tiny/drop.csv"]))[0]
    profile = build_profile([run])
    cell = {"cache_mb": [3], "io_threads": [4]}
    summary = run.metrics.summary
    dropped = predict(run.route, profile, cell, drop=1.0).iloc[0]
    plain = predict(run.route, profile, cell).iloc[0]
    assert dropped["hit_pct"] == pytest.approx(summary["cache_hit_pct"], abs=0.051)
    assert abs(plain["hit_pct"] - summary["cache_hit_pct"]) > 10


def test_phone_profile_of_two_configurations_measures_its_error(corpus: Path):
    """Two --overlap phone files of different configurations: each, held out, is predicted
    from the other, so the profile knows its model error (from 2 configurations) and its
    intervals claim their coverage, never narrower than the spread alone; the serial file is
    predicted but unpriced (its flash wait is not what lane busy time measures)."""
    from bmoe.analyze.device import against_files, interval_kind

    metrics = corpus / "metrics"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pair = profile_runs(read_recorded_runs([metrics / "2026-07-14-warmup/baseline_qwen_k8.csv",
                          metrics / "2026-07-13/qwen_auto_ov.csv"]))  # fmt: skip
        files = profile_runs(read_recorded_runs(sorted(metrics.glob("2026-07-1[24]*/*.csv"))))
        profile = build_profile(pair)
        cells = against_files(None, profile, files)["cells"].set_index("cell")
    error = profile.model_error
    assert error["configurations"] == 2 and error["sd_rel"] is not None
    assert all("error_pct" in r for r in error["held_out"])
    assert interval_kind(profile)[1]
    priced = cells[cells["tok_s_predicted"].notna()]
    assert (priced["interval_pct_predicted"] >= priced["spread_pct_predicted"] - 1e-9).all()
    assert "--overlap runs only" in cells.loc["qwen_c4000_l4", "unpriced"]
