"""The same cells across sweeps: trends, steps worked by hand, regressions that fail CI, and
the index page of several sweeps."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import history as hist
from bmoe.cli import main
from bmoe.sweep.archive import write_results


def sweep(values: dict[int, list[float]], day: int, name: str = "grid") -> pd.DataFrame:
    """Attempts of cells cache_mb=<key> with the given tok/s, started on 2026-12-<day>."""
    rows = [
        {"run": f"c{cache}/r{i + 1}", "cell": f"cache_mb-{cache}-{day}", "repeat": i + 1,
         "status": "ok", "cache_mb": cache, "tok_s_mean": rate, "engine": "embedded",
         "started": f"2026-12-{day:02d}T10:{i:02d}:00+00:00"}
        for cache, rates in values.items() for i, rate in enumerate(rates)
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.attrs.update(axes=["cache_mb"], params=["cache_mb"], name=name)
    return frame


OLD = {0: [100.0, 102.0, 98.0], 8: [200.0, 204.0, 196.0]}
NEW = {0: [80.0, 82.0, 78.0], 8: [201.0, 205.0, 197.0]}


def test_steps_by_hand() -> None:
    # given newest first: the order comes from when the sweeps started
    lined = hist.line_up({"new": sweep(NEW, 2), "old": sweep(OLD, 1)})
    assert lined.attrs["sweeps"] == ["old", "new"]
    assert lined["cell"].unique().tolist() == ["cache_mb=0", "cache_mb=8"]  # ids differ, axes match
    table = hist.steps(lined, "tok_s_mean", 5.0).set_index("cell")
    slow = table.loc["cache_mb=0"]
    assert (slow["before"], slow["after"]) == ("old", "new")
    assert slow["change_pct"] == pytest.approx(-20.0)
    # sd 2 over 3 runs each: log-scale variances (2/80)^2/3 and (2/100)^2/3, Welch df 3.8,
    # so t = 3.182 (df rounded down)
    va, vb = (2 / 80) ** 2 / 3, (2 / 100) ** 2 / 3
    assert (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2) == pytest.approx(3.82, abs=0.01)
    se = math.sqrt(va + vb)
    expected = (0.8, 0.8 * math.exp(-3.182 * se), 0.8 * math.exp(3.182 * se))
    assert (slow["ratio"], slow["ratio_low"], slow["ratio_high"]) == pytest.approx(expected)
    assert slow["regressed"] and not slow["improved"] and slow["ratio_high"] < 1
    same = table.loc["cache_mb=8"]
    assert not same["regressed"] and not same["improved"]
    assert "no change beyond noise" in same["sentence"] and "regression" in slow["sentence"]
    trend = hist.trend_table(lined).set_index("cell")
    assert trend.loc["cache_mb=0", ["old", "new"]].tolist() == [100.0, 80.0]
    assert trend.loc["cache_mb=8", "change_pct"] == pytest.approx(0.5)


def test_noise_and_single_runs() -> None:
    # 8 % slower but the repeats scatter by +-20 %: the interval reaches 1, no regression
    noisy = hist.steps(hist.line_up({
        "a": sweep({0: [80.0, 100.0, 120.0]}, 1), "b": sweep({0: [72.0, 92.0, 112.0]}, 2),
    }))  # fmt: skip
    assert noisy["ratio"].iloc[0] < 0.95 and noisy["ratio_high"].iloc[0] > 1
    assert not noisy["regressed"].iloc[0]
    # single runs: no interval, the change decides; a time (lower is better) that grew
    one = {"a": sweep({0: [100.0]}, 1), "b": sweep({0: [90.0]}, 2)}
    assert hist.steps(hist.line_up(one))["regressed"].iloc[0]
    for frame, value in zip(one.values(), (0.5, 0.6), strict=True):
        frame["ttft_s"] = value
    ttft = hist.steps(hist.line_up(one, "ttft_s"), "ttft_s")
    assert ttft["ratio"].iloc[0] == pytest.approx(0.5 / 0.6) and ttft["regressed"].iloc[0]
    assert "single runs: no interval" in ttft["sentence"].iloc[0]


def test_regressions_only_into_the_newest_sweep() -> None:
    three = {"a": sweep(OLD, 1), "b": sweep(NEW, 2), "c": sweep(NEW, 3)}
    table = hist.steps(hist.line_up(three))
    assert table["regressed"].sum() == 1  # a -> b
    assert hist.regressions(table).empty  # b -> c changed nothing
    assert len(hist.regressions(table, latest_only=False)) == 1


@pytest.mark.parametrize(("text", "value"), [("5%", 5.0), ("5", 5.0), ("0.05", 5.0)])
def test_thresholds(text: str, value: float) -> None:
    assert hist.parse_threshold(text) == value


def folder(tmp_path: Path, name: str, frame: pd.DataFrame) -> Path:
    root = tmp_path / name
    root.mkdir()
    write_results(root, frame, ["cache_mb"], "grid")
    return root


def test_history_command_fails_on_a_regression(tmp_path: Path, capsys) -> None:
    old = folder(tmp_path, "2026-12-01-grid", sweep(OLD, 1))
    new = folder(tmp_path, "2026-12-02-grid", sweep(NEW, 2))
    same = folder(tmp_path, "2026-12-03-grid", sweep(NEW, 3))
    code = main(["history", str(old), str(new), "--fail-on-regression", "5%"])
    err = capsys.readouterr().err
    assert code == 1 and "REGRESSION cache_mb=0: tok_s_mean -20.0 %" in err
    assert main(["history", str(old), str(new), "--fail-on-regression", "25%"]) == 0
    assert main(["history", str(old), str(new), str(same), "--fail-on-regression", "5%"]) == 0
    capsys.readouterr()
    assert main(["history", str(old), str(new), "--fail-on-regression", "lots"]) == 2
    assert "give a percentage such as 5%" in capsys.readouterr().err
    assert main(["history", str(old)]) == 2


def test_report_of_several_sweeps_is_an_index(tmp_path: Path, capsys) -> None:
    old = folder(tmp_path, "2026-12-01-grid", sweep(OLD, 1))
    new = folder(tmp_path, "2026-12-02-grid", sweep(NEW, 2))
    out = tmp_path / "pages" / "history.html"
    assert main(["report", str(new), str(old), "-o", str(out)]) == 0, capsys.readouterr().err
    index = out.read_text()
    assert "regression: cache_mb=0: tok_s_mean -20.0 % from 2026-12-01-grid to 2026-12-02-grid" in (
        index
    )
    assert index.count("data:image/png;base64,") == 1  # the trend plot
    for name in ("2026-12-01-grid", "2026-12-02-grid"):
        page = out.parent / f"history-{name}.html"
        assert f'href="history-{name}.html"' in index and page.is_file()
        assert "Ranking by tok_s_mean" in page.read_text()
