"""Profiles from what phones record (per-token metrics only, any version), hand-worked on
small synthetic files with round numbers; the memory-pressure and prefetch costs; the
refusals; the honesty of a profile (spread, starved runs, traced runs) and of the interval."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.analyze.device import (
    against_files,
    build_profile,
    compare_cells,
    memory_faults,
    predict,
    profile_runs,
    stall_per_miss,
    token_times,
)
from bmoe.cli import main
from bmoe.errors import BmoeError
from bmoe.formats.metrics import MetricsRun, write_metrics
from bmoe.formats.profile import read_profile, write_profile
from bmoe.formats.route import read_route_trace
from bmoe.formats.runfiles import read_recorded_runs
from tests.analyze.device.test_predict import DECODE, PREFILL, Z80, make_trace, round_profile

MIB = 1 << 20

# a model of 2 MoE layers, top-2, 1 MiB experts: v2's cache_cycle_mb (one token's routed bytes)
# is 2 layers x 2 experts x 1 MiB = 4 MiB
PARAMS = {
    "model": "hand.gguf", "arch": "qwen3moe", "n_layer": 2, "n_expert": 8, "n_expert_used": 2,
    "threads": 2, "moe_stream": 1, "cache_mb": 3, "io_threads": 1, "overlap": 0, "prefetch": 0,
    "dense_weights": "mmap", "cache_cycle_mb": 4,
}  # fmt: skip


def write(path: Path, rows: list[dict], version: int = 2, summary=None, **params) -> Path:
    """A metrics file of `rows` (plus step/steps) with the preamble `PARAMS` updated by
    `params` (none at all for version 0)."""
    frame = pd.DataFrame(rows)
    frame.insert(0, "steps", len(frame))
    frame.insert(0, "step", np.arange(1, len(frame) + 1))
    tokens = len(frame)
    wall = float(frame["wall_ms"].sum())
    trailer = {"tokens": tokens, "tok/s": round(1000 * tokens / wall, 3)} | (summary or {})
    preamble = {k: v for k, v in {**PARAMS, **params}.items() if v is not None}  # None: left out
    run = MetricsRun(str(path), version, {} if version == 0 else preamble, frame,
                     [trailer])  # fmt: skip
    write_metrics(run, path)
    return path


def serial_rows(n=32, overhead=0.5, latency=2.0, compute=10.0, mgmt=(1.0, 0.5), cpu=None):
    """Serial tokens at one lane: even tokens read 4 experts (2 a layer: 2 waves a layer),
    odd ones 2 (1 a layer). io = 2 batches x overhead + waves x latency: 9 and 5 ms;
    mgmt = 1 + 0.5 a read: 3 and 2 ms."""
    out = []
    for i in range(n):
        reads = 4 if i % 2 == 0 else 2
        io = 2 * overhead + reads * latency
        m = mgmt[0] + mgmt[1] * reads
        out.append({
            "wall_ms": compute + io + m, "io_ms": io, "compute_ms": compute,
            "read_bytes": reads * MIB, "cache_hit_pct": 50.0, "stall_ms": 0.0, "mgmt_ms": m,
            "majflt": 0, "cpu_ms": (cpu if cpu is not None else compute) * 2,
        })  # fmt: skip
    return out


def overlap_rows(n=32, lanes=2, latency=4.0, stall=(3.0, 1.5), compute=10.0):
    """Overlap tokens: io_ms is the lanes' busy time (latency per read); the stall
    3 + 1.5 ms a read; management 1 + 0.5 a read."""
    out = []
    for i in range(n):
        reads = 4 if i % 2 == 0 else 2
        s = stall[0] + stall[1] * reads
        m = 1.0 + 0.5 * reads
        out.append({
            "wall_ms": compute + s + m, "io_ms": reads * latency, "compute_ms": compute,
            "read_bytes": reads * MIB, "cache_hit_pct": 50.0, "stall_ms": s, "mgmt_ms": m,
            "majflt": 0, "cpu_ms": compute * 2,
        })  # fmt: skip
    return out


def profile_of(*paths: Path, **kw):
    return build_profile(profile_runs(read_recorded_runs(paths)), **kw)


# ----------------------------------------------------------------------------- hand-worked


def test_serial_metrics_profile_hand_worked(tmp_path):
    """io_ms = 2 x 0.5 + waves x 2 separates the per-batch overhead (0.5 ms) from the wave
    latency (2 ms, so 1 MiB / 2 ms = 500 MiB/s on one lane); compute 10 ms; management
    1 ms + 0.5 ms a read; expert sizes from the preamble (4 MiB / (2 x 2))."""
    prof = profile_of(write(tmp_path / "a.csv", serial_rows()))
    assert prof.model["expert_bytes"] == {"0": MIB, "1": MIB}
    assert "cache_cycle_mb" in prof.model["sizes_from"]
    row = prof.flash.iloc[0]
    assert (row["lanes"], row["req_bytes"]) == (1, MIB)
    assert row["latency_ms"] == pytest.approx(2.0)
    assert row["batch_overhead_ms"] == pytest.approx(0.5)
    assert row["mib_s"] == pytest.approx(500.0)
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert prof.mgmt["token_ms"] == pytest.approx(1.0)
    assert prof.mgmt["per_admit_ms"] == pytest.approx(0.5)
    # every term says where it came from; one lane count is one point of the lane curve
    assert prof.terms["flash"]["runs"] == [str(tmp_path / "a.csv")]
    assert "io_ms" in prof.terms["flash"]["columns"]
    assert "1 lanes only" in prof.terms["flash"]["note"]
    assert prof.terms["compute"]["columns"] == ["compute_ms"]
    # constant per-token figures: nothing to be unsure of
    assert prof.terms["compute"]["sd_rel"] == pytest.approx(0.0, abs=1e-9)
    assert prof.settled, prof.unsettled
    # no run used --overlap, none recorded memory: named, never zero
    assert "stall" in prof.absent and "overlap" in prof.absent["stall"]
    assert "memory" in prof.absent


def test_overlap_metrics_profile_hand_worked(tmp_path):
    """Under --overlap io_ms is the lanes' busy time: 4 ms a read at 2 lanes; the stall fits
    3 ms a token + 1.5 ms a read missed."""
    prof = profile_of(write(tmp_path / "o.csv", overlap_rows(), overlap=1, io_threads=2))
    assert prof.mode == "overlap"
    row = prof.flash.iloc[0]
    assert (row["lanes"], row["latency_ms"]) == (2, pytest.approx(4.0))
    assert "overlap" in row["source"]
    assert prof.overlap["stall_ms"] == pytest.approx(3.0)
    assert prof.overlap["stall_ms_per_miss"] == pytest.approx(1.5)
    assert prof.overlap["lanes"] == [2]
    assert prof.terms["stall"]["columns"][0] == "stall_ms"
    # at one lane a read is no faster than its 4 ms alone (no lane to share it with): 4 ms a
    # lane against 4 / 2 at two lanes, so the stall per read doubles to 3 ms; at 8 lanes the
    # lanes' throughput is held at the measured one
    assert stall_per_miss(prof, 1) == pytest.approx(3.0)
    assert stall_per_miss(prof, 8) == pytest.approx(1.5)


def test_mixed_profile_predicts_both_modes_hand_worked(tmp_path):
    """A serial run at one lane and an overlap run at two: one profile, mode mixed. At budget
    0 each decode step of DECODE misses 2 experts at each of 2 layers (4 reads):
    serial at 1 lane: 2 x 0.5 + 4 x 2 = 9 ms flash; overlap at 2 lanes: 3 + 4 x 1.5 = 9 ms;
    both add compute 10 and management 1 + 0.5 x 4 = 3."""
    prof = profile_of(
        write(tmp_path / "s.csv", serial_rows()),
        write(tmp_path / "o.csv", overlap_rows(), overlap=1, io_threads=2),
    )
    assert prof.mode == "mixed"
    trace = make_trace(PREFILL, DECODE)
    trace.meta["n_expert_used"] = 2
    out = predict(trace, prof, {"cache_mb": [0], "io_threads": [1, 2], "overlap": [0, 1]})
    at = out.set_index(["io_threads", "overlap"])
    assert at.loc[(1, 0), "flash_ms"] == pytest.approx(9.0)
    assert at.loc[(2, 1), "flash_ms"] == pytest.approx(9.0)
    assert at.loc[(1, 0), "token_ms"] == pytest.approx(22.0)
    # the flash table prices a request 2 ms per lane at one lane (serial: 2 ms a wave) as at
    # two (overlap: 4 ms / 2 lanes): the stall per read stays 1.5 ms at one lane
    assert at.loc[(1, 1), "flash_ms"] == pytest.approx(9.0)


def test_two_lane_counts_give_a_lane_curve(tmp_path):
    """At 4 lanes a token of 4 reads (2 a layer) is one wave a layer, one of 10 reads (5 a
    layer) two: io = 2 x 0.5 + waves x 3 = 7 and 13 ms."""
    wide = serial_rows()
    for i, row in enumerate(wide):
        reads, io = (4, 7.0) if i % 2 == 0 else (10, 13.0)
        row.update(read_bytes=reads * MIB, io_ms=io, wall_ms=row["compute_ms"] + io + 3.0,
                   mgmt_ms=3.0)  # fmt: skip
    prof = profile_of(
        write(tmp_path / "a.csv", serial_rows(latency=2.0)),
        write(tmp_path / "b.csv", wide, io_threads=4),
    )
    assert sorted(prof.flash["lanes"]) == [1, 4]
    assert "lane curve from 1, 4 lanes" in prof.terms["flash"]["note"]
    at4 = prof.flash.set_index("lanes").loc[4]
    assert (at4["latency_ms"], at4["batch_overhead_ms"]) == (pytest.approx(3.0), pytest.approx(0.5))


def test_v0_file_without_sizes_prices_mib_and_says_so(tmp_path):
    """A v0 file (no preamble) and no trace: the expert sizes are unknown; the profile prices
    MiB read (a read unit of 1 MiB), says so, assumes the engine's default lanes and refuses to
    price a route trace's reads."""
    path = write(tmp_path / "old.csv", serial_rows(), version=0)
    prof = profile_of(path)
    assert prof.model["expert_bytes"] == {} and prof.model["sizes_from"] is None
    assert prof.read_unit_bytes == MIB
    assert any("expert sizes unknown" in c for c in prof.caveats)
    assert f"io_threads not recorded: the engine's default 4 ({path})" in prof.caveats
    with pytest.raises(BmoeError, match="does not know its model's expert sizes"):
        predict(make_trace(PREFILL, DECODE), prof, {"cache_mb": [0]})
    # given a trace of the model, the sizes come from it
    trace_path = tmp_path / "hand.route.csv"
    trace_path.write_text(
        "# route_trace v1\n# model=hand.gguf arch=qwen3moe n_layer=2 n_expert=8 "
        "n_expert_used=2\n# layer=0 expert_bytes=1048576 dense_bytes=0\n"
        "# layer=1 expert_bytes=1048576 dense_bytes=0\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"
        "0,1,3,0,0,1,0.5,0,1048576,0\n0,1,3,0,1,2,0.5,0,1048576,0\n"
    )
    from bmoe.formats.route import read_route_trace

    sized = profile_of(path, trace=read_route_trace(trace_path))
    assert sized.model["expert_bytes"] == {"0": MIB, "1": MIB}
    assert str(trace_path) in sized.model["sizes_from"]


def test_against_files_matches_each_file_by_its_preamble(tmp_path):
    """Loose files, each predicted with its own configuration (from its preamble, the policy
    as the engine names it): reads from the file itself when no trace is given. A profile of
    file a predicts file b exactly where b is the same device with another budget; but b's
    policy and budget are levers no run of the profile measured: b is labelled unpriced
    (both named) and kept out of the headline."""
    a = write(tmp_path / "a.csv", serial_rows())
    b = write(tmp_path / "b.csv", serial_rows(), cache_mb=8, cache_policy="layer-lfu")
    mmap = write(tmp_path / "mmap.csv", serial_rows(), moe_stream=0)
    prof = profile_of(a)
    out = against_files(None, prof, profile_runs(read_recorded_runs([a, b, mmap])))
    cells = out["cells"].set_index("cell")
    assert cells.loc["b", "cache_mb"] == 8 and cells.loc["b", "policy"] == "layerlfu"
    assert cells.loc["b", "tok_s_predicted"] == pytest.approx(cells.loc["b", "tok_s"], rel=1e-3)
    assert cells.loc["a", "measurement"] == "a profile run (in sample)"
    assert "plain mmap" in cells.loc["mmap", "comparable"]
    assert cells.loc["b", "unpriced_levers"] == "policy, cache_mb"
    assert "cache policy layerlfu" in cells.loc["b", "unpriced"]
    summary = out["summary"]
    assert (summary["compared"], summary["labelled"], summary["not_predicted"]) == (0, 2, 1)
    assert summary["reads"] == "measured"


# ----------------------------------------------------------------------------- memory


def memory_rows(n, faults, compute=10.0, per_fault=0.1, cache=2.0, rss=3.0, avail=3.0):
    """Serial tokens (as serial_rows) with memory columns; major faults alternate about
    `faults` (+-50 %) and each costs `per_fault` ms of compute."""
    out = serial_rows(n, compute=compute)
    for i, row in enumerate(out):
        f = faults * (1.5 if i % 2 else 0.5)
        row.update({
            "majflt": int(f), "compute_ms": compute + per_fault * f,
            "wall_ms": row["wall_ms"] + per_fault * f, "cache_budget_mib": cache,
            "rss_mib": rss, "rss_anon_mib": cache, "mem_available_mib": avail,
        })  # fmt: skip
    return out


def memory_profile(tmp_path):
    """Run A: budget 2 MiB, 1 MiB else resident, 3 MiB available: it asks 3 of 6 MiB and
    takes no major fault. Run B: budget 3 MiB, 2 MiB available: it asks 4 of 6 MiB and takes
    100 faults a token at 0.1 ms each."""
    a = write(tmp_path / "a.csv", memory_rows(32, 0, cache=2, rss=3, avail=3), cache_mb=2)
    b = write(tmp_path / "b.csv", memory_rows(32, 100, cache=3, rss=4, avail=2), cache_mb=3)
    return profile_of(a, b)


def test_memory_pressure_hand_worked(tmp_path):
    prof = memory_profile(tmp_path)
    assert prof.memory["ms_per_fault"] == pytest.approx(0.1)
    assert prof.memory["resident_mib"] == pytest.approx(1.0)
    assert prof.memory["available_mib"] == pytest.approx(6.0)
    # the faults' time is not compute: base compute is 10 ms in both runs
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert memory_faults(prof, 2)[0] == pytest.approx(0.0)
    assert memory_faults(prof, 3)[0] == pytest.approx(100.0)
    # 2.5 MiB asks 3.5 of 6: half way
    assert memory_faults(prof, 2.5)[0] == pytest.approx(50.0)
    # 4 MiB asks 5 of 6, past every run: the last slope (100 faults per 1/6) goes on, noted
    faults, note = memory_faults(prof, 4)
    assert faults == pytest.approx(200.0)
    assert "more than any profile run" in note


def test_predict_prints_the_memory_notes_among_what_to_weigh(tmp_path, capsys):
    """The command line shows a cell's memory note after the answer, labelled memory:, naming
    the cell: a budget between the run without pressure and the one under it."""
    from bmoe.formats.route import write_route_trace

    prof = memory_profile(tmp_path)
    path = tmp_path / "p.json"
    write_profile(prof, path)
    trace = make_trace([[[0]]], [[[e]] for e in [0, 1, 2] * 12])
    trace.layers = pd.DataFrame({"layer": [0, 1], "expert_bytes": [MIB, MIB]})
    trace.meta["n_expert_used"] = 2
    write_route_trace(trace, tmp_path / "m.route.csv")
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "m.route.csv"), "-p", str(path),
                 "-g", "cache_mb=2.5"]) == 0  # fmt: skip
    shown = " ".join(capsys.readouterr().out.split())
    assert "memory: 2.5M 1L: asks 4 MiB of memory" in shown
    assert "between a profile run without pressure (3 MiB) and one under it" in shown


def test_more_cache_that_pushes_memory_out_predicts_slower(tmp_path):
    """One layer routing experts 0, 1, 2 in turn: 2 MiB of cache holds two and misses every
    token (LRU), 3 MiB holds all three. The third MiB saves a read a token (2.5 ms of flash
    and management at one lane) but costs 100 major faults (10 ms): predicted slower, though
    its hit rate is higher. A hit-rate curve is not a throughput argument."""
    prof = memory_profile(tmp_path)
    cycle = [[[e]] for e in [0, 1, 2] * 12]
    trace = make_trace([[[0]]], cycle)
    trace.layers = pd.DataFrame({"layer": [0, 1], "expert_bytes": [MIB, MIB]})
    trace.meta["n_expert_used"] = 2
    out = predict(trace, prof, {"cache_mb": [2, 3]}).set_index("cache_mb")
    assert out.loc[3, "hit_pct"] > out.loc[2, "hit_pct"]
    assert out.loc[3, "faults_per_token"] == pytest.approx(100.0)
    assert out.loc[3, "tok_s"] < out.loc[2, "tok_s"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1, 100), st.floats(0, 50), st.floats(0, 500)),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.floats(0, 200), min_size=2, max_size=6),
)
def test_more_cache_never_predicts_fewer_faults(points, budgets):
    prof = round_profile()
    prof.memory = {
        "ms_per_fault": 0.1,
        "resident_mib": 10.0,
        "available_mib": 100.0,
        "points": [
            {"asked_mib": c + r, "available_mib": 100.0, "faults_per_token": f}
            for c, r, f in points
        ],
    }
    faults = [memory_faults(prof, b)[0] for b in sorted(budgets)]
    assert all(f >= 0 for f in faults)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(faults))


# ----------------------------------------------------------------------------- prefetch


# every step routes experts the step before did not: the previous-token bet never hits
FRESH = [[[2 * i % 8, (2 * i + 1) % 8], [2 * i % 8, (2 * i + 1) % 8]] for i in range(1, 9)]


@pytest.mark.parametrize("mode", ["serial", "overlap"])
def test_prefetch_that_buys_no_hit_predicts_a_slowdown(mode):
    """Prefetch is priced as the reads it adds: the bet reads experts no step uses, so the
    hit rate is the same and each prefetched read costs its management (and its lane time
    where compute no longer hides it)."""
    extra = {"overlap": {"stall_ms": 0.0, "stall_ms_per_miss": 1.5, "lanes": [1]}}
    prof = round_profile(mode=mode, **(extra if mode == "overlap" else {}))
    # 3 MiB holds one layer's pair and room to bet on: the bet is read, never used
    out = predict(make_trace(PREFILL, FRESH), prof, {"cache_mb": [3], "prefetch": [0, 1]})
    off, on = out.iloc[0], out.iloc[1]
    assert on["prefetched_per_token"] > 0
    assert on["hit_pct_decode"] == pytest.approx(off["hit_pct_decode"])
    assert on["tok_s"] < off["tok_s"]
    assert on["mib_per_token"] > off["mib_per_token"]


# ----------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 8), st.floats(0.1, 20.0)),
        min_size=1,
        max_size=4,
        unique_by=lambda r: r[0],
    ),
    st.integers(1, 8),
)
def test_more_lanes_never_predict_more_stall(rows, measured_at):
    prof = round_profile(
        mode="overlap",
        flash=[
            {"lanes": n, "req_bytes": MIB, "latency_ms": lat, "batch_overhead_ms": 0.0, "reads": 1}
            for n, lat in rows
        ],
        overlap={"stall_ms": 1.0, "stall_ms_per_miss": 2.0, "lanes": [measured_at]},
    )
    per = [stall_per_miss(prof, lanes) for lanes in range(1, 12)]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(per))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=2, max_size=8),
    st.integers(0, 3),
    st.sampled_from(["serial", "overlap"]),
    st.integers(1, 4),
)
def test_more_reads_never_predict_faster(misses, more, mode, lanes):
    """Adding reads to any token never makes any token faster, serial or overlapped."""
    from bmoe.analyze.device import CellReads

    extra = {"overlap": {"stall_ms": 1.0, "stall_ms_per_miss": 1.5, "lanes": [1]}}
    prof = round_profile(mode=mode, **(extra if mode == "overlap" else {}))
    n = len(misses)

    def reads(m):
        return CellReads(np.arange(n), np.zeros(n, dtype=int), np.asarray(m), np.zeros(n), n,
                         0.0, 0.0)  # fmt: skip

    bigger = [m + (more if i == 0 else 0) for i, m in enumerate(misses)]
    base = token_times(prof, reads(misses), lanes, compute_ms=10.0)["wall_ms"].to_numpy()
    after = token_times(prof, reads(bigger), lanes, compute_ms=10.0)["wall_ms"].to_numpy()
    assert np.all(after >= base - 1e-9)


# ----------------------------------------------------------------------------- refusals


def test_a_trace_at_another_top_k_is_refused():
    prof = round_profile()
    prof.model["n_expert_used"] = 3
    trace = make_trace(PREFILL, DECODE)
    with pytest.raises(BmoeError, match=r"top-2 .*top-3.*--n-expert-used"):
        predict(trace, prof, {"cache_mb": [0]})


def test_a_trace_of_another_model_is_refused_naming_both(tmp_path):
    path = write(tmp_path / "run.csv", serial_rows())
    trace = make_trace(PREFILL, DECODE)
    trace.meta["n_layer"] = 48
    with pytest.raises(BmoeError, match=r"hand\.route\.csv \(n_layer=48\) and .*run\.csv"):
        profile_of(path, trace=trace)
    other = make_trace(PREFILL, DECODE, size=3 * MIB)
    with pytest.raises(BmoeError, match=r"hand\.route\.csv has experts of 3\.000 MiB.*run\.csv"):
        profile_of(path, trace=other)
    wider = make_trace(PREFILL, DECODE)
    wider.meta["n_expert_used"] = 3
    with pytest.raises(BmoeError, match=r"routes top-3 but .*run\.csv ran top-2"):
        profile_of(path, trace=wider)


def sized_trace(path: Path, sizes: dict[int, float], n_layer: int, k: int = 2) -> Path:
    """A route trace of a model whose MoE layers `sizes` (layer -> MiB an expert) differ, as
    a K-quant's do; layers of `n_layer` not in `sizes` are dense (route nothing)."""
    lines = [
        "# route_trace v1",
        f"# model=hand.gguf arch=qwen3moe n_layer={n_layer} n_expert=8 n_expert_used={k}",
        *(f"# layer={i} expert_bytes={round(mib * MIB)} dense_bytes=0" for i, mib in sizes.items()),
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped",
    ]
    for step in range(3, 40):
        for layer, mib in sizes.items():
            for slot in range(k):
                lines.append(
                    f"0,1,{step},{layer},{slot},{(step + slot) % 8},0.5,0,{round(mib * MIB)},0"
                )
    path.write_text("\n".join(lines) + "\n")
    return path


# a K-quant-like model: 4 MoE layers whose experts are 1.5, 1, 1 and 1 MiB (one layer of a
# wider type); at top-2 a token routes 2 x 4.5 = 9 MiB, its widest layer 2 x 1.5 = 3 MiB
MIXED = {0: 1.5, 1: 1.0, 2: 1.0, 3: 1.0}


def test_a_k_quant_like_model_profiles_without_refusal(tmp_path):
    """Layers of different expert sizes (a mixed-quantisation model): the contract's
    figures read as it defines them (layer_demand_MiB the widest layer, token_demand_MiB and
    cache_cycle_mb k x the sum) agree with the trace's per-layer sizes; so do a model's dense
    layers, which route nothing (cache_cycle_mb is over the MoE layers only)."""
    trace = sized_trace(tmp_path / "mixed.route.csv", MIXED, n_layer=4)
    v1 = write(tmp_path / "v1.csv", serial_rows(), version=1, n_layer=4, cache_cycle_mb=None,
               summary={"token_demand_MiB": 9.0, "layer_demand_MiB": 3.0})  # fmt: skip
    v2 = write(tmp_path / "v2.csv", serial_rows(), n_layer=4, cache_cycle_mb=9)
    for path in (v1, v2):
        prof = profile_of(path, trace=read_route_trace(trace))
        assert prof.expert_bytes() == {i: round(m * MIB) for i, m in MIXED.items()}
    # without a trace the summary alone gives the mean size: 9 MiB / (4 layers x top-2)
    alone = profile_of(v1)
    assert set(alone.expert_bytes().values()) == {round(9 * MIB / 8)}
    # a deepseek2-like model: layer 0 dense, layers 1-2 of 1 MiB experts; v2's
    # cache_cycle_mb is 2 MoE layers x top-2 x 1 MiB = 4, not divided over the 3 layers
    dense = sized_trace(tmp_path / "dense.route.csv", {1: 1.0, 2: 1.0}, n_layer=3)
    path = write(tmp_path / "ds.csv", serial_rows(), n_layer=3, cache_cycle_mb=4)
    prof = profile_of(path, trace=read_route_trace(dense))
    assert prof.expert_bytes() == {1: MIB, 2: MIB}
    # the profile of the preamble alone predicts the trace of that model
    out = predict(read_route_trace(dense), profile_of(path), {"cache_mb": [0]})
    assert out["mib_per_token"].iloc[0] == pytest.approx(4.0)


def test_a_trace_whose_sizes_give_other_demand_figures_is_refused(tmp_path):
    """Sizes that do not give the run's figures (another quantisation): refused, naming the
    figure; the widest layer is checked as well as the sum."""
    even = sized_trace(tmp_path / "even.route.csv", {i: 1.125 for i in range(4)}, n_layer=4)
    path = write(tmp_path / "v1.csv", serial_rows(), version=1, n_layer=4, cache_cycle_mb=None,
                 summary={"token_demand_MiB": 9.0, "layer_demand_MiB": 3.0})  # fmt: skip
    with pytest.raises(BmoeError, match=r"widest MoE layer's expert is 2\.250 MiB but .*"
                       r"v1\.csv says layer_demand_MiB=3\.000"):  # fmt: skip
        profile_of(path, trace=read_route_trace(even))
    other = sized_trace(tmp_path / "q8.route.csv", {i: 2.0 for i in range(4)}, n_layer=4)
    with pytest.raises(BmoeError, match=r"summed is 16\.000 MiB but .*token_demand_MiB=9\.000"):
        profile_of(path, trace=read_route_trace(other))


def test_a_metrics_file_without_io_ms_is_refused(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "io_ms"} for r in serial_rows()]
    path = write(tmp_path / "noio.csv", rows)
    with pytest.raises(BmoeError, match=r"noio\.csv: no io_ms column"):
        profile_of(path)


def test_runs_at_two_top_ks_are_refused(tmp_path):
    a = write(tmp_path / "a.csv", serial_rows())
    b = write(tmp_path / "b.csv", serial_rows(), n_expert_used=4)
    with pytest.raises(BmoeError, match="different top-k"):
        profile_of(a, b)


# ----------------------------------------------------------------------------- honesty


def starved_rows(n=32, stolen=30.0):
    """Serial tokens whose compute residual carries `stolen` ms the engine spent waiting for
    a core: its CPU time (2 threads x 10 ms) stays what the work took."""
    out = serial_rows(n)
    for row in out:
        row["compute_ms"] += stolen
        row["wall_ms"] += stolen
    return out


def test_a_starved_run_takes_compute_from_cpu_time_and_says_so(tmp_path):
    """The quiet run calibrates CPU time against compute (cpu / threads = 10 ms = compute);
    the starved run's wall is mostly off-CPU (a 52 ms token of which 10 + 9 + 3 busy), so
    its compute is taken from its CPU time: 10 ms, not 40."""
    quiet = write(tmp_path / "quiet.csv", serial_rows())
    busy = write(tmp_path / "busy.csv", starved_rows())
    prof = profile_of(quiet, busy)
    state = {Path(r["name"]).name: r for r in prof.runs}
    assert state["busy.csv"]["starved"] and not state["quiet.csv"]["starved"]
    assert state["busy.csv"]["off_cpu_pct"] > 50
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert "cpu_ms/threads" in prof.terms["compute"]["columns"]
    assert "starved of a core" in prof.terms["compute"]["note"]


def test_a_profile_of_starved_runs_only_is_unsettled_and_strict_refuses(tmp_path, capsys):
    busy = write(tmp_path / "busy.csv", starved_rows())
    prof = profile_of(busy)
    assert not prof.settled
    assert any("every run was contended" in u for u in prof.unsettled)
    # nothing to calibrate against: CPU time per thread one to one (20 ms over 2 threads)
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    out = tmp_path / "busy.json"
    write_profile(prof, out)
    assert json.loads(out.read_text())["unsettled"] == prof.unsettled
    assert main(["profile", str(busy), "--strict"]) == 2
    assert "not settled (--strict)" in capsys.readouterr().err.replace("\n", " ")
    assert main(["profile", str(busy), "-o", str(out), "--force"]) == 0
    shown = capsys.readouterr().out  # after the answer, with what to weigh
    assert "unsettled:" in shown and "starved" in shown.replace("\n", " ")
    # every predict that uses it says so; --strict refuses it
    trace = tmp_path / "t.route.csv"
    route_trace(trace)
    assert main(["predict", str(trace), "-p", str(out), "-g", "cache_mb=0"]) == 0
    assert "unsettled:" in capsys.readouterr().out
    assert main(["predict", str(trace), "-p", str(out), "-g", "cache_mb=0", "--strict"]) == 2


def route_trace(path: Path) -> Path:
    """A route trace of the synthetic files' model (2 layers of 1 MiB experts, top-2)."""
    lines = [
        "# route_trace v1",
        "# model=hand.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2",
        "# layer=0 expert_bytes=1048576 dense_bytes=0",
        "# layer=1 expert_bytes=1048576 dense_bytes=0",
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped",
    ]
    for step in range(3, 40):
        for layer in range(2):
            for slot in range(2):
                lines.append(f"0,1,{step},{layer},{slot},{(step + slot) % 8},0.5,0,1048576,0")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_traced_runs_give_routing_and_untraced_runs_the_timing(tmp_path):
    """A route-traced run (its compute 4 ms slower a token) and an untraced one of the same
    configuration: compute and management come from the untraced run, the overhead is
    measured (4 ms), and the profile says which."""
    traced = write(tmp_path / "t.csv", serial_rows(compute=14.0))
    route_trace(tmp_path / "t.route.csv")
    plain = write(tmp_path / "u.csv", serial_rows(compute=10.0))
    prof = profile_of(traced, plain)
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert prof.terms["compute"]["runs"] == [str(plain)]
    assert prof.tracing["overhead_ms"]["compute_ms"] == pytest.approx(4.0)
    assert "from the untraced runs" in prof.tracing["how"]
    alone = profile_of(traced)
    assert alone.tracing["how"] == "not removed"
    assert any("traced runs only" in u for u in alone.unsettled)


def test_coverage_and_width_are_reported_and_a_wide_interval_covers_nothing():
    """Four cells: inside a 20 %-wide interval; outside one; inside an interval from 0.7 to
    39 tok/s around 4 (wider than the prediction itself: it predicts nothing, so it does not
    count as covered); and one whose own measurement is unsettled (out of the headline)."""
    cells = pd.DataFrame(
        {
            "cell": ["in", "out", "wide", "noisy"],
            "tok_s": [10.0, 10.0, 1.0, 10.0],
            "tok_s_predicted": [10.5, 5.0, 4.0, 20.0],
            "tok_s_low_predicted": [9.5, 4.5, 0.7, 18.0],
            "tok_s_high_predicted": [11.5, 5.5, 39.0, 22.0],
            "steady_tok_s": np.nan, "steady_tok_s_predicted": np.nan,
            "steady_tok_s_low_predicted": np.nan, "steady_tok_s_high_predicted": np.nan,
            "mib_per_token": 1.0, "mib_per_token_predicted": 1.0,
            "hit_pct": 50.0, "hit_pct_predicted": 50.0,
            "measurement": [None, None, None, "repeats disagree"],
        }
    )  # fmt: skip
    out = compare_cells(cells, round_profile())
    summary = out["summary"]
    assert summary["compared"] == 3 and summary["labelled"] == 1
    assert out["cells"]["inside_interval"].tolist() == [True, False, False, False]
    assert summary["inside_interval"] == 1
    assert summary["coverage_pct"] == pytest.approx(100 / 3)
    assert summary["intervals_too_wide"] == 1
    # widths 20 %, 20 %, 957.5 %, 20 %: median 20
    assert summary["median_interval_width_pct"] == pytest.approx(20.0)
    # |errors| of the firm cells: 5, 50, 300 %
    assert summary["median_abs_tok_s_error_pct"] == pytest.approx(50.0)
    assert summary["coverage_stated_pct"] == pytest.approx(80.0)


def test_the_profile_states_its_coverage_and_a_wider_one_widens_the_interval(tmp_path):
    prof = round_profile()
    trace = make_trace(PREFILL, DECODE)
    row80 = predict(trace, prof, {"cache_mb": [0]}).iloc[0]
    prof.coverage = 0.95
    row95 = predict(trace, prof, {"cache_mb": [0]}).iloc[0]
    assert row95["interval_pct"] == pytest.approx(row80["interval_pct"] * 1.959964 / Z80)
    path = tmp_path / "p.json"
    write_profile(prof, path)
    assert read_profile(path).coverage == 0.95


def test_a_profile_whose_compute_swings_is_unsettled_and_its_intervals_count_for_nothing(
    tmp_path,
):
    """The symptom of a noisy machine: compute per token swinging between 16 and 1337 ms in
    long stretches (p10 16, p90 1337). The profile says its compute is unsettled; the
    interval it gives is wider than the prediction itself, so --against counts no cell as
    covered however far off it is."""
    rows = serial_rows(64)
    for i, row in enumerate(rows):
        swing = 1337.0 if (i // 8) % 3 == 0 else 16.0
        row["wall_ms"] += swing - row["compute_ms"]
        row["compute_ms"] = swing
        row["cpu_ms"] = 2 * swing  # not starved: the CPU did the work
    prof = profile_of(write(tmp_path / "noisy.csv", rows))
    assert not prof.settled
    assert any(u.startswith("compute: its mean is uncertain") for u in prof.unsettled)
    trace = make_trace(PREFILL, DECODE)
    predicted = predict(trace, prof, {"cache_mb": [0, 100]})
    cells = predicted.rename(
        columns={c: f"{c}_predicted" for c in ("tok_s", "tok_s_low", "tok_s_high",
                                               "steady_tok_s", "steady_tok_s_low",
                                               "steady_tok_s_high", "mib_per_token",
                                               "hit_pct")}
    )  # fmt: skip
    cells["tok_s"] = cells["tok_s_predicted"] * 0.1  # measured: -90 %
    cells["steady_tok_s"] = np.nan
    cells["mib_per_token"] = cells["mib_per_token_predicted"]
    cells["hit_pct"] = cells["hit_pct_predicted"]
    summary = compare_cells(cells, prof)["summary"]
    assert summary["inside_interval"] == 0
    assert summary["intervals_too_wide"] == 2
    assert summary["profile_settled"] is False


def test_expert_sizes_from_the_model_file(tmp_path, capsys):
    """--model GGUF: the expert sizes from its tensor table (the tiny synthetic model: 4
    layers, each expert the sum of its gate, up and down slices)."""
    pytest.importorskip("gguf", reason="the gguf package (engine extra) is not installed")
    from bmoe.engine.embedded.layout import read_layout
    from bmoe.engine.synth import synth_model

    model = synth_model(tmp_path / "tiny.gguf", "tiny")
    layout = read_layout(model)
    path = write(tmp_path / "run.csv", serial_rows(), version=0)
    out = tmp_path / "p.json"
    assert main(["profile", str(path), "--model", str(model), "-o", str(out)]) == 0, (
        capsys.readouterr().err
    )
    data = json.loads(out.read_text())
    expected = {str(layer): layout.expert_bytes(layer) for layer in layout.moe_layers}
    assert data["model"]["expert_bytes"] == expected
    assert str(model) in data["model"]["sizes_from"]


def io_traced_run(tmp_path: Path):
    """A serial run at one lane (serial_rows) with its route trace and an io trace of 1 MiB
    requests that each took 2 ms: the run's path and the route trace."""
    from bmoe.formats.route import read_route_trace

    traced = write(tmp_path / "t.csv", serial_rows())
    route_trace(tmp_path / "t.route.csv")
    io = [
        "# io_trace v1",
        "# model=hand.gguf arch=qwen3moe n_layer=2 n_threads=2 io_threads=1",
        "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns",
    ]
    io += [f"0,1,{3 + i},0,{i % 8},0,0,0,0,1048576,1048576,2000000" for i in range(32)]
    (tmp_path / "t.io.csv").write_text("\n".join(io) + "\n")
    return traced, read_route_trace(tmp_path / "t.route.csv")


def test_the_flash_table_prices_a_wave_by_what_it_adds_to_a_batch(tmp_path):
    """Four lanes whose requests start 0.1 ms apart and take 0.3 ms each: a batch of n
    requests lasts 0.3 + 0.1 (n - 1) ms, so each wave of four adds 0.4 ms, more than a
    request's 0.3 ms latency; the table's latency is the wave's (the median request's
    where the trace does not say when requests started)."""
    from bmoe.analyze.device import flash_table
    from bmoe.formats.op_traces import read_io_trace

    lines = [
        "# io_trace v1",
        "# model=hand.gguf arch=qwen3moe n_layer=2 n_threads=2 io_threads=4",
        "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns,"
        "start_ns",
    ]
    t = 0
    for step in range(3, 35):
        n = 4 * (1 + step % 3)  # 1, 2 or 3 waves
        for i in range(n):
            lines.append(f"0,1,{step},0,{i},0,{i % 4},0,0,1048576,1048576,300000,{t + 100000 * i}")
        t += 10_000_000
    (tmp_path / "w.io.csv").write_text("\n".join(lines) + "\n")
    trace = read_io_trace(tmp_path / "w.io.csv")
    table = flash_table([(trace, 4)])
    assert table["latency_ms"].iloc[0] == pytest.approx(0.4)
    untimed = read_io_trace(tmp_path / "w.io.csv")
    untimed.rows = untimed.rows.drop(columns=["start_ns"])
    assert flash_table([(untimed, 4)])["latency_ms"].iloc[0] == pytest.approx(0.3)


def test_a_batch_mixing_request_sizes_prices_each_size_by_its_own_latency(tmp_path):
    """One lane; each batch alternates a 2 MiB request of 0.6 ms (a fused gate_up) and a
    1 MiB one of 0.3 ms (the down projection), back to back: a batch of n pairs lasts
    0.9 n ms. Each size keeps its own latency (0.6 and 0.3 ms): the 1 MiB requests of a
    batch span the 2 MiB ones between them, and fitting one size alone would price a 1 MiB
    request at 0.9 ms."""
    from bmoe.analyze.device import flash_table
    from bmoe.formats.op_traces import read_io_trace

    lines = [
        "# io_trace v1",
        "# model=hand.gguf arch=gemma4 n_layer=2 n_threads=2 io_threads=1",
        "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns,"
        "start_ns",
    ]
    t = 0
    for step in range(3, 35):
        for pair in range(1 + step % 3):  # 1, 2 or 3 pairs
            for proj, size, ns in ((3, 2 * MIB, 600_000), (2, MIB, 300_000)):
                lines.append(f"0,1,{step},0,{pair},{proj},0,0,0,{size},{size},{ns},{t}")
                t += ns
        t += 10_000_000
    (tmp_path / "m.io.csv").write_text("\n".join(lines) + "\n")
    table = flash_table([(read_io_trace(tmp_path / "m.io.csv"), 1)]).set_index("req_bytes")
    assert table.loc[2 * MIB, "latency_ms"] == pytest.approx(0.6, rel=1e-3)
    assert table.loc[MIB, "latency_ms"] == pytest.approx(0.3, rel=1e-3)


def test_io_traced_lanes_and_untraced_lanes_share_the_flash_table(tmp_path):
    """An io trace at one lane count and an untraced run at another: the table has both,
    the second from the untraced run's io_ms."""
    traced, trace = io_traced_run(tmp_path)
    wide = write(tmp_path / "w.csv", serial_rows(latency=3.0), io_threads=4)
    prof = profile_of(traced, wide, trace=trace)
    sources = prof.flash.set_index("lanes")["source"]
    assert sources[1] == "io trace" and sources[4] == "io_ms"


def test_an_io_traced_runs_latencies_are_brought_to_its_untraced_twins_level(tmp_path):
    """The io trace says 2 ms a request, and its run's io_ms agrees (9 and 5 ms a token); an
    untraced run of the same configuration waited half as long (4.5 and 2.5 ms): the
    profile's latency at that lane count is the trace's times 0.5. An untraced run of
    another configuration changes nothing."""
    traced, trace = io_traced_run(tmp_path)
    other = write(tmp_path / "o.csv", serial_rows(overhead=0.25, latency=1.0), cache_mb=7)
    alone = profile_of(traced, other, trace=trace).flash.set_index("lanes")
    assert alone.loc[1, "latency_ms"] == pytest.approx(2.0)
    twin = write(tmp_path / "u.csv", serial_rows(overhead=0.25, latency=1.0))
    prof = profile_of(traced, twin, other, trace=trace)
    flash = prof.flash.set_index("lanes")
    assert flash.loc[1, "latency_ms"] == pytest.approx(1.0)
    assert flash.loc[1, "source"] == "io trace"
    assert flash.loc[1, "batch_overhead_ms"] == pytest.approx(0.25, abs=0.02)
    runs = profile_runs(read_recorded_runs([traced, twin]))
    assert runs[0].io is not None and runs[1].io is None
    note = prof.terms["flash"]["note"]
    assert "x0.5 to the untraced runs of its configurations" in note


def test_a_contended_io_traced_runs_latencies_are_scaled_as_its_tokens_are(tmp_path):
    """A quiet untraced run: 2 ms a request. An io-traced run of the same configuration
    whose every time took twice as long (its compute 2x its CPU time per thread: slowdown 2),
    its io trace saying 4 ms a request: its token times are divided by 2, and so are its
    requests' latencies: the profile's flash latency is 2 ms, not 4 (its level against the
    quiet twin is 1: both waits, scaled, agree)."""
    from bmoe.formats.route import read_route_trace

    busy = serial_rows(overhead=1.0, latency=4.0, compute=20.0, mgmt=(2.0, 1.0), cpu=10.0)
    traced = write(tmp_path / "t.csv", busy)
    route_trace(tmp_path / "t.route.csv")
    io = [
        "# io_trace v1",
        "# model=hand.gguf arch=qwen3moe n_layer=2 n_threads=2 io_threads=1",
        "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns",
    ]
    io += [f"0,1,{3 + i},0,{i % 8},0,0,0,0,1048576,1048576,4000000" for i in range(32)]
    (tmp_path / "t.io.csv").write_text("\n".join(io) + "\n")
    quiet = write(tmp_path / "q.csv", serial_rows())
    prof = profile_of(traced, quiet, trace=read_route_trace(tmp_path / "t.route.csv"))
    state = {Path(r["name"]).name: r for r in prof.runs}
    assert state["t.csv"]["slowdown"] == pytest.approx(2.0)
    flash = prof.flash.set_index("lanes")
    assert flash.loc[1, "source"] == "io trace"
    assert flash.loc[1, "latency_ms"] == pytest.approx(2.0, rel=1e-3)


def _rows_reading(reads_even: int, reads_odd: int, compute: float, n: int = 32) -> list[dict]:
    """Serial tokens at one lane as in serial_rows, reading `reads_even` / `reads_odd` experts
    of 1 MiB, with `compute` ms of compute each."""
    out = []
    for i in range(n):
        reads = reads_even if i % 2 == 0 else reads_odd
        io, m = 1.0 + 2.0 * reads, 1.0 + 0.5 * reads
        out.append({
            "wall_ms": compute + io + m, "io_ms": io, "compute_ms": compute,
            "read_bytes": reads * MIB, "cache_hit_pct": 50.0, "stall_ms": 0.0, "mgmt_ms": m,
            "majflt": 0, "cpu_ms": compute * 2,
        })  # fmt: skip
    return out


def test_compute_follows_the_read_volume_between_runs_hand_worked(tmp_path):
    """Two runs reading 3 and 6 MiB a token with 10 and 16 ms of compute: the profile keeps
    one compute point per read volume, and a configuration reading 4.5 MiB a token is priced
    at the interpolated 13 ms; beyond the points the nearest one holds (no extrapolation).
    One read volume keeps the single figure."""
    from bmoe.analyze.device.timing import compute_at

    a = write(tmp_path / "a.csv", _rows_reading(4, 2, 10.0), cache_mb=3)
    b = write(tmp_path / "b.csv", _rows_reading(8, 4, 16.0), cache_mb=1)
    prof = profile_of(a, b)
    assert prof.compute["by_read"] == [
        {"read_mib": pytest.approx(3.0), "token_ms": pytest.approx(10.0)},
        {"read_mib": pytest.approx(6.0), "token_ms": pytest.approx(16.0)},
    ]
    assert prof.compute["token_ms"] == pytest.approx(13.0)  # the mean of every token
    assert compute_at(prof.compute, 4.5) == pytest.approx(13.0)
    assert compute_at(prof.compute, 1.0) == pytest.approx(10.0)
    assert compute_at(prof.compute, 12.0) == pytest.approx(16.0)
    # runs that differ because they read different volumes do not disagree about compute
    assert prof.terms["compute"]["runs_disagree_pct"] == pytest.approx(0.0, abs=1e-9)
    assert prof.terms["compute"]["settled"]
    assert not any(line.startswith("compute") for line in prof.unsettled)
    # the points survive the JSON and the schema
    out = tmp_path / "p.json"
    write_profile(prof, out)
    assert read_profile(out).compute["by_read"] == prof.compute["by_read"]
    # runs of one read volume (within 25 %): one figure, as before
    c = write(tmp_path / "c.csv", _rows_reading(4, 3, 12.0), cache_mb=2)
    single = profile_of(a, c)
    assert "by_read" not in single.compute
    assert compute_at(single.compute, 9.0) == pytest.approx(single.compute["token_ms"])


def test_bmoe_profile_shows_compute_per_read_volume(tmp_path, capsys):
    a = write(tmp_path / "a.csv", _rows_reading(4, 2, 10.0), cache_mb=3)
    b = write(tmp_path / "b.csv", _rows_reading(8, 4, 16.0), cache_mb=1)
    assert main(["profile", str(a), str(b)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "compute 13 ms/token (by MiB read a token: 10 ms at 3, 16 ms at 6)" in out


def _rows_at_latency(reads_even: int, reads_odd: int, latency: float, n: int = 32) -> list[dict]:
    """Serial tokens at one lane as in _rows_reading (10 ms of compute), each read waiting
    `latency` ms: flash slower at one read volume than at another."""
    out = _rows_reading(reads_even, reads_odd, 10.0, n)
    for i, row in enumerate(out):
        reads = reads_even if i % 2 == 0 else reads_odd
        io = 1.0 + latency * reads
        row["wall_ms"] += io - row["io_ms"]
        row["io_ms"] = io
    return out


def test_flash_follows_the_read_volume_between_runs(tmp_path):
    """Two runs at one lane reading 3 and 6 MiB a token, their reads waiting 2 and 3 ms: the
    table's one line prices neither, so the profile keeps, per read volume, the measured
    wait a token beyond the table's (less at 3 MiB, more at 6), interpolated between and
    carried beyond as the nearest point's excess a MiB; a new configuration reading what
    one of them read is then predicted as that run measured, and without it is not."""
    import dataclasses

    from bmoe.analyze.device import excess_at, flash_factor
    from bmoe.analyze.device.build import with_probe

    a = write(tmp_path / "a.csv", _rows_at_latency(4, 2, 2.0), cache_mb=3)
    b = write(tmp_path / "b.csv", _rows_at_latency(8, 4, 3.0), cache_mb=1)
    prof = profile_of(a, b)
    row = prof.flash.iloc[0]
    overhead, latency = float(row["batch_overhead_ms"]), float(row["latency_ms"])

    def excess(reads_even: int, reads_odd: int, wave_ms: float) -> float:
        """Mean measured minus priced io_ms over a token pair (2 batches a token)."""
        pair = (reads_even, reads_odd)
        return sum((1.0 + wave_ms * r) - (2 * overhead + latency * r) for r in pair) / 2

    low, high = excess(4, 2, 2.0), excess(8, 4, 3.0)
    assert low < 0.0 < high
    assert prof.flash_by_read == [
        {"lanes": 1, "read_mib": pytest.approx(3.0), "excess_ms": pytest.approx(low)},
        {"lanes": 1, "read_mib": pytest.approx(6.0), "excess_ms": pytest.approx(high)},
    ]
    points = prof.flash_by_read
    assert excess_at(points, 4.5, 1) == pytest.approx((low + high) / 2)
    assert excess_at(points, 1.0, 1) == pytest.approx(low / 3)  # its excess a MiB, carried
    assert excess_at(points, 12.0, 1) == pytest.approx(2 * high)
    assert excess_at(points, 4.5, 2) == 0.0  # no run measured two lanes
    assert flash_factor(-3.0, 2.0) == 0.0  # never a negative wait
    assert flash_factor(1.0, 0.0) == 1.0  # nothing read, nothing added
    # the flash term's runs differ by their volumes, not by chance
    assert prof.terms["flash"]["runs_disagree_pct"] == pytest.approx(0.0, abs=1e-9)
    assert "by MiB read a token" in prof.terms["flash"]["note"]

    c = write(tmp_path / "c.csv", _rows_at_latency(8, 4, 3.0), cache_mb=2)
    d = write(tmp_path / "d.csv", _rows_at_latency(4, 2, 2.0), cache_mb=4)
    cells = against_files(None, prof, profile_runs(read_recorded_runs([c, d])))["cells"].set_index(
        "cell"
    )
    for name in ("c", "d"):
        assert cells.loc[name, "tok_s_predicted"] == pytest.approx(cells.loc[name, "tok_s"])
    flat = dataclasses.replace(prof, flash_by_read=[])
    unscaled = against_files(None, flat, profile_runs(read_recorded_runs([c, d])))[
        "cells"
    ].set_index("cell")
    for name in ("c", "d"):
        off = unscaled.loc[name, "tok_s_predicted"] / unscaled.loc[name, "tok_s"] - 1.0
        assert abs(off) > 0.01
    # the points survive the JSON and the schema; a probe's latencies drop them
    out = tmp_path / "p.json"
    write_profile(prof, out)
    assert read_profile(out).flash_by_read == prof.flash_by_read
    assert with_probe(prof, prof.flash, "a test").flash_by_read == []
    # runs of one read volume: the table alone
    e = write(tmp_path / "e.csv", _rows_at_latency(4, 3, 2.5), cache_mb=2)
    assert profile_of(a, e).flash_by_read == []


def test_bmoe_profile_shows_flash_per_read_volume(tmp_path, capsys):
    a = write(tmp_path / "a.csv", _rows_at_latency(4, 2, 2.0), cache_mb=3)
    b = write(tmp_path / "b.csv", _rows_at_latency(8, 4, 3.0), cache_mb=1)
    assert main(["profile", str(a), str(b)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # less than the table at 3 MiB a token, more at 6 (the hand-worked figures are above)
    assert re.search(
        r"beyond the table's at 1 lane by MiB read a token: -[0-9.]+ ms at 3 MiB, \+[0-9.]+ ms "
        r"at 6",
        out,
    )
    assert main(["profile", str(a), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flash_by_read"] == []


def contended_rows(n=32, waited=8.0):
    """Serial tokens whose compute took `waited` ms more than its CPU time per thread (the
    compute threads waited for a core), not enough off-CPU time to count as starved."""
    return starved_rows(n, stolen=waited)


def test_a_contended_run_takes_compute_from_cpu_time_calibrated_by_an_uncontended_one(tmp_path):
    """The quiet run's compute is its CPU time per thread (10 ms of 20 over 2 threads); the
    contended run's compute took 18 ms, 1.8x its CPU time per thread, with a quarter of its
    wall off-CPU (not starved): its compute is taken from its CPU time, 10 ms, not 14."""
    quiet = write(tmp_path / "quiet.csv", serial_rows())
    busy = write(tmp_path / "busy.csv", contended_rows())
    prof = profile_of(quiet, busy)
    state = {Path(r["name"]).name: r for r in prof.runs}
    assert state["busy.csv"]["compute_over_cpu"] == pytest.approx(1.8)
    assert state["busy.csv"]["contended"] and not state["busy.csv"]["starved"]
    assert not state["quiet.csv"]["contended"]
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert "1.80x its CPU time per thread" in prof.terms["compute"]["note"]
    assert any(u.startswith("1 of 2 timing runs were contended") for u in prof.unsettled)
    assert not any("contended" in u for u in profile_of(quiet).unsettled)
    # with the CPU time ignored (none recorded), the contended run's compute stands as measured
    rows = [{k: v for k, v in r.items() if k != "cpu_ms"} for r in contended_rows()]
    bare = write(tmp_path / "bare.csv", rows)
    assert profile_of(quiet, bare).compute["token_ms"] == pytest.approx(14.0)


def test_a_cell_whose_compute_waited_for_a_core_is_labelled_and_kept_out_of_the_headline(
    tmp_path,
):
    a = write(tmp_path / "a.csv", serial_rows())
    a16 = write(tmp_path / "a16.csv", serial_rows(), cache_mb=16)  # 8 MiB is inside the runs'
    quiet = write(tmp_path / "quiet.csv", serial_rows(), cache_mb=8)
    busy = write(tmp_path / "busy.csv", contended_rows(), cache_mb=16)
    out = against_files(None, profile_of(a, a16), profile_runs(read_recorded_runs([quiet, busy])))
    cells = out["cells"].set_index("cell")
    assert pd.isna(cells.loc["quiet", "measurement"])
    assert "compute waited for a core (1.8x its CPU time)" in cells.loc["busy", "measurement"]
    assert out["summary"]["compared"] == 1 and out["summary"]["labelled"] == 1
    assert out["summary"]["median_abs_tok_s_error_pct"] == pytest.approx(0.0, abs=0.1)


def test_the_model_error_grows_with_the_distance_from_the_measured_configurations(tmp_path):
    """Four configurations reading 3, 6, 9 and 12 MiB a token at one lane: held out in turn,
    each lies |ln(reads / nearest other)| from the others (ln 2, ln 1.5, ln 4/3, ln 4/3); the
    two in the middle are interpolated and predicted, the two at the ends are held at the
    nearest point's compute and are not. The profile keeps where its configurations lie, so
    that a configuration reading what one of them read has the model error at distance 0,
    and one between them more."""
    import math
    from dataclasses import replace

    from bmoe.analyze.device import model_error

    paths = [
        write(tmp_path / f"r{i}.csv", _rows_reading(2 * i, i, 4.0 + 2.0 * 1.5 * i), cache_mb=9 - i)
        for i in (2, 4, 6, 8)
    ]
    prof = profile_of(*paths)
    section = prof.model_error
    distance = {Path(r["run"]).name: r["distance"] for r in section["held_out"]}
    assert distance == {
        "r2.csv": pytest.approx(math.log(2)),
        "r4.csv": pytest.approx(math.log(1.5)),
        "r6.csv": pytest.approx(math.log(4 / 3)),
        "r8.csv": pytest.approx(math.log(4 / 3)),
    }
    lanes = {p["io_threads"] for p in section["configurations_at"]}
    assert len(lanes) == 1
    assert [p["read_mib"] for p in section["configurations_at"]] == [
        pytest.approx(v) for v in (3.0, 6.0, 9.0, 12.0)
    ]
    # compute is a line in the read volume: interpolated, the runs inside are predicted;
    # the ends, held at the nearest point's compute, are not
    errors = {Path(r["run"]).name: abs(r["error_pct"]) for r in section["held_out"]}
    assert errors["r4.csv"] < 1.0 and errors["r6.csv"] < 1.0
    assert errors["r2.csv"] > 5.0 and errors["r8.csv"] > 5.0
    assert section["sd_rel_unit"] > 0.05
    (one,) = lanes
    at = replace(prof, model_error={**section, "sd_rel_zero": 0.02, "sd_rel_unit": 0.3})
    assert model_error(at, 6.0, one).sd_rel == pytest.approx(0.02)
    assert model_error(at, 6.0, one).distance == 0.0
    between = model_error(at, 6.6, one)  # nearer 6 than 9
    assert between.distance == pytest.approx(math.log(1.1))
    assert between.sd_rel == pytest.approx(math.sqrt(0.02**2 + 0.09 * math.log(1.1)))
    assert model_error(at, 24.0, one).sd_rel == pytest.approx(
        math.sqrt(0.02**2 + 0.09 * math.log(2))
    )
    assert model_error(at, 6.0, one).k == 4
    # without the reads, the model error without distance
    assert model_error(at).sd_rel == pytest.approx(section["sd_rel"])
    # a profile written before distance was measured keeps its model error inside its range
    old = {k: v for k, v in section.items() if k not in ("sd_rel_zero", "sd_rel_unit")}
    wide = replace(prof, model_error={**old, "sd_rel": 0.4, "sd_rel_inside": 0.05,
                                      "configurations_inside": 2})  # fmt: skip
    assert model_error(wide, 7.5).sd_rel == pytest.approx(0.05)
    assert model_error(wide, 7.5).inside and model_error(wide, 7.5).k == 2
    assert model_error(wide, 20.0).sd_rel == pytest.approx(0.4)
    one_inside = replace(wide, model_error={**wide.model_error, "configurations_inside": 1})
    assert model_error(one_inside, 7.5).sd_rel == pytest.approx(0.4)  # too few inside


def test_a_sweep_cell_whose_compute_waited_for_a_core_is_labelled():
    """Sweep results: per run compute and CPU time per token and threads; a cell whose runs'
    compute took 1.6x their CPU time per thread is labelled, one at 0.9x is firm."""
    from bmoe.analyze.device import measured_cells

    rows = []
    for cell, compute_s in (("quiet", 0.009), ("busy", 0.016)):
        for repeat in range(3):
            rows.append({
                "cell": cell, "status": "ok", "cache_mb": 8 if cell == "quiet" else 16,
                "tok_s_mean": 50.0 + repeat * 0.1, "tok_s_reported": 50.0 + repeat * 0.1,
                "compute_s_per_token": compute_s, "cpu_s_per_token": 0.02, "threads": 2,
                "io_s_per_token": 0.005, "mgmt_ms_per_token": 1.0, "round": 1,
                "order": len(rows),
            })  # fmt: skip
    defaults = {"cache_mb": 0.0, "io_threads": 1.0, "prefetch": 0.0, "overlap": 0.0}
    cells = measured_cells(pd.DataFrame(rows), defaults).set_index("cell")
    assert cells.loc["busy", "measurement"] == "compute waited for a core (1.6x its CPU time)"
    assert pd.isna(cells.loc["quiet", "measurement"])


def test_a_contended_runs_token_times_are_divided_by_its_compute_slowdown(tmp_path):
    """A run on a busy machine whose every time took 1.8x as long (CPU time the same): its
    compute over CPU time per thread is 1.8 against the quiet run's 1.0, so its times are
    divided by 1.8 and the profile of both measures what the quiet run alone measures."""
    slow = []
    for row in serial_rows():
        slow.append(
            {**row, **{k: row[k] * 1.8 for k in ("wall_ms", "io_ms", "compute_ms", "mgmt_ms")}}
        )
    quiet = write(tmp_path / "quiet.csv", serial_rows())
    busy = write(tmp_path / "busy.csv", slow, cache_mb=4)
    alone = profile_of(quiet)
    both = profile_of(quiet, busy)
    state = {Path(r["name"]).name: r for r in both.runs}
    assert state["busy.csv"]["slowdown"] == pytest.approx(1.8)
    assert state["quiet.csv"]["slowdown"] is None
    assert both.mgmt["token_ms"] == pytest.approx(alone.mgmt["token_ms"])
    assert both.mgmt["per_admit_ms"] == pytest.approx(alone.mgmt["per_admit_ms"])
    assert both.flash["latency_ms"].iloc[0] == pytest.approx(alone.flash["latency_ms"].iloc[0])
    assert both.compute["token_ms"] == pytest.approx(10.0)
    assert any("busy.csv 1.80x" in c for c in both.caveats)


# ----------------------------------------------------------------------------- levers


def two_budget_profile(tmp_path, **params):
    """Serial runs at 2 and 8 MiB of cache, prefetch 0, LRU, one lane, 2 threads."""
    a = write(tmp_path / "a.csv", serial_rows(), cache_mb=2, **params)
    b = write(tmp_path / "b.csv", serial_rows(), cache_mb=8, **params)
    return profile_of(a, b)


@pytest.mark.parametrize(
    ("grid", "kw", "lever"),
    [
        ({"cache_mb": [4], "prefetch": [1]}, {}, "prefetch"),
        ({"cache_mb": [4]}, {"policy": "lfu"}, "policy"),
        ({"cache_mb": [4], "io_threads": [4]}, {}, "io_threads"),
        ({"cache_mb": [64]}, {}, "cache_mb"),
    ],
)
def test_a_prediction_changing_an_unmeasured_lever_is_labelled_and_widened(
    tmp_path, grid, kw, lever
):
    """Runs of one prefetch depth, policy and lane count, at budgets of 2-8 MiB: a cell that
    changes one of those levers (or a budget far beyond) is unpriced, names the lever, and
    its interval's half-width is at least the lever's recorded effect; the same cell without
    the change is priced."""
    from bmoe.analyze.device.levers import effect_of

    prof = two_budget_profile(tmp_path)
    trace = read_route_trace(route_trace(tmp_path / "r.route.csv"))
    changed = predict(trace, prof, grid, **kw).iloc[0]
    plain = predict(trace, prof, {"cache_mb": [4]}).iloc[0]
    assert plain["unpriced"] is None and plain["lever_effect_pct"] == 0.0
    assert changed["unpriced_levers"] == lever
    effect = effect_of(lever)
    assert effect.sd_rel > 0 and effect.where
    assert changed["lever_effect_pct"] == pytest.approx(effect.effect_pct)
    assert changed["interval_pct"] >= effect.effect_pct
    assert changed["tok_s_low"] <= changed["tok_s"] / (1 + effect.sd_rel)
    assert f"+-{effect.effect_pct:.0f} % seen" in changed["unpriced"]
    # kept out of the headline: compared with itself, it is labelled, not counted
    measured = {"cell": "x", "tok_s": changed["tok_s"], "steady_tok_s": np.nan,
                "mib_per_token": 1.0, "hit_pct": 50.0, "measurement": None}  # fmt: skip
    cells = pd.DataFrame([measured])
    for f in ("tok_s", "tok_s_low", "tok_s_high", "steady_tok_s", "steady_tok_s_low",
              "steady_tok_s_high", "mib_per_token", "hit_pct"):  # fmt: skip
        cells[f"{f}_predicted"] = changed[f]
    cells["unpriced"] = changed["unpriced"]
    summary = compare_cells(cells, prof)["summary"]
    assert summary["compared"] == 0 and summary["labelled"] == 1
    assert summary["no_headline"].endswith("1 of 1 predicted with a lever the profile does "
                                           "not price (see unpriced).")  # fmt: skip


def test_a_profile_that_mixes_prefetch_depths_prices_each_with_its_own_term(tmp_path):
    """Run a at prefetch 0 and run b at prefetch 1 whose tokens take 20 % longer than their
    reads explain (its speculative reads compete with the demand reads): the profile's terms
    come from a alone (compute 10 ms, not a blend), prefetch 1 gets a term of x1.2 measured
    on b, and a prefetch-1 cell is priced with it; a prefetch-2 cell is unpriced."""
    a = write(tmp_path / "a.csv", serial_rows(), cache_mb=2)
    slow = []
    for r in serial_rows():
        compute = r["compute_ms"] + 0.2 * r["wall_ms"]
        slow.append(dict(r, compute_ms=compute, wall_ms=1.2 * r["wall_ms"], cpu_ms=2 * compute))
    b = write(tmp_path / "b.csv", slow, cache_mb=2, prefetch=1)
    prof = profile_of(a, b)
    assert prof.compute["token_ms"] == pytest.approx(10.0)
    assert prof.levers["baseline"]["prefetch"] == "0"
    (term,) = prof.levers["terms"]
    assert (term["lever"], term["value"]) == ("prefetch", "1")
    assert term["factor"] == pytest.approx(1.2, rel=1e-3) and term["runs"] == [str(b)]
    assert {r["name"]: r["lever_term"] for r in prof.runs} == {str(a): None, str(b): "prefetch 1"}
    out = against_files(None, prof, profile_runs(read_recorded_runs([a, b])))["cells"].set_index(
        "cell"
    )
    assert out.loc["b", "tok_s_predicted"] == pytest.approx(out.loc["b", "tok_s"], rel=1e-3)
    assert pd.isna(out.loc["b", "unpriced"]) and out.loc["b", "lever_factor_predicted"] > 1.19
    trace = read_route_trace(route_trace(tmp_path / "r.route.csv"))
    cells = predict(trace, prof, {"cache_mb": [2], "prefetch": [0, 1, 2]}).set_index("prefetch")
    assert cells.loc[0, "lever_factor"] == 1.0 and cells.loc[1, "lever_factor"] > 1.19
    assert cells.loc[1, "unpriced"] is None and cells.loc[2, "unpriced_levers"] == "prefetch"
    assert "prefetch depth 2: the profile's runs priced 0, 1 only" in cells.loc[2, "unpriced"]


def test_a_configuration_asking_more_memory_than_any_run_says_so(tmp_path):
    """Runs that asked 3 and 4 MiB of a device with 6 available, the larger leaving 2 MiB: a
    budget asking 4.2 MiB (0.2 MiB more: a tenth of what the largest run left) is noted; one
    asking 6 MiB (2 more: all that was left) is unpriced, its memory named. Where the largest
    run already took major faults, any budget beyond it is unpriced."""
    a = write(tmp_path / "a.csv", memory_rows(32, 0, cache=2, rss=3, avail=3), cache_mb=2)
    b = write(tmp_path / "b.csv", memory_rows(32, 0, cache=3, rss=4, avail=2), cache_mb=3)
    prof = profile_of(a, b)
    trace = make_trace([[[0]]], [[[e]] for e in [0, 1, 2] * 12])
    trace.layers = pd.DataFrame({"layer": [0, 1], "expert_bytes": [MIB, MIB]})
    trace.meta["n_expert_used"] = 2
    out = predict(trace, prof, {"cache_mb": [2.5, 3.2, 5]}).set_index("cache_mb")
    assert out.loc[2.5, "unpriced"] is None and out.loc[2.5, "memory_note"] is None
    assert "more than any profile run" in out.loc[3.2, "memory_note"]
    assert out.loc[3.2, "unpriced"] is None
    assert "memory" in out.loc[5, "unpriced_levers"].split(", ")
    assert (
        "asks 6 MiB of memory, 2 more than any profile run (the largest left 2 MiB"
        in (out.loc[5, "unpriced"])
    )
    pressed = predict(trace, memory_profile(tmp_path), {"cache_mb": [2.5, 3.2]})
    faulting = pressed.iloc[1]
    assert faulting["unpriced_levers"] == "memory"
    assert "100 major faults a token" in faulting["unpriced"]
    # between a run without pressure (3 MiB asked) and one under it (4 MiB, 100 faults a
    # token): priced between the two, and said so
    between = pressed.iloc[0]
    assert between["unpriced"] is None
    assert (
        "between a profile run without pressure (3 MiB) and one under it (4 MiB"
        in (between["memory_note"])
    )


def shared_lanes_trace(tmp_path: Path, timed: bool = True):
    """Four lanes sharing the device: a batch of n requests (2 to 9) lasts 0.05 + 0.1 n ms,
    each request adding its share whether or not it fills a wave."""
    from bmoe.formats.op_traces import read_io_trace

    header = "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns"
    lines = ["# io_trace v1", "# model=hand.gguf arch=qwen3moe n_layer=2 n_threads=2 io_threads=4",
             header + (",start_ns" if timed else "")]  # fmt: skip
    t = 0
    for step in range(3, 43):
        n = 2 + step % 8
        for i in range(n):
            start = t + (0 if i < 4 else 100_000 * (i - 3))  # the fifth request on: 0.1 ms on
            end = t + 50_000 + 100_000 * n if i == n - 1 else start + 300_000
            row = f"0,1,{step},0,{i},0,{i % 4},0,0,1048576,1048576,{end - start}"
            lines.append(row + (f",{start}" if timed else ""))
        t += 10_000_000
    (tmp_path / "s.io.csv").write_text("\n".join(lines) + "\n")
    return read_io_trace(tmp_path / "s.io.csv")


def test_a_part_filled_wave_costs_its_part_where_the_trace_priced_requests(tmp_path):
    """Batches of 2 to 9 requests at four lanes last 0.05 + 0.1 n ms: the table prices a
    wave of four at 0.4 ms and, its rows fitted over the batches (``BATCH_SOURCE``), a batch
    of 6 requests at 1.5 waves (0.6 ms beyond its overhead), not at 2 whole ones (0.8 ms).
    Rows from a trace that does not say when requests started keep whole waves."""
    from bmoe.analyze.device import BATCH_SOURCE, batch_flash_ms, flash_table

    table = flash_table([(shared_lanes_trace(tmp_path), 4)]).assign(batch_overhead_ms=0.0)
    assert table["source"].iloc[0] == BATCH_SOURCE
    assert table["latency_ms"].iloc[0] == pytest.approx(0.4, rel=0.05)
    lat = float(table["latency_ms"].iloc[0])
    assert batch_flash_ms(table, np.array([6.0]), MIB, 4)[0] == pytest.approx(1.5 * lat)
    whole = table.assign(source="io trace")
    assert batch_flash_ms(whole, np.array([6.0]), MIB, 4)[0] == pytest.approx(2 * lat)
    untimed = flash_table([(shared_lanes_trace(tmp_path, timed=False), 4)])
    assert (untimed["source"] == "io trace").all()


def test_flash_at_a_volume_its_lanes_never_read_is_widened_by_what_that_was_seen_to_do():
    """A profile whose runs read 10 MiB a token at one lane and 4 MiB at four: at one lane
    and 10 MiB the flash wait is as measured (no widening); at 8 MiB, 1.25x away, it carries
    the whole recorded effect of reading another volume (``flash_volume``), at 9 MiB a part
    of it; at two lanes, which no run used, nothing (the lane count is a lever of its own);
    where the lane count's runs read two volumes (``flash_by_read``) nothing either."""
    from types import SimpleNamespace

    from bmoe.analyze.device.levers import effect_of
    from bmoe.analyze.device.timing import flash_volume_sd

    at = [{"io_threads": 1, "read_mib": 10.0}, {"io_threads": 4, "read_mib": 4.0}]
    prof = SimpleNamespace(flash_by_read=[], model_error={"configurations_at": at})
    full = effect_of("flash_volume").sd_rel
    assert full > 0.1
    assert flash_volume_sd(prof, 10.0, 1) == 0.0  # type: ignore[arg-type]
    assert flash_volume_sd(prof, 8.0, 1) == pytest.approx(full)  # type: ignore[arg-type]
    assert 0 < flash_volume_sd(prof, 9.0, 1) < full  # type: ignore[arg-type]
    assert flash_volume_sd(prof, 4.0, 2) == 0.0  # type: ignore[arg-type]
    prof.flash_by_read = [{"lanes": 1, "read_mib": 10.0, "excess_ms": 0.0},
                          {"lanes": 1, "read_mib": 5.0, "excess_ms": 1.0}]  # fmt: skip
    assert flash_volume_sd(prof, 8.0, 1) == 0.0  # type: ignore[arg-type]


def test_a_traced_run_with_untraced_twins_is_not_scored_as_the_model_error(tmp_path):
    """An io-traced run and its untraced twin of one configuration, and a run of another:
    the model error scores the twin, not the traced run (which its trace slowed)."""
    from bmoe.analyze.device.build import TRACED_TWIN

    traced, trace = io_traced_run(tmp_path)
    twin = write(tmp_path / "u.csv", serial_rows(overhead=0.25, latency=1.0))
    other = write(tmp_path / "o.csv", serial_rows(overhead=0.25, latency=1.0), cache_mb=7)
    prof = profile_of(traced, twin, other, trace=trace)
    held = {Path(r["run"]).name: r for r in prof.model_error["held_out"]}
    assert held["t.csv"].get("why") == TRACED_TWIN
    assert "error_pct" in held["u.csv"]
