"""``bmoe report``: one self-contained page whose tables carry the analyses' figures."""

from __future__ import annotations

import re
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest

import bmoe
from bmoe.cli import main

pytestmark = pytest.mark.slow  # whole reports, plots and replays

ROOT = Path(__file__).resolve().parents[2]


class Tables(HTMLParser):
    """Every ``<table data-view=...>``: its header and rows of (text, full value) cells."""

    def __init__(self) -> None:
        super().__init__()
        self.views: dict[str, dict] = {}
        self.srcs: list[str] = []
        self._view: str | None = None
        self._cell: list[str] | None = None
        self._title: str | None = None
        self._row: list[tuple[str, str | None]] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "src" in attrs:
            self.srcs.append(attrs["src"] or "")
        if tag == "table" and "data-view" in attrs:
            self._view = attrs["data-view"]
            self.views[self._view] = {"header": [], "rows": []}
        elif self._view and tag == "tr":
            self._row = []
        elif self._view and tag in ("td", "th"):
            self._cell, self._title = [], attrs.get("title")

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if self._view is None:
            return
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(("".join(self._cell), self._title))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            table = self.views[self._view]
            if not table["header"]:
                table["header"] = [text for text, _ in self._row]
            else:
                table["rows"].append(self._row)
            self._row = None
        elif tag == "table":
            self._view = None

    def records(self, view: str) -> list[dict[str, tuple[str, str | None]]]:
        table = self.views[view]
        return [dict(zip(table["header"], row, strict=True)) for row in table["rows"]]

    def figures(self, view: str) -> dict[str, tuple[str, str | None]]:
        return {r["figure"][0]: r["value"] for r in self.records(view)}


def value(cell: tuple[str, str | None]) -> float | None:
    """A cell's number at full precision (its tooltip), or its text."""
    text, title = cell
    raw = title if title is not None else text
    return None if raw == "—" else float(raw)


def make_report(tmp_path: Path, *args: str) -> tuple[str, Tables]:
    out = tmp_path / "report.html"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["report", *args, "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    parsed = Tables()
    parsed.feed(page)
    return page, parsed


def assert_offline(page: str, parsed: Tables) -> None:
    """Nothing the browser would fetch: no URL, no external stylesheet, script or font."""
    assert parsed.srcs and all(s.startswith("data:image/png;base64,") for s in parsed.srcs)
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:", page)
    assert not re.search(r"https?://|//cdn|<script|<link|@import|url\(|<iframe", text, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#|data:)""", text, re.I)


def bench_sweep(name: str) -> Path:
    found = sorted((ROOT / "bench-data").glob(f"*-{name}"))
    if not found:
        pytest.skip(f"no {name} sweep in bench-data/")
    return found[-1]


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def test_run_report_carries_the_run_and_its_traces(tmp_path, corpus):
    from bmoe.analyze import op_traces, route
    from bmoe.analyze.metrics import run_summary
    from bmoe.analyze.stall import stall_attribution

    folder = corpus / "native-tiny"
    page, tables = make_report(tmp_path, str(folder / "run.csv"))
    assert_offline(page, tables)
    run = quiet(bmoe.load, folder / "run.csv")
    # Parameters and summary figures.
    params = tables.figures("run parameters")
    assert params["cache_mb"][0] == "2" and params["model"][0] == "tiny-moe.gguf"
    summary = run_summary(run)
    throughput = tables.figures("summary throughput")
    assert value(throughput["tok_s_mean"]) == pytest.approx(summary["tok_s_mean"], rel=1e-12)
    assert throughput["tok_s_mean"][0] == f"{summary['tok_s_mean']:.3f}"  # printed precision
    # Stall attribution, component by component.
    expected = stall_attribution(run).summary.set_index("component")
    for row in tables.records("stall attribution"):
        component = row["component"][0]
        assert value(row["ms_per_token"]) == pytest.approx(expected.loc[component, "ms_per_token"])
        assert row["source"][0] == expected.loc[component, "source"]
    # The caveats the analyses raised: instrumented (traces beside), no steady state.
    assert "instrumented run: trace(s) recorded alongside" in page
    # The route trace beside it: its views and the whole matrix of decode steps.
    trace = bmoe.load(folder / "run.route.csv")
    decode_rows = route.select(trace, "decode")
    reuse = route.reuse(decode_rows)
    shown = tables.records("route reuse")
    assert [int(value(r["n_reuse"])) for r in shown] == reuse["n_reuse"].tolist()
    assert [value(r["p50"]) for r in shown] == pytest.approx(reuse["p50"].astype(float).tolist())
    matrix = route.matrix(decode_rows, "experts", None)
    rows = tables.records("matrix")
    assert len(rows) == len(matrix) == route.count_steps(decode_rows)
    assert [r["L0"][0] for r in rows] == matrix["L0"].tolist()
    # The replay validation at the run's budget (2 MiB) and the io trace's latency.
    validation = {r["source"][0]: r for r in tables.records("replay validation")}
    assert value(validation["lru replay @ 2 MiB"]["hit_pct_cum"]) == pytest.approx(
        value(validation["trace residency column"]["hit_pct_cum"])
    )
    latency = op_traces.io_latency(bmoe.load(folder / "run.io.csv"))
    shown_latency = tables.figures("io latency_us")
    assert {k: value(v) for k, v in shown_latency.items()} == pytest.approx(latency)


def test_replay_in_the_report_matches_the_reference(tmp_path, corpus):
    folder = corpus / "native-tiny"
    _, tables = make_report(
        tmp_path, str(folder / "pf.route.csv"), "--metrics", str(folder / "pf.csv")
    )
    # reference: "validation @ 3 MiB: LRU replay = 32.9% cumulative (35.2% decode-only)"
    reference = (corpus / "reference" / "native-tiny.pf.replay.txt").read_text()
    cum, dec = re.search(r"= ([\d.]+)% cumulative \(([\d.]+)% decode-only\)", reference).groups()
    lru = next(r for r in tables.records("replay validation") if r["source"][0].startswith("lru"))
    assert f"{value(lru['hit_pct_cum']):.1f}" == cum
    assert f"{value(lru['hit_pct_decode']):.1f}" == dec
    curve = {value(r["budget_mib"]): r for r in tables.records("replay curve")}
    assert f"{value(curve[3.0]['lru']):.1f}" == "35.2"  # the reference table's 3 MiB lru row


def test_compute_trace_report(tmp_path, corpus):
    from bmoe.analyze.op_traces import analyze_compute

    folder = corpus / "native-tiny"
    page, tables = make_report(
        tmp_path, str(folder / "ct.compute.csv"), "-m", str(folder / "ct.csv")
    )
    assert_offline(page, tables)
    views = analyze_compute(
        bmoe.load(folder / "ct.compute.csv"), metrics=quiet(bmoe.load, folder / "ct.csv")
    )
    shown = tables.records("compute by_class")
    by_class = {r["op_class"][0]: value(r["ms_per_token"]) for r in shown}
    expected = views["by_class"].set_index("op_class")["ms_per_token"].to_dict()
    assert by_class == pytest.approx(expected)
    assert "measured, not a residual" in page  # the granularity's caveat


def test_sweep_report_ranks_and_attributes(tmp_path):
    from bmoe.analyze.stall import stall_by_run
    from bmoe.analyze.sweep import per_cell, rank_cells

    root = bench_sweep("tiny-cache-lanes")
    page, tables = make_report(tmp_path, str(root))
    assert_offline(page, tables)
    archive = bmoe.load_archive(root)
    ranked = rank_cells(archive.cells)
    shown = tables.records("ranking")
    assert [r["cell"][0] for r in shown] == ranked["cell"].tolist()
    assert [value(r["mean"]) for r in shown] == pytest.approx(ranked["mean"].tolist())
    assert [value(r["sd"]) for r in shown] == pytest.approx(ranked["sd"].tolist())
    stall = per_cell(archive.cells, stall_by_run(archive.metrics_runs())).set_index("cell")
    for row in tables.records("stall by cell"):
        cell = row["cell"][0]
        for col in ("wall_ms", "compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms"):
            assert value(row[col]) == pytest.approx(stall.loc[cell, col]), (cell, col)
    assert "[grid]" in page and "cache_mb = [0, 1, 2, 4, 8]" in page  # the resolved config
    noisy = int((ranked["cv_pct"] > 25).sum())
    if noisy:  # the caveat the spread raises, counted independently
        assert f"the repeats of {noisy} of {len(ranked)} cells disagree" in page
    assert "Ranking by tok_s_mean" in page  # the verdict, before the tables
    assert page.index("Ranking by tok_s_mean") < page.index('data-view="ranking"')
    neighbours = tables.records("neighbours")
    assert len(neighbours) == len(ranked) - 1
    said = ("faster than", "not distinguishable", "not measurable", "too few repeats")
    for r, (_, above), (_, below) in zip(neighbours, ranked.iterrows(), ranked.iloc[1:].iterrows(),
                                         strict=False):  # fmt: skip
        sentence = r["sentence"][0]
        assert sum(phrase in sentence for phrase in said) == 1, sentence
        if "too few repeats" in sentence:  # fewer than three runs on one side
            assert min(above["n"], below["n"]) < 3
        elif "not measurable" in sentence:  # no bounds printed, however wide they were
            assert value(r["ratio_low"]) is None and value(r["ratio_high"]) is None
        else:  # a usable interval: narrower than the ratio
            width = value(r["ratio_high"]) - value(r["ratio_low"])
            assert 0 <= width <= value(r["ratio"])
    assert "Two checks look at the execution order" in page


def test_sweep_report_with_traces_checks_the_recorded_hit_rate(tmp_path):
    from bmoe.analyze.replay import recorded_vs_replay

    root = bench_sweep("small-traces")
    archive = bmoe.load_archive(root)
    first = archive.runs()[0].run
    page, tables = make_report(tmp_path, str(root), "--run", first)
    assert_offline(page, tables)
    rows = {r["run"][0]: r for r in tables.records("recorded vs replay")}
    assert set(rows) == {r.run for r in archive.runs()}
    for run in archive.runs():
        budget = float(run.params["cache_mb"])
        expected = recorded_vs_replay(run.trace("route"), budget, run.metrics.summary)
        for key in ("recorded_hit_pct_decode", "lru_hit_pct_decode", "mrc_hit_pct_decode"):
            assert value(rows[run.run][key]) == pytest.approx(expected[key]), (run.run, key)
    assert "matrix" in tables.views  # the run shown in full brings its routing matrix
    assert "instrumented" in page


def test_loose_folder_report(tmp_path, corpus):
    page, tables = make_report(tmp_path, str(corpus / "native-tiny"))
    assert_offline(page, tables)
    assert len(tables.records("ranking")) == 7
    assert "loose files" in page


def test_report_refuses_what_it_cannot_show(tmp_path, corpus, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(corpus / "native-tiny" / "run.out"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a report takes a metrics CSV" in err and len(err.strip().splitlines()) == 1
    assert main(["report", str(corpus / "native-tiny" / "run.csv"), "-o", "r.txt"]) == 2
    assert "name it .html" in capsys.readouterr().err
    sweep = bench_sweep("tiny-cache-lanes")
    assert main(["report", str(sweep), "--outcome", "speed", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{sweep}: unknown outcome 'speed' (valid outcomes: tok_s_mean, " in err
    assert not out.exists()
