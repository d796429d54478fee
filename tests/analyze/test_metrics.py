"""Per-run summary against the real files, checked with a plain-Python reading of the CSV."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pytest

from bmoe.analyze.metrics import (
    STABLE_FIELDS,
    per_token,
    run_summary,
    steady_state,
    summarize_runs,
    summary_tables,
)
from bmoe.formats.metrics import COLUMNS_V2, MetricsWriter, metrics_from_text, read_metrics
from bmoe.formats.sidecar import pressure_sidecar_for, read_pressure

C4000 = "metrics/2026-07-12/qwen_c4000_l4.csv"
REAL_RUNS = [
    C4000,
    "metrics/2026-07-12/qwen_mmap.csv",
    "metrics/2026-07-13/qwen_auto_ov.csv",
    "metrics/2026-07-12-pr23/qwen_pf2.csv",
    "metrics/2026-07-14-warmup/baseline_qwen_k8.csv",
    "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv",
    "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv",
    "route-trace/gemma.metrics",
    "native-tiny/run.csv",
    "native-tiny/pf.csv",
]


def plain_rows(path: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Rows and the last summary of a metrics CSV, read with nothing but the csv module."""
    text = path.read_text(encoding="utf-8-sig")
    data = [ln for ln in text.splitlines() if not ln.startswith("#")]
    summary: dict[str, str] = {}
    for ln in text.splitlines():
        if ln.startswith("# summary"):
            summary = dict(t.split("=", 1) for t in ln.split()[2:] if "=" in t)
    return list(csv.DictReader(io.StringIO("\n".join(data)))), summary


def interpolated(values: list[float], q: float) -> float:
    """Quantile by linear interpolation between sorted neighbours (written out by hand)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def load(corpus: Path, name: str) -> dict:
    path = corpus / name
    sidecar = pressure_sidecar_for(path)
    return run_summary(read_metrics(path), read_pressure(sidecar) if sidecar else None)


def test_c4000_headline_figures(corpus: Path) -> None:
    rec = load(corpus, C4000)
    assert rec["tokens"] == 256 and rec["partial"] is False
    assert rec["cache_hit_pct"] == pytest.approx(76.5)
    assert rec["read_mib"] == pytest.approx(57509.4)
    # the run log prints 224.65 MiB/token and 3.469 tok/s
    assert f"{rec['read_mib_per_token']:.2f}" == "224.65"
    assert f"{rec['tok_s_mean']:.3f}" == "3.469"
    assert rec["ttft_s"] == pytest.approx(18.009 + 10.845)
    assert rec["prefill_tps"] == pytest.approx(3.14)
    # the pressure sidecar: kB -> GiB, mC -> C, dC -> C
    assert rec["peak_rss_gb"] == pytest.approx(5830692 / 1024**2)
    assert rec["mem_floor_gb"] == pytest.approx(1879568 / 1024**2)
    assert rec["cpu_temp_start_c"] == pytest.approx(48.2)
    assert rec["cpu_temp_max_c"] == pytest.approx(73.7)
    assert rec["batt_temp_max_c"] == pytest.approx(39.4)


@pytest.mark.parametrize("name", REAL_RUNS)
def test_reference_figures_match_a_plain_reading(corpus: Path, name: str) -> None:
    rows, summary = plain_rows(corpus / name)
    rec = load(corpus, name)
    wall = [float(r["wall_ms"]) for r in rows]
    rates = [1000.0 / w for w in wall if w > 0]
    assert rec["tokens"] == len(rows)
    assert rec["tok_s_mean"] == pytest.approx(len(rows) / (sum(wall) / 1000.0), rel=1e-12)
    assert rec["tok_s_min"] == pytest.approx(min(rates), rel=1e-12)
    assert rec["tok_s_max"] == pytest.approx(max(rates), rel=1e-12)
    assert rec["tok_s_median"] == pytest.approx(statistics.median(rates), rel=1e-12)
    assert rec["tok_s_p5"] == pytest.approx(interpolated(rates, 0.05), rel=1e-12)
    assert rec["tok_s_p95"] == pytest.approx(interpolated(rates, 0.95), rel=1e-12)
    assert rec["read_mib_per_token"] == pytest.approx(float(summary["read_MiB"]) / len(rows))
    assert rec["ttft_s"] == pytest.approx(float(summary["load_s"]) + float(summary["prefill_s"]))
    assert rec["prefill_tps"] == pytest.approx(float(summary["prefill_tps"]))
    hit = float(summary["cache_hit_pct"])
    assert rec["cache_hit_pct"] == (None if hit < 0 else pytest.approx(hit))
    for key, col in (("stall_ms_per_token", "stall_ms"), ("mgmt_ms_per_token", "mgmt_ms")):
        if col in rows[0]:
            assert rec[key] == pytest.approx(statistics.fmean(float(r[col]) for r in rows))
        else:
            assert rec[key] is None  # an older file: unknown, never 0


def test_missing_columns_and_sidecar_are_none_not_zero(corpus: Path) -> None:
    rec = load(corpus, C4000)  # 8 columns: no mgmt_ms, majflt, cpu_ms, memory picture
    for key in ("mgmt_ms_per_token", "majflt_per_token", "cpu_s_per_token", "rows_rss_max_gb"):
        assert rec[key] is None
    rec = load(corpus, "metrics/2026-07-14-warmup/baseline_qwen_k8.csv")  # no sidecar
    for key in ("peak_rss_gb", "mem_floor_gb", "cpu_temp_start_c", "batt_temp_max_c"):
        assert rec[key] is None
    assert list(rec)[: len(STABLE_FIELDS)] == list(STABLE_FIELDS)


def test_no_cache_and_v1_extras(corpus: Path) -> None:
    mmap = load(corpus, "metrics/2026-07-12/qwen_mmap.csv")
    assert mmap["cache_hit_pct"] is None and mmap["read_mib_per_token"] == 0.0
    drop = load(corpus, "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv")
    assert drop["drop_pct"] == pytest.approx(100 * 66582 / 469760)
    assert drop["majflt_per_token"] == pytest.approx(13.73)
    assert drop["partial"] is False  # 1469 of 2048 steps, then the end of sequence
    rows, _ = plain_rows(corpus / "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv")
    assert drop["rows_rss_max_gb"] == pytest.approx(max(float(r["rss_mib"]) for r in rows) / 1024)


def test_effective_rate_uses_loop_overhead(corpus: Path) -> None:
    rec = load(corpus, "native-tiny/run.csv")
    _, summary = plain_rows(corpus / "native-tiny/run.csv")
    overhead = float(summary["loop_overhead_s/tok"])
    assert rec["tok_s_effective"] == pytest.approx(1 / (1 / rec["tok_s_mean"] + overhead))
    assert rec["tok_s_effective"] < rec["tok_s_mean"]


def test_session_sums_its_turns(corpus: Path) -> None:
    rec = load(corpus, "native-tiny/sess.csv")
    assert rec["tokens"] == 14 and rec["turns"] == 2
    assert rec["read_mib_per_token"] == pytest.approx((9.2 + 7.0) / 14)
    assert rec["cache_hit_pct"] == pytest.approx(20.5)  # the session's last (cumulative) figure


# ----------------------------------------------------------------------------- constructed


def write_run(rows: list[dict], params: dict | None = None, summary: dict | None = None) -> str:
    buf = io.StringIO()
    base = {"model": "m.gguf", "n_expert_used": 8, "threads": 4, "overlap": False, "temp": 0.0}
    writer = MetricsWriter(buf, {**base, **(params or {})}, COLUMNS_V2)
    for row in rows:
        writer.row(row)
    if summary is not False:
        writer.summary({"tokens": len(rows), **(summary or {})})
    return buf.getvalue()


def test_speculation_groups_are_not_free_tokens() -> None:
    # decodes of 3, 1 and 2 tokens: cost on the first row, zeros on the rest
    rows = [
        {"step": 1, "steps": 6, "wall_ms": 300.0, "read_bytes": 3 * 1048576, "mtp_batch": 3},
        {"step": 2, "steps": 6, "wall_ms": 0.0, "mtp_batch": 0},
        {"step": 3, "steps": 6, "wall_ms": 0.0, "mtp_batch": 0},
        {"step": 4, "steps": 6, "wall_ms": 50.0, "read_bytes": 1048576, "mtp_batch": 1},
        {"step": 5, "steps": 6, "wall_ms": 400.0, "read_bytes": 0, "mtp_batch": 2},
        {"step": 6, "steps": 6, "wall_ms": 0.0, "mtp_batch": 0},
    ]
    summary = {"mtp_drafted": 6, "mtp_accepted": 3, "mtp_decodes": 3, "loop_overhead_s/tok": 0.05}
    run = metrics_from_text(write_run(rows, {"spec": "mtp"}, summary))
    tokens = per_token(run)
    assert list(tokens["wall_ms"]) == [100, 100, 100, 50, 200, 200]
    assert list(tokens["read_mib"]) == [1, 1, 1, 1, 0, 0]
    rec = run_summary(run)
    assert rec["tok_s_min"] == pytest.approx(5.0) and rec["tok_s_max"] == pytest.approx(20.0)
    assert rec["tok_s_median"] == pytest.approx(10.0)  # not 1000/0: zeros were spread
    assert rec["tok_s_mean"] == pytest.approx(6 / 0.75)
    assert rec["tok_s_effective"] == pytest.approx(1 / (0.75 / 6 + 0.05))
    assert rec["tokens_per_decode"] == pytest.approx(2.0)
    assert rec["draft_acceptance_pct"] == pytest.approx(50.0)


def _ramp_rows(n: int, head: int) -> list[dict]:
    """A run whose first `head` tokens read 400 MiB and the rest 100 MiB (one 350 MiB blip)."""
    rows = []
    for i in range(n):
        mib = 400 if i < head else 100
        if i == head + 5:
            mib = 350
        rows.append({"step": i + 1, "steps": n, "wall_ms": 100.0 + mib, "read_bytes": mib << 20})
    return rows


def test_steady_state_rule_on_a_known_head() -> None:
    run = metrics_from_text(write_run(_ramp_rows(64, 10)))
    steady = steady_state(per_token(run))
    assert steady.basis == "read_mib" and steady.level == pytest.approx(100)
    assert steady.warmup_tokens == 10 and steady.steady_tokens == 54
    rec = run_summary(run)
    assert rec["warmup_tokens"] == 10
    assert rec["steady_read_mib_per_token"] == pytest.approx((53 * 100 + 350) / 54)
    assert rec["steady_tok_s_mean"] == pytest.approx(54 / ((53 * 200 + 450) / 1000))


def test_steady_state_ignores_one_cheap_token_in_the_head() -> None:
    rows = _ramp_rows(64, 10)
    rows[3]["read_bytes"] = 50 << 20  # a cheap token inside the warm-up
    steady = steady_state(per_token(metrics_from_text(write_run(rows))))
    assert steady.warmup_tokens == 10


def test_short_probe_has_no_steady_state() -> None:
    steady = steady_state(per_token(metrics_from_text(write_run(_ramp_rows(24, 4)))))
    assert steady.warmup_tokens is None and "too short" in steady.reason


def test_no_reads_falls_back_to_wall_time() -> None:
    rows = [
        {"step": i + 1, "steps": 40, "wall_ms": 900.0 if i < 5 else 300.0, "read_bytes": 0}
        for i in range(40)
    ]
    steady = steady_state(per_token(metrics_from_text(write_run(rows))))
    assert steady.basis == "wall_ms" and steady.warmup_tokens == 5


def test_tables_show_unknown_as_missing(corpus: Path) -> None:
    frame = summarize_runs([read_metrics(corpus / C4000)])
    views = summary_tables(frame)
    assert set(views) == {"throughput", "cache"}  # no sidecar given: no pressure table
    assert views["throughput"]["run"].iloc[0] == "qwen_c4000_l4.csv"
    assert views["throughput"]["mgmt_ms_per_token"].isna().all()
