"""Decode-trace views: the reference figures on the native engine's files, hand-worked
examples, and a straightforward pure-Python oracle on generated traces."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.analyze import op_traces as dec
from bmoe.errors import BmoeError
from bmoe.formats.metrics import metrics_from_text, read_metrics
from bmoe.formats.op_traces import ComputeTrace, IoTrace, read_compute_trace, read_io_trace

TINY = "native-tiny"
REF = "reference"


def printed(value: float, text: str) -> bool:
    """`value` spelled with as many decimals as the reference printed equals its text."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{value:.{decimals}f}" == text


def assert_printed(value: float, text: str, what: str) -> None:
    assert printed(value, text), f"{what}: {value!r} does not print as {text!r}"


# ----------------------------------------------------------------------------- reference


def test_compute_per_node_matches_reference(corpus: Path) -> None:
    ref = (corpus / REF / "native-tiny.decode-compute.txt").read_text()
    trace = read_compute_trace(corpus / TINY / "ct.compute.csv")
    views = dec.analyze_compute(trace)
    summary = views["summary"]

    m = re.search(
        r"decode steps=(\d+)\s+nodes/step=(\d+)\s+measured compute=\s*([\d.]+) ms/token\s+"
        r"majflt=([\d.]+)/token",
        ref,
    )
    assert m, "reference header not found"
    assert summary["steps"] == int(m.group(1))
    assert_printed(summary["nodes_per_step"], m.group(2), "nodes/step")
    assert_printed(summary["ms_per_token"], m.group(3), "ms/token")
    assert_printed(summary["majflt_per_token"], m.group(4), "majflt/token")

    rows = re.findall(r"^([A-Z_]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)\s", ref, re.M)
    by_op = views["by_op"]
    assert len(rows) == 12 and list(by_op["op"]) == [r[0] for r in rows]
    for (op, ms, share, faults), got in zip(rows, by_op.itertuples(), strict=True):
        assert_printed(got.ms_per_token, ms, f"{op} ms/token")
        assert_printed(got.share_pct, share, f"{op} share")
        assert_printed(got.majflt_per_token, faults, f"{op} majflt/tok")

    layers = re.findall(r"layer\s+(-?\d+)\s+([\d.]+) ms/tok", ref)
    by_layer = views["by_layer"]
    assert [int(r[0]) for r in layers] == list(by_layer["layer"])
    for (layer, ms), got in zip(layers, by_layer["ms_per_token"], strict=True):
        assert_printed(got, ms, f"layer {layer}")


def test_compute_layer_granular_matches_reference(corpus: Path) -> None:
    ref = (corpus / REF / "native-tiny.decode-compute-layers.txt").read_text()
    trace = read_compute_trace(corpus / TINY / "ctl.compute-layers.csv")
    views = dec.analyze_compute(trace)
    m = re.search(r"decode steps=(\d+)\s+layer granularity\s+measured compute=\s*([\d.]+)", ref)
    assert m and views["summary"]["steps"] == int(m.group(1))
    assert_printed(views["summary"]["ms_per_token"], m.group(2), "ms/token")
    rows = re.findall(r"^(pre|blk\.\d+|post)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)", ref, re.M)
    segments = views["segments"]
    assert list(segments["segment"]) == [r[0] for r in rows]
    for (name, ms, share, faults), got in zip(rows, segments.itertuples(), strict=True):
        assert_printed(got.ms_per_token, ms, f"{name} ms/token")
        assert_printed(got.share_pct, share, f"{name} share")
        assert_printed(got.majflt_per_token, faults, f"{name} majflt/tok")
    assert "by_op" not in views and "by_class" not in views


def test_io_matches_reference(corpus: Path) -> None:
    ref = (corpus / REF / "native-tiny.decode-io.txt").read_text()
    trace = read_io_trace(corpus / TINY / "pf.io.csv")
    views = dec.analyze_io(trace, adjacent=True)
    s = views["summary"]

    m = re.search(r"decode steps=(\d+)\s+reads=(\d+) \((\d+)/token\)\s+read=([\d.]+) MiB", ref)
    assert m
    assert s["steps"] == int(m.group(1)) and s["reads"] == int(m.group(2))
    assert_printed(s["reads_per_token"], m.group(3), "reads/token")
    assert_printed(s["mib_per_token"], m.group(4), "MiB/token")
    m = re.search(r"lane-busy bandwidth=([\d.]+) MiB/s.*\(([\d.]+) ms lane-busy/token\)", ref)
    assert m
    assert_printed(s["lane_busy_mib_s"], m.group(1), "lane-busy MiB/s")
    assert_printed(s["busy_ms_per_token"], m.group(2), "busy ms/token")
    m = re.search(r"alignment waste=([\d.]+)% \(([\d.]+) MiB/token", ref)
    assert m
    assert_printed(s["waste_pct"], m.group(1), "waste %")
    assert_printed(s["waste_mib_per_token"], m.group(2), "waste MiB/token")

    for name, value in re.findall(r"^\s+(p50|p90|p99|max)\s+([\d.]+)$", ref, re.M):
        assert_printed(views["latency_us"][name], value, f"latency {name}")

    sizes = re.findall(r"^\s+(\d+) K\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", ref, re.M)
    got = views["sizes"]
    assert len(sizes) == len(got) == 1
    for (kib, reads, mib, mib_s, us), row in zip(sizes, got.itertuples(), strict=True):
        assert row.size_kib == int(kib) and row.reads == int(reads)
        assert_printed(row.mib, mib, "size MiB")
        assert_printed(row.mib_s, mib_s, "size MiB/s")
        assert_printed(row.us_per_read, us, "us/read")

    lanes = re.findall(
        r"lane (\d+):\s+([\d.]+) MiB/tok\s+busy\s+([\d.]+) ms/tok\s+([\d.]+) MiB/s", ref
    )
    got = views["lanes"]
    assert [int(r[0]) for r in lanes] == list(got["lane"])
    for (lane, mib, busy, mib_s), row in zip(lanes, got.itertuples(), strict=True):
        assert_printed(row.mib_per_token, mib, f"lane {lane} MiB/tok")
        assert_printed(row.busy_ms_per_token, busy, f"lane {lane} busy")
        assert_printed(row.mib_s, mib_s, f"lane {lane} MiB/s")

    m = re.search(r"(\d+) reads/token span (\d+) contiguous runs/token", ref)
    adj = views["adjacency"]
    assert m
    assert_printed(adj["reads_per_token"], m.group(1), "reads/token")
    assert_printed(adj["runs_per_token"], m.group(2), "runs/token")
    m = re.search(r"that is ([\d.]+)x fewer requests", ref)
    assert m
    assert_printed(adj["ceiling"], m.group(1), "coalescing ceiling")


# ----------------------------------------------------------------------------- hand-worked


def io_trace(rows: list[dict], **meta) -> IoTrace:
    frame = pd.DataFrame(rows)
    for col, default in (("turn", 0), ("phase", 1), ("spec", 0), ("proj", 0), ("expert", 0)):
        frame[col] = frame[col].fillna(default).astype(int) if col in frame else default
    return IoTrace(None, 1, meta, frame)


def test_quantile_index_rule() -> None:
    # n=10: q=0.5 -> index 5 (6th smallest), q=0.9 -> 9, q=0.99 -> min(9, 9) = 9.
    values = np.array([10, 1, 9, 2, 8, 3, 7, 4, 6, 5])
    assert dec.quantile_index(values, 0.5) == 6
    assert dec.quantile_index(values, 0.9) == 10
    assert dec.quantile_index(values, 0.99) == 10
    assert dec.quantile_index(np.array([7]), 0.5) == 7


def test_size_buckets_are_powers_of_two_kib_at_or_below() -> None:
    sizes = np.array([100, 1023, 1024, 4096, 69632, 67872, 131071, 131072, 1 << 30])
    assert list(dec.size_buckets(sizes)) == [1, 1, 1, 4, 64, 64, 64, 128, 1 << 20]


def test_adjacency_hand_worked() -> None:
    # Step 1: [0,100) [100,200) touch -> one run; [150,250) overlaps it -> same run;
    # [400,500) is apart -> second run. Step 2: [100,200) then [0,100) (sorted by offset they
    # touch) -> one run. 6 reads, 3 runs over 2 steps.
    reads = [
        (1, 100, 0), (1, 400, 100), (1, 0, 100), (1, 150, 100), (2, 100, 100), (2, 0, 100),
    ]  # fmt: skip
    trace = io_trace(
        [
            {
                "step": s,
                "layer": 0,
                "lane": 0,
                "offset": o,
                "req_bytes": 100,
                "read_bytes": 4096,
                "latency_ns": 1000,
            }
            for s, o, _ in reads
        ]
    )
    adj = dec.io_adjacency(trace)
    assert adj == {"reads_per_token": 3.0, "runs_per_token": 1.5, "ceiling": 2.0}


def test_io_summary_hand_worked() -> None:
    mib = 1 << 20
    trace = io_trace(
        [
            # prefill row: ignored because decode rows exist
            {
                "phase": 0,
                "step": 9,
                "layer": 0,
                "lane": 0,
                "offset": 0,
                "req_bytes": 1,
                "read_bytes": 999,
                "latency_ns": 10**9,
            },
            {
                "step": 10,
                "layer": 0,
                "lane": 0,
                "offset": 0,
                "req_bytes": mib // 2,
                "read_bytes": mib,
                "latency_ns": 2_000_000,
                "spec": 1,
            },
            {
                "step": 10,
                "layer": 1,
                "lane": 1,
                "offset": mib,
                "req_bytes": mib,
                "read_bytes": mib,
                "latency_ns": 4_000_000,
            },
            {
                "step": 11,
                "layer": 0,
                "lane": 1,
                "offset": 0,
                "req_bytes": mib,
                "read_bytes": 2 * mib,
                "latency_ns": 2_000_000,
            },
        ]
    )
    s = dec.io_summary(trace)
    assert s["steps"] == 2 and s["reads"] == 3
    assert s["mib_per_token"] == 2.0  # 4 MiB over 2 steps
    assert s["lane_busy_mib_s"] == pytest.approx(4 / 0.008)
    assert s["waste_pct"] == pytest.approx(100 * 1.5 / 4)
    lanes = dec.io_lanes(trace)
    assert list(lanes["busy_ms_per_token"]) == [1.0, 3.0]
    assert list(lanes["mib_s"]) == pytest.approx([500.0, 3 / 0.006])
    spec = dec.io_speculative(trace)
    assert spec["reads"] == 1 and spec["bytes_pct"] == 25.0
    sizes = dec.io_sizes(trace)
    assert list(sizes["size_kib"]) == [1024, 2048] and list(sizes["reads"]) == [2, 1]


def test_compute_faults_and_segments_order() -> None:
    rows = pd.DataFrame(
        {
            "turn": 0,
            "phase": 1,
            "step": [5, 5, 5, 5, 6, 6, 6, 6],
            "seq": [0, 1, 2, 3, 0, 1, 2, 3],
            "layer": [-1, 10, 2, -1] * 2,
            "op": pd.Categorical(["LAYER"] * 8),
            "name": pd.Categorical(["pre", "blk.10", "blk.2", "post"] * 2),
            "wall_ns": [1_000_000, 2_000_000, 3_000_000, 4_000_000] * 2,
            "majflt": [0, 4, 0, 2] * 2,
        }
    )
    trace = ComputeTrace(None, 1, {}, rows)
    assert trace.layer_granular
    seg = dec.compute_segments(trace)
    assert list(seg["segment"]) == ["pre", "blk.2", "blk.10", "post"]
    assert list(seg["ms_per_token"]) == [1.0, 3.0, 2.0, 4.0]
    faults = dec.compute_faults(trace)
    assert list(faults["segment"]) == ["blk.10", "post"]
    assert list(faults["majflt_per_token"]) == [4.0, 2.0]
    assert list(faults["fault_share_pct"]) == pytest.approx([100 * 4 / 6, 100 * 2 / 6])


def test_empty_trace_is_a_one_line_error() -> None:
    empty = ComputeTrace("x.csv", 1, {}, pd.DataFrame({"step": [], "wall_ns": []}))
    with pytest.raises(BmoeError, match="no rows"):
        dec.compute_summary(empty)


# ----------------------------------------------------------------------------- oracle


def oracle_compute(rows: list[dict]) -> dict:
    """The reference semantics, written the obvious way."""
    dec_rows = [r for r in rows if r["phase"] == 1] or rows
    steps = len({(r["turn"], r["step"]) for r in dec_rows})
    ns: dict = defaultdict(int)
    faults: dict = defaultdict(int)
    per_layer: dict = defaultdict(int)
    for r in dec_rows:
        ns[r["op"]] += r["wall_ns"]
        faults[r["op"]] += r["majflt"]
        per_layer[r["layer"]] += r["wall_ns"]
    total = sum(ns.values())
    return {
        "steps": steps,
        "ms_per_token": total / steps / 1e6,
        "by_op": {
            op: (v / steps / 1e6, 100 * v / total, faults[op] / steps) for op, v in ns.items()
        },
        "by_layer": {k: v / steps / 1e6 for k, v in per_layer.items()},
    }


def oracle_io(rows: list[dict]) -> dict:
    dec_rows = [r for r in rows if r["phase"] == 1] or rows
    steps = sorted({(r["turn"], r["step"]) for r in dec_rows})
    lat = sorted(r["latency_ns"] for r in dec_rows)
    n = len(lat)
    runs = 0
    for key in steps:
        reach = None
        for r in sorted(
            (r for r in dec_rows if (r["turn"], r["step"]) == key), key=lambda r: r["offset"]
        ):
            if reach is None or r["offset"] > reach:
                runs += 1
                reach = r["offset"] + r["req_bytes"]
            else:
                reach = max(reach, r["offset"] + r["req_bytes"])
    buckets: dict = defaultdict(int)
    for r in dec_rows:
        kib = max(r["read_bytes"] // 1024, 1)
        buckets[2 ** (kib.bit_length() - 1)] += 1
    return {
        "p50": lat[min(n - 1, math.floor(0.5 * n))] / 1e3,
        "p90": lat[min(n - 1, math.floor(0.9 * n))] / 1e3,
        "p99": lat[min(n - 1, math.floor(0.99 * n))] / 1e3,
        "runs": runs,
        "steps": len(steps),
        "buckets": dict(buckets),
    }


OPS = ["MUL_MAT", "ADD", "GET_ROWS", "MUL_MAT_ID"]


@st.composite
def compute_rows(draw) -> list[dict]:
    n = draw(st.integers(1, 60))
    return [
        {
            "turn": draw(st.integers(0, 1)),
            "phase": draw(st.integers(0, 1)),
            "step": draw(st.integers(0, 5)),
            "seq": i,
            "layer": draw(st.integers(-1, 3)),
            "op": draw(st.sampled_from(OPS)),
            "name": "n",
            "wall_ns": draw(st.integers(1, 10**7)),
            "majflt": draw(st.integers(0, 3)),
        }
        for i in range(n)
    ]


@settings(max_examples=30, deadline=None)
@given(compute_rows())
def test_compute_views_match_oracle(rows: list[dict]) -> None:
    frame = pd.DataFrame(rows).astype({"op": "category", "name": "category"})
    trace = ComputeTrace(None, 1, {}, frame)
    want = oracle_compute(rows)
    s = dec.compute_summary(trace)
    assert s["steps"] == want["steps"]
    assert s["ms_per_token"] == pytest.approx(want["ms_per_token"])
    by_op = dec.compute_by_op(trace, top=None).set_index("op")
    assert set(by_op.index) == set(want["by_op"])
    for op, (ms, share, faults) in want["by_op"].items():
        assert by_op.loc[op, "ms_per_token"] == pytest.approx(ms)
        assert by_op.loc[op, "share_pct"] == pytest.approx(share)
        assert by_op.loc[op, "majflt_per_token"] == pytest.approx(faults)
    assert list(by_op["ms_per_token"]) == sorted(by_op["ms_per_token"], reverse=True)
    by_layer = dec.compute_by_layer(trace).set_index("layer")["ms_per_token"].to_dict()
    assert by_layer == pytest.approx(want["by_layer"])


@st.composite
def io_rows(draw) -> list[dict]:
    n = draw(st.integers(1, 50))
    return [
        {
            "turn": 0,
            "phase": draw(st.integers(0, 1)),
            "step": draw(st.integers(0, 4)),
            "layer": draw(st.integers(0, 2)),
            "expert": 0,
            "proj": 0,
            "lane": draw(st.integers(0, 2)),
            "spec": 0,
            "offset": draw(st.integers(0, 40)) * 512,
            "req_bytes": draw(st.sampled_from([512, 1024, 1536])),
            "read_bytes": draw(st.integers(1, 300_000)),
            "latency_ns": draw(st.integers(1, 10**6)),
        }
        for _ in range(n)
    ]


@settings(max_examples=30, deadline=None)
@given(io_rows())
def test_io_views_match_oracle(rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    for ordered in (frame, frame.sort_values(["turn", "step"], kind="stable")):
        check_io_against_oracle(IoTrace(None, 1, {}, ordered), rows)


def check_io_against_oracle(trace: IoTrace, rows: list[dict]) -> None:
    want = oracle_io(rows)
    lat = dec.io_latency(trace)
    assert (lat["p50"], lat["p90"], lat["p99"]) == (want["p50"], want["p90"], want["p99"])
    adj = dec.io_adjacency(trace)
    assert adj["runs_per_token"] * want["steps"] == pytest.approx(want["runs"])
    sizes = dec.io_sizes(trace)
    assert dict(zip(sizes["size_kib"], sizes["reads"], strict=True)) == want["buckets"]


# ----------------------------------------------------------------------------- metrics join


@pytest.mark.parametrize("name", ["run", "pf"])
def test_io_join_lines_up_read_bytes_token_by_token(corpus: Path, name: str) -> None:
    """The metrics row's read_bytes is exactly what the io trace read at the same token: the
    proof that metrics step = trace step - prompt end + 1."""
    trace = read_io_trace(corpus / TINY / f"{name}.io.csv")
    run = read_metrics(corpus / TINY / f"{name}.csv")
    joined = dec.io_join(trace, run)
    assert len(joined) == len(run.rows)
    assert joined["read_bytes"].notna().all()
    assert (joined["read_bytes"] == joined["metrics_read_bytes"]).all()
    assert list(joined["step"]) == list(run.rows["step"])


def test_compute_join_puts_traced_time_next_to_wall(corpus: Path) -> None:
    trace = read_compute_trace(corpus / TINY / "ct.compute.csv")
    run = read_metrics(corpus / TINY / "ct.csv")
    joined = dec.compute_join(trace, run)
    assert len(joined) == 32 and joined["traced_ms"].notna().all()
    # The graph is the whole decode: its measured time sits just under wall_ms, token by token.
    assert (joined["traced_ms"] <= joined["wall_ms"] + 1e-9).all()
    assert (joined["traced_pct_of_wall"] > 95).all()
    classes = [c for c in joined if c.endswith("_ms") and c.split("_ms")[0] in
               {"attention", "router", "expert_matmul", "dense_ffn", "norm", "other"}]  # fmt: skip
    assert len(classes) == 6
    assert np.allclose(joined[classes].sum(axis=1), joined["traced_ms"])


def test_prompt_end_without_prefill_rows_uses_summary_then_first_decode() -> None:
    rows = pd.DataFrame({"turn": 0, "phase": 1, "step": [40, 41, 42]})
    run = metrics_from_text(
        "step,steps,wall_ms\n1,3,1.0\n2,3,1.0\n3,3,1.0\n# summary tokens=3 n_prompt=40\n"
    )
    assert dec.prompt_ends(rows, run) == {0: 40}
    assert dec.prompt_ends(rows, None) == {0: 40}
    run_off = metrics_from_text("step,steps,wall_ms\n1,3,1.0\n# summary tokens=3 n_prompt=38\n")
    # A summary that disagrees with the trace wins only when the trace has no prefill rows.
    assert dec.prompt_ends(rows, run_off) == {0: 38}


def test_session_join_per_turn() -> None:
    """Two turns: each turn's decode steps map to its own metrics steps 1..n."""
    steps = [(0, 0, 16), *[(0, 1, s) for s in range(17, 20)], (1, 0, 30),
             *[(1, 1, s) for s in range(31, 33)]]  # fmt: skip
    rows = pd.DataFrame(
        {
            "turn": [t for t, _, _ in steps],
            "phase": [p for _, p, _ in steps],
            "step": [s for _, _, s in steps],
            "seq": 0,
            "layer": 0,
            "op": pd.Categorical(["MUL_MAT"] * len(steps)),
            "name": pd.Categorical(["ffn_up-0"] * len(steps)),
            "wall_ns": [s * 1_000_000 for _, _, s in steps],
            "majflt": 0,
        }
    )
    run = metrics_from_text(
        "step,steps,wall_ms,turn\n1,3,17.5,0\n2,3,18.5,0\n3,3,19.5,0\n1,2,31.5,1\n2,2,32.5,1\n"
    )
    joined = dec.compute_join(ComputeTrace(None, 1, {}, rows), run)
    assert list(zip(joined["turn"], joined["step"], joined["trace_step"], strict=True)) == [
        (0, 1, 17), (0, 2, 18), (0, 3, 19), (1, 1, 31), (1, 2, 32),
    ]  # fmt: skip
    assert np.allclose(joined["wall_ms"] - joined["traced_ms"], 0.5)
