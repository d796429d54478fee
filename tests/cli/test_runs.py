"""The run-analysis commands end to end: output shapes, refusals, plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs_factory import write_run

from bmoe.analyze.metrics import STABLE_FIELDS
from bmoe.cli import main

C4000 = "metrics/2026-07-12/qwen_c4000_l4.csv"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_metrics_json_one_record_per_file(corpus: Path, capsys) -> None:
    code, out, _ = run_cli(
        capsys, "analyze", "metrics", corpus / C4000,
        corpus / "metrics/2026-07-14-warmup/baseline_qwen_k8.csv", "--format", "json",
    )  # fmt: skip
    assert code == 0
    records = json.loads(out)["runs"]
    assert len(records) == 2
    assert list(records[0])[: len(STABLE_FIELDS)] == list(STABLE_FIELDS)
    assert records[0]["tokens"] == 256 and records[0]["cache_hit_pct"] == 76.5
    assert records[0]["mgmt_ms_per_token"] is None  # 8-column file: null, not 0
    assert records[1]["peak_rss_gb"] is None  # no sidecar


def test_metrics_csv_and_markdown(corpus: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "analyze", "metrics", corpus / C4000, "--format", "csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "# view=runs"
    assert lines[1].split(",")[: len(STABLE_FIELDS)] == list(STABLE_FIELDS)
    code, out, _ = run_cli(capsys, "analyze", "metrics", corpus / C4000, "-f", "markdown")
    assert "### throughput" in out and "### pressure" in out and "### cache" in out
    assert "| qwen_c4000_l4.csv | 256 | no | 3.469 |" in out
    assert "| 76.5 | 224.65 |" in out


def test_metrics_table(corpus: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "analyze", "metrics", corpus / C4000)
    assert code == 0 and "3.469" in out and "224.65" in out and "—" in out


def test_stall_table_and_plot(corpus: Path, tmp_path: Path, capsys) -> None:
    png = tmp_path / "stall.png"
    path = corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv"
    code, out, _err = run_cli(capsys, "analyze", "stall", path, "--plot", png, "-f", "json")
    assert code == 0
    views = json.loads(out)
    assert views["run"]["compute from"] == "cpu_ms / threads"
    assert [r["component"] for r in views["attribution"]] == [
        "wall", "compute", "flash wait", "cache mgmt", "unattributed", "overlapped (not wall time)",
    ]  # fmt: skip
    inside = [r["pct_of_wall"] for r in views["attribution"] if r["in_wall"]]
    assert sum(inside) == pytest.approx(100.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_compare_refuses_then_forces(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a.csv")
    b = write_run(tmp_path / "b.csv", n_expert_used=4)
    code, _, err = run_cli(capsys, "analyze", "compare", a, b)
    assert code == 2
    assert "not comparable" in err and "different n_expert_used: 2 vs 4" in err
    assert "Traceback" not in err
    code, out, err = run_cli(capsys, "analyze", "compare", a, b, "--force", "-f", "json")
    assert code == 0 and "FORCED PAST A REFUSAL" in err
    views = json.loads(out)
    table = views["comparison"]
    assert table[0]["figure"] == "tok/s mean (steady)"
    assert views["concerns"][0]["level"] == "refuse"


def test_compare_warns_loudly(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a.csv")
    b = write_run(tmp_path / "b.csv", temp=0.8)
    code, _out, err = run_cli(capsys, "analyze", "compare", a, b)
    assert code == 0 and "WARNING" in err and "temp=0.8" in err


def test_contamination_json_records(tmp_path: Path, capsys) -> None:
    for i, faults in enumerate([2.0, 3.0, 60.0]):
        write_run(tmp_path / f"c{i}.csv", summary={"majflt/tok": faults, "cpu_s/tok": 0.1})
    code, out, _ = run_cli(capsys, "analyze", "contamination", tmp_path, "--format", "json")
    assert code == 0
    flags = json.loads(out)["flags"]
    assert [f["tell"] for f in flags] == ["majflt"] and flags[0]["cells"] == ["c2.csv"]
    assert set(flags[0]) == {"tell", "cells", "evidence"}


def test_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("this is not,a metrics file\n1,2\n")
    code, _, err = run_cli(capsys, "analyze", "metrics", bad)
    assert code == 2 and "bad.csv" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "analyze", "metrics", bad, "-f", "yaml")
    assert code == 2 and "unknown --format" in err


@pytest.mark.parametrize("command", ["metrics", "stall", "compare", "contamination"])
def test_help_has_an_example(command: str, capsys) -> None:
    code, out, _ = run_cli(capsys, "analyze", command, "--help")
    assert code == 0 and "Example: bmoe analyze " + command in " ".join(out.split())
