"""``bmoe analyze route`` end to end, and the route plots."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure
from rich.console import Console

from bmoe.analyze import route
from bmoe.cli import main
from bmoe.formats.route import read_route_trace
from bmoe.render import route as text
from bmoe.render.plots import route as plots

ROOT = Path(__file__).resolve().parents[2]
DROP = "native-tiny/drop.route.csv"
GEMMA = "route-trace/gemma.route.csv"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["analyze", "route", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_one_object_of_views(corpus: Path, capsys) -> None:
    code, out, err = run(capsys, corpus / DROP, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == list(route.DEFAULT_VIEWS)
    assert data["reuse"][0] == {"layer": 0, "n_reuse": 88, "p50": 5, "p90": 5, "max": 9,
                                "never_2nd": 0}  # fmt: skip
    assert data["overlap"][-1]["layer"] == "ALL"
    assert "dropping was ON" in err  # caveats go to stderr, stdout stays parseable


def test_csv_blocks_keep_the_stable_columns(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, corpus / DROP, "-f", "csv", "--view", "reuse,overlap,cache,entropy,bytes,hot"
    )
    assert code == 0
    headers = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# view="):
            headers[line[len("# view=") :]] = lines[i + 1]
    assert headers["reuse"] == "layer,n_reuse,p50,p90,max,never_2nd"
    assert headers["overlap"] == "layer,lag_1,lag_2,lag_4,lag_8"
    assert headers["cache"] == "layer,miss_pct,hit_pct,prefetch_pct,routings"
    assert headers["entropy"] == "layer,entropy_bits,top1_pct"
    assert headers["bytes"].startswith("layer,read_mib,expert_mib,dense_mib")
    assert headers["hot"] == "layer,unique,coverage_pct,top"


def test_table_shows_caveats_figures_and_matrix(corpus: Path, capsys) -> None:
    code, out, _ = run(capsys, corpus / DROP, "--view", "all")
    assert code == 0
    assert "NOTE" in out and "123 of 384 routings" in out
    assert "6:27 2:11 3:11" in out  # hot listing of layer 0
    assert "showing the first 20 steps" in out
    assert "*4 1" in out  # step 104, layer 1 of the matrix


def test_matrix_window_and_markdown(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, corpus / GEMMA, "--view", "matrix", "--cells", "hit", "--steps", "29-31",
        "--layers", "0,1", "-f", "markdown",
    )  # fmt: skip
    assert code == 0
    assert "| step | L0 | L1 |" in out
    assert "| 29 | MMMMMM | MMMMMM |" in out and "| 30 | MMHHHH | HMMMMM |" in out
    assert "showing the first" not in out


def test_empty_phase_is_said(corpus: Path, capsys) -> None:
    code, out, _ = run(capsys, corpus / GEMMA, "--steps", "0-5")
    assert code == 0
    assert "leaves no rows" in out and "steps 29-156" in out


@pytest.mark.parametrize(
    "args",
    [["--view", "nope"], ["--layers", "3-a"], ["--phase", "warmup"], ["--cells", "x"],
     ["-f", "xml"], ["--plot", "out.txt"]],
)  # fmt: skip
def test_bad_options_are_one_line_errors(corpus: Path, capsys, tmp_path, args) -> None:
    args = [str(tmp_path / a) if a == "out.txt" else a for a in args]
    code, _, err = run(capsys, corpus / DROP, *args)
    assert code == 2
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("view", "kind", "expected"),
    [
        ("default", "auto", "reuse"),
        ("workset", "auto", "workset"),
        ("matrix", "auto", "heatmap"),
        ("overlap", "auto", "overlap"),
        ("hot", "auto", "hot"),
        ("default", "reuse-bytes", "reuse-bytes"),
        ("sanity", "auto", "reuse"),
    ],
)
def test_plot_is_written(corpus: Path, capsys, tmp_path, view, kind, expected) -> None:
    out = tmp_path / "fig.png"
    args = ["--view", view, "--plot", out, "--plot-kind", kind, "--budget-mib", "4"]
    if view == "matrix":
        args += ["--cells", "hit"]
    code, _, err = run(capsys, corpus / DROP, *args)
    assert code == 0
    assert out.stat().st_size > 10_000
    assert f"wrote {expected} plot" in err


def _labels(fig: Figure) -> list[str]:
    ax = fig.axes[0]
    return [ax.get_xlabel(), ax.get_ylabel(), ax.get_title() or fig._suptitle.get_text()]


def test_plots_carry_titles_and_units(corpus: Path) -> None:
    trace = route.select(read_route_trace(corpus / DROP), "decode")
    figures = [
        plots.reuse_distance_plot(route.reuse_distances(trace)),
        plots.reuse_distance_plot(route.reuse_bytes_distances(trace), "bytes", 2.0),
        plots.routing_heatmap(route.routing_grid(trace)),
        plots.routing_heatmap(route.routing_grid(trace, "expert"), "expert"),
        plots.workset_growth_plot(route.workset_curve(trace), 2.0),
        plots.hot_concentration_plot(route.expert_counts(trace), 8),
        plots.overlap_plot(route.overlap(trace, (1, 2, 4, 8, 16)), 25.0),
    ]
    for fig in figures:
        assert all(_labels(fig)), _labels(fig)
    assert "MiB" in figures[1].axes[0].get_xlabel()
    assert "%" in figures[5].axes[0].get_ylabel()


def test_matrix_bands_fit_the_console() -> None:
    frame = pd.DataFrame(
        {"step": [1, 2], **{f"L{i}": ["10 20 30 40", "*10 5 6 7"] for i in range(30)}}
    )
    buf = io.StringIO()
    console = Console(file=buf, width=100, color_system=None)
    text.print_matrix(console, frame)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum("=== step x layer matrix" in line for line in lines) == 5  # 30 layers, 6 a band


def test_prefill_cache_note(corpus: Path, capsys) -> None:
    code, out, _ = run(capsys, corpus / GEMMA, "--phase", "prefill", "--view", "cache")
    assert code == 0
    assert "100.0" in out and "over-counts reads" in " ".join(out.split())
    code, out, _ = run(capsys, corpus / GEMMA, "--view", "cache")
    assert "over-counts" not in out


_NO_PANDAS = """
import contextlib, io, sys
from bmoe.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(code, "pandas" in sys.modules, len(out.getvalue()))
"""


def test_table_output_does_not_import_pandas(corpus: Path, capsys) -> None:
    """The command line's default views are numpy columns: pandas is imported only for the
    matrix, the other formats or a file the careful reader must read; the text is the same."""
    args = ["analyze", "route", str(corpus / GEMMA), "--phase", "all"]
    fresh = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS, *args],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
    ).stdout.split()  # fmt: skip
    code, out, _ = run(capsys, *args[2:])
    assert fresh == ["0", "False", str(len(out))]
    assert code == 0


def write_gaps_trace(path: Path) -> Path:
    """A route trace whose layer 0 routes experts 1, 2 then 3, 4 then 5, 6 (none comes back)
    and layer 1 routes 1, 2 every step (decode steps 1-3)."""
    from bmoe.formats.route import RouteTrace, write_route_trace

    rows = [
        (0, 1, step, layer, slot, expert, 0.5, 0, 1048576, 0)
        for step in (1, 2, 3)
        for layer in (0, 1)
        for slot, expert in enumerate((2 * step - 1, 2 * step) if layer == 0 else (1, 2))
    ]
    columns = ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency",
               "expert_bytes", "dropped"]  # fmt: skip
    frame = pd.DataFrame(rows, columns=columns)
    sizes = pd.DataFrame({"layer": [0, 1], "expert_bytes": 1048576, "dense_bytes": 2097152})
    meta = {"model": "m", "arch": "a", "n_layer": 2, "n_expert": 8, "n_expert_used": 2}
    write_route_trace(RouteTrace(None, 1, meta, sizes, frame), path)
    return path


def test_a_layer_without_reuse_shows_its_distances_as_unknown_in_every_format(
    tmp_path: Path, capsys
) -> None:
    """Layer 0's experts never come back, layer 1's come back every step (see
    :func:`write_gaps_trace`): layer 0's p50/p90/max are unknown, not 0 or -1 (a dash in the
    table, null in JSON, an empty field in CSV, pandas' missing integer in the library)
    while layer 1's are 1; the same with --stream, which joins layers read in passes."""
    path = write_gaps_trace(tmp_path / "gaps.route.csv")

    frame_view = route.reuse(read_route_trace(path))
    assert str(frame_view["p50"].dtype) == "Int64"
    assert frame_view["p50"].isna().tolist() == [True, False]
    assert frame_view["n_reuse"].tolist() == [0, 4]
    for stream in ((), ("--stream",)):
        code, out, _ = run(capsys, path, "--view", "reuse", "-f", "json", *stream)
        assert code == 0
        data = json.loads(out)["reuse"]
        assert [(r["p50"], r["p90"], r["max"]) for r in data] == [(None, None, None), (1, 1, 1)]
        assert data[0]["never_2nd"] == 6
        code, out, _ = run(capsys, path, "--view", "reuse", "-f", "csv", *stream)
        assert "\n0,0,,,,6\n" in out and "\n1,4,1,1,1,0\n" in out
        code, out, _ = run(capsys, path, "--view", "reuse", *stream)
        first = next(line for line in out.splitlines() if line.strip(" │|").startswith("0 "))
        assert first.count("—") == 3, first
