"""Profile and predict: hand-worked cases, properties, refusals, and the archived runs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.analyze import replay
from bmoe.analyze.device import (
    against,
    batch_flash_ms,
    build_profile,
    cell_reads,
    parse_grid,
    predict,
    profile_runs,
)
from bmoe.errors import BmoeError
from bmoe.formats.profile import profile_from_dict, read_profile, write_profile
from bmoe.formats.route import RouteTrace
from bmoe.formats.runfiles import read_recorded_runs

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"


def make_trace(
    prefill: list[list[list[int]]], decode: list[list[list[int]]], size=MIB, weights=None
):
    """A route trace from expert ids: ``prefill[token][layer]``, ``decode[step][layer]``."""
    rows = []
    n_layer = len((prefill or decode)[0])
    for phase, tokens, first in ((0, prefill, 0), (1, decode, len(prefill))):
        for t, per_layer in enumerate(tokens):
            for layer, ids in enumerate(per_layer):
                for slot, e in enumerate(ids):
                    rows.append((0, phase, first + t, layer, slot, e))
    frame = pd.DataFrame(rows, columns=["turn", "phase", "step", "layer", "slot", "expert"])
    if weights is not None:  # per slot, the same in every routing
        frame["weight"] = frame["slot"].map(dict(enumerate(weights)))
    layers = pd.DataFrame({"layer": range(n_layer), "expert_bytes": size})
    k = len((prefill or decode)[0][0])
    meta = {"model": "hand.gguf", "n_layer": n_layer, "n_expert": 8, "n_expert_used": k}
    return RouteTrace("hand.route.csv", 1, meta, layers, frame)


#: the standard normal's 90th percentile: an 80 % interval is +-Z80 standard deviations
Z80 = 1.2815515655446004


def interval(parts: dict[str, float], sd_rel: dict[str, float], z: float = Z80):
    """(low, high) tok/s of a token of `parts` ms whose terms' means move by `sd_rel`."""
    total = sum(parts.values())
    sd = sum((sd_rel.get(k, 0.0) * v) ** 2 for k, v in parts.items()) ** 0.5
    rel = z * sd / total
    return 1000 / (total * (1 + rel)), 1000 / (total * (1 - rel))


def round_profile(n_layer=2, size=MIB, flash=None, mode="serial", **extra):
    """A profile with round numbers: compute 10 ms/token, mgmt 1 ms + 0.5 ms per expert
    admitted, one slice per expert, 2 ms per request on one lane; a run's mean compute moves
    by 10 % (relative sd), its flash wait by 20 %, management not at all."""
    data = {
        "format": "bmoe_profile",
        "version": 2,
        "mode": mode,
        "model": {
            "name": "hand.gguf",
            "expert_bytes": {str(i): size for i in range(n_layer)},
            "slices_per_expert": 1,
        },
        "flash": flash
        or [
            {
                "lanes": 1,
                "req_bytes": size,
                "latency_ms": 2.0,
                "latency_ms_p10": 1.0,
                "latency_ms_p90": 4.0,
                "batch_overhead_ms": 0.0,
                "mib_s": 500.0,
                "reads": 100,
            }
        ],
        "compute": {"token_ms": 10.0, "token_ms_p10": 8.0, "token_ms_p90": 20.0},
        "mgmt": {"token_ms": 1.0, "per_admit_ms": 0.5},
        "terms": {
            "compute": {"sd_rel": 0.1},
            "flash": {"sd_rel": 0.2},
            "stall": {"sd_rel": 0.2},
            "mgmt": {"sd_rel": 0.0},
        },
        **extra,
    }
    return profile_from_dict(data)


# one prompt token, then three decode steps; two layers, top-2
PREFILL = [[[0, 1], [0, 1]]]
DECODE = [[[2, 3], [2, 3]], [[0, 1], [0, 1]], [[2, 3], [2, 3]]]


def test_no_cache_hand_worked_time():
    """Budget 0: every decode step misses 2 experts at each of 2 layers. One lane at 2 ms a
    request: 2 x 2 x 2 = 8 ms flash; mgmt 1 + 0.5 x 4 = 3 ms; compute 10 ms: 21 ms a token."""
    out = predict(make_trace(PREFILL, DECODE), round_profile(), {"cache_mb": [0]})
    row = out.iloc[0]
    assert row["flash_ms"] == pytest.approx(8.0)
    assert row["mgmt_ms"] == pytest.approx(3.0)
    assert row["compute_ms"] == pytest.approx(10.0)
    assert row["token_ms"] == pytest.approx(21.0)
    assert row["tok_s"] == pytest.approx(1000 / 21)
    assert row["mib_per_token"] == pytest.approx(4.0)
    assert row["hit_pct"] == 0.0
    # the 80 % interval: compute 10 +- 10 %, flash 8 +- 20 % (sd of a run's mean), in
    # quadrature: sd 1.887 ms of 21, +-1.2816 sd
    low, high = interval({"compute": 10, "flash": 8, "mgmt": 3}, {"compute": 0.1, "flash": 0.2})
    assert row["tok_s_low"] == pytest.approx(low)
    assert row["tok_s_high"] == pytest.approx(high)
    assert row["interval_pct"] == pytest.approx(100 * Z80 * (1 + 2.56) ** 0.5 / 21)


def test_cache_that_holds_everything_hand_worked():
    """A large budget: step 1 misses 4 experts (21 ms), steps 2 and 3 hit all (11 ms each);
    hits: 8 of 16 lookups (prefill included), 8 of 12 in decode; 4 MiB over 3 tokens."""
    out = predict(make_trace(PREFILL, DECODE), round_profile(), {"cache_mb": [100]})
    row = out.iloc[0]
    assert row["token_ms"] == pytest.approx(43 / 3)
    assert row["tok_s"] == pytest.approx(3000 / 43)
    assert row["hit_pct"] == pytest.approx(50.0)
    assert row["hit_pct_decode"] == pytest.approx(200 / 3)
    assert row["mib_per_token"] == pytest.approx(4 / 3)
    assert row["compute_pct"] == pytest.approx(100 * 10 / (43 / 3))


def test_more_lanes_measured_hand_worked():
    """With a 2-lane row at 3 ms a request, each layer's 2 requests take one 3 ms wave."""
    flash = [
        {"lanes": 1, "req_bytes": MIB, "latency_ms": 2.0, "batch_overhead_ms": 0.0, "reads": 1},
        {"lanes": 2, "req_bytes": MIB, "latency_ms": 3.0, "batch_overhead_ms": 0.5, "reads": 1},
    ]
    prof = round_profile(flash=flash)
    out = predict(make_trace(PREFILL, DECODE), prof, {"cache_mb": [0], "io_threads": [1, 2]})
    assert out["flash_ms"].tolist() == pytest.approx([8.0, 2 * (0.5 + 3.0)])
    assert out["token_ms"].tolist() == pytest.approx([21.0, 10 + 7 + 3])


# three warm-up steps that each route two new experts per layer, then 37 steps of the prompt's
WARM_DECODE = [[[2, 3], [2, 3]], [[4, 5], [4, 5]], [[6, 7], [6, 7]]] + [[[0, 1], [0, 1]]] * 37


def test_steady_state_rate_hand_worked():
    """A budget that holds everything: the 3 warm-up steps miss 4 experts each (21 ms, 4 MiB,
    as in test_no_cache_hand_worked_time), the 37 others hit all (10 + 1 = 11 ms, 0 MiB).
    The second-half median is 0 MiB, so warm-up ends at the first token reading 0 with
    nothing read over its next 8: token 3. Whole decode: 40 tokens in 3 x 21 + 37 x 11 =
    470 ms; steady state: 1000 / 11 tok/s. The interval's relative width is the whole decode's
    (compute 10, flash 3 x 8 / 40, mgmt (3 x 3 + 37 x 1) / 40 ms a token)."""
    out = predict(make_trace(PREFILL, WARM_DECODE), round_profile(), {"cache_mb": [100]})
    row = out.iloc[0]
    assert row["tok_s"] == pytest.approx(40_000 / 470)
    assert row["warmup_tokens"] == 3
    assert row["steady_tok_s"] == pytest.approx(1000 / 11)
    parts = {"compute": 10, "flash": 0.6, "mgmt": 1.15}
    low, high = interval(parts, {"compute": 0.1, "flash": 0.2})
    whole = 1000 / 11.75
    assert row["steady_tok_s_low"] == pytest.approx(1000 / 11 * low / whole)
    assert row["steady_tok_s_high"] == pytest.approx(1000 / 11 * high / whole)
    assert row["mib_per_token"] == pytest.approx(12 / 40)


def test_steady_state_from_the_first_token_when_every_token_reads_alike():
    """Budget 0 reads 4 MiB every token: the level is 4 MiB, every token is within it, so
    the steady state starts at once and equals the whole-decode rate (1000 / 21)."""
    row = predict(make_trace(PREFILL, WARM_DECODE), round_profile(), {"cache_mb": [0]}).iloc[0]
    assert row["warmup_tokens"] == 0
    assert row["steady_tok_s"] == pytest.approx(row["tok_s"]) == pytest.approx(1000 / 21)


def test_short_decode_has_no_steady_state():
    """3 decode tokens (< 32): no steady-state figure, the whole-decode rate still given."""
    row = predict(make_trace(PREFILL, DECODE), round_profile(), {"cache_mb": [100]}).iloc[0]
    assert np.isnan(row["steady_tok_s"])
    assert np.isnan(row["steady_tok_s_low"]) and np.isnan(row["steady_tok_s_high"])
    assert np.isnan(row["warmup_tokens"])
    assert row["tok_s"] == pytest.approx(3000 / 43)


def test_against_compares_steady_state_with_steady_state():
    """Whole-run measured tok/s is compared with the whole-decode prediction, the runs'
    steady-state tok/s with the steady-state prediction; a cell whose runs had no steady
    state has no steady error and does not count in the steady summary."""
    results = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "failed"],
            "cell": ["big", "big", "none", "none"],
            "cache_mb": [100, 100, 0, 0],
            "io_threads": [1, 1, 1, 1],
            "tok_s_reported": [80.0, 90.0, 40.0, 1.0],
            "steady_tok_s_mean": [100.0, 100.0, None, 1.0],
            "read_mib_per_token": [0.3, 0.3, 4.0, 4.0],
            "cache_hit_pct": [0.0, 0.0, 0.0, 0.0],
        }
    )
    views = against(make_trace(PREFILL, WARM_DECODE), round_profile(), results)
    cells = views["cells"].set_index("cell")
    assert cells.loc["big", "tok_s"] == 85.0  # median of the two repeats
    assert cells.loc["big", "tok_s_error_pct"] == pytest.approx(100 * (40_000 / 470 / 85 - 1))
    assert cells.loc["big", "steady_tok_s_predicted"] == pytest.approx(1000 / 11)
    assert cells.loc["big", "steady_tok_s_error_pct"] == pytest.approx(100 * (10 / 11 - 1))
    assert np.isnan(cells.loc["none", "steady_tok_s_error_pct"])
    assert cells.loc["none", "tok_s_error_pct"] == pytest.approx(100 * (1000 / 21 / 40 - 1))
    summary = views["summary"]
    assert summary["steady_cells"] == 1
    assert summary["median_abs_steady_tok_s_error_pct"] == pytest.approx(100 / 11)
    # 100 tok/s lies inside 1000/11 -11 % .. +12 % (test_steady_state_rate_hand_worked)
    assert summary["steady_inside_interval"] == 1


def test_overlap_profile_prices_the_stall_per_miss():
    prof = round_profile(mode="overlap", overlap={"stall_ms_per_miss": 1.5})
    row = predict(make_trace(PREFILL, DECODE), prof, {"cache_mb": [0]}).iloc[0]
    assert row["flash_ms"] == pytest.approx(4 * 1.5)


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
@pytest.mark.parametrize("budget", [64, 256])
def test_prefetch_reads_agree_with_the_prefetch_replay(budget):
    """The per-batch prefetch replay the prediction uses totals what the replay's own
    previous-token bet reports: experts prefetched and demand misses."""
    run = profile_runs(
        read_recorded_runs([next((SMALL / "cells").glob("cache_mb-64_io_threads-1*/r1/run.csv"))])
    )[0]
    batches = replay.prepare_batches(run.route)
    reads = cell_reads(run.route, batches, "lru", budget, prefetch=1)
    ref = replay.prefetch_replay(run.route, batches, "lru", budget, 1)
    assert ref["prefetched"] > 0
    assert reads.prefetched.sum() == ref["prefetched"]
    prefill_misses = int(
        (batches.n_lookups - replay.simulate(batches, "lru", budget * MIB))[~batches.decode].sum()
    )
    assert reads.misses.sum() + prefill_misses == ref["demand_misses"]


def test_drop_hand_worked():
    """Gate weights 0.7 / 0.3 at top-2, --drop 1.0: the 0.3 slot is below 1.0 x 1/2, so at
    budget 0 each decode step reads one expert per layer instead of two: flash 2 x 2 ms,
    mgmt 1 + 0.5 x 2, compute 10: 16 ms a token; 2 lookups of 4 per step are never made."""
    trace = make_trace(PREFILL, DECODE, weights=[0.7, 0.3])
    row = predict(trace, round_profile(), {"cache_mb": [0]}, drop=1.0).iloc[0]
    assert row["token_ms"] == pytest.approx(16.0)
    assert row["mib_per_token"] == pytest.approx(2.0)
    assert row["misses_per_token"] == pytest.approx(2.0)
    # --drop 0.5: the threshold is 0.25, the 0.3 slot stays
    kept = predict(trace, round_profile(), {"cache_mb": [0]}, drop=0.5).iloc[0]
    assert kept["token_ms"] == pytest.approx(21.0)


def test_drop_needs_weights():
    with pytest.raises(BmoeError, match="no gate weights"):
        predict(make_trace(PREFILL, DECODE), round_profile(), {"cache_mb": [0]}, drop=1.0)


# ----------------------------------------------------------------------------- properties


@st.composite
def traces(draw):
    n_layer = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    n_expert = draw(st.integers(k, 8))
    ids = st.lists(st.integers(0, n_expert - 1), min_size=k, max_size=k, unique=True)
    step = st.lists(ids, min_size=n_layer, max_size=n_layer)
    prefill = draw(st.lists(step, min_size=1, max_size=3))
    decode = draw(st.lists(step, min_size=1, max_size=8))
    return make_trace(prefill, decode)


@settings(max_examples=25, deadline=None)
@given(traces(), st.lists(st.integers(0, 12), min_size=2, max_size=5, unique=True))
def test_more_budget_never_predicts_more_reads(trace, budgets):
    prof = round_profile(n_layer=len(trace.layers))
    out = predict(trace, prof, {"cache_mb": sorted(budgets)})
    reads = out["mib_per_token"].to_numpy()
    assert np.all(np.diff(reads) <= 1e-9)
    assert np.all(np.diff(out["hit_pct"].to_numpy()) >= -1e-9)


flash_rows = st.lists(
    st.tuples(st.integers(1, 8), st.floats(0.1, 50.0), st.floats(0.0, 5.0)),
    min_size=1,
    max_size=5,
    unique_by=lambda r: r[0],
)


@settings(max_examples=50, deadline=None)
@given(flash_rows, st.lists(st.integers(0, 40), min_size=1, max_size=10))
def test_more_lanes_never_predict_slower_flash(rows, requests):
    flash = pd.DataFrame(
        [
            {"lanes": n, "req_bytes": MIB, "latency_ms": lat, "batch_overhead_ms": over}
            for n, lat, over in rows
        ]
    )
    times = [batch_flash_ms(flash, np.asarray(requests), MIB, lanes) for lanes in range(1, 12)]
    for fewer, more in itertools.pairwise(times):
        assert np.all(more <= fewer + 1e-9)


# ----------------------------------------------------------------------------- refusals


def test_profile_of_another_model_is_refused():
    prof = round_profile(size=2 * MIB)
    with pytest.raises(BmoeError, match="its own model's expert reads"):
        predict(make_trace(PREFILL, DECODE), prof, {"cache_mb": [0]})


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_compute_traced_runs_are_refused_unless_allowed():
    runs = profile_runs(read_recorded_runs([SMALL / "cells"]))
    assert all(r.compute_traced for r in runs)
    with pytest.raises(BmoeError, match="compute-traced"):
        build_profile(runs)
    prof = build_profile(runs, allow_traced=True)
    assert any("compute-traced" in c for c in prof.caveats)


def test_runs_of_two_models_are_refused(tmp_path):
    from bmoe.analyze.device import ProfileRun
    from bmoe.formats.metrics import MetricsRun

    rows = pd.DataFrame({"wall_ms": [10.0], "io_ms": [1.0], "compute_ms": [9.0], "mgmt_ms": [0.0]})
    a = ProfileRun(MetricsRun("a.csv", 2, {}, rows), route=make_trace(PREFILL, DECODE))
    b = ProfileRun(MetricsRun("b.csv", 2, {}, rows), route=make_trace(PREFILL, DECODE, 2 * MIB))
    with pytest.raises(BmoeError, match="another model"):
        build_profile([a, b])


def test_profile_file_round_trip_and_bad_files(tmp_path):
    prof = round_profile()
    path = tmp_path / "device.json"
    write_profile(prof, path)
    back = read_profile(path)
    assert back.to_dict() == prof.to_dict()
    data = json.loads(path.read_text())
    data["version"] = 9
    path.write_text(json.dumps(data))
    with pytest.raises(BmoeError, match="version 9"):
        read_profile(path)
    data["version"] = 1
    del data["compute"]["token_ms"]
    path.write_text(json.dumps(data))
    with pytest.raises(BmoeError, match=r"compute\.token_ms is missing"):
        read_profile(path)
    path.write_text("{\n  nope")
    with pytest.raises(BmoeError, match=r"device\.json:2: not JSON"):
        read_profile(path)


def test_parse_grid():
    assert parse_grid("cache_mb=64,128,io_threads=1,4") == {
        "cache_mb": [64, 128],
        "io_threads": [1, 4],
    }
    assert parse_grid(["cache_mb=64", "prefetch=0,1"]) == {"cache_mb": [64], "prefetch": [0, 1]}
    with pytest.raises(BmoeError, match="unknown axis 'lanes'"):
        parse_grid("cache_mb=1,lanes=2")
    with pytest.raises(BmoeError, match="needs cache_mb"):
        parse_grid("io_threads=2")
    with pytest.raises(BmoeError, match="not a valid value"):
        parse_grid("cache_mb=1,io_threads=1.5")


# ----------------------------------------------------------------------------- archived runs


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_archived_runs_reads_and_hits_are_the_replays():
    """Each archived run's MiB/token and hit % come out of the prediction of its own cell
    (the summary rounds to 0.1)."""
    runs = profile_runs(read_recorded_runs([SMALL / "cells"]))
    prof = build_profile(runs, allow_traced=True)
    for run in runs:
        params, summary = run.metrics.params, run.metrics.summary
        out = predict(
            run.route,
            prof,
            {"cache_mb": [params["cache_mb"]], "io_threads": [params["io_threads"]]},
        ).iloc[0]
        assert out["mib_per_token"] == pytest.approx(
            summary["read_MiB"] / summary["tokens"], abs=0.06 / summary["tokens"] + 1e-3
        )
        assert out["hit_pct"] == pytest.approx(summary["cache_hit_pct"], abs=0.051)


def test_a_version_1_profile_still_reads_and_says_what_it_lacks(tmp_path):
    """A profile written before terms and runs were recorded: read, upgraded in memory with a
    caveat; its interval from its 10th-90th percentile spread (as it was written for)."""
    data = round_profile().to_dict()
    data["version"] = 1
    for key in ("terms", "absent", "runs", "tracing", "coverage", "unsettled", "memory"):
        data.pop(key)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = read_profile(path)
    assert old.version == 1
    assert any("version 1 profile" in c for c in old.caveats)
    row = predict(make_trace(PREFILL, DECODE), old, {"cache_mb": [0]}).iloc[0]
    assert row["token_ms"] == pytest.approx(21.0)
    # compute 8..20 ms around 10: sd (20 - 8) / (2 x 1.2816) = 4.68 ms; flash 1..4 around 2
    # a request: sd 0.585 of 1 relative to its latency, of 8 ms
    sd = ((12 / (2 * Z80)) ** 2 + (3 / (2 * Z80) / 2 * 8) ** 2) ** 0.5
    assert row["interval_pct"] == pytest.approx(100 * Z80 * sd / 21)
