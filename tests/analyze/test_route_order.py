"""The compiled loops of the route views' row order give what numpy's unique and stable
argsort give, and the selection built on them equals the numpy path's."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from bmoe import compiled
from bmoe.analyze import route_cells, route_order


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_small_unique_is_numpys_unique_with_inverse(dtype) -> None:
    rng = np.random.default_rng(int(np.dtype(dtype).itemsize))
    for n, span in ((1, 1), (50, 3), (10_000, 48), (20_000, 40_000)):
        values = (rng.integers(0, span, size=n) - span // 3).astype(dtype)
        inverse = np.empty(n, dtype=np.int32)
        uniq = route_order.small_unique(values, inverse)
        expect_uniq, expect_inverse = np.unique(values, return_inverse=True)
        np.testing.assert_array_equal(uniq, expect_uniq)
        assert uniq.dtype == values.dtype
        np.testing.assert_array_equal(inverse, expect_inverse)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.int64])
def test_the_gather_is_numpys_fancy_indexing(dtype) -> None:
    """Compiled for int8/16/32 and float32 values at int32 positions (bit for bit, NaN and
    -0.0 included); any other type goes to numpy's indexing, with the same result."""
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(5000) * 100).astype(dtype)
    if values.dtype.kind == "f":
        values[:3] = [np.nan, -0.0, np.inf]
    for order in (rng.permutation(5000), rng.integers(0, 5000, size=7000), np.zeros(0, int)):
        at = order.astype(np.int32)
        got = route_cells.take_rows(values, at)
        assert got.dtype == values.dtype
        assert got.tobytes() == values[order].tobytes()
        if not os.environ.get(compiled.JIT_ONLY):
            assert route_order.gather.takes(values, at, values[:0]) == (dtype != np.int64)


@pytest.mark.parametrize("expert_type", [np.int16, np.int32])
@pytest.mark.parametrize("key_type", [np.int16, np.int32])
def test_key_order_is_the_stable_argsort(expert_type, key_type) -> None:
    rng = np.random.default_rng(4)
    for n, n_layers, n_expert in ((0, 1, 1), (1, 1, 1), (5000, 1, 7), (20_000, 48, 128)):
        layer_idx = np.sort(rng.integers(0, n_layers, size=n)).astype(np.int32)
        expert = rng.integers(0, n_expert, size=n).astype(expert_type)
        key = layer_idx.astype(np.int64) * n_expert + expert
        order = np.full(n, -1, dtype=np.int32)
        ordered = np.empty(n, dtype=key_type)
        route_order.key_order(layer_idx, expert, n_expert, n_layers * n_expert, order, ordered)
        expect = np.argsort(key, kind="stable")
        np.testing.assert_array_equal(order, expect)
        np.testing.assert_array_equal(ordered, key[expect])


def rows(order: str, seed: int, n_steps: int = 300, n_layers: int = 7, k: int = 3):
    """(layer index, step code, slot) of a trace written step-major (as engines write),
    layer-major, or shuffled."""
    rng = np.random.default_rng(seed)
    step = np.repeat(np.arange(n_steps), n_layers * k)
    layer = np.tile(np.repeat(np.arange(n_layers), k), n_steps)
    slot = np.tile(np.arange(k), n_steps * n_layers)
    if order == "layer":
        at = np.lexsort((slot, step, layer))
    elif order == "shuffled":
        at = rng.permutation(len(step))
    else:
        at = np.arange(len(step))
    return layer[at].astype(np.int16), (2 * step[at]).astype(np.int32), slot[at].astype(np.int8)


@pytest.mark.parametrize("order", ["step", "layer", "shuffled"])
@pytest.mark.parametrize("kept", [None, 0.6])
def test_layer_major_finds_the_order_and_sorts_step_major_rows_by_layer(order, kept) -> None:
    layer_idx, step_code, slot = rows(order, 1)
    rng = np.random.default_rng(2)
    keep = rng.random(len(layer_idx)) < kept if kept else np.zeros(0, dtype=bool)
    take = np.full(len(layer_idx), -1, dtype=np.int32)
    state, written = route_order.layer_major(layer_idx, step_code, slot, keep, take)
    take = take[:written]
    expect = {"step": route_order.STEP_MAJOR, "layer": route_order.LAYER_MAJOR,
              "shuffled": route_order.UNSORTED}[order]  # fmt: skip
    assert state == expect
    if state == route_order.STEP_MAJOR:
        stable = np.argsort(layer_idx, kind="stable")
        if kept:
            stable = stable[keep[stable]]
        np.testing.assert_array_equal(take, stable)


@pytest.mark.parametrize("order", ["step", "layer", "shuffled"])
def test_the_selection_is_the_numpy_paths(order, monkeypatch) -> None:
    layer_idx, step_code, slot = rows(order, 3)
    rng = np.random.default_rng(4)
    n = len(layer_idx)
    cols = {
        "phase": (rng.random(n) < 0.8).astype(np.int8),
        "step": (step_code // 2).astype(np.int32),
        "layer": (layer_idx * 2 + 1).astype(np.int16),
        "slot": slot,
        "expert": rng.integers(0, 64, size=n).astype(np.int16),
    }
    keep = cols["phase"] == 1
    fast = route_cells._sorted_rows(dict(cols), keep)
    with monkeypatch.context() as m:
        m.setattr(route_cells, "_layer_major", lambda *args: None)
        m.setattr(route_order.small_unique, "takes", lambda *args: False)
        slow = route_cells._sorted_rows(dict(cols), keep)
    assert fast is not None and slow is not None
    for name in cols:
        np.testing.assert_array_equal(fast[0][name], slow[0][name], err_msg=name)
    np.testing.assert_array_equal(fast[3], slow[3])


def test_cell_sets_are_the_numpy_paths(corpus, monkeypatch) -> None:
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    trace = read_route_columns(corpus / "route-trace/gemma.route.csv")
    for phase in ("decode", "prefill", "all"):
        seq, _ = route_cells.sequence_of(route.select(trace, phase))
        fast = route._cell_sets(seq)
        with monkeypatch.context() as m:
            m.setattr(route_order.cell_sets, "takes", lambda *args: False)
            slow = route._cell_sets(seq)
        assert fast.dtype == slow.dtype == np.uint64
        np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize(
    "name", ["route-trace/gemma.route.csv", "native-tiny/run.route.csv", "synthetic"]
)
def test_overlap_lags_are_the_numpy_paths(corpus, monkeypatch, name) -> None:
    """Every lag's shares, per layer and pooled, to the last bit; cells without experts
    (all slots dropped) and layers shorter than a lag included."""
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    if name == "synthetic":
        rng = np.random.default_rng(8)
        n_cells = 400
        sets = rng.integers(0, 2**63, size=(2, n_cells), dtype=np.int64).astype(np.uint64)
        sets[:, rng.random(n_cells) < 0.1] = 0  # empty cells
        layer = np.sort(rng.integers(0, 5, size=n_cells))
        phases = {"synthetic": None}
    else:
        phases = {p: read_route_columns(corpus / name) for p in ("decode", "prefill", "all")}
    for phase, trace in phases.items():
        if trace is None:
            seq = route_cells.sequence_of(
                route.select(read_route_columns(corpus / "native-tiny/run.route.csv"), "all")
            )[0]
            starts = np.flatnonzero(np.r_[True, layer[1:] != layer[:-1]])
            first = np.repeat(starts, np.diff(np.r_[starts, n_cells]))
            seq = dataclasses.replace(
                seq, cell_start=np.arange(n_cells), layers=np.unique(layer),
                cell_layer_idx=layer.astype(np.int32),
                cell_index=(np.arange(n_cells) - first).astype(np.int32),
                cells_per_layer=np.bincount(layer),
            )  # fmt: skip
            monkeypatch.setattr(route, "_cell_sets", lambda _seq: sets)
        else:
            seq = route_cells.sequence_of(route.select(trace, phase))[0]
        lags = (1, 2, 3, 8, 64)
        fast = route._overlap(seq, lags)
        with monkeypatch.context() as m:
            m.setattr(route_order.overlap_lag, "takes", lambda *args: False)
            slow = route._overlap(seq, lags)
        assert list(fast) == list(slow)
        for column, values in fast.items():
            if values.dtype == object:  # the layers, and ALL
                assert values.tolist() == slow[column].tolist()
            else:
                assert values.tobytes() == slow[column].tobytes(), (phase, column)


@pytest.mark.parametrize(
    "choice",
    [{"phase": "decode"}, {"phase": "prefill"}, {"phase": "all", "layers": [1, 3]},
     {"phase": "decode", "steps": [40, 41, 45], "max_steps": 2}, {"phase": "decode", "turn": 9}],
)  # fmt: skip
def test_select_sequence_is_the_selections_own_sequence(corpus, choice) -> None:
    """The sequence made from the selection's order holds the cells the selected rows' own
    sequence holds (its step codes are the whole trace's: the same order), and the views
    made with it are the views made without it."""
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    path = corpus / "route-trace/gemma.route.csv"
    selected, seq = route.select_sequence(read_route_columns(path), **choice)
    own, _ = route_cells.sequence_of(route.select(read_route_columns(path), **choice))
    assert seq.rows is selected.columns or not selected.n_rows
    for field in ("layer", "layer_idx", "layers", "expert", "gcell", "cell_start",
                  "cell_layer_idx", "cell_index", "cells_per_layer"):  # fmt: skip
        np.testing.assert_array_equal(getattr(seq, field), getattr(own, field), err_msg=field)
    assert (seq.n_expert, seq.n_steps) == (own.n_expert, own.n_steps)
    assert seq.n_steps == route.count_steps(selected)
    codes = np.unique(seq.cell_step_code, return_inverse=True)[1]
    np.testing.assert_array_equal(codes, np.unique(own.cell_step_code, return_inverse=True)[1])
    names = route.VIEWS
    given = route.view_columns(selected, names, matrix_limit=None, sequence=seq)
    alone = route.view_columns(selected, names, matrix_limit=None)
    assert list(given) == list(alone)
    for name in names:
        if name == "matrix":  # a DataFrame already
            assert given[name].equals(alone[name])
        else:
            assert route.as_frame(given[name]).equals(route.as_frame(alone[name])), name


def test_the_by_key_order_is_the_numpy_paths(corpus, monkeypatch) -> None:
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    trace = read_route_columns(corpus / "route-trace/gemma.route.csv")
    for phase in ("decode", "prefill", "all"):
        selected = route.select(trace, phase)
        fast = route_cells.sequence_of(selected)[0].by_key()
        with monkeypatch.context() as m:
            m.setattr(route_order.key_order, "takes", lambda *args: False)
            slow = route_cells.sequence_of(selected)[0].by_key()
        for a, b in zip(fast, slow, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_residency_counts_are_the_numpy_paths(corpus, monkeypatch) -> None:
    """The cache view whichever pass counts: residencies outside 0..2 included."""
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    trace = read_route_columns(corpus / "route-trace/gemma.route.csv")
    seq, _ = route_cells.sequence_of(route.select(trace, "all"))
    res = seq.rows["residency"].copy()
    res[::7], res[3::11] = -1, 5
    seq.rows["residency"] = res
    fast = route._cache(seq)
    with monkeypatch.context() as m:
        m.setattr(route_order.residency_counts, "takes", lambda *args: False)
        slow = route._cache(seq)
    assert list(fast) == list(slow)
    for name, values in fast.items():
        assert values.tolist() == slow[name].tolist(), name
        assert values.dtype == slow[name].dtype, name


@pytest.mark.parametrize("phase", ["decode", "prefill", "all"])
def test_the_cells_are_the_numpy_paths(corpus, monkeypatch, phase) -> None:
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    for name in ("route-trace/gemma.route.csv", "native-tiny/run.route.csv"):
        selected = route.select(read_route_columns(corpus / name), phase)
        fast, _ = route_cells.sequence_of(selected)
        with monkeypatch.context() as m:
            m.setattr(route_order.cells, "takes", lambda *args: False)
            slow, _ = route_cells.sequence_of(selected)
        for field in ("gcell", "cell_start", "cell_layer_idx", "cell_index", "cell_step_code"):
            a, b = getattr(fast, field), getattr(slow, field)
            assert a.dtype == b.dtype, field
            np.testing.assert_array_equal(a, b, err_msg=field)


@pytest.mark.parametrize("phase", ["decode", "prefill", "all"])
def test_the_selections_columns_are_the_kept_rows_sorted(corpus, phase) -> None:
    """Every selected column (those made rather than gathered among them: the chosen phase,
    a column of one value) is the kept rows' in (layer, turn, step, phase, slot) order."""
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    trace = read_route_columns(corpus / "route-trace/gemma.route.csv")
    cols = {c: a.copy() for c, a in trace.columns.items()}
    cols["turn"][:] = 3  # one value, not zero
    trace.columns = dict(cols)
    keep = np.ones(len(cols["step"]), dtype=bool)
    if phase != "all":
        keep = cols["phase"] == route_cells.PHASES[phase]
    kept = {c: a[keep] for c, a in cols.items()}
    order = np.lexsort(tuple(kept[c] for c in ("slot", "phase", "step", "turn", "layer")))
    selected = route.select(trace, phase, consume=True)
    assert list(selected.columns) == list(cols)
    for name, values in kept.items():
        got = selected.columns[name]
        assert got.dtype == values.dtype, name
        np.testing.assert_array_equal(got, values[order], err_msg=name)


def test_reuse_figures_are_the_numpy_paths(corpus, monkeypatch) -> None:
    """The compiled pass of the reuse view gives the numpy path's figures and gaps, on
    the corpus trace's phases and on rows where one expert repeats within a cell."""
    from bmoe.analyze import route
    from bmoe.formats.route import read_route_columns

    if not route_order.reuse_figures.compile_ahead():
        pytest.skip("the reuse pass is not compiled ahead here")
    trace = read_route_columns(corpus / "route-trace/gemma.route.csv")
    twice = {c: a.copy() for c, a in trace.columns.items()}
    twice["expert"][1::7] = twice["expert"][::7][: len(twice["expert"][1::7])]
    cases = [route.select(trace, phase) for phase in ("decode", "prefill", "all")]
    cases.append(route.select(dataclasses.replace(trace, columns=twice), "all"))
    for selected in cases:
        seq, _ = route_cells.sequence_of(selected)
        fast = route._reuse(seq)
        with monkeypatch.context() as m:
            m.setattr(route_order.reuse_figures, "takes", lambda *args: False)
            slow = route._reuse(seq)
        assert list(fast) == list(slow)
        assert int(np.asarray(fast["n_reuse"]).sum()) > 0
        for name in fast:
            assert type(fast[name]) is type(slow[name]), name
            assert fast[name].tolist() == slow[name].tolist(), name
