"""The same cells across sweeps: trends, steps worked by hand, regressions that fail CI, and
the index page of several sweeps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import history as hist
from bmoe.cli import main
from bmoe.sweep.archive import write_results


def sweep(
    values: dict[int, list[float]], day: int, name: str = "grid", **base: object
) -> pd.DataFrame:
    """Attempts of cells cache_mb=<key> with the given tok/s, started on 2026-12-<day>, with
    the `base` parameters every cell shares."""
    rows = [
        {"run": f"c{cache}/r{i + 1}", "cell": f"cache_mb-{cache}-{day}", "repeat": i + 1,
         "status": "ok", "cache_mb": cache, "tok_s_mean": rate, "engine": "embedded",
         "started": f"2026-12-{day:02d}T10:{i:02d}:00+00:00", **base}
        for cache, rates in values.items() for i, rate in enumerate(rates)
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.attrs.update(axes=["cache_mb"], params=["cache_mb", *base], name=name)
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
    # (to the precision of t printed to three decimals)
    assert (slow["ratio"], slow["ratio_low"], slow["ratio_high"]) == pytest.approx(
        expected, rel=2e-4
    )
    assert slow["regressed"] and not slow["improved"] and slow["ratio_high"] < 1
    same = table.loc["cache_mb=8"]
    assert not same["regressed"] and not same["improved"]
    assert "no change beyond noise" in same["sentence"] and "regression" in slow["sentence"]
    trend = hist.trend_table(lined).set_index("cell")
    assert trend.loc["cache_mb=0", ["old", "new"]].tolist() == [100.0, 80.0]
    assert trend.loc["cache_mb=8", "change_pct"] == pytest.approx(0.5)


def test_noise_and_single_runs() -> None:
    # 8 % slower but the repeats scatter by +-10 %: the interval reaches 1, no regression
    noisy = hist.steps(hist.line_up({
        "a": sweep({0: [90.0, 100.0, 110.0]}, 1), "b": sweep({0: [82.0, 92.0, 102.0]}, 2),
    }))  # fmt: skip
    assert noisy["ratio"].iloc[0] < 0.95 and noisy["ratio_high"].iloc[0] > 1
    assert not noisy["regressed"].iloc[0]
    assert noisy["verdict"].iloc[0] == "no change beyond noise"
    # +-20 %: sd 20 over 3 runs each side, Welch df 3.97 -> 3, t = 3.182, se = 0.1705; the
    # interval 0.92 * (e^0.5425 - e^-0.5425) = 1.05 wide, wider than the ratio 0.92 itself
    va, vb = (20 / 100) ** 2 / 3, (20 / 92) ** 2 / 3
    assert (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2) == pytest.approx(3.97, abs=0.01)
    width = 0.92 * 2 * math.sinh(3.182 * math.sqrt(va + vb))
    assert width > 0.92
    wide = hist.steps(hist.line_up({
        "a": sweep({0: [80.0, 100.0, 120.0]}, 1), "b": sweep({0: [72.0, 92.0, 112.0]}, 2),
    })).iloc[0]  # fmt: skip
    assert wide["verdict"].startswith("not measurable") and not wide["regressed"]
    assert math.isnan(wide["ratio_low"]) and math.isnan(wide["ratio_high"])
    assert wide["sentence"] == f"cache_mb=0: tok_s_mean from a to b: {wide['verdict']}"
    # single runs, or two: too few repeats, whatever the change (a time that grew 20 %)
    one = {"a": sweep({0: [100.0]}, 1), "b": sweep({0: [90.0]}, 2)}
    assert not hist.steps(hist.line_up(one))["regressed"].iloc[0]
    for frame, value in zip(one.values(), (0.5, 0.6), strict=True):
        frame["ttft_s"] = value
    ttft = hist.steps(hist.line_up(one, "ttft_s"), "ttft_s").iloc[0]
    assert ttft["ratio"] == pytest.approx(0.5 / 0.6) and not ttft["regressed"]
    assert ttft["verdict"] == "too few repeats (n = 1)"
    two = {"a": sweep({0: [100.0, 101.0]}, 1), "b": sweep({0: [50.0, 51.0, 49.0]}, 2)}
    halved = hist.steps(hist.line_up(two)).iloc[0]
    assert halved["verdict"] == "too few repeats (n = 2)" and not halved["regressed"]
    assert halved["sentence"] == "cache_mb=0: tok_s_mean from a to b: too few repeats (n = 2)"


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


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sweeps_that_measured_different_things_are_not_comparable(tmp_path: Path, capsys) -> None:
    # the newer sweep generated 16 tokens instead of 32 and traced its routing: 20 % slower,
    # but not a regression of anything
    old = folder(tmp_path, "2026-12-01-grid", sweep(OLD, 1, n_predict=32, threads=2))
    new = folder(tmp_path, "2026-12-02-grid",
                 sweep(NEW, 2, n_predict=16, threads=2, route_trace=True))  # fmt: skip
    code, out, err = run_cli(capsys, "history", old, new, "--fail-on-regression", "5%",
                             "-f", "json")  # fmt: skip
    assert code == 0, err
    assert "REGRESSION" not in err
    assert ("2026-12-01-grid and 2026-12-02-grid are not comparable (n_predict 32 vs 16; "
            "tracing none vs route_trace)") in err  # fmt: skip
    views = json.loads(out)
    assert {s["verdict"] for s in views["steps"]} == {"not comparable"}
    assert all(s["change_pct"] is None and s["ratio"] is None
               for s in views["steps"])  # fmt: skip
    listed = {(d["what"], d["value_before"], d["value_after"], d["effect"])
              for d in views["differences"]}  # fmt: skip
    assert listed == {("base n_predict", "32", "16", "not comparable"),
                      ("tracing", "none", "route_trace", "not comparable")}  # fmt: skip
    # the newer sweep's traced runs leave its ranking not settled, and the sweeps table says so
    assert [s["ranking"] for s in views["sweeps"]] == ["settled", "not settled"]
    trend = {r["cell"]: r for r in views["trend"]}
    assert trend["cache_mb=0"]["change_pct"] is None  # no change across incomparable sweeps
    # the terminal table says it too
    code, out, _ = run_cli(capsys, "history", old, new, "--fail-on-regression", "5%")
    assert code == 0 and "comparable" in out and "REGRESSION" not in out
    # and the index page of both
    page = tmp_path / "pages" / "history.html"
    code, _, err = run_cli(capsys, "report", old, new, "-o", page)
    assert code == 0, err
    index = page.read_text()
    assert 'data-view="differences"' in index and "regression:" not in index
    assert "are not comparable (n_predict 32 vs 16; tracing none vs route_trace)" in index


def test_a_version_change_is_listed_and_a_regression_still_fails(tmp_path: Path, capsys) -> None:
    before = sweep(OLD, 1, n_predict=32).assign(summary_engine="bmoe-embedded-0.1.0")
    after = sweep(NEW, 2, n_predict=32).assign(summary_engine="bmoe-embedded-0.2.0")
    old, new = folder(tmp_path, "2026-12-01-grid", before), folder(tmp_path, "2026-12-02-grid",
                                                                    after)  # fmt: skip
    code, out, err = run_cli(capsys, "history", old, new, "--fail-on-regression", "5%",
                             "-f", "json")  # fmt: skip
    assert code == 1
    assert "REGRESSION cache_mb=0: tok_s_mean -20.0 % from 2026-12-01-grid" in err
    views = json.loads(out)
    assert [(d["what"], d["effect"]) for d in views["differences"]] == [
        ("engine version", "listed")
    ]
    steps = {s["cell"]: s["verdict"] for s in views["steps"]}
    assert steps == {"cache_mb=0": "regression", "cache_mb=8": "no change beyond noise"}


def test_a_step_into_an_unsettled_sweep_is_not_judged(tmp_path: Path, capsys) -> None:
    # the newer sweep's engine got a sliver of a CPU: 1 ms of CPU per token on one thread at
    # 80 tok/s (12.5 ms a token) leaves 92 % of the wall off-CPU, past the 50 % the verdict
    # allows
    old = folder(tmp_path, "2026-12-01-grid", sweep(OLD, 1))
    busy = sweep(NEW, 2).assign(cpu_s_per_token=0.001, threads=1)
    new = folder(tmp_path, "2026-12-02-grid", busy)
    code, out, err = run_cli(capsys, "history", old, new, "--fail-on-regression", "5%",
                             "-f", "json")  # fmt: skip
    assert code == 0, err
    step = {s["cell"]: s for s in json.loads(out)["steps"]}["cache_mb=0"]
    assert step["verdict"] == "not settled" and step["change_pct"] == pytest.approx(-20.0)
    assert "the ranking of 2026-12-02-grid is not settled" in err and "off-CPU" in err


def test_cells_missing_from_a_sweep_are_blank(tmp_path: Path, capsys) -> None:
    old = folder(tmp_path, "2026-12-01-grid", sweep(OLD, 1))  # cache_mb 0 and 8
    new = folder(tmp_path, "2026-12-02-grid",
                 sweep({0: NEW[0], 4: [150.0, 151.0, 149.0]}, 2))  # fmt: skip
    code, out, err = run_cli(capsys, "history", old, new, "-f", "json")
    assert code == 0, err
    trend = {r["cell"]: r for r in json.loads(out)["trend"]}
    # gone from the newest sweep: no mean there and no change (not 0)
    assert trend["cache_mb=8"]["2026-12-02-grid"] is None
    assert trend["cache_mb=8"]["change_pct"] is None
    # new in the newest sweep: nothing before it, no change
    assert trend["cache_mb=4"]["2026-12-01-grid"] is None
    assert trend["cache_mb=4"]["change_pct"] is None
    assert trend["cache_mb=0"]["change_pct"] == pytest.approx(-20.0)
    assert "1 cell(s) of earlier sweeps are missing from 2026-12-02-grid: cache_mb=8" in err
    code, out, _ = run_cli(capsys, "history", old, new, "-f", "csv")
    row = next(line for line in out.splitlines() if line.startswith("cache_mb=8,"))
    assert row.split(",")[2:] == ["", ""]  # the newest sweep's mean and the change: blank


def test_a_copy_of_a_sweep_renders_as_json(tmp_path: Path, capsys) -> None:
    # history A A-copy -f json: the start times are text, the steps changed nothing
    first = folder(tmp_path, "a", sweep(OLD, 1))
    copy = folder(tmp_path, "a-copy", sweep(OLD, 1))
    code, out, err = run_cli(capsys, "history", first, copy, "-f", "json")
    assert code == 0, err
    views = json.loads(out)
    assert [s["started"] for s in views["sweeps"]] == ["2026-12-01T10:00:00+00:00"] * 2
    assert {s["verdict"] for s in views["steps"]} == {"no change beyond noise"}
    assert [s["change_pct"] for s in views["steps"]] == [0.0, 0.0]


def test_sweeps_without_a_common_cell_or_one_folder_twice(tmp_path: Path, capsys) -> None:
    # no cell in common: nothing to step across (an empty steps table, not a crash)
    low = folder(tmp_path, "low", sweep({0: [1.0, 1.0, 1.0]}, 1))
    high = folder(tmp_path, "high", sweep({64: [2.0, 2.0, 2.0]}, 2))
    code, out, err = run_cli(capsys, "history", low, high, "-f", "json",
                             "--fail-on-regression", "5%")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["steps"] == []
    code, out, err = run_cli(capsys, "history", low, low)
    assert code == 2 and f"{low}: the same sweep folder given twice" in err
    code, out, err = run_cli(capsys, "history", low, tmp_path / "high" / ".." / "low")
    assert code == 2 and "the same sweep folder given twice (as" in err
    assert "Traceback" not in err and "internal error" not in err


def test_the_shipped_sweeps_are_not_comparable(capsys) -> None:
    bench = Path(__file__).resolve().parents[2] / "bench-data"
    tiny, small = bench / "2026-11-29-tiny-cache-lanes", bench / "2026-11-29-small-traces"
    code, out, err = run_cli(capsys, "history", tiny, small, "-f", "json",
                             "--fail-on-regression", "5%")  # fmt: skip
    assert code == 0, err
    assert "internal error" not in err
    views = json.loads(out)
    what = {d["what"]: d for d in views["differences"]}
    # their sweep.toml files: n_predict 32 and 12, the small sweep traced route, compute, io
    assert (what["base n_predict"]["value_before"], what["base n_predict"]["value_after"]) == (
        "32", "12")  # fmt: skip
    assert what["tracing"]["value_after"] == "route_trace, compute_trace, io_trace"
    assert what["model file"]["value_before"] == "tiny.gguf"
    assert "are not comparable (n_predict 32 vs 12" in err


def grid_sweep(day: int, scale: float) -> pd.DataFrame:
    """A 5 x 3 grid (cache_mb x io_threads), three repeats a cell, started on 2026-12-<day>."""
    rows = [
        {"run": f"c{c}-{io}/r{r}", "cell": f"c{c}-{io}-{day}", "status": "ok", "cache_mb": c,
         "io_threads": io, "tok_s_mean": scale * (100 + 10 * c + io + r),
         "started": f"2026-12-{day:02d}T10:00:00+00:00"}
        for c in (0, 1, 2, 4, 8) for io in (1, 2, 4) for r in range(3)
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.attrs.update(axes=["cache_mb", "io_threads"], params=["cache_mb", "io_threads"])
    return frame


def test_the_trend_plot_tells_fifteen_cells_apart() -> None:
    import matplotlib.pyplot as plt

    from bmoe.render.plots.sweep import trend_lines

    lined = hist.line_up({"a": grid_sweep(1, 1.0), "b": grid_sweep(2, 1.1),
                          "c": grid_sweep(3, 0.5)})  # fmt: skip
    fig = trend_lines(lined, breaks={("b", "c"): "n_predict 32 vs 16"})
    try:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        # one panel per cache_mb, one line per io_threads (the axis with the fewest values)
        assert sorted(ax.get_title() for ax in panels) == [f"cache_mb={c}" for c in (0, 1, 2, 4, 8)]
        colour_of: dict[str, object] = {}
        for ax in panels:
            solid = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
            # three io_threads values, each drawn a -> b and, after the break, c on its own
            assert len({ln.get_color() for ln in solid}) == 3
            for line in solid:
                x = line.get_xdata()
                assert max(x) - min(x) < 1.5  # never joined across the b | c break
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                colour = handle[0].get_color() if hasattr(handle, "__getitem__") else None
                assert colour_of.setdefault(label, colour) == colour  # same value, same colour
            assert any(ln.get_linestyle() == ":" for ln in ax.lines)  # the break is marked
        assert sorted(colour_of) == ["io_threads=1", "io_threads=2", "io_threads=4"]
        assert len(set(colour_of.values())) == 3
    finally:
        plt.close(fig)


def test_the_readme_history_of_the_shipped_tiny_sweeps(capsys) -> None:
    # bmoe history bench-data/*-tiny-cache-lanes --fail-on-regression 5%: two recordings of
    # one configuration (sweeps/bench-tiny-cache-lanes.toml), the newer on a busy machine
    bench = Path(__file__).resolve().parents[2] / "bench-data"
    folders = sorted(bench.glob("*-tiny-cache-lanes"))
    if len(folders) < 2:
        pytest.skip("fewer than two tiny-cache-lanes sweeps in bench-data/")
    code, out, err = run_cli(capsys, "history", *folders, "--fail-on-regression", "5%",
                             "-f", "json")  # fmt: skip
    views = json.loads(out)
    effects = {d["what"]: d["effect"] for d in views["differences"]}
    assert "not comparable" not in effects.values(), effects  # like with like
    newest = views["sweeps"][-1]
    # the newest sweep's own summary.md, written when it was recorded, gives its ranking
    summary = (bench / newest["sweep"] / "summary.md").read_text()
    settled = "| ranking | settled |" in summary
    assert newest["ranking"] == ("settled" if settled else "not settled")
    if not settled:  # then no step into it is judged, and CI passes
        assert code == 0 and "is not settled" in err
        verdicts = {s["verdict"] for s in views["steps"]}
        assert all(v == "not settled" or v.startswith(("not measurable", "too few"))
                   for v in verdicts), verdicts  # fmt: skip
