"""The metrics CSV reader and writer against the native engine's real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.formats.metrics import metrics_to_text, read_metrics

METRICS_FILES = [
    "metrics/2026-07-12/qwen_c4000_l4.csv",
    "metrics/2026-07-12/qwen_mmap.csv",
    "metrics/2026-07-13/qwen_auto_ov.csv",
    "metrics/2026-07-12-pr23/qwen_pf2.csv",
    "metrics/2026-07-14-warmup/baseline_qwen_k8.csv",
    "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv",
    "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv",
    "native-tiny/run.csv",
    "native-tiny/sess.csv",
    "native-tiny/pf.csv",
    "route-trace/gemma.metrics",
]


@pytest.mark.parametrize("name", METRICS_FILES)
def test_native_files_round_trip_byte_for_byte(corpus: Path, name: str, read_mode: str) -> None:
    path = corpus / name
    assert metrics_to_text(read_metrics(path)) == path.read_text(encoding="utf-8")


def test_versions_and_shapes(corpus: Path) -> None:
    v0 = read_metrics(corpus / "metrics/2026-07-12/qwen_c4000_l4.csv")
    assert v0.version == 0 and v0.params == {}
    assert list(v0.rows.columns)[:3] == ["step", "steps", "wall_ms"] and len(v0.rows.columns) == 8
    assert v0.summary["read_MiB"] == pytest.approx(57509.4)
    assert v0.summary["cache_hit_pct"] == pytest.approx(76.5)
    v1 = read_metrics(corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv")
    assert v1.version == 1 and v1.params["dense_weights"] == "anon" and v1.params["overlap"] is True
    v2 = read_metrics(corpus / "native-tiny/run.csv")
    assert v2.version == 2 and v2.engine == "0.19.0" and len(v2.rows.columns) == 29
    assert v2.params["seed"] == 4294967295 and v2.params["top_p"] == pytest.approx(0.95)
    assert isinstance(v2.params["temp"], float)
    assert v2.rows["turn"].dtype.itemsize <= 2


def test_a_run_ended_at_end_of_sequence_is_finished(corpus: Path) -> None:
    # 1354 of 2048 steps, then the model's end of sequence: the summary says tokens=1354
    run = read_metrics(corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv")
    assert run.tokens == 1354 and run.steps == 2048 and not run.partial
    assert not read_metrics(corpus / "native-tiny/run.csv").partial


def _cut(text: str, rows: int, tokens: int | None) -> str:
    """`text` (a one-turn metrics CSV) with its first `rows` token rows and a summary saying
    `tokens` (none when None)."""
    lines = text.splitlines(keepends=True)
    head = [ln for ln in lines if ln.startswith("#") and not ln.startswith("# summary")]
    body = [ln for ln in lines if not ln.startswith("#")]
    summary = next(ln for ln in lines if ln.startswith("# summary"))
    out = "".join(head + body[: rows + 1])
    if tokens is not None:
        out += summary.replace("tokens=24 ", f"tokens={tokens} ", 1)
    return out


@pytest.mark.parametrize(
    ("rows", "tokens", "partial"),
    [(10, 10, False), (24, 24, False), (10, 24, True), (10, None, True), (24, 10, True)],
)
def test_finished_means_a_summary_whose_tokens_match_the_rows(
    corpus: Path, tmp_path: Path, rows: int, tokens: int | None, partial: bool
) -> None:
    path = tmp_path / "run.csv"
    path.write_text(_cut((corpus / "native-tiny/run.csv").read_text(), rows, tokens))
    run = read_metrics(path)
    assert run.tokens == rows and run.steps == 24 and run.partial is partial


def test_a_session_is_finished_when_its_turns_tokens_add_up(corpus: Path, tmp_path: Path) -> None:
    text = (corpus / "native-tiny/sess.csv").read_text()
    assert not read_metrics(corpus / "native-tiny/sess.csv").partial
    last = text.rindex("# summary")
    path = tmp_path / "sess.csv"
    path.write_text(text[:last])  # the second turn's rows without its summary: killed
    assert read_metrics(path).partial


def test_drop_run_summary_keys(corpus: Path) -> None:
    run = read_metrics(corpus / "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv")
    assert run.summary["experts_dropped"] == 66582
    assert run.summary["experts_routed"] == 469760
    assert run.params["drop_cold_frac"] == pytest.approx(0.75)


def test_session_csv_has_a_summary_per_turn(corpus: Path) -> None:
    run = read_metrics(corpus / "native-tiny/sess.csv")
    assert [s["tokens"] for s in run.summaries] == [8, 6]
    assert sorted(run.rows["turn"].unique()) == [0, 1]
    assert not run.partial
