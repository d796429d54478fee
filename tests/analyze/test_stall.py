"""Stall attribution: the telemetry contract's panel, on real and constructed files; its
parts add up to the wall time on every file."""

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
    assert att.overlap is True and att.overlap_source == "the preamble's overlap=1"
    assert att.threads == 4 and att.compute_source == COMPUTE_PROXY
    data = csv_rows(corpus / V1)
    # waits first, then compute up to the wall they left
    compute = [min(r["cpu_ms"] / 4, r["wall_ms"] - r["stall_ms"] - r["mgmt_ms"]) for r in data]
    unattributed = [
        max(0.0, r["wall_ms"] - r["cpu_ms"] / 4 - r["stall_ms"] - r["mgmt_ms"]) for r in data
    ]
    beyond = [max(0.0, r["cpu_ms"] / 4 + r["stall_ms"] + r["mgmt_ms"] - r["wall_ms"]) for r in data]
    got = bars(att)
    assert got["compute"] == pytest.approx(statistics.fmean(compute))
    assert got["overlapped (not wall time)"] == pytest.approx(statistics.fmean(beyond))
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


def test_parts_fill_the_wall_and_the_surplus_is_overlapped(tmp_path: Path) -> None:
    # 100 ms wall; cpu 320 ms over 4 threads = 80, io 40, mgmt 10: 130 > 100
    run = read_metrics(write_run(tmp_path / "r.csv", rows(40, cpu_ms=320.0)))
    att = stall_attribution(run)
    got = bars(att)
    # the waits keep their measured values; compute gets the 50 ms they leave
    assert got["flash wait"] == 40.0 and got["cache mgmt"] == 10.0 and got["compute"] == 50.0
    assert got["unattributed"] == 0.0 and got["overlapped (not wall time)"] == 30.0
    share = att.summary.set_index("component")
    assert share.loc[share["in_wall"] == True, "pct_of_wall"].sum() == pytest.approx(100.0)  # noqa: E712
    # the note gives the table's figure, at the table's precision (30 of 100 ms)
    assert share.loc["overlapped (not wall time)", "pct_of_wall"] == pytest.approx(30.0)
    assert "busy time equal to 30.0 % of the wall time ran alongside the waits" in att.notes[0]
    # a small share keeps its decimal: 0.3 ms of 100 is 0.3 %, not "0 %"
    small = stall_attribution(read_metrics(write_run(tmp_path / "t.csv", rows(40, cpu_ms=201.2))))
    assert bars(small)["overlapped (not wall time)"] == pytest.approx(0.3)
    assert "equal to 0.3 % of the wall" in small.notes[0]
    # a slow token with little CPU: the rest is unattributed (off-CPU time), nothing overlaps
    slow = rows(40, cpu_ms=80.0, wall_ms=[300.0] + [100.0] * 39)
    att = stall_attribution(read_metrics(write_run(tmp_path / "s.csv", slow)))
    assert att.tokens["unattributed_ms"].iloc[0] == pytest.approx(300 - 20 - 40 - 10)
    assert att.tokens["overlapped_ms"].iloc[0] == 0.0
    # a wait longer than its token (lane time summed in a file that says serial) is cut at the
    # wall, and the rest is overlapped too
    long = rows(40, io_ms=150.0, cpu_ms=80.0)
    att = stall_attribution(read_metrics(write_run(tmp_path / "l.csv", long)))
    first = att.tokens.iloc[0]
    assert (first["flash_ms"], first["mgmt_ms"], first["compute_ms"]) == (100.0, 0.0, 0.0)
    assert first["overlapped_ms"] == pytest.approx(50 + 10 + 20)


def _metrics_files(root: Path) -> list[Path]:
    from bmoe.formats.detect import detect_bytes
    from bmoe.formats.load import read_head

    return [
        p for p in sorted(root.rglob("*")) if p.suffix in (".csv", ".metrics") and p.is_file()
        and detect_bytes(read_head(p)) == "metrics"
    ]  # fmt: skip


def test_shares_sum_to_the_wall_on_every_corpus_file(corpus: Path) -> None:
    files = _metrics_files(corpus)
    assert len(files) >= 10
    for path in files:
        att = stall_attribution(read_metrics(path))
        tokens = att.tokens
        parts = tokens[["compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms"]].fillna(0.0)
        assert parts.sum(axis=1).to_numpy() == pytest.approx(tokens["wall_ms"].to_numpy()), path
        assert (parts >= 0).all().all() and (tokens["overlapped_ms"] >= 0).all(), path
        share = att.summary.set_index("component")
        inside = share.loc[share["in_wall"] == True, "pct_of_wall"].fillna(0.0)  # noqa: E712
        assert inside.sum() == pytest.approx(100.0), path
    # the serial two-lane run the panel once showed at 172 %: the surplus is named
    run = stall_attribution(read_metrics(corpus / "native-tiny/run.csv")).summary
    overlapped = run.set_index("component").loc["overlapped (not wall time)", "pct_of_wall"]
    assert overlapped > 50


def test_threads_override_enables_the_proxy(corpus: Path) -> None:
    run = read_metrics(corpus / "route-trace/gemma.metrics")  # cpu_ms but no preamble
    assert stall_attribution(run).compute_source == COMPUTE_RESIDUAL
    att = stall_attribution(run, threads=4)
    assert att.compute_source == COMPUTE_PROXY
    first = csv_rows(corpus / "route-trace/gemma.metrics")[0]
    room = first["wall_ms"] - first["stall_ms"] - first["mgmt_ms"]  # what the waits left
    assert att.tokens["compute_ms"].iloc[0] == pytest.approx(min(first["cpu_ms"] / 4, room))
    surplus = max(0.0, first["cpu_ms"] / 4 - room)
    assert att.tokens["overlapped_ms"].iloc[0] == pytest.approx(surplus)


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
