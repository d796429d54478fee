"""The block-by-block replay gives the whole-trace views exactly, for every policy (belady in
a second pass) and for the exact LRU curve, whatever the blocks; it refuses rows out of the
engine's order."""

from __future__ import annotations

import itertools
from pathlib import Path

import hypothesis.strategies as st
import pandas as pd
import pytest
from hypothesis import given, settings

from bmoe.analyze import replay as rp
from bmoe.analyze.replay_stream import stream_replay
from bmoe.cache import POLICIES
from bmoe.errors import BmoeError
from bmoe.formats.route import iter_route_rows, read_route_preamble, read_route_trace
from tests.analyze.test_replay import make_trace

MIB = 1 << 20
ALL = tuple(POLICIES)
SIZES = {0: MIB, 1: 2 * MIB, 2: 3 * MIB}


def blocks_of(rows: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    return [rows.iloc[i : i + n] for i in range(0, len(rows), n)]


def cut_at(rows: pd.DataFrame, lengths: list[int]) -> list[pd.DataFrame]:
    """`rows` in blocks of the `lengths`, taken in turn until the rows run out."""
    out, at = [], 0
    for n in itertools.cycle(lengths):
        if at >= len(rows):
            return out
        out.append(rows.iloc[at : at + n])
        at += n
    return out


def whole_views(trace, budgets, policies, seed=0) -> dict[str, pd.DataFrame]:
    """What ``rp.replay`` gives for the curve and the exact LRU curve."""
    budgets = rp.check_budgets(budgets)
    batches = rp.prepare_batches(trace)
    dist = rp.lru_stack_distances(batches)
    return {
        "shape": rp.model_shape(trace, batches),
        "curve": rp.replay_curve(batches, budgets, policies, seed=seed, jobs=1),
        "mrc_budgets": rp.mrc_at(dist, budgets),
        "mrc": rp.lru_mrc(dist),
    }


def assert_same_views(streamed, whole) -> None:
    assert set(streamed) == set(whole)
    for name in whole:
        if isinstance(whole[name], dict):  # NaN where a figure has nothing to count
            assert pd.Series(streamed[name]).equals(pd.Series(whole[name])), name
        else:
            pd.testing.assert_frame_equal(streamed[name], whole[name], obj=name)


experts = st.lists(st.integers(0, 7), min_size=1, max_size=4)  # repeats allowed
token = st.lists(experts, min_size=1, max_size=3)  # layers 0.. in order
turns = st.lists(
    st.tuples(st.lists(token, max_size=3), st.lists(token, min_size=1, max_size=12)),
    min_size=1,
    max_size=3,
)


def engine_cells(turn_list) -> list[tuple]:
    """(turn, phase, step, layer, experts) in the order the engine writes them."""
    cells = []
    for t, (prefill, decode) in enumerate(turn_list):
        for s, per_layer in enumerate(prefill):
            cells += [(t, 0, s, layer, ex) for layer, ex in enumerate(per_layer)]
        for s, per_layer in enumerate(decode, start=len(prefill)):
            cells += [(t, 1, s, layer, ex) for layer, ex in enumerate(per_layer)]
    return cells


@settings(max_examples=60, deadline=None)
@given(turns, st.lists(st.integers(1, 25), min_size=1, max_size=4), st.integers(0, 3))
def test_random_traces_in_random_blocks_replay_as_a_whole(turn_list, lengths, seed) -> None:
    """Every streamable policy at budgets from none to all, and the exact LRU curve."""
    trace = make_trace(engine_cells(turn_list), sizes=SIZES, n_layer=3)
    budgets = [0, 1, 2.5, 4, 7, 12, 40]
    streamed = stream_replay(
        trace, cut_at(trace.rows, lengths), budgets, ALL, mrc=True, seed=seed, jobs=1
    )
    assert_same_views(streamed, whole_views(trace, budgets, ALL, seed))


@pytest.mark.parametrize("block", [997, 1 << 30])
def test_gemma_in_blocks_is_the_whole_replay(corpus: Path, block: int) -> None:
    trace = read_route_trace(corpus / "route-trace/gemma.route.csv")
    budgets = rp.default_budgets(trace)
    whole = whole_views(trace, budgets, ALL)
    streamed = stream_replay(trace, blocks_of(trace.rows, block), budgets, ALL, mrc=True, jobs=2)
    assert_same_views(streamed, whole)
    curve = whole["curve"]
    assert curve["hit_pct_cum"].max() > 50  # the budgets reach the reuse
    at = curve[curve["budget_mib"] == budgets[len(budgets) // 2]]
    assert at["hit_pct_cum"].nunique() > 3  # and the policies differ there


def test_turns_and_repeats_in_blocks_of_every_length() -> None:
    cells = [
        (0, 0, 0, 0, [1, 2]), (0, 0, 1, 0, [2, 3]), (0, 0, 0, 1, [4]), (0, 0, 1, 1, [4, 5]),
        (0, 1, 2, 0, [1, 1]), (0, 1, 2, 1, [5, 6]), (0, 1, 3, 0, [3, 2]), (0, 1, 3, 1, [6]),
        (1, 0, 0, 0, [7, 1]), (1, 0, 0, 1, [6]), (1, 1, 1, 0, [2, 7]), (1, 1, 1, 1, [4, 4]),
    ]  # fmt: skip
    trace = make_trace(cells, k=2)
    budgets = [0, 1, 2, 3, 5, 8]
    whole = whole_views(trace, budgets, ALL)
    for n in range(1, len(trace.rows) + 1):
        streamed = stream_replay(trace, blocks_of(trace.rows, n), budgets, ALL, mrc=True, jobs=1)
        assert_same_views(streamed, whole)


def test_ids_beyond_n_expert_are_replayed_and_warned_about_once() -> None:
    cells = [(0, 1, s, s % 2, [s % 5, 3 * s % 23]) for s in range(40)]
    trace = make_trace(cells, sizes={0: MIB, 1: 2 * MIB}, n_layer=2)  # n_expert=8
    budgets = [1, 4, 9]
    with pytest.warns(UserWarning, match="outside 0..7") as caught:
        streamed = stream_replay(trace, blocks_of(trace.rows, 7), budgets, ALL, mrc=True, jobs=1)
    assert len(caught) == 1
    assert_same_views(streamed, whole_views(trace, budgets, ALL))


def test_blocks_read_from_the_file(corpus: Path) -> None:
    path = corpus / "native-tiny/pf.route.csv"
    budgets = [1, 2, 4]
    whole = rp.replay_curve(read_route_trace(path), budgets, ["lru", "arc"], jobs=1)
    streamed = stream_replay(
        read_route_preamble(path), iter_route_rows(path, 64), budgets, ["lru", "arc"]
    )
    pd.testing.assert_frame_equal(streamed["curve"], whole)


def test_belady_alone_leaves_no_spill_behind(tmp_path, monkeypatch) -> None:
    import tempfile

    from bmoe.analyze import replay_stream
    from bmoe.formats.spill import SpillFolder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spilled = []
    add = replay_stream._Spill.add

    def recorded(spill, chunk) -> None:
        add(spill, chunk)
        spilled.append(sum(f.stat().st_size for f in Path(spill.store.where).iterdir()))

    monkeypatch.setattr(replay_stream._Spill, "add", recorded)
    cells = [(0, 1, s, s % 2, [s % 5, 3 * s % 7]) for s in range(30)]
    trace = make_trace(cells, sizes={0: MIB, 1: 2 * MIB}, n_layer=2)
    with SpillFolder() as spill:
        streamed = stream_replay(trace, blocks_of(trace.rows, 5), [2, 8], ["belady"], spill=spill)
    whole = rp.replay_curve(trace, [2, 8], ["belady"], jobs=1)
    pd.testing.assert_frame_equal(streamed["curve"], whole)
    assert whole["hit_pct_cum"].iloc[-1] > whole["hit_pct_cum"].iloc[0]
    assert len(spilled) > 3 and spilled[-1] > spilled[0] > 0  # on disk under tmp_path
    assert not list(tmp_path.iterdir())  # and gone


def test_rows_out_of_order_are_errors() -> None:
    trace = make_trace([(0, 1, 1, 0, [1]), (0, 1, 2, 0, [2]), (0, 1, 3, 0, [1])])
    rows = trace.rows
    shuffled = [rows.iloc[[1]], rows.iloc[[0]], rows.iloc[[2]]]
    with pytest.raises(BmoeError, match="out of the engine's order"):
        stream_replay(trace, shuffled, [1])
    with pytest.raises(BmoeError, match="no routing rows"):
        stream_replay(trace, [rows.iloc[:0]], [1])


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_blocks_of_either_form_are_the_rows_of_the_columns_asked(corpus: Path, tmp_path, form):
    from bmoe.formats.parquet import write_table

    path = corpus / "route-trace/gemma.route.csv"
    if form == "parquet":
        path = write_table(read_route_trace(path), "route", tmp_path / "g.route.parquet")
    wanted = rp.REPLAY_COLUMNS
    blocks = list(iter_route_rows(path, 5000, wanted))
    if form == "parquet":  # a CSV is read in blocks of bytes (1 MiB here: one block)
        assert len(blocks) > 3
    whole = read_route_trace(path, wanted).rows
    pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), whole)
    preamble = read_route_preamble(path)
    assert preamble.expert_bytes() == read_route_trace(path).expert_bytes()
    assert preamble.meta == read_route_trace(path).meta and not len(preamble.rows)
