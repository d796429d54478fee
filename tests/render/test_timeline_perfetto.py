"""Decode timelines (measured and reconstructed) and the Chrome trace-event export."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.timeline import build_timeline, layer_segments
from bmoe.formats.op_traces import ComputeTrace, IoTrace, read_compute_trace, read_io_trace
from bmoe.render.perfetto import chrome_trace, overlap_levels

TINY = "native-tiny"


def io_rows(reads: list[tuple[int, int, int]], start: list[int] | None = None) -> pd.DataFrame:
    """(step, lane, latency_ns) per read, optional start_ns."""
    frame = pd.DataFrame(
        {
            "turn": 0,
            "phase": 1,
            "step": [s for s, _, _ in reads],
            "layer": 0,
            "expert": range(len(reads)),
            "proj": 1,
            "lane": [lane for _, lane, _ in reads],
            "spec": 0,
            "offset": [4096 * i for i in range(len(reads))],
            "req_bytes": 4000,
            "read_bytes": 4096,
            "latency_ns": [lat for _, _, lat in reads],
        }
    )
    if start is not None:
        frame["start_ns"] = start
    return frame


def compute_rows(nodes: list[tuple[int, int]]) -> pd.DataFrame:
    """(step, wall_ns) per node."""
    return pd.DataFrame(
        {
            "turn": 0,
            "phase": 1,
            "step": [s for s, _ in nodes],
            "seq": range(len(nodes)),
            "layer": 0,
            "op": pd.Categorical(["MUL_MAT"] * len(nodes)),
            "name": pd.Categorical(["ffn_up-0"] * len(nodes)),
            "wall_ns": [w for _, w in nodes],
            "majflt": 0,
        }
    )


def test_reconstructed_io_lays_each_lane_end_to_end_within_its_step() -> None:
    io = IoTrace(None, 1, {}, io_rows([(5, 0, 100), (5, 1, 300), (5, 0, 50), (6, 0, 10)]))
    tl = build_timeline(None, io)
    assert tl.reconstructed and not tl.io_measured and "reconstructed" in tl.notes[0]
    # step 5: lane 0 reads at 0 and 100, lane 1 at 0; the step lasts 300 (lane 1).
    assert list(tl.io["start_ns"]) == [0, 0, 100, 300]
    assert list(tl.io["dur_ns"]) == [100, 300, 50, 10]
    assert list(tl.steps["start_ns"]) == [0, 300] and list(tl.steps["end_ns"]) == [300, 310]


def test_reconstructed_steps_last_as_long_as_compute_or_busiest_lane() -> None:
    io = IoTrace(None, 1, {}, io_rows([(1, 0, 100), (2, 0, 500)]))
    comp = ComputeTrace(None, 1, {}, compute_rows([(1, 200), (1, 200), (2, 100)]))
    tl = build_timeline(comp, io)
    assert list(tl.compute["start_ns"]) == [0, 200, 400]
    assert list(tl.io["start_ns"]) == [0, 400]
    assert list(tl.steps["end_ns"]) == [400, 900]


def test_measured_io_keeps_start_ns_and_anchors_compute_steps() -> None:
    io = IoTrace(None, 1, {}, io_rows([(1, 0, 100), (1, 1, 100), (2, 0, 100)], [1000, 1050, 5000]))
    comp = ComputeTrace(None, 1, {}, compute_rows([(1, 300), (1, 300), (2, 100), (3, 100)]))
    tl = build_timeline(comp, io)
    assert tl.io_measured and not tl.compute_measured
    assert list(tl.io["start_ns"]) == [1000, 1050, 5000]
    # step 1 starts at its first read, step 2 at its first read, step 3 (no reads) right
    # after step 2's compute.
    assert list(tl.compute["start_ns"]) == [1000, 1300, 5000, 5100]


def test_compute_never_starts_before_the_previous_step_ended() -> None:
    io = IoTrace(None, 1, {}, io_rows([(1, 0, 10), (2, 0, 10)], [0, 50]))
    comp = ComputeTrace(None, 1, {}, compute_rows([(1, 200), (2, 100)]))
    tl = build_timeline(comp, io)
    assert list(tl.compute["start_ns"]) == [0, 200]


def test_layer_segments_merge_consecutive_nodes_of_a_layer(corpus: Path) -> None:
    comp = read_compute_trace(corpus / TINY / "ct.compute.csv")
    tl = build_timeline(comp, None, decode_only=True)
    seg = layer_segments(tl.compute)
    assert seg["dur_ns"].sum() == tl.compute["dur_ns"].sum()
    assert seg["nodes"].sum() == len(tl.compute)
    first = seg[seg["step"] == seg["step"].min()]
    assert list(first["name"]) == ["no layer", "blk.0", "blk.1", "blk.2", "blk.3", "no layer"]


def test_overlap_levels_separate_overlapping_slices() -> None:
    start = np.array([0, 5, 10, 10, 30])
    end = np.array([10, 20, 12, 15, 40])
    level = overlap_levels(start, end)
    assert _valid(start, end, level)
    assert level[0] == 0 and level[4] == 0  # slices clear of every earlier one stay on top
    assert len(np.unique(level)) >= 3  # 5..20 overlaps 10..12 and 10..15: three deep


def _valid(start, end, level) -> bool:
    for lv in np.unique(level):
        idx = np.flatnonzero(level == lv)
        order = idx[np.argsort(start[idx], kind="stable")]
        if (start[order][1:] < end[order][:-1]).any():
            return False
    return True


def check_chrome_trace(doc: dict) -> list[dict]:
    """The trace-event format's rules; returns the complete events."""
    assert isinstance(doc["traceEvents"], list)
    named: set[tuple[int, int]] = set()
    slices = []
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("X", "M"), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert isinstance(ev["name"], str) and ev["name"]
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "thread_sort_index")
            assert isinstance(ev["args"], dict)
            if ev["name"] == "thread_name":
                named.add((ev["pid"], ev["tid"]))
            continue
        assert isinstance(ev["ts"], int | float) and ev["ts"] >= 0
        assert isinstance(ev["dur"], int | float) and ev["dur"] >= 0
        assert isinstance(ev.get("args", {}), dict)
        slices.append(ev)
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in slices:
        assert (ev["pid"], ev["tid"]) in named, f"track {ev['tid']} has no thread_name"
        tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for track, spans in tracks.items():
        spans.sort()
        for (_s0, e0), (s1, _e1) in itertools.pairwise(spans):
            assert s1 >= e0 - 1e-6, f"overlapping slices on track {track}"
    return slices


def test_export_of_corpus_traces_follows_the_format(corpus: Path) -> None:
    comp = read_compute_trace(corpus / TINY / "ct.compute.csv")
    io = read_io_trace(corpus / TINY / "pf.io.csv")
    tl = build_timeline(comp, io)
    doc = json.loads(chrome_trace(tl, comp.meta))
    slices = check_chrome_trace(doc)
    reads = [e for e in slices if e["cat"].startswith("io")]
    nodes = [e for e in slices if e["cat"] == "compute"]
    assert len(reads) == len(io.rows) and len(nodes) == len(comp.rows)
    # microseconds: a read lasts its latency_ns / 1000
    assert sorted(e["dur"] for e in reads) == pytest.approx(
        sorted(io.rows["latency_ns"].to_numpy() / 1e3)
    )
    assert sorted(e["ts"] for e in reads) == pytest.approx(sorted(tl.io["start_ns"] / 1e3))
    one = reads[0]["args"]
    assert {"layer", "expert", "proj", "read_bytes", "req_bytes", "offset", "lane"} <= set(one)
    lanes = {e["args"]["lane"] for e in reads}
    assert len({e["tid"] for e in reads}) == len(lanes) == 4
    assert doc["otherData"]["io_timeline"] == "reconstructed"
    assert {e["args"]["op_class"] for e in nodes} >= {"attention", "router", "expert matmul"}


def test_export_moves_overlapping_measured_reads_to_extra_tracks() -> None:
    io = IoTrace(None, 1, {}, io_rows([(1, 0, 100), (1, 0, 100), (1, 0, 100)], [0, 50, 100]))
    doc = json.loads(chrome_trace(build_timeline(None, io)))
    reads = [e for e in check_chrome_trace(doc) if e["cat"] == "io"]
    assert len(reads) == 3 and len({e["tid"] for e in reads}) >= 2
    assert sorted(e["ts"] for e in reads) == [0.0, 0.05, 0.1]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "io lane 0 (overlap 1)" in names
    assert doc["otherData"]["io_timeline"] == "measured"


def test_traces_of_different_runs_are_called_out() -> None:
    io = IoTrace(None, 1, {}, io_rows([(50, 0, 100)]))
    comp = ComputeTrace(None, 1, {}, compute_rows([(7, 100)]))
    assert any("different runs" in n for n in build_timeline(comp, io).notes)
    same = ComputeTrace(None, 1, {}, compute_rows([(50, 100)]))
    assert not any("different runs" in n for n in build_timeline(same, io).notes)
