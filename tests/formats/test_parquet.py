"""Parquet round trip: preamble and summaries in the schema metadata, equal objects back."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bmoe.formats.convert import convert_file, output_path
from bmoe.formats.errors import FormatError
from bmoe.formats.load import load_file, read_parquet, write_parquet
from bmoe.formats.metrics import read_metrics, write_metrics
from bmoe.formats.op_traces import (
    read_compute_trace,
    read_io_trace,
    write_compute_trace,
    write_io_trace,
)
from bmoe.formats.route import read_route_trace, write_route_trace

CASES = [
    ("native-tiny/sess.csv", read_metrics, write_metrics),
    ("metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv", read_metrics, write_metrics),
    ("metrics/2026-07-12/qwen_mmap.csv", read_metrics, write_metrics),
    ("route-trace/gemma.route.csv", read_route_trace, write_route_trace),
    ("native-tiny/drop.route.csv", read_route_trace, write_route_trace),
    ("native-tiny/ct.compute.csv", read_compute_trace, write_compute_trace),
    ("native-tiny/ctl.compute-layers.csv", read_compute_trace, write_compute_trace),
    ("native-tiny/run.io.csv", read_io_trace, write_io_trace),
]


def _same(a, b) -> None:
    assert type(a) is type(b) and a.version == b.version
    for name in ("params", "summaries", "meta", "warnings"):
        if hasattr(a, name):
            assert getattr(a, name) == getattr(b, name), name
    if hasattr(a, "layers"):
        pd.testing.assert_frame_equal(a.layers, b.layers)
    pd.testing.assert_frame_equal(a.rows, b.rows)


@pytest.mark.parametrize(("name", "reader", "writer"), CASES)
def test_readers_accept_parquet_and_give_the_same_object(
    corpus: Path, tmp_path: Path, name: str, reader, writer
) -> None:
    original = reader(corpus / name)
    dest = write_parquet(original, tmp_path / "x.parquet")
    back = reader(dest)
    _same(original, back)
    _same(original, load_file(dest))
    text = io.StringIO()
    writer(back, text)
    assert text.getvalue() == (corpus / name).read_text(encoding="utf-8")


def test_metadata_is_readable_without_bmoe(corpus: Path, tmp_path: Path) -> None:
    run = read_metrics(corpus / "metrics/2026-07-22-drop-cold-experts/bmoe-20260722-142300.csv")
    meta = pq.read_schema(write_parquet(run, tmp_path / "d.parquet")).metadata
    assert meta[b"bmoe.kind"] == b"metrics" and meta[b"bmoe.version"] == b"1"
    assert b'"experts_dropped": 66582' in meta[b"bmoe.summaries"]
    assert b'"drop_cold_frac": 0.75' in meta[b"bmoe.meta"]


def test_wrong_kind_foreign_and_corrupt_parquet(corpus: Path, tmp_path: Path) -> None:
    dest = write_parquet(read_metrics(corpus / "native-tiny/run.csv"), tmp_path / "m.parquet")
    with pytest.raises(FormatError, match="holds a metrics file, not a route file"):
        read_route_trace(dest)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), foreign)
    with pytest.raises(FormatError, match="without bmoe metadata"):
        read_parquet(foreign)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + b"\x00garbage" * 10)
    with pytest.raises(FormatError, match="unreadable Parquet"):
        load_file(corrupt)


def test_convert_there_and_back(corpus: Path, tmp_path: Path) -> None:
    src = corpus / "native-tiny/pf.route.csv"
    assert output_path(src, "parquet") == src.parent / "pf.route.parquet"
    parquet = convert_file(src, "parquet", tmp_path)
    assert parquet == tmp_path / "pf.route.parquet"
    csv = convert_file(parquet, "csv", tmp_path / "back")
    assert csv.read_bytes() == src.read_bytes()
    with pytest.raises(FormatError, match="already parquet"):
        convert_file(parquet, "parquet")
    with pytest.raises(FormatError, match="only metrics CSVs and route/compute/io traces"):
        convert_file(corpus / "native-tiny/run.out", "parquet", tmp_path)
