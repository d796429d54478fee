"""What a newcomer trips over in a first hour: a missing model found before any run, a flag
written with ``_`` answered with the one meant, a file that is no sweep named as such, help
that keeps its lists and examples whole, headers broken only where they may be, the sweep's
last line whole in a pipe, a run report that opens on its figures, plots whose colours and
ticks read."""

from __future__ import annotations

import io
import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from bmoe.cli import cli_command, main, reflowed, register

ROOT = Path(__file__).resolve().parents[2]
SMALL_RUN = (
    ROOT / "bench-data" / "2026-11-29-small-traces" / "cells" / "cache_mb-64_io_threads-1-281579ec"
)
sys.path.insert(0, str(ROOT / "tests"))


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_dry_run_refuses_a_model_that_is_not_there(tmp_path, capsys) -> None:
    cfg = _write(
        tmp_path / "sweep.toml",
        """\
        [sweep]
        name = "nomodel"
        engine = "embedded"
        output = "out"

        [base]
        model = "../models/tiny.gguf"
        n_predict = 4

        [grid]
        cache_mb = [1, 2]
        """,
    )
    for extra in (["--dry-run"], []):  # the dry run checks what the sweep would find
        assert main(["sweep", str(cfg), *extra]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{cfg}:7: base.model: " in err, err
        assert f"{tmp_path.parent / 'models' / 'tiny.gguf'}: no such model file" in err, err
        assert "bmoe model synth" in err and "--preset tiny" in err
        assert err.count("no such model file") == 1  # said once, not once per attempt
    assert not (tmp_path / "out").exists()  # refused before a folder was made


def test_a_flag_written_with_underscores_is_answered_with_the_one_meant(capsys) -> None:
    assert main(["run", "--cache_mb", "2"]) == 2
    assert "unknown flag '--cache_mb' (did you mean '--cache-mb'?)" in capsys.readouterr().err
    assert main(["run", "-m", "x.gguf", "--io-thread", "2"]) == 2
    assert "did you mean '--io-threads'?" in capsys.readouterr().err


def test_analyze_sweep_of_a_file_that_is_no_sweep_says_so(tmp_path, capsys) -> None:
    people = tmp_path / "people.csv"
    people.write_text("name,age\nada,36\n")
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "x"\n')
    for path in (people, other):
        assert main(["analyze", "sweep", str(path)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{path}: not a sweep folder or configuration" in err, err
        assert "TOML" not in err.split("configuration")[0]


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_no_help_cuts_a_list_short_at_80_or_100_columns(capsys, monkeypatch) -> None:
    register()
    paths = [p for p, cmd in _commands(cli_command()) if p and not hasattr(cmd, "commands")]
    assert len(paths) > 20
    for width in (80, 100):
        monkeypatch.setenv("COLUMNS", str(width))
        for path in paths:
            if path == ("run",):  # the engine's own flag table, printed as text
                continue
            assert main([*path, "--help"]) == 0
            out = capsys.readouterr().out
            assert "…" not in out, (path, width, [ln for ln in out.splitlines() if "…" in ln])


def test_each_help_example_keeps_a_line_of_its_own() -> None:
    register()
    merged = []
    for path, cmd in _commands(cli_command()):
        lines = reflowed(cmd.help or "").splitlines()
        for line, after in itertools.pairwise(lines):
            if line.startswith("Example:") and after and not after.startswith(("Example:", "(")):
                merged.append((" ".join(path), after))
    assert not merged, merged


def test_a_table_without_rows_breaks_its_headers_where_a_full_one_would() -> None:
    from bmoe.render.tables import print_table

    out = io.StringIO()
    console = Console(file=out, width=60, color_system=None)
    columns = [(h, True, []) for h in ("before", "after", "change_pct", "ratio_low", "ratio_high")]
    print_table(console, [("cell", False, []), *columns], title="regressions")
    text = out.getvalue()
    assert not re.search(r"ratio_hig\b|ratio_lo\b|change_pc\b", text), text
    assert "(none)" in text


def test_the_sweep_says_where_its_folder_is_on_one_line_in_a_pipe(tmp_path) -> None:
    from sweep_helpers import install_fake_cli

    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF stand-in")
    out = tmp_path / "a-rather-long-output-folder-name-for-the-archives"
    cfg = _write(
        tmp_path / "sweep.toml",
        f"""\
        [sweep]
        name = "one-line"
        engine = "native"
        output = "{out}"
        timeout_s = 30

        [base]
        model = "tiny.gguf"
        n_predict = 4

        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )
    done = subprocess.run(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg)], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "80"}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "runs complete" in ln]
    folder = next(out.iterdir())
    assert line.endswith(f"-> {folder}"), line


@pytest.mark.skipif(not SMALL_RUN.is_dir(), reason="bench-data absent")
def test_a_run_report_opens_on_its_figures_in_plain_words(tmp_path) -> None:
    page = tmp_path / "run.html"
    assert main(["report", str(SMALL_RUN / "r1" / "run.csv"), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    lead = re.search(r'<p class="verdict">([^<]*)</p>', html)
    assert lead is not None and html.index(lead.group(0)) < html.index("<nav>")
    for figure in ("12 tokens at 2.30 tok/s", "cache hit 0.0 % at 64 MiB", "flash wait"):
        assert figure in lead.group(1), lead.group(1)
    assert "refuse:" not in html and "a comparison of runs refuses this one" in html


def _distance(a: str, b: str) -> float:
    from matplotlib.colors import to_rgb

    return sum((x - y) ** 2 for x, y in zip(to_rgb(a), to_rgb(b), strict=True)) ** 0.5


def test_plot_colours_and_ticks_read() -> None:
    import pandas as pd
    from matplotlib.colors import to_rgb

    from bmoe.render.plots.runs import MEMORY_STYLE
    from bmoe.render.plots.sweep import outcome_lines

    anon, avail = MEMORY_STYLE["rss_anon_mib"], MEMORY_STYLE["mem_available_mib"]
    assert _distance(anon[1], avail[1]) > 0.35 and anon[2] != avail[2]
    cells = pd.DataFrame({"cache_mb": [0, 2, 0, 2], "io_threads": [1, 1, 2, 2],
                          "n": 3, "mean": [10.0, 20, 12, 24], "min": [9.0, 19, 11, 23],
                          "max": [11.0, 21, 13, 25]})  # fmt: skip
    fig = outcome_lines(cells, "cache_mb", "io_threads")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0, 2]  # the axis's values, not 0.25 steps
    for line in ax.get_lines():  # no line near white (viridis ends in a pale yellow)
        r, g, b = to_rgb(line.get_color())
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.75, line.get_color()
