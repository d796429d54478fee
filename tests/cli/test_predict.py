"""``bmoe profile`` and ``bmoe predict`` on the archived small sweep, and their bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bmoe.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"
pytestmark = pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def route_trace() -> Path:
    return next((SMALL / "cells").glob("cache_mb-64_io_threads-1*/r1/run.route.csv"))


@pytest.fixture
def device(small_profile: Path) -> Path:
    """The small sweep's profile (tests/conftest.py), made once for every test that reads it."""
    return small_profile


def test_profile_writes_a_profile_with_its_caveat(device: Path) -> None:
    data = json.loads(device.read_text())
    assert data["format"] == "bmoe_profile" and data["version"] == 2
    assert sorted(row["lanes"] for row in data["flash"]) == [1, 4]
    assert data["model"]["slices_per_expert"] == 3
    assert any("compute-traced" in c for c in data["caveats"])


def test_profile_refuses_traced_runs_without_the_flag(capsys) -> None:
    code, _, err = run(capsys, "profile", SMALL)
    assert code == 2
    assert "compute-traced" in err and "Traceback" not in err


def test_predict_grid_csv(capsys, device: Path, tmp_path: Path) -> None:
    out_csv = tmp_path / "p.csv"
    code, out, _ = run(
        capsys, "predict", route_trace(), "-p", device, "-g", "cache_mb=64,256",
        "-g", "io_threads=1,4", "--csv", out_csv, "-f", "json",
    )  # fmt: skip
    assert code == 0
    table = pd.DataFrame(json.loads(out)["predicted"])
    assert len(table) == 4
    assert table.equals(table.sort_values(["cache_mb", "io_threads"], ignore_index=True))
    # at each budget more lanes predict no less speed; more budget reads no more
    for _, part in table.groupby("cache_mb"):
        assert part["tok_s"].is_monotonic_increasing
    assert table.groupby("cache_mb")["mib_per_token"].first().is_monotonic_decreasing
    assert pd.read_csv(out_csv).shape == (4, table.shape[1])
    # both rates are printed; these runs decode 12 tokens, too few for a steady state
    assert {"tok_s", "steady_tok_s", "steady_tok_s_low", "steady_tok_s_high"} <= set(table)
    assert table["steady_tok_s"].isna().all() and table["warmup_tokens"].isna().all()


def test_predict_against_the_sweep(capsys, device: Path) -> None:
    code, out, _ = run(
        capsys, "predict", route_trace(), "-p", device, "--against", SMALL, "-f", "json"
    )
    assert code == 0
    views = json.loads(out)
    cells = pd.DataFrame(views["cells"])
    assert len(cells) == 4
    # reads and hits are the replay's: equal to what each run measured (summary rounding)
    assert cells["mib_per_token_error"].abs().max() < 0.01
    assert cells["hit_pct_error"].abs().max() < 0.051
    assert views["summary"]["cells"] == 4
    # every run of this archive is traced (labelled): no firm cell, so nothing to check
    assert views["summary"]["compared"] == 0
    assert views["summary"]["coverage_check"] == "no firm cell to check the intervals on"
    # like with like: the archive's runs have no steady state (12 tokens), so no steady error
    assert views["summary"]["steady_cells"] == 0
    assert cells["steady_tok_s_error_pct"].isna().all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-g", "cache_mb=1,lanes=2"], "unknown axis 'lanes'"),
        ([], "give --grid"),
        (["-g", "cache_mb=1", "-f", "yaml"], "unknown --format"),
    ],
)
def test_predict_bad_arguments(capsys, device: Path, args, message) -> None:
    code, _, err = run(capsys, "predict", route_trace(), "-p", device, *args)
    assert code == 2
    assert message in err


def test_predict_bad_profile_names_file_and_line(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "device.json"
    bad.write_text('{"format": "bmoe_profile",\n "version": }')
    code, _, err = run(capsys, "predict", route_trace(), "-p", bad, "-g", "cache_mb=1")
    assert code == 2
    assert f"{bad}:2: not JSON" in err.replace("\n", "")


def test_predict_refuses_another_models_profile(capsys, device: Path, tmp_path: Path) -> None:
    data = json.loads(device.read_text())
    data["model"]["expert_bytes"] = {k: v * 2 for k, v in data["model"]["expert_bytes"].items()}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    code, _, err = run(capsys, "predict", route_trace(), "-p", other, "-g", "cache_mb=64")
    assert code == 2
    assert "its own model's expert reads" in err.replace("\n", " ")


def test_profile_from_a_metrics_file_alone(capsys, tmp_path: Path) -> None:
    """A run's metrics without its traces: the expert sizes from the preamble
    (cache_cycle_mb), the same as the route trace's, so the trace can be predicted."""
    run_dir = next((SMALL / "cells").glob("cache_mb-64_io_threads-1*/r1"))
    shutil.copy(run_dir / "run.csv", tmp_path / "run.csv")
    out = tmp_path / "p.json"
    code, _, err = run(capsys, "profile", tmp_path / "run.csv", "-o", out)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert "cache_cycle_mb" in data["model"]["sizes_from"]
    code, _, err = run(capsys, "predict", route_trace(), "-p", out, "-g", "cache_mb=64")
    assert code == 0, err


def _lines(*args: object, columns: int) -> list[str]:
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bmoe", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("columns", [80, 200])
def test_predict_grid_reads_at_80_and_200_columns_in_a_pipe(device: Path, columns: int) -> None:
    """Written to a pipe at 80 and at 200 columns: no line wider than the terminal, no escape
    codes, two tables (speed apart from cache) whose headers and short cell labels are
    whole on one line each, one row a cell."""
    lines = _lines(
        "predict", route_trace(), "-p", device, "-g", "cache_mb=64,256,1024",
        "-g", "io_threads=1,4", "-g", "prefetch=0,1", columns=columns,
    )  # fmt: skip
    text = "\n".join(lines)
    assert "\x1b" not in text
    assert max(map(len, lines)) <= columns
    speed = next(i for i, line in enumerate(lines) if line.startswith("speed"))
    cache = next(i for i, line in enumerate(lines) if line.startswith("cache"))
    assert speed < cache

    def header(start: int) -> str:  # a header may take two lines: its words, in order
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("┡"))
        return " ".join(lines[start + 2 : end])

    for word in ("cell", "tok/s", "low", "high", "steady", "compute", "flash", "mgmt", "ms"):
        assert word in header(speed)
    assert all(w in header(cache) for w in ("MiB/token", "hit %", "misses", "prefetched"))
    for label in ("64M 1L", "1024M 4L p1", "256M 4L"):
        rows = [line for line in lines[speed:cache] if f"│ {label} " in line
                and line.split("│")[1].strip() == label]  # fmt: skip
        assert len(rows) == 1, label
    # 12 cells: one line each in both tables
    assert sum(1 for line in lines[speed:cache] if line.startswith("│")) == 12


def test_predict_against_reads_at_80_columns(device: Path) -> None:
    lines = _lines("predict", route_trace(), "-p", device, "--against", SMALL, columns=80)
    assert max(map(len, lines)) <= 80
    assert any(line.startswith("summary") for line in lines)
    assert any("coverage achieved" in line for line in lines)


def test_profile_and_predict_views_are_keyed_by_catalogued_slugs(
    capsys, device: Path, tmp_path: Path
) -> None:
    """JSON keys are the catalogue's slugs; tables and markdown show its titles."""
    from bmoe.analyze.views import PREDICT, PROFILE

    again = tmp_path / "again.json"
    code, out, _ = run(capsys, "profile", SMALL, "--allow-traced", "-o", again, "-f", "json")
    assert code == 0 and set(json.loads(out)) <= set(PROFILE.slugs)
    assert {"profile", "terms", "flash", "runs"} <= set(json.loads(out))
    md = tmp_path / "md.json"
    code, out, _ = run(capsys, "profile", SMALL, "--allow-traced", "-o", md, "-f", "markdown")
    assert code == 0
    for slug in ("terms", "flash", "runs_by_config"):
        assert PROFILE.title(slug) in out
    grid = ("-g", "cache_mb=64,256")
    code, out, _ = run(capsys, "predict", route_trace(), "-p", device, *grid, "-f", "json")
    assert code == 0 and set(json.loads(out)) == {"predicted"}
    code, out, _ = run(capsys, "predict", route_trace(), "-p", device, *grid, "-f", "markdown")
    assert code == 0 and PREDICT.title("cache") in out
    assert "speed (tok/s with its " in out and "{interval}" not in out
    code, out, _ = run(
        capsys, "predict", route_trace(), "-p", device, "--against", SMALL, "-f", "json"
    )
    assert code == 0 and set(json.loads(out)) <= set(PREDICT.slugs)
    code, out, _ = run(
        capsys, "predict", route_trace(), "-p", device, "--against", SMALL, "-f", "markdown"
    )
    assert code == 0 and PREDICT.title("compared") in out
