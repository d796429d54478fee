"""Every CLI command on hostile input: damaged real files, values outside the contract and
damaged sweep folders (tests/hostile_inputs.py makes them). Whatever the input, a command ends
with 0, 1 (findings) or 2 (a one-line error), never a traceback or an internal error (3)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import ROOT
from hostile_inputs import (
    FILE_COMMANDS,
    Case,
    argv,
    commands,
    file_cases,
    fixtures,
    materialize,
    run_in_process,
    sweep_cases,
)

SWEEP = ROOT / "bench-data" / "2026-11-29-small-traces"


def _check(case: Case, name: str, args: list[str]) -> None:
    result = run_in_process(args)
    where = f"{name} on {case.name} ({case.what}): bmoe {' '.join(args)}"
    assert result.traceback is None, f"{where}\n{result.traceback}"
    assert result.code in (0, 1, 2), f"{where}: exit {result.code}\n{result.err}"
    if result.code == 2:  # one line naming the problem, never a dump
        lines = [ln for ln in result.err.splitlines() if ln.startswith("error:")]
        assert lines, f"{where}: exit 2 without an error line:\n{result.err}"


def _sample(cases: list[Case], n: int, seed: int) -> list[Case]:
    """`n` cases, one of each kind of damage first (a random one of each `what` prefix)."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.kind, case.what.split("-")[0]), []).append(case)
    picked = [rng.choice(group) for group in groups.values()]
    rng.shuffle(picked)
    picked = picked[:n]
    rest = [c for c in cases if c not in picked]
    return picked + rng.sample(rest, max(0, min(len(rest), n - len(picked))))


def _run_all(
    cases: list[Case], tmp_path: Path, every: bool = False, second_round: bool = True
) -> int:
    from conftest import CORPUS

    extra = fixtures(CORPUS, tmp_path) if CORPUS.is_dir() else {}
    runs = 0
    for case in cases:
        path = materialize(case, tmp_path)
        for i, (name, template) in enumerate(commands(case, every, second_round)):
            out = tmp_path / f"{case.name}.out{i}"
            out.mkdir()
            _check(case, name, argv(template, path, out, extra))
            runs += 1
    return runs


def test_every_command_on_damaged_files(corpus: Path, tmp_path: Path) -> None:
    cases = _sample(file_cases(corpus, big_value=1 << 16), 30, seed=1)
    assert _run_all(cases, tmp_path, second_round=False) >= 180


def test_sweep_commands_on_damaged_folders(tmp_path: Path) -> None:
    if not SWEEP.is_dir():
        pytest.skip("no archived sweep in bench-data")
    cases = sweep_cases(SWEEP)
    assert _run_all(cases, tmp_path, second_round=False) == 4 * len(cases)


@pytest.mark.slow
def test_history_of_damaged_folders(corpus: Path, tmp_path: Path) -> None:
    """Every sweep command, the newer ones included, on each damaged sweep folder (the newer
    ones take the corpus's route trace beside the folder, so the test needs the corpus)."""
    if not SWEEP.is_dir():
        pytest.skip("no archived sweep in bench-data")
    cases = sweep_cases(SWEEP)
    assert _run_all(cases, tmp_path) == sum(len(commands(c)) for c in cases)


@pytest.mark.slow
def test_second_round_cases(corpus: Path, tmp_path: Path) -> None:
    """A sample of each second-round family: Parquet schemas, header and control-character
    damage, device profiles, configurations asking for unbounded work, special paths."""
    from hostile_inputs import (
        config_cases,
        parquet_cases,
        profile_cases,
        special_cases,
        text_cases,
    )

    rng = random.Random(3)
    cases = [
        *rng.sample(parquet_cases(corpus), 12),
        *rng.sample(text_cases(corpus), 12),
        *rng.sample(profile_cases(corpus), 12),
        *rng.sample(config_cases(), 4),
        *special_cases(corpus, sparse_gb=1),
    ]
    assert _run_all(cases, tmp_path) >= 150


@pytest.mark.slow
def test_every_command_on_every_damaged_file(corpus: Path, tmp_path: Path) -> None:
    cases = _sample(file_cases(corpus, big_value=1 << 16), 400, seed=2)
    assert _run_all(cases, tmp_path, every=True, second_round=False) > 5000


# ----------------------------------------------------------------------------- regressions
# One test per kind of failure the audit found, on a file written here.

MARKUP_TEXT = "[bold]b[/][link=http://x]y[/link][/]"


def _with_model(src: Path, dest: Path, model: str) -> Path:
    data = src.read_bytes().replace(b"model=/tmp/tiny-moe.gguf", f"model={model}".encode(), 1)
    assert model.encode() in data
    dest.write_bytes(data)
    return dest


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["validate"],
        ["analyze", "route"],
        ["analyze", "replay", "--budgets", "1"],
        ["analyze", "drop"],
    ],
)
def test_markup_in_a_file_is_printed_as_text(corpus: Path, tmp_path: Path, args) -> None:
    trace = _with_model(corpus / "native-tiny/run.route.csv", tmp_path / "t.route.csv",
                        MARKUP_TEXT)  # fmt: skip
    result = run_in_process([*args, str(trace)])
    assert result.traceback is None and result.code in (0, 1), result.err
    if args in (["info"], ["analyze", "route"]):
        assert MARKUP_TEXT in result.out  # a table cell, a header line: literally


def test_markup_in_an_error_and_a_warning_is_printed_as_text(corpus: Path, tmp_path: Path):
    bad = tmp_path / "bad.route.csv"
    bad.write_bytes(
        (corpus / "native-tiny/run.route.csv").read_bytes().replace(b"n_expert=8", b"n_expert=[/]")
    )
    result = run_in_process(["analyze", "route", str(bad)])
    assert result.code == 2 and result.traceback is None
    assert "n_expert='[/]' is not a count" in result.err
    (tmp_path / "[bold]").mkdir()
    cut = tmp_path / "[bold]" / "cut[red].route.csv"  # the name, too, is text from outside
    cut.write_bytes((corpus / "native-tiny/run.route.csv").read_bytes() + b"0,1,[link=x]")
    result = run_in_process(["analyze", "route", str(cut), "--format", "json"])
    assert result.code == 0 and result.traceback is None
    warning = [ln for ln in result.err.splitlines() if ln.startswith("warning:")]
    assert warning and "[bold]/cut[red].route.csv:304: last line is cut short" in warning[0]


def test_printers_take_text_literally(capsys) -> None:
    import warnings

    from bmoe.cli import _show_warning, fail

    exit_ = fail("a [/] b [bold]c\x1b[31m")
    assert exit_.exit_code == 2
    _show_warning("w [/] [link=x]y", UserWarning, "f.py", 1)
    with warnings.catch_warnings():
        err = capsys.readouterr().err
    assert "error: a [/] b [bold]c\\x1b[31m" in err  # ESC spelled out, not sent
    assert "warning: w [/] [link=x]y" in err


def test_table_cells_titles_and_headers_are_literal() -> None:
    import io

    import pandas as pd
    from rich.console import Console

    from bmoe.render.tables import render

    console = Console(record=True, width=200, file=io.StringIO())
    frame = pd.DataFrame({"[bold]col": ["[/]", "[link=x]y[/link]", "z" * 5000]})
    render({"[red]view": frame}, "table", console)
    text = console.export_text()
    for literal in ("[bold]col", "[/]", "[link=x]y[/link]", "[red]view"):
        assert literal in text
    assert "4600 more characters" in text and "z" * 401 not in text  # cut, not wrapped


def test_progress_shows_config_and_engine_text_literally() -> None:
    import io

    from rich.console import Console

    from bmoe.render.progress import LiveProgress, PlainProgress
    from bmoe.sweep.plan import Cell, Run

    run = Run(Cell("[/]cell", 0, {"model": "m"}, {}), 1, 1, False, 0)
    record = {"run": "[bold]r", "status": "failed", "duration_s": 1.0, "attempt": 1,
              "error": "engine said [/] \x1b[2J"}  # fmt: skip
    console = Console(record=True, width=160, file=io.StringIO())
    live = LiveProgress(console)
    live.sweep_started(2, 0, ["[link=x]t"])
    live.run_started("[link=x]t", run, 1)
    console.print(live)
    live.run_finished("[link=x]t", run, record)
    live.message("note [/]")
    console.print(live)
    text = console.export_text()
    assert "[/]cell/r1" in text and "[link=x]t" in text and "[bold]r: failed" in text
    assert "note [/]" in text
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.sweep_started(1, 0, ["t"])
    plain.run_finished("t", run, record)
    assert "engine said [/] \\x1b[2J" in out.getvalue()


def test_special_files_are_refused_not_waited_on(tmp_path: Path) -> None:
    import os
    import signal

    fifo = tmp_path / "pipe.route.csv"
    os.mkfifo(fifo)

    def hang(signum, frame):
        raise TimeoutError("blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hang)
    try:
        for name, template in FILE_COMMANDS.items():
            signal.alarm(10)
            result = run_in_process(argv(template, fifo, tmp_path))
            signal.alarm(0)
            assert result.code == 2, (name, result.err)
            assert "FIFO" in result.err or name == "run", (name, result.err)  # run: no model
        result = run_in_process(["info", "/dev/zero"])
        assert result.code == 2 and "character device" in result.err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_no_command_writes_over_its_input(corpus: Path, tmp_path: Path) -> None:
    io_trace = tmp_path / "x.io.csv"
    io_trace.write_bytes((corpus / "native-tiny/run.io.csv").read_bytes())
    route = tmp_path / "x.route.csv"
    route.write_bytes((corpus / "native-tiny/run.route.csv").read_bytes())
    before = {p: p.read_bytes() for p in (io_trace, route)}
    for args in (
        ["export", "trace", str(io_trace), "-o", str(io_trace)],
        ["analyze", "replay", str(route), "--budgets", "1", "--csv", str(route)],
    ):
        for force in ([], ["--force"]):
            result = run_in_process(args + force)
            assert result.code == 2 and "is also an input" in result.err, (args, result.err)
    assert {p: p.read_bytes() for p in before} == before


def test_existing_outputs_need_force(corpus: Path, tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "run.csv").write_bytes((corpus / "native-tiny/run.csv").read_bytes())
    out = tmp_path / "out"
    result = run_in_process(["convert", str(tmp_path / "a/run.csv"), str(tmp_path / "b/run.csv"),
                             "-o", str(out)])  # fmt: skip
    assert result.code == 2 and "would also be written to" in result.err
    assert (out / "run.parquet").is_file()  # the first one, once
    parquet = out / "run.parquet"
    back = out / "run.csv"
    back.write_text("keep me")
    result = run_in_process(["convert", str(parquet), "--to", "csv"])
    assert result.code == 2 and "pass --force" in result.err and back.read_text() == "keep me"
    result = run_in_process(["convert", str(parquet), "--to", "csv", "--force"])
    assert result.code == 0 and back.read_bytes() == (corpus / "native-tiny/run.csv").read_bytes()
    json_out = tmp_path / "t.json"
    json_out.write_text("{}")
    args = ["export", "trace", str(corpus / "native-tiny/run.io.csv"), "-o", str(json_out)]
    assert run_in_process(args).code == 2 and json_out.read_text() == "{}"
    assert run_in_process([*args, "--force"]).code == 0 and json_out.stat().st_size > 2


def test_drop_work_follows_the_rows_not_the_preamble(corpus: Path) -> None:
    from bmoe.analyze.drop import drop_replay
    from bmoe.formats.route import read_route_trace

    trace = read_route_trace(corpus / "native-tiny/drop.route.csv")
    honest = drop_replay(trace)["decode"]
    trace.meta["n_expert_used"] = 100_000  # a declared number, far beyond the rows
    inflated = drop_replay(trace)["decode"]
    widest = trace.rows.groupby(["turn", "phase", "step", "layer"]).size().max()
    assert len(inflated["static_k"]) == len(honest["static_k"]) == widest - 1
    assert inflated["survivors"].shape[1] <= widest + 2  # frac, and counts 0..widest


def test_drop_without_slot_is_an_error(corpus: Path, tmp_path: Path) -> None:
    from hostile_inputs import _drop_column

    trace = tmp_path / "noslot.route.csv"
    trace.write_bytes(_drop_column((corpus / "native-tiny/run.route.csv").read_bytes(), "slot"))
    result = run_in_process(["analyze", "drop", str(trace)])
    assert result.code == 2 and "needs the slot column" in result.err


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_validate_flags_wall_ms_that_is_no_time(corpus: Path, tmp_path: Path, value) -> None:
    from hostile_inputs import _set_column

    run = tmp_path / "run.csv"
    run.write_bytes(_set_column((corpus / "native-tiny/run.csv").read_bytes(), "wall_ms", value))
    result = run_in_process(["validate", str(run)])
    assert result.code == 1 and "wall_ms is nan, inf or 0" in result.out


def test_perfetto_export_is_strict_json_with_nan_in_the_preamble(corpus, tmp_path) -> None:
    import json

    src = (corpus / "native-tiny/run.io.csv").read_bytes()
    io_trace = tmp_path / "nan.io.csv"
    io_trace.write_bytes(src.replace(b"overlap=0", b"overlap=nan o_direct=inf", 1))
    out = tmp_path / "t.json"
    assert run_in_process(["export", "trace", str(io_trace), "-o", str(out)]).code == 0

    def refuse(name):
        raise AssertionError(f"{name} in the export")

    doc = json.loads(out.read_text(), parse_constant=refuse)
    assert doc["otherData"]["overlap"] is None


def test_markdown_cells_keep_the_table_whole() -> None:
    import pandas as pd

    from bmoe.render.tables import render_markdown

    text = render_markdown({"v": pd.DataFrame({"prompt": ["a|b\nc<script>"], "n": [1]})})
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(rows) == 3 and "<script>" not in text and "a\\|b<br>c&lt;script&gt;" in rows[2]


def test_contamination_of_a_relative_folder(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("run.csv", "pf.csv"):
        (folder / name).write_bytes((corpus / "native-tiny" / name).read_bytes())
    monkeypatch.chdir(tmp_path)
    result = run_in_process(["analyze", "contamination", "runs"])
    assert result.code == 0, result.err
    assert "run.csv" in result.out and "pf.csv" in result.out  # the cells, named


def test_plots_and_reports_never_overwrite_without_force(corpus: Path, tmp_path: Path) -> None:
    tiny = corpus / "native-tiny"
    plot = tmp_path / "p.png"
    beside = {"timeline": tmp_path / "p.timeline.png", "mrc": tmp_path / "p.mrc.png"}
    plot_commands = {
        "compute": ["analyze", "decode", "compute", str(tiny / "ct.compute.csv")],
        "io": ["analyze", "decode", "io", str(tiny / "run.io.csv")],
        "replay": ["analyze", "replay", str(tiny / "run.route.csv"), "--budgets", "1", "--mrc"],
        "route": ["analyze", "route", str(tiny / "run.route.csv")],
        "stall": ["analyze", "stall", str(tiny / "run.csv")],
        "history": ["history", str(SWEEP), str(SWEEP)],
    }
    for name, args in plot_commands.items():
        plot.write_text("keep me")
        result = run_in_process([*args, "--plot", str(plot)])
        assert result.code == 2 and "pass --force" in result.err, (name, result.err)
        assert plot.read_text() == "keep me", name
        plot.unlink()
    for name, derived in (("io", beside["timeline"]), ("replay", beside["mrc"])):
        derived.write_text("keep me")  # the file drawn beside the plot is checked too
        result = run_in_process([*plot_commands[name], "--plot", str(plot)])
        assert result.code == 2 and str(derived) in result.err, (name, result.err)
        assert derived.read_text() == "keep me" and not plot.exists(), name
        derived.unlink()
    plot.write_text("keep me")
    result = run_in_process([*plot_commands["stall"], "--plot", str(plot), "--force"])
    assert result.code == 0, result.err
    assert plot.read_bytes().startswith(b"\x89PNG")

    page = tmp_path / "r.html"
    page.write_text("keep me")
    report = ["report", str(tiny / "run.csv"), "-o", str(page)]
    result = run_in_process(report)
    assert result.code == 2 and "pass --force" in result.err and page.read_text() == "keep me"
    result = run_in_process([*report, "--force"])
    assert result.code == 0 and "<html" in page.read_text().lower()
    # an input is never overwritten, --force or not (here through a link named .html)
    link = tmp_path / "link.html"
    link.symlink_to(tiny / "run.csv")
    for force in ([], ["--force"]):
        result = run_in_process(["report", str(link), "-o", str(link), *force])
        assert result.code == 2 and "is also an input" in result.err, result.err
    # several sweeps: the index and the page per sweep written beside it
    other = SWEEP.parent / "2026-11-29-tiny-cache-lanes"
    index = tmp_path / "h.html"
    beside_page = tmp_path / f"h-{other.name}.html"
    beside_page.write_text("keep me")
    result = run_in_process(["report", str(SWEEP), str(other), "-o", str(index)])
    assert result.code == 2 and "pass --force" in result.err and str(beside_page) in result.err
    assert beside_page.read_text() == "keep me" and not index.exists()


def test_sweep_plots_never_overwrite_without_force(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    args = ["analyze", "sweep", str(SWEEP.parent / "2026-11-29-tiny-cache-lanes"), "-f", "json",
            "--plots", str(plots)]  # fmt: skip
    assert run_in_process(args).code == 0
    drawn = sorted(plots.iterdir())
    assert drawn
    for path in drawn:
        path.write_text("keep me")
    result = run_in_process(args)
    assert result.code == 2 and "pass --force" in result.err
    assert all(path.read_text() == "keep me" for path in drawn)
    assert run_in_process([*args, "--force"]).code == 0
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in drawn)
