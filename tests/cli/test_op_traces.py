"""``bmoe analyze decode compute|io`` and ``bmoe export trace`` from the command line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from bmoe.cli import main

TINY = "native-tiny"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compute_json_has_the_stable_names(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, "analyze", "decode", "compute", str(corpus / TINY / "ct.compute.csv"),
        "--format", "json", "--metrics", str(corpus / TINY / "ct.csv"),
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert {"steps", "nodes_per_step", "ms_per_token", "majflt_per_token"} <= set(doc["summary"])
    assert doc["summary"]["steps"] == 32
    assert {"op", "ms_per_token", "share_pct", "majflt_per_token"} <= set(doc["by_op"][0])
    assert len(doc["by_op"]) == 12 and doc["by_op"][0]["op"] == "GET_ROWS"
    assert [r["layer"] for r in doc["by_layer"]] == [-1, 0, 1, 2, 3]
    assert {"layer", "ms_per_token"} <= set(doc["by_layer"][0])
    assert [r["op_class"] for r in doc["by_class"]][:3] == ["attention", "router", "expert matmul"]
    assert len(doc["per_token"]) == 32 and doc["per_token"][0]["step"] == 1
    assert {"traced_ms", "compute_ms", "wall_ms"} <= set(doc["per_token"][0])


def test_compute_layer_granular_json_segments(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, "analyze", "decode", "compute",
        str(corpus / TINY / "ctl.compute-layers.csv"), "-f", "json",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert [s["segment"] for s in doc["segments"]] == [
        "pre", "blk.0", "blk.1", "blk.2", "blk.3", "post",
    ]  # fmt: skip
    assert set(doc["segments"][0]) >= {"segment", "ms_per_token", "share_pct", "majflt_per_token"}


def test_io_json_has_the_stable_names(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, "analyze", "decode", "io", str(corpus / TINY / "pf.io.csv"), "-f", "json",
        "--adjacent",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert {"steps", "reads", "mib_per_token", "lane_busy_mib_s", "waste_pct"} <= set(
        doc["summary"]
    )
    assert set(doc["latency_us"]) == {"p50", "p90", "p99", "max"}
    assert set(doc["sizes"][0]) >= {"size_kib", "reads", "mib", "mib_s", "us_per_read"}
    assert set(doc["lanes"][0]) >= {"lane", "mib_per_token", "busy_ms_per_token", "mib_s"}
    assert set(doc["adjacency"]) == {"reads_per_token", "runs_per_token", "ceiling"}
    assert doc["summary"]["reads"] == 747 and doc["sizes"][0]["size_kib"] == 64


def test_io_table_csv_markdown(corpus: Path, capsys) -> None:
    path = str(corpus / TINY / "pf.io.csv")
    code, out, _ = run(capsys, "analyze", "decode", "io", path)
    assert code == 0 and "latency_us" in out and "208.90" in out and "lane_busy_mib_s" in out
    code, out, _ = run(capsys, "analyze", "decode", "io", path, "-f", "csv")
    assert code == 0
    blocks = out.split("# view=")
    sizes = next(b for b in blocks if b.startswith("sizes"))
    rows = list(csv.DictReader(io.StringIO(sizes.split("\n", 1)[1])))
    assert rows[0]["size_kib"] == "64" and rows[0]["reads"] == "747"
    code, out, _ = run(capsys, "analyze", "decode", "io", path, "-f", "markdown")
    assert code == 0 and "### lanes" in out and "| lane |" in out


def test_plots_are_written(corpus: Path, capsys, tmp_path: Path) -> None:
    png = tmp_path / "io.png"
    code, _, err = run(
        capsys, "analyze", "decode", "io", str(corpus / TINY / "run.io.csv"), "--plot", str(png),
        "--steps", "17-19",
    )  # fmt: skip
    assert code == 0, err
    timeline = tmp_path / "io.timeline.png"
    for path in (png, timeline):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cls = tmp_path / "classes.svg"
    code, _, err = run(
        capsys, "analyze", "decode", "compute", str(corpus / TINY / "ct.compute.csv"),
        "--layers", "--plot", str(cls),
    )  # fmt: skip
    assert code == 0, err
    assert b"<svg" in cls.read_bytes()[:500]


def test_export_trace_writes_chrome_json(corpus: Path, capsys, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    code, text, err = run(
        capsys, "export", "trace", str(corpus / TINY / "ctl.compute-layers.csv"),
        str(corpus / TINY / "pf.io.csv"), "-o", str(out), "--decode-only",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert any(e.get("cat") == "compute" and e["name"] == "blk.0" for e in doc["traceEvents"])
    assert "reconstructed" in text


def test_export_trace_layer_detail(corpus: Path, capsys, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    code, _, err = run(
        capsys, "export", "trace", str(corpus / TINY / "ct.compute.csv"), "-o", str(out),
        "--compute-detail", "layer", "--steps", "103-104",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    compute = [e for e in doc["traceEvents"] if e.get("cat") == "compute"]
    assert len(compute) == 12 and {e["args"]["nodes"] for e in compute} > {1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "decode", "io", "{c}/ct.compute.csv"], "not an io trace"),
        (["analyze", "decode", "compute", "{c}/pf.io.csv"], "not a compute trace"),
        (["analyze", "decode", "compute", "{c}/nope.csv"], "no such file"),
        (["analyze", "decode", "io", "{c}/pf.io.csv", "-f", "yaml"], "unknown --format"),
        (["analyze", "decode", "io", "{c}/pf.io.csv", "--plot", "x.gif"], "must end in"),
        (["export", "trace", "{c}/run.csv", "-o", "x.json"], "expected a compute or an io"),
        (["export", "trace", "{c}/pf.io.csv", "-o", "x.json", "--steps", "9-2"], "ends before"),
    ],
)
def test_errors_are_one_line(corpus: Path, capsys, tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *[a.format(c=corpus / TINY) for a in argv])
    assert code == 2
    assert message in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) <= 2  # one message (rich may wrap it once)
