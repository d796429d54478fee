"""The verdict on a sweep's ranking: intervals worked by hand, and constructed archives from a
busy and a quiet machine read back through the command line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.sweep import analyze_sweep, rank_cells, sweep_verdict
from bmoe.analyze.verdict import (
    cell_labels,
    compare_neighbours,
    mean_interval_pct,
    t_quantile,
)
from bmoe.cli import main
from bmoe.errors import BmoeError
from bmoe.sweep.archive import write_results

CELLS = [(0, 1), (0, 4), (8, 1), (8, 4)]
#: the relative precision of a t quantile printed to three decimals (the hand values below)
TABLE = 2e-4


def test_t_quantiles() -> None:
    assert t_quantile(2)[0] == pytest.approx(4.303, rel=TABLE)
    assert t_quantile(2.9)[0] == pytest.approx(4.303, rel=TABLE)  # fractional df: down, wider
    assert t_quantile(200)[0] == pytest.approx(1.972, abs=1e-3)
    assert math.isnan(t_quantile(0)[0])


def test_mean_interval_by_hand() -> None:
    # n = 3, sd = 10, mean = 100: 4.303 * 10 / sqrt(3) = 24.84 % of the mean
    got = mean_interval_pct(pd.Series([100.0]), pd.Series([10.0]), pd.Series([3]))
    assert got.iloc[0] == pytest.approx(4.303 * 10 / math.sqrt(3), rel=TABLE)


def test_neighbours_by_hand() -> None:
    ranked = pd.DataFrame(
        {"cell": ["a", "b", "c"], "n": [4, 4, 1], "mean": [123.0, 100.0, 99.0],
         "sd": [2.46, 2.0, np.nan]}
    )  # fmt: skip
    table = compare_neighbours(ranked, "tok_s_mean")
    first = table.iloc[0]
    # log-scale variance per cell (sd / mean)^2 / n = 0.02^2 / 4 for both; Welch df = 6
    se = math.sqrt(2 * 0.02**2 / 4)
    assert first["ratio"] == pytest.approx(1.23)
    assert first["ratio_low"] == pytest.approx(1.23 * math.exp(-2.447 * se), rel=TABLE)
    assert first["ratio_high"] == pytest.approx(1.23 * math.exp(2.447 * se), rel=TABLE)
    half = (first["ratio_high"] - first["ratio_low"]) / 2
    assert first["distinguishable"]
    assert first["sentence"] == f"a is 1.23 ± {half:.2f}x faster than b"
    assert pd.isna(first["why"])
    second = table.iloc[1]
    assert (
        not second["distinguishable"] and second["sentence"] == "b and c: too few repeats (n = 1)"
    )
    assert math.isnan(second["ratio_low"]) and math.isnan(second["ratio_high"])
    # lower is better: the ratio is how many times lower the better one is
    lower = compare_neighbours(ranked.iloc[::-1].reset_index(drop=True), "ttft_s", True)
    assert lower.iloc[1]["ratio"] == pytest.approx(123 / 100)
    assert "lower on ttft_s" in lower.iloc[1]["sentence"]


def test_two_repeats_are_too_few_for_a_ratio() -> None:
    # n = 2 per side: one degree of freedom per cell, t = 12.7 (or worse, a fractional df
    # rounded down): the interval would be meaningless, so no number is given
    ranked = pd.DataFrame(
        {"cell": ["a", "b", "c"], "n": [2, 3, 3], "mean": [209.0, 100.0, 50.0],
         "sd": [150.0, 1.0, 1.0]}
    )  # fmt: skip
    table = compare_neighbours(ranked, "tok_s_mean")
    first = table.iloc[0]
    assert first["sentence"] == "a and b: too few repeats (n = 2)"
    assert first["why"] == "too few repeats (n = 2)" and not first["distinguishable"]
    assert math.isnan(first["ratio_low"]) and math.isnan(first["ratio_high"])
    assert first["ratio"] == pytest.approx(2.09)  # the ratio of the means is still a fact
    assert pd.isna(table.iloc[1]["why"]) and table.iloc[1]["distinguishable"]


def test_an_interval_wider_than_the_ratio_is_not_measurable() -> None:
    # three runs each, sd / mean = 0.3 on both sides: log-scale variance 0.09 / 3 per side,
    # se = sqrt(0.06) = 0.245, Welch df = 0.06^2 / (2 * 0.03^2 / 2) = 4, t = 2.776; the
    # interval spans ratio * (e^0.68 - e^-0.68) = 1.47 ratios: wider than the ratio
    wide = pd.DataFrame(
        {"cell": ["a", "b"], "n": [3, 3], "mean": [110.0, 100.0], "sd": [33.0, 30.0]}
    )  # fmt: skip
    row = compare_neighbours(wide, "tok_s_mean").iloc[0]
    assert row["sentence"].startswith("a and b: not measurable")
    assert "±" not in row["sentence"] and math.isnan(row["ratio_high"])
    # sd / mean = 0.2: se = 0.163, t * se = 0.453, the interval 0.94 ratios wide: a number
    narrow = wide.assign(sd=[22.0, 20.0])
    row = compare_neighbours(narrow, "tok_s_mean").iloc[0]
    se = math.sqrt(2 * 0.04 / 3)
    assert row["ratio_high"] - row["ratio_low"] == pytest.approx(
        1.1 * (math.exp(2.776 * se) - math.exp(-2.776 * se)), rel=TABLE
    )
    assert pd.isna(row["why"]) and "not distinguishable (1.10 ±" in row["sentence"]


def attempts(
    noise: float, drift: float, cpu_s_per_token: float, seed: int = 1
) -> list[dict[str, object]]:
    """Three rounds over a 2x2 grid (the second backwards), tok/s 100 * (1 + cache_mb / 8) *
    (1 + io_threads / 8), times lognormal `noise`; reversed rounds scaled by 1 + `drift`."""
    rng = np.random.default_rng(seed)
    rows, order = [], 0
    for rnd in (1, 2, 3):
        seq = CELLS[::-1] if rnd == 2 else CELLS
        for cache, io in seq:
            level = 100.0 * (1 + cache / 8) * (1 + io / 8)
            rate = level * math.exp(noise * rng.standard_normal()) * (1 + drift * (rnd == 2))
            rows.append({
                "run": f"c{cache}-{io}/r{rnd}", "cell": f"c{cache}-{io}", "repeat": rnd,
                "attempt": 1, "order": order, "round": rnd, "reversed": rnd == 2,
                "status": "ok", "target": "local", "cache_mb": cache, "io_threads": io,
                "threads": 2, "tok_s_mean": rate, "cpu_s_per_token": cpu_s_per_token / rate,
                "io_s_per_token": 0.1 / rate, "mgmt_ms_per_token": 0.0,
            })  # fmt: skip
            order += 1
    return rows


def archive(tmp_path: Path, rows: list[dict[str, object]], name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    frame = pd.DataFrame(rows)
    frame.attrs["params"] = ["cache_mb", "io_threads", "threads"]
    write_results(root, frame, ["cache_mb", "io_threads"], name)
    return root


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_busy_machine_ranking_is_not_settled(tmp_path: Path, capsys) -> None:
    # CV ~50 %, reversed rounds 60 % slower, and 0.17 CPU-seconds per wall-second: the
    # engine got 17 % of a CPU
    root = archive(tmp_path, attempts(noise=0.5, drift=-0.6, cpu_s_per_token=0.17), "busy")
    code, out, _ = run_cli(capsys, "analyze", "sweep", root, "-f", "json")
    assert code == 0
    import json

    verdict = json.loads(out)["verdict"]
    assert verdict["ranking"] == "not settled"
    sentence = verdict["verdict"]
    assert sentence.startswith("Ranking by tok_s_mean not settled, because ")
    assert "disagree (coefficient of variation" in sentence
    assert "forward and reversed rounds differ by a median of" in sentence
    assert "off-CPU" in sentence and "the engine got 17 % of a CPU" in sentence
    code, out, _ = run_cli(capsys, "analyze", "sweep", root)  # the terminal says it too
    assert code == 0 and "not settled" in out and "because" in out


def test_quiet_machine_ranks_with_intervals(tmp_path: Path, capsys) -> None:
    rows = attempts(noise=0.01, drift=0.0, cpu_s_per_token=1.9)
    root = archive(tmp_path, rows, "quiet")
    results = pd.DataFrame(rows)
    results.attrs["axes"] = ["cache_mb", "io_threads"]
    verdict = sweep_verdict(results)
    assert verdict.settled and not verdict.reasons
    ranked = rank_cells(results)
    top = verdict.neighbours.iloc[0]
    assert top["ratio"] == pytest.approx(ranked["mean"].iloc[0] / ranked["mean"].iloc[1])
    assert top["distinguishable"] and top["ratio_low"] > 1.0
    assert top["sentence"].startswith("cache_mb=8 io_threads=4 is ")
    assert top["sentence"].endswith("x faster than cache_mb=8 io_threads=1")
    assert "±" in top["sentence"]
    code, out, _ = run_cli(capsys, "analyze", "sweep", root, "-f", "markdown")
    assert code == 0
    assert "Ranking by tok_s_mean settled" in out and top["sentence"] in out


def test_unknown_outcome_is_refused_with_the_valid_ones(tmp_path: Path, capsys) -> None:
    root = archive(tmp_path, attempts(0.01, 0.0, 1.9), "typo")
    code, out, err = run_cli(capsys, "analyze", "sweep", root, "--outcome", "tok_s")
    assert code == 2 and out == ""
    assert "unknown outcome 'tok_s'" in err and "tok_s_mean" in err
    assert "Traceback" not in err
    with pytest.raises(BmoeError, match="valid outcomes: tok_s_mean"):
        analyze_sweep(pd.DataFrame(attempts(0.01, 0.0, 1.9)), "tok_s")


def test_cells_without_a_completed_run_are_named() -> None:
    rows = attempts(0.01, 0.0, 1.9)
    for row in rows:
        if row["cell"] == "c8-4":
            row["status"] = "crashed"
    verdict = sweep_verdict(pd.DataFrame(rows))
    assert "c8-4" not in set(verdict.stability["cell"])
    assert "1 cell(s) have no completed run and are not ranked: c8-4" in verdict.caveats
    assert "3 of 12 attempt(s) did not complete (3 crashed)" in verdict.caveats


def test_the_sweeps_system_checks_are_used() -> None:
    rows = attempts(0.01, 0.0, 1.9)
    for i, row in enumerate(rows):
        row["engine_cpu_share"] = 0.3 if i < 6 else None
        row["system_warnings"] = (
            "the governor is powersave; load 3.1 above 1 CPU" if i < 2 else None
        )
    verdict = sweep_verdict(pd.DataFrame(rows))
    assert "system check (2 of 12 runs): the governor is powersave" in verdict.caveats
    assert "system check (2 of 12 runs): load 3.1 above 1 CPU" in verdict.caveats
    first = verdict.stability.set_index("cell")
    # c8-4 ran 3 times (positions 3, 4, 11), twice with a recorded share of 0.3 CPU
    assert first.loc["c8-4", "cpu_pct"] == pytest.approx(30.0)
    assert first.loc["c0-1", "cpu_pct"] == pytest.approx(190.0)  # once 30 %, twice 190 %


def failed_rows() -> list[dict[str, object]]:
    return [
        {"run": f"c{c}-{i}/r1", "cell": f"c{c}-{i}", "repeat": 1, "attempt": a, "order": n,
         "status": "crashed", "target": "local", "cache_mb": c, "io_threads": i,
         "error": "engine exited with status 2"}
        for n, (c, i) in enumerate(CELLS) for a in (1, 2)
    ]  # fmt: skip


def test_a_sweep_whose_runs_all_failed_says_so(tmp_path: Path, capsys) -> None:
    root = archive(tmp_path, failed_rows(), "failed")
    code, out, _ = run_cli(capsys, "analyze", "sweep", root, "-f", "json")
    assert code == 0
    import json

    verdict = json.loads(out)["verdict"]
    assert (
        verdict["verdict"] == "Nothing to rank by tok_s_mean: none of the 8 attempt(s) completed."
    )
    page = tmp_path / "failed.html"
    code, _, err = run_cli(capsys, "report", root, "-o", page)
    assert code == 0, err
    text = page.read_text()
    assert "none of the 8 attempt(s) completed" in text and "8 crashed" in text
    assert "try: )" not in text
    # completed runs that did not record the outcome: said, not refused
    done = pd.DataFrame(attempts(0.01, 0.0, 1.9)).drop(columns="tok_s_mean")
    assert sweep_verdict(done).sentence == (
        "Nothing to rank by tok_s_mean: none of the 12 completed run(s) recorded tok_s_mean."
    )


def test_plots_answer_the_question(tmp_path: Path, capsys) -> None:
    root = archive(tmp_path, attempts(0.01, 0.0, 1.9), "plots")
    out = tmp_path / "figures"
    code, _, err = run_cli(capsys, "analyze", "sweep", root, "--plots", out, "-f", "json")
    assert code == 0, err
    # two axes with two values each: tok/s against the first, one line per value of the other
    assert [p.name for p in out.iterdir()] == ["tok_s_mean-by-cache_mb-and-io_threads.png"]
    three = [{**row, "threads": t, "cell": f"{row['cell']}-t{t}", "run": f"{row['run']}-t{t}"}
             for row in attempts(0.01, 0.0, 1.9) for t in (1, 2)]  # fmt: skip
    root = tmp_path / "three"
    root.mkdir()
    frame = pd.DataFrame(three)
    write_results(root, frame, ["cache_mb", "io_threads", "threads"], "three")
    out = tmp_path / "plots3"
    code, _, err = run_cli(capsys, "analyze", "sweep", root, "--plots", out, "-f", "json")
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2 and all(n.endswith(("threads-1.png", "threads-2.png")) for n in names)


def test_two_repeats_say_too_few_everywhere(tmp_path: Path, capsys) -> None:
    # two rounds of the 2x2 grid: every neighbour comparison has n = 2 on both sides
    rows = [r for r in attempts(noise=0.01, drift=0.0, cpu_s_per_token=1.9) if r["round"] < 3]
    root = archive(tmp_path, rows, "two")
    sentence = "too few repeats (n = 2)"
    code, out, _ = run_cli(capsys, "analyze", "sweep", root)  # the terminal
    assert code == 0
    flat = " ".join(re.sub(r"[│┃]", " ", out).split())
    assert flat.count(sentence) >= 3 and "±" not in flat
    assert "4 of 4 cells ran fewer than 3 times (n = 2)" in flat
    code, out, _ = run_cli(capsys, "analyze", "sweep", root, "-f", "markdown")  # summary.md's
    assert code == 0 and out.count(f": {sentence}") == 3 and "±" not in out
    code, out, _ = run_cli(capsys, "analyze", "sweep", root, "-f", "json")
    views = json.loads(out)
    assert views["verdict"]["ranking"] == "not settled"
    # no interval of a mean from two runs either: blank, and the reason beside it
    assert {r["ci_pct"] for r in views["stability"]} == {None}
    assert {r["unstable"] for r in views["stability"]} == {"too few repeats"}
    page = tmp_path / "two.html"
    code, _, err = run_cli(capsys, "report", root, "-o", page)
    assert code == 0, err
    text = page.read_text()
    assert text.count(sentence) >= 3
    table = re.search(r'<table[^>]*data-view="neighbours".*?</table>', text, re.S)
    assert table is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", table.group(0), re.S)
    numbers = [float(c) for c in cells if re.fullmatch(r"-?\d+(\.\d+)?", c.strip())]
    # per row: the ratio of means (near 1.1-1.3 here) and nothing else: no bounds
    assert len(numbers) == 3 and all(0.5 < x < 2 for x in numbers)


@pytest.mark.slow  # a real sweep of a stand-in engine
def test_a_two_repeat_sweep_writes_the_too_few_sentence(tmp_path: Path, capsys) -> None:
    from sweep_helpers import install_fake_cli, sweep_folder, write_config

    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF stand-in")
    config = write_config(tmp_path, f"""\
        [sweep]
        name = "two"
        engine = "native"
        output = "{tmp_path / "out"}"
        repeats = 2
        timeout_s = 30

        [base]
        model = "tiny.gguf"
        prompt = "hello"
        n_predict = 4
        fake_jitter = 0.05

        [grid]
        cache_mb = [0, 8]

        [[targets]]
        name = "here"
        binary = "{fake}"
        """)  # fmt: skip
    code, _, err = run_cli(capsys, "sweep", config, "--plain")
    assert code == 0, err
    summary = (sweep_folder(tmp_path / "out") / "summary.md").read_text()
    assert "cache_mb=8 and cache_mb=0: too few repeats (n = 2)" in summary or (
        "cache_mb=0 and cache_mb=8: too few repeats (n = 2)" in summary
    )
    assert "±" not in summary


def test_the_quick_start_sweep_can_be_settled() -> None:
    # the README's quick start: timed runs only, and enough repeats for every comparison; the
    # traced variant is the same grid with routing recorded (never settled)
    from bmoe.analyze.history import PROBE_PARAMS
    from bmoe.analyze.verdict import MIN_REPEATS
    from bmoe.sweep.config import load_config

    sweeps = Path(__file__).resolve().parents[2] / "sweeps"
    quick = load_config(sweeps / "tiny-embedded.toml")
    traced = load_config(sweeps / "tiny-embedded-traced.toml")
    assert not [p for p in PROBE_PARAMS if quick.base.get(p)]
    for cell in quick.cells:
        assert not [p for p in PROBE_PARAMS if cell.get(p)]
    assert quick.settings.repeats >= MIN_REPEATS
    assert traced.base.get("route_trace") is True
    assert {k: v for k, v in traced.base.items() if k != "route_trace"} == quick.base
    assert traced.grid == quick.grid


def test_cell_labels_leave_out_an_axis_a_cell_has_no_value_for() -> None:
    ranked = pd.DataFrame({"cell": ["a", "b"], "cache_mb": [8.0, None], "tag": ["x", None]})
    assert cell_labels(ranked, ["cache_mb", "tag"]) == ["cache_mb=8.0 tag=x", "b"]
