"""The compiled CSV loop (:mod:`bmoe.formats.numeric_csv`) gives pyarrow's columns bit for bit
wherever it takes a file, stops on whatever it does not take, and the route reader then
gives what pyarrow gives (rows or error)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.errors import BmoeError
from bmoe.formats import csvtable, numeric_csv
from bmoe.formats.route import COLUMN_TYPES, NUMPY_TYPES, read_route_columns

HEADER = ["turn", "phase", "step", "layer", "slot", "expert", "weight", "residency"]


def by_pyarrow(text: bytes, header: list[str]) -> dict[str, np.ndarray] | str:
    """What pyarrow reads from `text` (rows under `header`, the header line first)."""
    try:
        table = pacsv.read_csv(
            pa.BufferReader(text),
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            convert_options=pacsv.ConvertOptions(
                column_types={c: COLUMN_TYPES[c] for c in header}, null_values=[],
                strings_can_be_null=False,
            ),
        )  # fmt: skip
    except pa.ArrowInvalid:
        return "invalid"
    return {c: table.column(c).to_numpy() for c in header}


def by_loop(text: bytes, header: list[str]) -> dict[str, np.ndarray] | None:
    layout = numeric_csv.Layout(header, NUMPY_TYPES, None)
    try:
        (block,) = numeric_csv.iter_blocks(text, 0, len(text), layout, len(text))
    except numeric_csv.Stopped:
        return None
    return block


def pyarrow_alone(source, start, end, layout, rows, header=True):
    """In place of numeric_csv.iter_blocks: take no row (pyarrow reads them all)."""
    raise numeric_csv.Stopped(start)
    yield


def assert_same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert list(ours) == list(theirs)
    for name, values in ours.items():
        assert values.dtype == theirs[name].dtype, name
        # bit for bit: -0.0 and NaN included
        assert values.tobytes() == theirs[name].tobytes(), name


def float_texts() -> st.SearchStrategy[str]:
    """Weights as writers spell them: %g of float32s, short decimals, exponents, nan."""
    f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
    return st.one_of(
        f32.map(lambda x: f"{x:g}"),
        f32.map(lambda x: f"{x:.9g}"),
        f32.map(lambda x: repr(float(x))),
        st.decimals(places=7, min_value=-10, max_value=10, allow_nan=False).map(str),
        st.integers(0, 10**15).map(lambda m: f"{m}e-{m % 30}"),
        st.sampled_from(["0", "-0", "0.5", ".5", "5.", "-.25", "1e5", "1E-05", "nan", "1e+3"]),
    )


row = st.tuples(
    st.integers(-(2**15), 2**15 - 1), st.integers(-128, 127), st.integers(0, 2**31 - 1),
    st.integers(0, 2**15 - 1), st.integers(0, 127), st.integers(-(2**15), 2**15 - 1),
    float_texts(), st.integers(0, 2),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(row, min_size=1, max_size=40), st.booleans())
def test_the_loop_gives_pyarrows_columns(rows, final_newline: bool) -> None:
    text = ",".join(HEADER) + "\n" + "\n".join(",".join(map(str, r)) for r in rows)
    data = (text + ("\n" if final_newline else "")).encode()
    ours, theirs = by_loop(data, HEADER), by_pyarrow(data, HEADER)
    if ours is not None:
        assert not isinstance(theirs, str)
        assert_same(ours, theirs)
    # every weight printed without an exponent in at most 11 characters is taken
    if all(len(r[6]) < 12 and "e" not in r[6] for r in rows):
        assert ours is not None, data


def test_near_float32_rounding_boundaries_stop_or_agree() -> None:
    """Decimals at and beside the midpoints between adjacent float32s, where rounding to
    float64 first could round the wrong way."""
    rng = np.random.default_rng(1)
    values = rng.random(2000).astype(np.float32)
    up = np.nextafter(values, np.float32(2))
    mid = (values.astype(np.float64) + up.astype(np.float64)) / 2
    texts = [f"{m:.17g}" for m in mid] + [f"{m:.15g}" for m in mid] + [f"{m:.9g}" for m in mid]
    data = ("weight\n" + "\n".join(texts) + "\n").encode()
    theirs = by_pyarrow(data, ["weight"])
    assert not isinstance(theirs, str)
    for i, text in enumerate(texts):  # one row at a time: one stop does not hide the rest
        ours = by_loop(f"weight\n{text}\n".encode(), ["weight"])
        if ours is not None:
            assert ours["weight"].tobytes() == theirs["weight"][i : i + 1].tobytes(), text


@pytest.mark.parametrize(
    "rows",
    [
        "0,1,5,0,0,3,0.5,1\r\n",  # CRLF
        '0,1,5,0,0,"3",0.5,1\n',  # quotes
        "0,1,5,0,0,3,0.5\n",  # a field short
        "0,1,5,0,0,3,0.5,1,9\n",  # a field more
        "0,1,5,0,0, 3,0.5,1\n",  # a blank
        "0,1,5,0,0,3,inf,1\n",  # inf
        "0,200,5,0,0,3,0.5,1\n",  # phase beyond int8
        "0,1,5,0,0,3,0.5,1\n\n",  # an empty line
        "0,1,5,0,0,+3,0.5,1\n",  # a sign pyarrow may read
        "0,1,99999999999,0,0,3,0.5,1\n",  # beyond int32
    ],
)
def test_what_the_loop_does_not_take_stops_it(rows: str) -> None:
    data = (",".join(HEADER) + "\n0,1,4,0,0,2,0.25,0\n" + rows).encode()
    assert by_loop(data, HEADER) is None
    # the rows up to the last newline and a last row without one are parsed by two loops
    if not rows.endswith("\n\n"):  # (without its last newline, an empty line is none)
        assert by_loop(data[:-1], HEADER) is None
    assert by_loop(data + b"0,1,6,0,0,2,0.25,0\n", HEADER) is None


@pytest.mark.parametrize(
    "rows",
    [
        "0,1,5,0,0,3,0.5,1\n",
        "-3,-128,2147483647,32767,127,-32768,-000.00012500,2\n",
        "0,1,5,0,0,3,0000012.5e-2,1\n",
        "0,1,5,0,0,3,0.1234567890123456,1\n",  # 16 significant digits: stops
        "0,1,5,0,0,3,0.000000000000001234567890123456,1\n",
        "0,1,5,0,0,3,0.0000000000012345,1\n0,1,5,0,0,3,0000000000000012345.5,1\n",
        "0,1,5,0,0,3,123456789012345,1\n",
        "0,1,5,0,0,3,1e22,1\n0,1,5,0,0,3,1e23,1\n",
        "0,1,5,0,0,3,nan,1\n0,1,5,0,0,3,na,1\n",
        "0,1,5,0,0,3,.,1\n",
        "0,1,5,0,0,3,-,1\n",
        "0,1,5,0,0,3,1e,1\n",
        "0,1,5,0,0,3,1e1234,1\n",
        "0,1,00000000005,0,0,3,0.5,1\n",  # 11 digits
        "0,1,0000000005,0,0,3,0.5,1\n",  # 10 digits
        "0,1,5,0,0,3,0.5,1,\n",
        "0,1,5,,0,3,0.5,1\n",
    ],
)
def test_both_loops_give_the_same_rows_stop_and_reason(rows: str) -> None:
    """The loop for rows that end with a newline (no end checks) and the one that checks
    every byte against the end: the same columns, rows, stop and reason on the same rows."""
    data = np.frombuffer(("0,1,4,0,0,2,0.25,0\n" + rows).encode(), dtype=np.uint8)
    layout = numeric_csv.Layout(HEADER, NUMPY_TYPES, None)
    got = []
    for loop in (numeric_csv.parse_rows, numeric_csv._rows_checked):
        outputs = layout.outputs(8)
        for out in outputs:
            out[:] = 0
        found = loop(data, 0, len(data), layout.kind, layout.slot, layout.lo, layout.hi,
                     *outputs, 0, 8, numeric_csv._POW10)  # fmt: skip
        got.append((tuple(int(x) for x in found), [o.tobytes() for o in outputs]))
    assert got[0] == got[1]


def write(path: Path, body: str) -> None:
    path.write_text(
        "# route_trace v1\n# model=m.gguf n_layer=2 n_expert=8 n_expert_used=2\n"
        "# layer=0 expert_bytes=100\n# layer=1 expert_bytes=100\n" + ",".join(HEADER) + "\n"
        + body, encoding="utf-8",
    )  # fmt: skip


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize(
    "damage",
    ["", "0,1,7,0,0,3,0.5,1\r\n", "0,1,7,0,0,x,0.5,1\n", "0,300,7,0,0,3,0.5,1\n"],
)
def test_the_reader_gives_pyarrows_rows_or_error(
    tmp_path: Path, monkeypatch, damage: str, large: bool
) -> None:
    """With the loop and without it (pyarrow alone), read whole or streamed from disk."""
    rng = np.random.default_rng(5)
    lines = [
        f"0,1,{s},{layer},{k},{rng.integers(0, 8)},{rng.random():g},{rng.integers(0, 3)}\n"
        for s in range(400) for layer in range(2) for k in range(2)
    ]  # fmt: skip
    path = tmp_path / "t.route.csv"
    write(path, "".join(lines[:700]) + damage + "".join(lines[700:]))
    if large:
        monkeypatch.setattr(csvtable, "STREAM_ABOVE", -1)
        monkeypatch.setattr(numeric_csv, "CHUNK", 4096)  # many chunks, rows across their ends

    def read():
        try:
            return read_route_columns(path).columns
        except BmoeError as exc:
            return str(exc)

    ours = read()
    with monkeypatch.context() as m:
        m.setattr(numeric_csv, "iter_blocks", pyarrow_alone)
        theirs = read()
    if isinstance(theirs, str):
        assert ours == theirs
    else:
        assert not isinstance(ours, str)
        assert_same(ours, theirs)


def test_file_blocks_cut_the_rows_into_blocks_of_the_size_asked(
    tmp_path: Path, monkeypatch
) -> None:
    lines = [f"0,1,{s},0,{k},{s % 8},0.5,1\n" for s in range(3000) for k in range(2)]
    path = tmp_path / "t.route.csv"
    write(path, "".join(lines))
    monkeypatch.setattr(numeric_csv, "CHUNK", 8192)
    sec = csvtable.load_sections(str(path), verify=False)
    start = path.read_bytes().index(b"turn,")
    layout = numeric_csv.Layout(HEADER, NUMPY_TYPES, {"step", "expert"})
    blocks = list(numeric_csv.iter_blocks(str(path), start, path.stat().st_size, layout, 700))
    assert [len(b["step"]) for b in blocks] == [700] * 8 + [400]
    assert list(blocks[0]) == ["step", "expert"]
    step = np.concatenate([b["step"] for b in blocks])
    np.testing.assert_array_equal(step, np.repeat(np.arange(3000), 2))
    assert sec.header == HEADER
