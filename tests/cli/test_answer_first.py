"""``bmoe profile`` and ``bmoe predict`` open on their answer: the headline on the first screen
of a 40-line, 80-column terminal and of a pipe, the caveats after it grouped with their
counts, runs named by their cell, units in the headers, and implausible fits flagged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze.device.checks import implausible_flash
from bmoe.analyze.device.fits import provenance
from bmoe.render.predict import caveat_lines, run_name

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "bench-data" / "2026-11-29-tiny-cache-lanes"
LATER = ROOT / "bench-data" / "2026-12-02-tiny-cache-lanes"
SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"
pytestmark = pytest.mark.skipif(not TINY.is_dir(), reason="bench-data absent")
SCREEN = 40


def _lines(*args: object, columns: int = 80) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "bmoe", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _headers(lines: list[str]) -> list[str]:
    """The column headers of each box table, a header broken over lines joined again: one
    string per table, its columns' headers separated by " | "."""
    out: list[str] = []
    rows: list[list[str]] = []
    inside = False
    for line in lines:
        if line.startswith("┏"):
            inside, rows = True, []
        elif line.startswith("┡"):
            inside = False
            columns = zip(*rows, strict=True)
            out.append(" | ".join(" ".join(w for w in col if w) for col in columns))
        elif inside:
            rows.append([cell.strip() for cell in line.strip("┃").split("┃")])
    return out


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory) -> Path:
    from bmoe.cli import main

    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    assert main(["profile", str(TINY), "-o", str(out), "-f", "json"]) == 0
    return out


def test_an_implausible_flash_fit_is_flagged() -> None:
    flags = implausible_flash(
        pd.DataFrame({"lanes": [1, 2], "mib_s": [31148.0, 539.0], "latency_ms": [0.01, 0.9]})
    )
    assert any("31,148 MiB/s is faster than flash" in f for f in flags), flags
    assert any("beside 539 MiB/s at 2 lanes (58x)" in f for f in flags), flags
    usual = pd.DataFrame({"lanes": [1, 2, 4], "mib_s": [319.0, 313.0, 622.0],
                          "latency_ms": [0.59, 1.2, 1.2]})  # fmt: skip
    assert implausible_flash(usual) == []


def test_caveats_of_many_runs_are_said_once_with_their_count() -> None:
    names = [
        f"bench-data/t/cells/cache_mb-{c}_io_threads-1-0a1b2c3{c}/r{k}/run.csv"
        for c in (2, 4)
        for k in (1, 2, 3)
    ]
    texts = [
        f"{n}: system warnings: {5 + i} other tasks were running on 2 CPUs before the run"
        for i, n in enumerate(names)
    ]
    texts.append("tracing: compute from the untraced runs")
    out = caveat_lines(texts, names)
    assert len(out) == 2, out
    assert "5-10 other tasks were running" in out[0] and "6 runs" in out[0], out
    assert "run.csv" not in out[0] and "cache_mb-2_io_threads-1/r1" in out[0]
    assert out[1] == "tracing: compute from the untraced runs"
    # a run of a sweep is named by its cell; a loose file by its name
    assert run_name(names[0]) == "cache_mb-2_io_threads-1/r1"
    assert run_name("phone/gemma.csv") == "gemma" and run_name("runs/run.csv") == "runs/run"


def test_a_term_of_many_runs_says_their_range_not_every_mean() -> None:
    means = {f"r{i}": 1.0 + i for i in range(45)}
    record = provenance(list(means), ["mgmt_ms"], {"runs_disagree_pct": 4400.0,
                                                   "run_means": means})  # fmt: skip
    assert "run means 1 to 45 over 45 runs" in record["why"], record["why"]
    few = provenance(["a", "b"], ["mgmt_ms"], {"runs_disagree_pct": 50.0,
                                               "run_means": {"a": 1.0, "b": 1.5}})  # fmt: skip
    assert "run means 1, 1.5" in few["why"]


def test_profile_opens_on_its_answer(tiny_profile: Path) -> None:
    lines = _lines("profile", TINY)
    assert max(map(len, lines)) <= 80
    first = "\n".join(lines[:SCREEN])
    assert lines[0].startswith("profile: 45 runs of tiny.gguf"), lines[0]
    weigh = next(i for i, line in enumerate(lines) if line.startswith("to weigh ("))
    assert weigh < 15
    head = "\n".join(lines[:weigh])
    for figure in ("compute", "ms/token", "flash", "MiB/s", "model error"):
        assert figure in head, (figure, head)
    # the caveats come grouped, on the first screen, before the long tables
    caveats = [line for line in lines if re.match(r"  (caveat|unsettled|absent|note): ", line)]
    assert 0 < len(caveats) <= 10, caveats
    assert "contended runs' token times" in first
    assert "run.csv" not in "\n".join(lines)  # runs are named by their cell
    assert not re.search(r"run means( [\d.]+,){6}", "\n".join(lines))
    # units in the headers of the terms, flash, runs and held-out tables
    headers = _headers(lines)
    assert any("unit" in h and "value" in h for h in headers), headers
    assert any("latency ms" in h and "overhead ms" in h and "MiB/s" in h for h in headers)
    assert any("tok/s" in h and "runs" in h and "config" in h for h in headers), headers
    # one row per configuration (15), not per run (45)
    assert sum(1 for line in lines if line.startswith("│ 8M 4L ")) == 2  # runs and held out


def test_predict_opens_on_the_best_configuration(small_profile: Path) -> None:
    trace = next((SMALL / "cells").glob("cache_mb-64_io_threads-1*/r1/run.route.csv"))
    device = small_profile
    grid = ["-g", "cache_mb=64,256,1024", "-g", "io_threads=1,4", "-g", "prefetch=0,1"]
    lines = _lines("predict", trace, "-p", device, *grid)
    assert max(map(len, lines)) <= 80
    assert lines[0].startswith("best predicted: "), lines[0]
    assert re.search(r"\d+\.\d+ tok/s", lines[0]), lines[0]
    speed = next(i for i, line in enumerate(lines) if line.startswith("speed"))
    caveat = next(i for i, line in enumerate(lines) if re.match(r"  (caveat|unsettled)", line))
    assert speed < SCREEN and speed < caveat
    headers = _headers(lines)
    assert any("compute ms" in h and "flash ms" in h for h in headers), headers
    assert any("MiB/token" in h for h in headers), headers


def test_predict_against_opens_on_its_error(tiny_profile: Path) -> None:
    files = sorted(LATER.glob("cells/*/r1/run.csv"))
    lines = _lines("predict", "-p", tiny_profile, "--against", *files)
    assert max(map(len, lines)) <= 80
    assert lines[0].startswith("against 15 measured cells: "), lines[0]
    assert "median |error|" in lines[0] or "median |error|" in lines[1]
    table = next(i for i, line in enumerate(lines) if line.startswith("measured vs predicted"))
    assert table < 8
    assert "run.csv" not in "\n".join(lines) and "cache_mb-0_io~" not in "\n".join(lines)


def test_a_stable_cell_has_no_label_and_a_comparison_with_one_does_not_fail() -> None:
    """A cell the verdict finds stable has no reason (NaN): it was labelled "nan", and next
    to a cell of the profile's own runs the label's join failed (predict --against of a
    tune's folder stopped with an internal error)."""
    from bmoe.analyze.device.compare import _measurement_labels

    ok = pd.DataFrame({"cell": ["a", "a", "a", "b"], "tok_s_mean": [100.0, 101.0, 99.0, 50.0],
                       "status": "ok", "repeat": [1, 2, 3, 1], "order": [0, 1, 2, 3]})  # fmt: skip
    assert _measurement_labels(ok, pd.Series(["a", "b"])) == [None, None]
