"""Stall attribution: the telemetry contract's panel, on real and constructed files."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pytest
from runs_factory import rows, write_run

from bmoe.analyze.stall import (
    COMPUTE_PROXY,
    COMPUTE_RESIDUAL,
    decide_overlap,
    memory_picture,
    stall_attribution,
)
from bmoe.formats.metrics import read_metrics

V1 = "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv"


def csv_rows(path: Path) -> list[dict[str, float]]:
    text = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(text))]


def bars(att) -> dict[str, float | None]:
    frame = att.summary.set_index("component")["ms_per_token"]
    return {k: (None if v != v else v) for k, v in frame.items()}


def test_v1_overlap_run_uses_cpu_proxy_and_stall(corpus: Path) -> None:
    att = stall_attribution(read_metrics(corpus / V1))
    assert att.overlap is True and att.overlap_source == "preamble overlap="
    assert att.threads == 4 and att.compute_source == COMPUTE_PROXY
    data = csv_rows(corpus / V1)
    compute = [r["cpu_ms"] / 4 for r in data]
    unattributed = [
        max(0.0, r["wall_ms"] - r["cpu_ms"] / 4 - r["stall_ms"] - r["mgmt_ms"]) for r in data
    ]
    got = bars(att)
    assert got["compute"] == pytest.approx(statistics.fmean(compute))
    assert got["flash wait"] == pytest.approx(statistics.fmean(r["stall_ms"] for r in data))
    assert got["cache mgmt"] == pytest.approx(statistics.fmean(r["mgmt_ms"] for r in data))
    assert got["unattributed"] == pytest.approx(statistics.fmean(unattributed))
    # io_ms under overlap is summed lane time: it must not be the flash bar
    assert got["flash wait"] < statistics.fmean(r["io_ms"] for r in data)


def test_v0_serial_run_falls_back_to_the_residual(corpus: Path) -> None:
    path = corpus / "metrics/2026-07-12/qwen_c4000_l4.csv"
    att = stall_attribution(read_metrics(path))
    assert att.overlap is False and "inferred" in att.overlap_source
    assert att.compute_source == COMPUTE_RESIDUAL
    data = csv_rows(path)
    got = bars(att)
    assert got["compute"] == pytest.approx(statistics.fmean(r["compute_ms"] for r in data))
    assert got["flash wait"] == pytest.approx(statistics.fmean(r["io_ms"] for r in data))
    assert got["cache mgmt"] is None  # no mgmt_ms column: unknown, not 0
    # the run log: compute 0.161 + flash I/O 0.127 s/token
    assert round(got["compute"] / 1000, 3) == 0.161 and round(got["flash wait"] / 1000, 3) == 0.127


def test_v0_overlap_is_inferred_from_stall(corpus: Path) -> None:
    run = read_metrics(corpus / "metrics/2026-07-13/qwen_auto_ov.csv")
    overlap, source = decide_overlap(run)
    assert overlap is True and "stall_ms > 0" in source
    assert decide_overlap(run, overlap=False) == (False, "given")


def test_cpu_unmeasured_on_some_tokens_is_labelled(tmp_path: Path) -> None:
    cpu = [200.0] * 32 + [0.0] * 32
    run = read_metrics(write_run(tmp_path / "r.csv", rows(64, cpu_ms=cpu)))
    att = stall_attribution(run)
    assert att.compute_source.startswith("mixed") and "32 tokens" in att.compute_source
    assert list(att.tokens["compute_ms"][:2]) == [50.0, 50.0]  # 200 / 4 threads
    assert att.tokens["compute_is_residual"].sum() == 32
    none = stall_attribution(read_metrics(write_run(tmp_path / "z.csv", rows(64, cpu_ms=0.0))))
    assert none.compute_source == COMPUTE_RESIDUAL


def test_bars_are_not_rescaled_and_remainder_is_clamped(tmp_path: Path) -> None:
    # 100 ms wall; cpu 320 ms over 4 threads = 80, io 40, mgmt 10: 130 > 100
    run = read_metrics(write_run(tmp_path / "r.csv", rows(40, cpu_ms=320.0)))
    att = stall_attribution(run)
    got = bars(att)
    assert got["compute"] == 80.0 and got["flash wait"] == 40.0 and got["cache mgmt"] == 10.0
    assert got["unattributed"] == 0.0
    share = att.summary.set_index("component")["pct_of_wall"]
    assert share["compute"] + share["flash wait"] + share["cache mgmt"] == pytest.approx(130.0)
    # a slow token with little CPU: the rest is unattributed (off-CPU time)
    slow = rows(40, cpu_ms=80.0, wall_ms=[300.0] + [100.0] * 39)
    att = stall_attribution(read_metrics(write_run(tmp_path / "s.csv", slow)))
    assert att.tokens["unattributed_ms"].iloc[0] == pytest.approx(300 - 20 - 40 - 10)


def test_threads_override_enables_the_proxy(corpus: Path) -> None:
    run = read_metrics(corpus / "route-trace/gemma.metrics")  # cpu_ms but no preamble
    assert stall_attribution(run).compute_source == COMPUTE_RESIDUAL
    att = stall_attribution(run, threads=4)
    assert att.compute_source == COMPUTE_PROXY
    first = csv_rows(corpus / "route-trace/gemma.metrics")[0]
    assert att.tokens["compute_ms"].iloc[0] == pytest.approx(first["cpu_ms"] / 4)


def test_speculation_group_cost_is_spread(tmp_path: Path) -> None:
    data = rows(40, mtp_batch=[2, 0] * 20, wall_ms=[200.0, 0.0] * 20, cpu_ms=[400.0, 0.0] * 20,
                io_ms=[80.0, 0.0] * 20, mgmt_ms=[20.0, 0.0] * 20)  # fmt: skip
    att = stall_attribution(read_metrics(write_run(tmp_path / "m.csv", data, spec="mtp")))
    assert set(att.tokens["wall_ms"]) == {100.0}
    assert set(att.tokens["compute_ms"]) == {50.0} and set(att.tokens["flash_ms"]) == {40.0}


def test_memory_picture_keeps_measured_columns(corpus: Path, tmp_path: Path) -> None:
    mem = memory_picture(read_metrics(corpus / V1))
    for col in ("rss_anon_mib", "rss_file_mib", "swap_mib", "mem_available_mib"):
        assert col in mem
    assert mem["cache_budget_mib"].iloc[0] == 3000.0
    blank = memory_picture(read_metrics(write_run(tmp_path / "r.csv")))  # all zeros
    assert [c for c in blank.columns if c.endswith("_mib")] == []
