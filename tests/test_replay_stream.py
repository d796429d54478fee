"""The block-by-block LRU replay gives the whole-trace curve exactly, whatever the block
size, and refuses rows out of the engine's order."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import replay as rp
from bmoe.analyze.replay_stream import stream_lru_curve
from bmoe.errors import BmoeError
from bmoe.formats.route import iter_route_rows, read_route_preamble, read_route_trace
from tests.test_replay import make_trace


def blocks_of(rows: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    return [rows.iloc[i : i + n] for i in range(0, len(rows), n)]


@pytest.mark.parametrize("block", [97, 7777, 1 << 30])
def test_gemma_in_blocks_is_the_whole_curve(corpus: Path, block: int) -> None:
    trace = read_route_trace(corpus / "route-trace/gemma.route.csv")
    budgets = rp.default_budgets(trace)
    whole = rp.replay_curve(trace, budgets, ["lru"], jobs=1)
    streamed = stream_lru_curve(trace, blocks_of(trace.rows, block), budgets)
    pd.testing.assert_frame_equal(streamed, whole)
    assert whole["hit_pct_cum"].max() > 50  # the budgets reach the reuse


def test_turns_and_repeats_in_blocks(tmp_path: Path) -> None:
    cells = [
        (0, 0, 0, 0, [1, 2]), (0, 0, 1, 0, [2, 3]), (0, 0, 0, 1, [4]), (0, 0, 1, 1, [4, 5]),
        (0, 1, 2, 0, [1, 1]), (0, 1, 2, 1, [5, 6]), (0, 1, 3, 0, [3, 2]), (0, 1, 3, 1, [6]),
        (1, 0, 0, 0, [7, 1]), (1, 0, 0, 1, [6]), (1, 1, 1, 0, [2, 7]), (1, 1, 1, 1, [4, 4]),
    ]  # fmt: skip
    trace = make_trace(cells, k=2)
    budgets = [0, 1, 2, 3, 5, 8]
    whole = rp.replay_curve(trace, budgets, ["lru"], jobs=1)
    for n in range(1, len(trace.rows) + 1):
        pd.testing.assert_frame_equal(
            stream_lru_curve(trace, blocks_of(trace.rows, n), budgets), whole
        )


def test_blocks_read_from_the_file(corpus: Path) -> None:
    path = corpus / "native-tiny/pf.route.csv"
    whole = rp.replay_curve(read_route_trace(path), [1, 2, 4], ["lru"], jobs=1)
    streamed = stream_lru_curve(read_route_preamble(path), iter_route_rows(path, 64), [1, 2, 4])
    pd.testing.assert_frame_equal(streamed, whole)


def test_rows_out_of_order_are_an_error() -> None:
    trace = make_trace([(0, 1, 1, 0, [1]), (0, 1, 2, 0, [2]), (0, 1, 3, 0, [1])])
    rows = trace.rows
    shuffled = [rows.iloc[[1]], rows.iloc[[0]], rows.iloc[[2]]]
    with pytest.raises(BmoeError, match="out of the engine's order"):
        stream_lru_curve(trace, shuffled, [1])
    with pytest.raises(BmoeError, match="no routing rows"):
        stream_lru_curve(trace, [rows.iloc[:0]], [1])
