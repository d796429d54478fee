"""The route reader's batch-by-batch path for large files gives exactly what the careful path
gives, and hands anything unusual to it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.errors import BmoeError
from bmoe.formats import csvtable
from bmoe.formats import route as route_format
from bmoe.formats.route import COLUMNS, RouteTraceWriter, read_route_trace

META = {"model": "m.gguf", "arch": "qwen3moe", "n_layer": 3, "n_expert": 16, "n_expert_used": 2}


def write_trace(path: Path, steps: int = 900, columns: tuple[str, ...] = COLUMNS) -> None:
    rng = np.random.default_rng(7)
    n = steps * 3 * 2
    rows = pd.DataFrame(
        {
            "turn": 0,
            "phase": (np.arange(n) >= 60).astype(np.int8),
            "step": np.repeat(np.arange(steps), 6),
            "layer": np.tile(np.repeat(np.arange(3), 2), steps),
            "slot": np.tile([0, 1], 3 * steps),
            "expert": rng.integers(0, 16, n),
            "weight": rng.random(n).round(4),
            "residency": rng.integers(0, 3, n),
            "expert_bytes": rng.integers(0, 2**20, n),
            "dropped": 0,
        }
    )
    rows.loc[5, "weight"] = np.nan
    layers = pd.DataFrame({"layer": [0, 1, 2], "expert_bytes": 1 << 20})
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        RouteTraceWriter(fh, META, layers, columns).rows(rows[list(columns)])


def read_both(path: Path, monkeypatch) -> tuple:
    """(careful read, read with every file streamed from disk), or the errors they raise."""

    def attempt():
        try:
            return read_route_trace(path)
        except BmoeError as exc:
            return str(exc)

    careful = attempt()
    with monkeypatch.context() as m:
        m.setattr(csvtable, "STREAM_ABOVE", -1)
        streamed = attempt()
    return careful, streamed


def test_streamed_rows_equal_the_careful_read(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "t.route.csv"
    write_trace(path)
    calls = []
    real = route_format._stream_columns
    monkeypatch.setattr(route_format, "_stream_columns", lambda *a: calls.append(1) or real(*a))
    careful, streamed = read_both(path, monkeypatch)
    assert calls == [1, 1]  # the second read took the batch path ...
    assert len(streamed.rows) == 900 * 6
    pd.testing.assert_frame_equal(streamed.rows, careful.rows)  # ... to the same frame
    assert streamed.meta == careful.meta


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text.replace("\n0,1,300,1,0,", "\n0,1,300,x,0,", 1),  # not a number
        lambda text: text.replace("\n0,1,300,1,0,", "\n0,1,70000,1,0,", 1),  # too wide: widened
        lambda text: text + "0,1,5\n",  # a short row
    ],
)
def test_rows_that_do_not_parse_take_the_careful_path(tmp_path: Path, monkeypatch, damage) -> None:
    path = tmp_path / "t.route.csv"
    write_trace(path)
    damaged = damage(path.read_text())
    assert damaged != path.read_text()
    path.write_text(damaged)
    careful, streamed = read_both(path, monkeypatch)
    if isinstance(careful, str):
        assert streamed == careful
    else:
        pd.testing.assert_frame_equal(streamed.rows, careful.rows)


def test_unknown_and_missing_columns_take_the_careful_path(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "t.route.csv"
    write_trace(path, columns=("step", "layer", "slot", "expert", "weight"))
    text = path.read_text().replace("step,layer,", "step,layer_x,", 1)
    for content in (path.read_text(), text):
        path.write_text(content)
        careful, streamed = read_both(path, monkeypatch)
        if isinstance(careful, str):
            assert streamed == careful
        else:
            pd.testing.assert_frame_equal(streamed.rows, careful.rows)


def test_validate_in_engine_order_agrees_with_the_general_checks(tmp_path: Path) -> None:
    """The one-pass order checks (a trace as engines write it) find what the general ones
    find: a repeated row, a cell of the wrong size; a step going back is out of order."""
    from bmoe.formats.validate import validate_file

    path = tmp_path / "t.route.csv"
    write_trace(path, steps=40)
    lines = path.read_text().splitlines(keepends=True)
    n_head = sum(ln.startswith("#") for ln in lines) + 1  # the preamble and the header
    head, body = lines[:n_head], lines[n_head:]
    damaged = [*body[:100], body[99], *body[100:150], *body[151:]]  # repeat a row, drop one
    path.write_text("".join(head + damaged))
    in_order = {(f.severity, f.message.split(" (")[0]) for f in validate_file(path)}
    shuffled = tmp_path / "s.route.csv"
    order = np.random.default_rng(1).permutation(len(damaged))
    shuffled.write_text("".join(head + [damaged[i] for i in order]))
    general = {(f.severity, f.message.split(" (")[0]) for f in validate_file(shuffled)}
    assert ("error", "(turn, phase, step, layer, slot) repeats an earlier row") in in_order
    assert any("do not hold n_expert_used=2 rows" in m for _, m in in_order)
    # the shuffled file also has steps going back, which the in-order one cannot have
    assert in_order == general - {("error", "step goes back within its turn, phase and layer")}


def test_rows_in_blocks_are_the_rows(tmp_path: Path, monkeypatch) -> None:
    from bmoe.formats.route import iter_route_rows, read_route_preamble

    path = tmp_path / "t.route.csv"
    write_trace(path)
    whole = read_route_trace(path).rows
    head = read_route_preamble(path)
    assert head.meta == META and head.expert_bytes() == {0: 1 << 20, 1: 1 << 20, 2: 1 << 20}
    assert not len(head.rows) and (head.rows.dtypes == whole.dtypes).all()
    monkeypatch.setattr(csvtable, "STREAM_ABOVE", -1)
    monkeypatch.setattr(csvtable, "BLOCK_SIZE", 4096)  # the CSV read options of every reader
    blocks = list(iter_route_rows(path, rows=1000))
    assert len(blocks) > 3
    pd.testing.assert_frame_equal(pd.concat(blocks, ignore_index=True), whole)
    # a number too wide for its column half-way: the blocks already given are not repeated
    text = path.read_text()
    path.write_text(
        text[: len(text) // 2] + text[len(text) // 2 :].replace(",1,0,", ",1,99999,", 1)
    )
    again = pd.concat(iter_route_rows(path, rows=1000), ignore_index=True)
    assert len(again) == len(whole)
    assert again["slot"].max() == 99999


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_reading_some_columns_gives_those_columns_of_the_whole_read(
    tmp_path: Path, read_mode: str, form: str
) -> None:
    from bmoe.analyze.replay import REPLAY_COLUMNS
    from bmoe.formats.load import write_parquet

    path = tmp_path / "t.route.csv"
    write_trace(path)
    if form == "parquet":
        path = write_parquet(read_route_trace(path), tmp_path / "t.route.parquet")
    whole = read_route_trace(path)
    some = read_route_trace(path, columns=[*REPLAY_COLUMNS, "not_a_column"])
    assert list(some.rows.columns) == [c for c in COLUMNS if c in REPLAY_COLUMNS]
    pd.testing.assert_frame_equal(some.rows, whole.rows[list(some.rows.columns)])
    assert some.meta == whole.meta
    pd.testing.assert_frame_equal(some.layers, whole.layers)


def test_streamed_read_of_some_columns_parses_only_those(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "t.route.csv"
    write_trace(path)
    monkeypatch.setattr(csvtable, "STREAM_ABOVE", -1)
    asked = []
    real = route_format._batches

    def spy(*args):
        asked.append(args[-1])
        return real(*args)

    monkeypatch.setattr(route_format, "_batches", spy)
    rows = read_route_trace(path, columns=("step", "layer", "expert")).rows
    assert asked == [["step", "layer", "expert"]]
    assert list(rows.columns) == ["step", "layer", "expert"]
