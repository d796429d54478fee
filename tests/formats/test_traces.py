"""Route, compute and io traces from the native engine: read, typed compactly, written back."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from bmoe.formats.op_traces import (
    read_compute_trace,
    read_io_trace,
    write_compute_trace,
    write_io_trace,
)
from bmoe.formats.route import read_route_trace, write_route_trace

CASES = [
    ("route-trace/gemma.route.csv", read_route_trace, write_route_trace),
    ("native-tiny/run.route.csv", read_route_trace, write_route_trace),
    ("native-tiny/drop.route.csv", read_route_trace, write_route_trace),
    ("native-tiny/ct.compute.csv", read_compute_trace, write_compute_trace),
    ("native-tiny/ctl.compute-layers.csv", read_compute_trace, write_compute_trace),
    ("native-tiny/pf.io.csv", read_io_trace, write_io_trace),
]


@pytest.mark.parametrize(("name", "reader", "writer"), CASES)
def test_round_trip_byte_for_byte(corpus: Path, name, reader, writer, read_mode: str) -> None:
    buf = io.StringIO()
    writer(reader(corpus / name), buf)
    assert buf.getvalue() == (corpus / name).read_text(encoding="utf-8")


def test_gemma_trace_without_dropped_column(corpus: Path) -> None:
    trace = read_route_trace(corpus / "route-trace/gemma.route.csv")
    assert "dropped" not in trace.rows and not trace.recorded_with_dropping
    assert trace.meta["n_expert_used"] == 6 and trace.meta["arch"] == "gemma4"
    sizes = trace.expert_bytes()
    assert len(sizes) == 30 and sizes[0] == 4336640 and sizes[7] == 3593216
    assert trace.rows["expert"].dtype == np.int16 and trace.rows["weight"].dtype == np.float32
    assert len(trace.rows) == 28260


def test_drop_trace_says_it_dropped(corpus: Path) -> None:
    trace = read_route_trace(corpus / "native-tiny/drop.route.csv")
    assert trace.recorded_with_dropping
    assert int(trace.rows["dropped"].sum()) > 0


def test_layer_granular_compute_trace(corpus: Path) -> None:
    assert read_compute_trace(corpus / "native-tiny/ctl.compute-layers.csv").layer_granular
    assert not read_compute_trace(corpus / "native-tiny/ct.compute.csv").layer_granular


def test_large_files_stream_from_disk(corpus: Path, read_mode: str) -> None:
    from bmoe.formats.csvtable import load_sections

    trace = load_sections(corpus / "route-trace/gemma.route.csv")
    assert trace.streamed() == (read_mode == "streamed")
    # a '#' line after the header (the metrics summary) needs the whole file
    assert not load_sections(corpus / "native-tiny/run.csv").streamed()
