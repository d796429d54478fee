"""Every native file reads, and files of one run agree with each other where they overlap."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from bmoe.formats import protocol
from bmoe.formats.errors import FormatWarning
from bmoe.formats.load import detect_kind, load_file
from bmoe.formats.metrics import MetricsRun, read_metrics
from bmoe.formats.op_traces import ComputeTrace, IoTrace
from bmoe.formats.route import RouteTrace, read_route_trace
from bmoe.formats.runlog import RunOutput, read_run_output
from bmoe.formats.sidecar import read_pressure, read_state

KIND_BY_SUFFIX = {
    ".route.csv": ("route", RouteTrace),
    ".compute.csv": ("compute", ComputeTrace),
    ".compute-layers.csv": ("compute", ComputeTrace),
    ".io.csv": ("io", IoTrace),
    ".csv": ("metrics", MetricsRun),
    ".out": ("protocol", RunOutput),
    ".log": ("log", RunOutput),
    ".err": ("log", RunOutput),
    ".state": ("state", dict),
}


def _expected(path: Path) -> tuple[str, type]:
    if path.suffix == ".metrics":  # the name is no guide: some are metrics CSVs, some sidecars
        head = path.read_bytes()[:200]
        return ("metrics", MetricsRun) if b"step," in head else ("pressure", dict)
    for suffix, kind in KIND_BY_SUFFIX.items():
        if path.name.endswith(suffix):
            return kind
    raise AssertionError(f"no expectation for {path}")


def test_every_corpus_file_reads_as_its_kind(corpus: Path) -> None:
    files = sorted(
        p
        for p in corpus.rglob("*")
        if p.is_file() and "reference" not in p.parts and p.suffix != ".md"
    )
    assert len(files) >= 40
    for path in files:
        kind, cls = _expected(path)
        if path.suffix == ".out" and not path.read_bytes().startswith(b"BMOE_"):
            kind = "log"  # one-shot runs without --progress print only the end-of-run lines
        assert detect_kind(path) == kind, path
        with warnings.catch_warnings():
            warnings.simplefilter("error", FormatWarning)
            assert isinstance(load_file(path), cls), path


def test_one_run_agrees_across_its_files(corpus: Path) -> None:
    tiny = corpus / "native-tiny"
    run_csv = read_metrics(tiny / "run.csv")
    out = read_run_output(tiny / "run.out")
    assert len(out.of(protocol.Progress)) == run_csv.tokens == out.figures["tokens"] == 24
    assert out.figures["tok/s"] == run_csv.summary["tok/s"] == 362.141
    assert out.figures["evictions"] == run_csv.summary["evictions"] == 186
    assert out.figures["cache_hit_pct"] == run_csv.summary["cache_hit_pct"] == 9.7
    assert out.answer is not None
    assert out.answer == b"".join(p.delta_text_bytes for p in out.of(protocol.Progress))
    progress = out.progress()
    assert len(progress) == 24 and progress["turn"].eq(0).all()
    assert progress["load_mb"].iloc[0] == 1.2 and progress["step"].dtype.itemsize == 4


def test_dropping_is_the_same_123_everywhere(corpus: Path) -> None:
    tiny = corpus / "native-tiny"
    trace = read_route_trace(tiny / "drop.route.csv")
    decode = trace.rows[trace.rows["phase"] == 1]
    figures = read_run_output(tiny / "drop.out").figures
    summary = read_metrics(tiny / "drop.csv").summary
    assert int(trace.rows["dropped"].sum()) == int(decode["dropped"].sum()) == 123
    assert figures["experts_dropped"] == summary["experts_dropped"] == 123
    assert figures["experts_routed"] == summary["experts_routed"] == len(decode) == 384


def test_session_stream_matches_its_csv(corpus: Path) -> None:
    tiny = corpus / "native-tiny"
    done = read_run_output(tiny / "sess.out").generations
    csv = read_metrics(tiny / "sess.csv")
    assert [d.tokens for d in done] == [s["tokens"] for s in csv.summaries] == [8, 6]
    assert [d.n_prompt for d in done] == [s["n_prompt"] for s in csv.summaries] == [17, 14]
    assert [d.tok_s for d in done] == [s["tok/s"] for s in csv.summaries]
    progress = read_run_output(tiny / "sess.out").progress()
    assert progress.groupby("turn").size().tolist() == [8, 6]


def test_phone_logs_carry_their_sidecar(corpus: Path) -> None:
    for stem in ("2026-07-12/qwen_mmap", "2026-07-12/qwen_c4000_l4", "2026-07-13/qwen_auto_ov"):
        log = read_run_output(corpus / "metrics" / f"{stem}.log")
        sidecar = read_pressure(corpus / "metrics" / f"{stem}.metrics")
        assert log.pressure == sidecar and len(sidecar) == 9
        csv = read_metrics(corpus / "metrics" / f"{stem}.csv")
        assert log.figures["tokens"] == csv.summary["tokens"] == 256
        assert log.figures["load_s"] == csv.summary["load_s"]
    assert read_pressure(corpus / "metrics/2026-07-12/qwen_mmap.metrics")["peak_rss_kb"] == 6152604


def test_gemma_run_agrees_across_its_files(corpus: Path) -> None:
    log = read_run_output(corpus / "route-trace/gemma.log").figures
    csv = read_metrics(corpus / "route-trace/gemma.metrics")
    assert csv.version == 0 and csv.tokens == 128 and not csv.partial
    for key in ("tok/s", "read_MiB", "n_prompt", "stall_s/tok", "cpu_s/tok", "mgmt_s/tok"):
        assert log[key] == csv.summary[key], key
    trace = read_route_trace(corpus / "route-trace/gemma.route.csv")
    assert trace.rows.loc[trace.rows["phase"] == 1, "step"].nunique() == 128


def test_device_state_snapshot(corpus: Path) -> None:
    state = read_state(corpus / "route-trace/gemma.state")
    before, after = state["before"], state["after"]
    assert before.scaling_max_freq == {"policy0": 2188800, "policy6": 1651200}
    assert after.scaling_max_freq["policy0"] == 1900800
    assert before.meminfo_kb["MemAvailable"] == 6794156 and after.thermal_status == 2
    assert before.cpu_temp_max_c == 99.6 and before.battery_temp_dC is None


def test_decode_traces(corpus: Path) -> None:
    tiny = corpus / "native-tiny"
    per_node = load_file(tiny / "ct.compute.csv")
    per_layer = load_file(tiny / "ctl.compute-layers.csv")
    assert len(per_node.rows) == 6930 and not per_node.layer_granular
    assert len(per_layer.rows) == 297 and per_layer.layer_granular
    assert per_layer.meta["n_layer"] == 4 and per_layer.rows["op"].dtype == "category"
    io = load_file(tiny / "pf.io.csv")
    assert len(io.rows) == 825 and int(io.rows["spec"].sum()) == 0
    assert read_run_output(tiny / "pf.out").figures["spec_experts"] == 0
    assert (io.rows["read_bytes"] >= io.rows["req_bytes"]).all()


def test_failed_run(corpus: Path) -> None:
    err = read_run_output(corpus / "native-tiny/ov.err")
    assert err.failure is not None and err.failure.startswith("--overlap requires")
    assert err.figures == {} and not err.events


@pytest.mark.parametrize("name", ["native-tiny/run.csv", "route-trace/gemma.route.csv"])
def test_bmoe_load_is_load_file(corpus: Path, name: str) -> None:
    import bmoe

    assert type(bmoe.load(corpus / name)) is type(load_file(corpus / name))
