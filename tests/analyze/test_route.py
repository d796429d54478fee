"""Route views on hand-worked traces, and against a straightforward implementation on
generated ones (``tests/oracles/route.py``, independent of the vectorised code)."""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze import route
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace
from tests.oracles import route as naive

ROOT = Path(__file__).resolve().parents[2]

DTYPES = {
    "turn": "int16", "phase": "int8", "step": "int32", "layer": "int16", "slot": "int8",
    "expert": "int16", "weight": "float32", "residency": "int8", "expert_bytes": "int32",
    "dropped": "int8",
}  # fmt: skip


def make_trace(records, sizes=None, k=2, n_expert=8) -> RouteTrace:
    rows = pd.DataFrame(records, columns=list(DTYPES)).astype(DTYPES)
    layers = sorted(set(rows["layer"]))
    sizes = {x: 1048576 for x in layers} if sizes is None else sizes
    table = pd.DataFrame(
        {"layer": list(sizes), "expert_bytes": list(sizes.values()), "dense_bytes": 2097152}
    )
    meta = {"model": "m", "arch": "a", "n_layer": len(layers), "n_expert": n_expert,
            "n_expert_used": k}  # fmt: skip
    return RouteTrace(None, 1, meta, table, rows)


def cells(spec, phase=1, turn=0, res=None, weights=None):
    """Rows from {step: {layer: [experts]}}."""
    out = []
    for step, by_layer in spec.items():
        for layer, experts in by_layer.items():
            for slot, e in enumerate(experts):
                r = 1 if res is None else res[(step, layer)][slot]
                w = 0.5 if weights is None else weights[(step, layer)][slot]
                out.append((turn, phase, step, layer, slot, e, w, r, 1048576 * (r == 0), 0))
    return out


# one layer, k=2:  S0={1,2}  S1={2,3}  S2={1,2}  S3={4,5}
HAND = cells({10: {0: [1, 2]}, 11: {0: [2, 3]}, 12: {0: [1, 2]}, 13: {0: [4, 5]}})


def test_reuse_hand_worked() -> None:
    # distances: expert 2: 1 (S0->S1), 1 (S1->S2); expert 1: 2 (S0->S2) -> [1, 1, 2]
    rec = route.reuse(make_trace(HAND)).iloc[0]
    assert (rec["n_reuse"], rec["p50"], rec["p90"], rec["max"]) == (3, 1, 2, 2)
    assert rec["never_2nd"] == 3  # 3, 4, 5
    long = route.reuse_distances(make_trace(HAND))
    assert sorted(long["distance"]) == [1, 1, 2]


def test_overlap_hand_worked() -> None:
    frame = route.overlap(make_trace(HAND)).set_index("layer")
    assert frame.loc[0, "lag_1"] == pytest.approx((50 + 50 + 0) / 3)
    assert frame.loc[0, "lag_2"] == pytest.approx((100 + 0) / 2)
    assert frame.loc[0, "lag_4"] == 0.0  # no cell 4 back: the reference prints 0.0
    assert frame.loc["ALL", "lag_1"] == pytest.approx(100 / 3)


def test_overlap_of_a_layer_with_one_prefill_cell_is_zero() -> None:
    """The established analysis prints 0.0 for a lag no cell of the layer reaches: in
    prefill the last layer may route only the final prompt token (one cell)."""
    spec = {s: {0: [1, 2], 1: [1, 2]} for s in range(3)}
    spec[2][2] = [3, 4]  # layer 2: only the last prompt token
    frame = route.overlap(make_trace(cells(spec, phase=0))).set_index("layer")
    assert [frame.loc[2, f"lag_{g}"] for g in (1, 2, 4, 8)] == [0.0] * 4
    assert frame.loc[0, "lag_1"] == 100.0 and frame.loc[0, "lag_4"] == 0.0
    assert frame.loc["ALL", "lag_1"] == 100.0  # the pooled mean counts only cells with a lag


def test_workset_hand_worked() -> None:
    frame = route.workset(make_trace(HAND))
    rec = frame.iloc[0]
    assert [c for c in frame.columns if c.startswith("s")] == ["s1", "s2", "s4"]
    assert (rec["of"], rec["s1"], rec["s2"], rec["s4"]) == (8, 2, 3, 5)
    assert frame.iloc[-1]["union_mib"] == pytest.approx(5.0)  # 5 experts x 1 MiB


def test_hot_ties_go_to_the_expert_routed_first() -> None:
    rec = route.hot(make_trace(HAND), top=3).iloc[0]
    assert rec["unique"] == 5
    assert rec["top"] == "2:3 1:2 3:1"  # 3, 4 and 5 tie: 3 was routed first
    assert rec["coverage_pct"] == pytest.approx(100 * 6 / 8)


def test_entropy_hand_worked() -> None:
    weights = {(10, 0): [0.75, 0.25], (11, 0): [0.6, float("nan")], (12, 0): [0.0, 0.0]}
    trace = make_trace(cells({10: {0: [1, 2]}, 11: {0: [2, 3]}, 12: {0: [4, 5]}}, weights=weights))
    rec = route.entropy(trace).iloc[0]
    h = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    # the nan cell normalises its known weight to 1 (entropy 0); the zero cell is skipped
    assert rec["entropy_bits"] == pytest.approx((h + 0.0) / 2, abs=1e-6)
    assert rec["top1_pct"] == pytest.approx((75 + 100) / 2, abs=1e-4)
    san = route.sanity(trace).iloc[0]
    assert san["cells_weighed"] == 2 and san["weight_sum_min"] == 0.0


def test_cache_prefetch_and_matrix_letters() -> None:
    res = {(10, 0): [0, 0], (11, 0): [1, 2], (12, 0): [2, 1]}
    trace = make_trace(cells({10: {0: [1, 2]}, 11: {0: [1, 3]}, 12: {0: [3, 1]}}, res=res))
    rec = route.cache(trace).set_index("layer").loc["ALL"]
    assert rec["miss_pct"] == pytest.approx(100 * 2 / 6)
    assert rec["prefetch_pct"] == pytest.approx(100 * 2 / 6)
    slots = route.prefetch_slots(trace).set_index("slot")
    assert slots.loc[0, "prefetch_hits"] == 1 and slots.loc[1, "prefetch_hits"] == 1
    grid = route.matrix(trace, cells="hit")
    assert list(grid["L0"]) == ["MM", "HP", "PH"]
    experts = route.matrix(trace, cells="experts")
    assert list(experts["L0"]) == ["1 2", "*1 3", "*3 *1"]
    mb = route.matrix(trace, cells="mb")
    assert list(mb["L0"]) == ["2.00", "0.00", "0.00"]


def test_matrix_marks_only_the_previous_displayed_row() -> None:
    trace = make_trace(
        cells({1: {0: [1, 2], 1: [5, 6]}, 2: {0: [2, 3]}, 3: {0: [3, 4], 1: [5, 7]}})
    )
    grid = route.matrix(trace)
    assert list(grid["step"]) == [1, 2, 3]
    assert list(grid["L0"]) == ["1 2", "*2 3", "*3 4"]
    assert pd.isna(grid["L1"].iloc[1]) and grid["L1"].iloc[2] == "5 7"  # step 2 had no L1 cell
    assert len(route.matrix(trace, limit=2)) == 2


def test_select_filters_and_orders() -> None:
    rows = cells({5: {1: [1, 2], 0: [3, 4]}, 6: {0: [1, 2]}}) + cells(
        {0: {0: [7, 6]}}, phase=0
    ) + cells({9: {0: [1, 2]}}, turn=1)  # fmt: skip
    trace = make_trace(rows)
    assert len(route.select(trace, "prefill").rows) == 2
    assert len(route.select(trace, "all").rows) == len(rows)
    dec = route.select(trace, "decode")
    assert list(dec.rows["layer"]) == [0, 0, 0, 0, 0, 0, 1, 1]  # layer-major
    assert list(dec.rows["step"][:6]) == [5, 5, 6, 6, 9, 9]
    assert len(route.select(trace, "decode", turn=1).rows) == 2
    assert set(route.select(trace, "decode", layers=[1]).rows["layer"]) == {1}
    assert set(route.select(trace, "decode", steps=range(6, 10)).rows["step"]) == {6, 9}
    assert set(route.select(trace, "decode", max_steps=2).rows["step"]) == {5, 6}
    assert route.count_steps(dec) == 3


def test_caveats() -> None:
    dropped = [(*r[:9], 1 if r[2] == 11 else 0) for r in HAND]
    trace = make_trace(dropped, sizes={})
    said = " ".join(route.caveats(trace))
    assert "2 of 8 routings (25.0%)" in said and "ROUTER" in said
    assert "no expert_bytes for layer 0" in said
    empty = route.select(trace, "prefill")
    assert "no prefill rows" in route.caveats(trace, empty, "prefill")[0]
    none = route.select(trace, "decode", steps=[99])
    assert "span steps 10-13" in route.caveats(trace, none, "decode")[0]
    assert route.caveats(make_trace(HAND)) == []


def test_empty_selection_gives_empty_views() -> None:
    selected = route.select(make_trace(HAND), "prefill")
    views = route.route_views(selected, route.VIEWS)
    assert views["sanity"].iloc[0]["rows"] == 0
    assert all(len(views[n]) == 0 for n in ("hot", "reuse", "entropy", "matrix"))


# ----------------------------------------------------------------------------- vs naive


def generated(seed: int, n_layer=5, n_expert=16, k=3, steps=40, prompt=6, turns=1, nan=False):
    """A skewed random router, with a prefill whose last layer routes one token."""
    rng = np.random.default_rng(seed)
    pop = rng.zipf(1.6, size=(n_layer, n_expert)).astype(float)
    out = []
    step = 0
    for turn in range(turns):
        phases = [(0, s) for s in range(step, step + prompt)]
        phases += [(1, s) for s in range(step + prompt, step + prompt + steps)]
        for phase, s in phases:
            for layer in range(n_layer):
                if phase == 0 and layer == n_layer - 1 and s != step + prompt - 1:
                    continue
                p = pop[layer] / pop[layer].sum()
                experts = rng.choice(n_expert, size=k, replace=False, p=p)
                w = rng.dirichlet(np.ones(k))
                if nan and rng.random() < 0.1:
                    w[rng.integers(k)] = np.nan
                res = rng.choice(3, size=k, p=[0.3, 0.6, 0.1])
                for slot in range(k):
                    eb = int(1000 * (layer + 1)) if res[slot] == 0 else 0
                    out.append(
                        (turn, phase, s, layer, slot, experts[slot], w[slot], res[slot], eb, 0)
                    )
        step += prompt + steps
    sizes = {x: 1000 * (x + 1) for x in range(n_layer)}
    return make_trace(out, sizes=sizes, k=k, n_expert=n_expert)


def _close(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)) or a is pd.NA:
        return b is None or (isinstance(b, float) and math.isnan(b)) or b is pd.NA
    return a == pytest.approx(b, rel=1e-6, abs=1e-6)


CASES = [
    dict(seed=1),
    dict(seed=2, n_layer=3, n_expert=64, k=6, steps=150, prompt=20),
    dict(seed=3, turns=2, nan=True),
    dict(seed=4, n_layer=1, n_expert=4, k=1, steps=12, prompt=1),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("phase", ["decode", "prefill", "all"])
def test_matches_straightforward_implementation(case, phase) -> None:
    trace = generated(**case)
    selected = route.select(trace, phase)
    rows = selected.rows.to_dict("records")
    for r in rows:
        r["weight"] = float(r["weight"])
    ref = naive.default_views(rows, trace.expert_bytes(), trace.n_expert_used)
    got = route.route_views(selected)

    san = got["sanity"].iloc[0]
    for key, value in ref["sanity"].items():
        assert _close(san[key], value), key
    for rec in got["hot"].to_dict("records"):
        unique, coverage, top = ref["hot"][rec["layer"]]
        assert (rec["unique"], rec["top"]) == (unique, top)
        assert _close(rec["coverage_pct"], coverage)
    for rec in got["reuse"].to_dict("records"):
        expect = ref["reuse"][rec["layer"]]
        values = [rec[c] for c in ("n_reuse", "p50", "p90", "max", "never_2nd")]
        assert all(_close(a, b) for a, b in zip(values, expect, strict=True)), rec
    for rec in got["overlap"].to_dict("records"):
        expect = ref["overlap"][rec["layer"]]
        assert all(_close(rec[f"lag_{g}"], e) for g, e in zip((1, 2, 4, 8), expect, strict=True))
    ws = got["workset"]
    for rec in ws[ws["layer"] != "ALL"].to_dict("records"):
        for col, value in ref["workset"][rec["layer"]].items():
            assert rec[col] == value, (rec["layer"], col)
    assert _close(ws.iloc[-1]["union_mib"], ref["workset"]["union_mib"])
    for rec in got["cache"].to_dict("records"):
        expect = ref["cache"][rec["layer"]]
        values = [rec[c] for c in ("miss_pct", "hit_pct", "prefetch_pct", "routings")]
        assert all(_close(a, b) for a, b in zip(values, expect, strict=True))
    ent = got["entropy"].set_index("layer")
    for layer, (bits, top1) in ref["entropy"].items():
        assert _close(ent.loc[layer, "entropy_bits"], bits)
        assert _close(ent.loc[layer, "top1_pct"], top1)
    by = got["bytes"].set_index("layer")
    for layer, mib in ref["bytes"].items():
        if layer == "mib_per_step":
            assert _close(by.loc["ALL", "mib_per_step"], mib)
        else:
            assert _close(by.loc[layer, "read_mib"], mib)


def lru_stack_distances(trace: RouteTrace) -> list[tuple[int, int, int, int]]:
    """Reuse distances in bytes by walking an explicit LRU stack over the engine's batches."""
    sizes = trace.expert_bytes()
    rows = trace.rows.sort_values(["turn", "phase", "step", "layer", "slot"])
    batches = []
    for (_, phase), g in rows.groupby(["turn", "phase"], sort=True):
        groups = g.groupby("layer", sort=True) if phase == 0 else g.groupby(["step", "layer"])
        for _, b in groups:
            if phase == 0:
                b = b.sort_values(["step", "slot"])
            batches.append(list(zip(b["layer"], b["expert"], b["step"], strict=True)))
    stack: OrderedDict = OrderedDict()
    out = []
    for batch in batches:
        seen = set()
        for layer, expert, step in batch:
            key = (int(layer), int(expert))
            if key in seen:
                continue
            seen.add(key)
            if key in stack:
                keys = list(stack)
                between = sum(sizes[k[0]] for k in keys[keys.index(key) + 1 :])
                out.append((key[0], key[1], int(step), between))
                stack.move_to_end(key)
            else:
                stack[key] = True
    return sorted(out)


@pytest.mark.parametrize("phase", ["decode", "all"])
@pytest.mark.parametrize("seed", [5, 6])
def test_reuse_in_bytes_is_the_lru_stack_distance(seed, phase) -> None:
    trace = route.select(generated(seed, turns=2 if seed == 6 else 1), phase)
    got = route.reuse_bytes_distances(trace)
    assert sorted(got.itertuples(index=False, name=None)) == lru_stack_distances(trace)


def test_reuse_in_bytes_needs_every_size() -> None:
    trace = make_trace(HAND, sizes={})
    with pytest.raises(route.BmoeError, match="no expert_bytes"):
        route.reuse_bytes_distances(trace)


def test_workset_curve_ends_at_the_view() -> None:
    trace = route.select(generated(7), "all")
    curve = route.workset_curve(trace)
    last = curve.groupby("layer").tail(1).set_index("layer")
    ws = route.workset(trace)
    col = [c for c in ws.columns if c.startswith("s")][-1]
    per_layer = ws[ws["layer"] != "ALL"].set_index("layer")
    assert (last["distinct"] == per_layer[col].astype(int)).all()


def test_routing_grid_places_every_routing() -> None:
    trace = generated(8)
    grid = route.routing_grid(route.select(trace, "decode"), "expert")
    dec = trace.rows[trace.rows["phase"] == 1]
    for r in dec.sample(20, random_state=0).itertuples():
        assert grid.loc[r.step, (r.layer, r.slot)] == r.expert
    assert (grid.to_numpy() >= 0).all()


def test_select_consume_moves_the_rows_out() -> None:
    rows = cells({s: {0: [1, 2], 1: [3, 4]} for s in range(5)}) + cells({9: {0: [5, 6]}}, phase=0)
    trace = make_trace(rows)
    expect = route.select(make_trace(rows), "decode")
    got = route.select(trace, "decode", consume=True)
    pd.testing.assert_frame_equal(got.rows, expect.rows)
    assert len(trace.rows) == 0 and list(trace.rows.columns) == list(expect.rows.columns)
    assert route.caveats(trace, got, "decode") == route.caveats(make_trace(rows), expect, "decode")
    # nothing selected: nothing moved, so the caveats can still describe the whole trace
    whole = make_trace(rows)
    assert not len(route.select(whole, "decode", layers=[7], consume=True).rows)
    assert len(whole.rows) == len(rows)


def test_a_consumed_trace_holds_none_of_its_rows_memory() -> None:
    """After ``select(consume=True)`` the trace's empty columns are arrays of their own: an
    empty view would keep its base, every row of the trace, alive beside the selection."""
    import gc
    import weakref

    from bmoe.formats.route import RouteColumns

    rows = cells({s: {0: [1, 2], 1: [3, 4]} for s in range(50)}) + cells({99: {0: [5, 6]}}, 0)
    frame_trace = make_trace(rows)
    block = weakref.ref(frame_trace.rows._mgr.blocks[0].values.base)
    selected = route.select(frame_trace, "decode", consume=True)
    gc.collect()
    assert len(selected.rows) and block() is None
    columns = RouteColumns.of(make_trace(rows))
    base = np.stack([columns.columns[c].astype(np.int32) for c in ("step", "layer")])
    columns.columns.update(step=base[0], layer=base[1])  # rows of one array, as parsed
    held = weakref.ref(base)
    del base
    chosen = route.select(columns, "decode", consume=True)
    gc.collect()
    decode_rows = len(route.select(make_trace(rows), "decode").rows)
    assert isinstance(chosen, RouteColumns) and len(chosen.columns["step"]) == decode_rows
    assert held() is None and all(len(a) == 0 for a in columns.columns.values())


def _random_trace(seed: int = 3) -> RouteTrace:
    """5 layers x 12 experts, top-3: 6 prefill steps (the last layer routes only the final
    prompt token) and 50 decode steps, in engine order; some weights unknown."""
    rng = np.random.default_rng(seed)
    records = []
    for step in range(56):
        phase = int(step >= 6)
        for layer in range(5):
            if layer == 4 and step < 5:
                continue
            for slot, e in enumerate(rng.choice(12, 3, replace=False)):
                res = int(rng.integers(0, 3))
                w = float("nan") if rng.random() < 0.05 else round(float(rng.random()), 3)
                records.append(
                    (0, phase, step, layer, slot, int(e), w, res, 1048576 * (res == 0), 0)
                )
    return make_trace(records, k=3, n_expert=12)


@pytest.mark.parametrize("phase", ["decode", "prefill", "all"])
@pytest.mark.parametrize("max_rows", [1, 200, 10**9])
def test_views_in_passes_equal_the_views(phase: str, max_rows: int) -> None:
    trace = _random_trace()
    rows = trace.rows

    def blocks():
        return (rows.iloc[a : a + 97].reset_index(drop=True) for a in range(0, len(rows), 97))

    expect = route.route_views(route.select(trace, phase))
    got = route.route_views_in_passes(blocks, trace, phase=phase, max_rows=max_rows)
    assert list(got) == list(expect)
    for name, frame in expect.items():
        pd.testing.assert_frame_equal(got[name], frame, check_exact=False, rtol=1e-9)


def test_views_in_passes_refuse_the_matrix() -> None:
    trace = _random_trace()
    with pytest.raises(BmoeError, match="cannot be analysed in passes"):
        route.route_views_in_passes(lambda: [trace.rows], trace, ["matrix"])
