"""Property tests: read(write(x)) == x for every format the project writes."""

from __future__ import annotations

import io
import math
import os
import string

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmoe.formats import kv, protocol
from bmoe.formats.metrics import (
    COLUMN_TYPES,
    COLUMNS_V2,
    SUMMARY_PRECISION,
    MetricsRun,
    read_metrics,
    write_metrics,
)
from bmoe.formats.metrics_columns import BY_NAME, COLUMNS, native_columns
from bmoe.formats.op_traces import (
    COMPUTE_COLUMNS,
    COMPUTE_TYPES,
    IO_COLUMNS,
    IO_TYPES,
    ComputeTrace,
    IoTrace,
    read_compute_trace,
    read_io_trace,
    write_compute_trace,
    write_io_trace,
)
from bmoe.formats.route import COLUMN_TYPES as ROUTE_TYPES
from bmoe.formats.route import COLUMNS as ROUTE_COLUMNS
from bmoe.formats.route import RouteTrace, read_route_trace, write_route_trace
from bmoe.formats.sidecar import PRESSURE_KEYS, read_pressure, write_pressure

PROPS = settings(
    max_examples=int(os.environ.get("BMOE_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
WORD = st.text(string.ascii_letters + string.digits + "._/-", min_size=1, max_size=12)
NAME = st.text(string.ascii_letters + "_", min_size=1, max_size=10)


def decimal(digits: int, lo: int = -(10**6), hi: int = 10**7) -> st.SearchStrategy[float]:
    """Floats the engine can print exactly with `digits` decimals (k / 10**digits)."""
    return st.integers(lo, hi).map(lambda k: k / 10**digits)


#: floats printed as %g (six significant digits) that read back as the same float
SIGNIFICANT = st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: float(f"{x:g}"))


def int_range(kind) -> st.SearchStrategy[int]:
    width = kind.bit_width
    return st.integers(0, min(2 ** (width - 1) - 1, 2**40))


def _frame(columns: dict[str, list], types: dict) -> pd.DataFrame:
    return pd.DataFrame(
        {c: pd.Series(v, dtype=types[c].to_pandas_dtype()) for c, v in columns.items()}
    )


def _bytes_back(writer, obj) -> bytes:
    buf = io.StringIO()
    writer(obj, buf)
    return buf.getvalue().encode("utf-8")


# ----------------------------------------------------------------------------- metrics

PARAM_VALUES = {
    **{k: st.booleans() for k in ("chatml", "moe_stream", "overlap", "o_direct", "load_all")},
    **{k: WORD for k in ("model", "arch", "dense_weights", "spec")},
    **{k: st.integers(0, 10**9) for k in ("n_layer", "n_expert", "cache_mb", "seed", "threads")},
    **{k: decimal(2, 0, 99999) for k in ("temp", "top_p", "drop_cold_frac")},
}


@st.composite
def metrics_runs(draw) -> MetricsRun:
    version = draw(st.sampled_from([0, 1, 2]))
    if version == 0:
        columns = COLUMNS_V2[: draw(st.integers(7, 12))]
        params: dict = {}
    else:  # the native header, and perhaps the embedded engine's own columns of the version
        own = [c.name for c in COLUMNS if not c.native and c.since <= version]
        columns = native_columns(version) + (own if draw(st.booleans()) else [])
        keys = draw(st.lists(st.sampled_from(sorted(PARAM_VALUES)), unique=True, max_size=8))
        params = {"engine": draw(WORD)} if version == 2 else {}
        params |= {k: draw(PARAM_VALUES[k]) for k in keys}
    n = draw(st.integers(0, 12))
    turns = sorted(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    data: dict[str, list] = {}
    for col in columns:
        spec = BY_NAME[col]
        if col == "turn":
            data[col] = turns
        elif spec.is_int:
            values = int_range(COLUMN_TYPES[col])
            data[col] = draw(st.lists(values, min_size=n, max_size=n))
        else:
            values = decimal(spec.digits) if spec.digits is not None else SIGNIFICANT
            data[col] = draw(st.lists(values, min_size=n, max_size=n))
    rows = _frame(data, COLUMN_TYPES)
    multi_turn = "turn" in rows and len(set(turns)) > 1
    n_summaries = len(set(turns)) if multi_turn else draw(st.integers(0, 1))
    summary_keys = sorted(SUMMARY_PRECISION)
    summaries = []
    for _ in range(n_summaries):
        chosen = draw(st.lists(st.sampled_from(summary_keys), unique=True, max_size=6))
        summary = {"tokens": draw(st.integers(0, 10**6))}
        summary |= {k: draw(decimal(SUMMARY_PRECISION[k])) for k in chosen}
        summary["evictions"] = draw(st.integers(0, 10**6))
        summaries.append(summary)
    return MetricsRun(None, version, params, rows, summaries)


@PROPS
@given(run=metrics_runs())
def test_metrics_round_trip(run: MetricsRun) -> None:
    back = read_metrics(_bytes_back(write_metrics, run))
    assert back.version == run.version
    assert back.params == run.params
    assert back.summaries == run.summaries
    pd.testing.assert_frame_equal(back.rows, run.rows)


# ----------------------------------------------------------------------------- traces

SIX_DIGITS = st.one_of(
    st.integers(0, 999999).map(lambda k: float(np.float32(float(f"{k / 1e6:.6g}")))),
    st.just(math.nan),
)


@st.composite
def route_traces(draw) -> RouteTrace:
    columns = ROUTE_COLUMNS if draw(st.booleans()) else ROUTE_COLUMNS[:-1]
    n = draw(st.integers(0, 15))
    data = {
        c: draw(
            st.lists(
                SIX_DIGITS if c == "weight" else int_range(ROUTE_TYPES[c]), min_size=n, max_size=n
            )
        )
        for c in columns
    }
    meta = {"model": draw(WORD), "arch": draw(WORD), "n_layer": draw(st.integers(1, 99))}
    meta["n_expert_used"] = draw(st.integers(1, 16))
    layer_ids = draw(st.lists(st.integers(0, 60), unique=True, max_size=5))
    layers = pd.DataFrame(
        {
            "layer": pd.Series(sorted(layer_ids), dtype="int64"),
            "expert_bytes": pd.Series(
                draw(
                    st.lists(
                        st.integers(1, 2**40), min_size=len(layer_ids), max_size=len(layer_ids)
                    )
                ),
                dtype="int64",
            ),
        }
    )
    if not layer_ids:
        layers = pd.DataFrame({"layer": pd.Series([], dtype="int64")})
    return RouteTrace(None, 1, meta, layers, _frame(data, ROUTE_TYPES))


@PROPS
@given(trace=route_traces())
def test_route_round_trip(trace: RouteTrace) -> None:
    back = read_route_trace(_bytes_back(write_route_trace, trace))
    assert back.meta == trace.meta and back.version == 1
    pd.testing.assert_frame_equal(back.layers, trace.layers)
    pd.testing.assert_frame_equal(back.rows, trace.rows)


@st.composite
def compute_traces(draw) -> ComputeTrace:
    n = draw(st.integers(1, 15))
    data: dict[str, list] = {}
    for col in COMPUTE_COLUMNS:
        if col in ("op", "name"):
            alphabet = (
                string.ascii_uppercase + "_" if col == "op" else string.ascii_lowercase + ".-"
            )
            words = st.text(alphabet, min_size=1, max_size=10)
            data[col] = draw(st.lists(words, min_size=n, max_size=n))
        else:
            data[col] = draw(st.lists(int_range(COMPUTE_TYPES[col]), min_size=n, max_size=n))
    frame = pd.DataFrame(data).astype(
        {c: COMPUTE_TYPES[c].to_pandas_dtype() for c in COMPUTE_COLUMNS if c not in ("op", "name")}
    )
    frame[["op", "name"]] = frame[["op", "name"]].astype("category")
    meta = {"model": draw(WORD), "n_threads": draw(st.integers(1, 64))}
    return ComputeTrace(None, 1, meta, frame)


@PROPS
@given(trace=compute_traces())
def test_compute_round_trip(trace: ComputeTrace) -> None:
    back = read_compute_trace(_bytes_back(write_compute_trace, trace))
    assert back.meta == trace.meta
    pd.testing.assert_frame_equal(back.rows, trace.rows, check_categorical=False)


@st.composite
def io_traces(draw) -> IoTrace:
    n = draw(st.integers(0, 15))
    data = {c: draw(st.lists(int_range(IO_TYPES[c]), min_size=n, max_size=n)) for c in IO_COLUMNS}
    return IoTrace(None, 1, {"io_threads": draw(st.integers(1, 8))}, _frame(data, IO_TYPES))


@PROPS
@given(trace=io_traces())
def test_io_round_trip(trace: IoTrace) -> None:
    back = read_io_trace(_bytes_back(write_io_trace, trace))
    assert back.meta == trace.meta
    pd.testing.assert_frame_equal(back.rows, trace.rows)


# ----------------------------------------------------------------------------- protocol

TEXT = st.one_of(
    st.text(max_size=20),
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
JSON_VALUES = st.one_of(
    st.integers(-(2**53), 2**53),
    st.booleans(),
    st.none(),
    TEXT,
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
)


def key_values(spec: protocol.Key) -> st.SearchStrategy:
    if spec.kind is bool:
        return st.booleans()
    if spec.kind is int:
        return st.integers(-(2**31), 2**53)
    if spec.kind is float:
        return decimal(spec.digits or 0)
    if spec.kind is str:
        return TEXT
    return st.lists(st.one_of(st.none(), decimal(4)), max_size=4)


@st.composite
def events(draw) -> tuple[str, dict]:
    tag = draw(st.sampled_from([*protocol.TAGS, "SOMETHING_NEW"]))
    specs = protocol.EVENT_TYPES[tag].keys() if tag in protocol.EVENT_TYPES else {}
    keys = draw(st.permutations(sorted(specs)))[: draw(st.integers(0, len(specs)))]
    data = {k: draw(key_values(specs[k])) for k in keys}
    extra = draw(st.dictionaries(NAME.filter(lambda k: k not in specs), JSON_VALUES, max_size=3))
    return tag, data | extra


@PROPS
@given(event=events())
def test_protocol_event_round_trip(event: tuple[str, dict]) -> None:
    tag, data = event
    line = protocol.format_event(tag, data)
    back = protocol.parse_line(protocol.to_bytes(line) + b"\n")
    assert back is not None and back.tag == tag
    assert back.data == data
    assert [type(v) for v in back.data.values()] == [type(v) for v in data.values()]
    assert protocol.format_event(back) == line


@st.composite
def run_figures(draw) -> dict:
    figures: dict = {}
    src = draw(st.sampled_from(["mtp", "ngram"]))
    spaced = st.text(string.ascii_lowercase + " ", min_size=1, max_size=16).map(str.strip)
    for name, shapes in protocol.RUN_LINES:
        if not draw(st.booleans()):
            continue
        usable = [s for s in shapes if s.const.get("spec", src) == src]
        shape = draw(st.sampled_from(usable))
        for key, kind in shape.fields():
            if key in figures:
                continue
            if kind == "d":
                figures[key] = draw(st.integers(0, 10**9))
            elif kind == "s":
                figures[key] = draw(spaced.filter(bool) if name == "mode" else WORD)
            else:
                figures[key] = draw(decimal(int(kind[1:-1]), 0))
        figures |= shape.const
    return figures


@PROPS
@given(figures=run_figures())
def test_run_lines_round_trip(figures: dict) -> None:
    lines = protocol.format_run_lines(figures)
    back = protocol.parse_run_lines("\n".join(lines))
    expected = {k: v for k, v in figures.items() if not (k == "overlap" and v is False)}
    assert {k: v for k, v in back.items() if not (k == "overlap" and v is False)} == expected
    assert protocol.format_run_lines(back) == lines


# ----------------------------------------------------------------------------- sidecar


@PROPS
@given(
    values=st.dictionaries(
        st.one_of(st.sampled_from(PRESSURE_KEYS), NAME.map(lambda k: k + "_kb")),
        st.integers(-(10**12), 10**12),
    )
)
def test_pressure_sidecar_round_trip(values: dict) -> None:
    buf = io.StringIO()
    write_pressure(values, buf)
    assert read_pressure(buf.getvalue().encode()) == values
    assert kv.parse_tokens(" ".join(buf.getvalue().split())) == values
