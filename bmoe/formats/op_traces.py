"""Decode traces: ``compute_trace v1`` (per graph node or per layer segment) and ``io_trace v1``
(per flash read; the embedded engine appends ``start_ns``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import pandas as pd
import pyarrow as pa

from bmoe.formats import kv
from bmoe.formats.csvtable import PathLike, check_int32, frame_or_empty, load_sections
from bmoe.formats.route import format_rows

COMPUTE_COLUMNS = ("turn", "phase", "step", "seq", "layer", "op", "name", "wall_ns", "majflt")
COMPUTE_TYPES: dict[str, pa.DataType] = {
    "turn": pa.int16(),
    "phase": pa.int8(),
    "step": pa.int32(),
    "seq": pa.int32(),
    "layer": pa.int16(),
    "op": pa.dictionary(pa.int32(), pa.string()),
    "name": pa.dictionary(pa.int32(), pa.string()),
    "wall_ns": pa.int64(),
    "majflt": pa.int32(),
}

IO_COLUMNS = (
    "turn", "phase", "step", "layer", "expert", "proj", "lane", "spec", "offset", "req_bytes",
    "read_bytes", "latency_ns",
)  # fmt: skip
IO_TYPES: dict[str, pa.DataType] = {
    "turn": pa.int16(),
    "phase": pa.int8(),
    "step": pa.int32(),
    "layer": pa.int16(),
    "expert": pa.int16(),
    "proj": pa.int8(),
    "lane": pa.int16(),
    "spec": pa.int8(),
    "offset": pa.int64(),
    "req_bytes": pa.int32(),
    "read_bytes": pa.int32(),
    "latency_ns": pa.int64(),
    "start_ns": pa.int64(),
}


#: Columns each reader requires, and the ids that must fit 32 bits.
COMPUTE_REQUIRED = ("step", "wall_ns")
COMPUTE_IDS = ("turn", "phase", "step", "seq", "layer")
IO_REQUIRED = ("step", "layer", "expert", "read_bytes", "latency_ns")
IO_IDS = ("turn", "phase", "step", "layer", "expert", "proj", "lane", "spec")


def compute_schema():
    """What the Parquet form of a compute trace must hold (:class:`~bmoe.formats.parquet.
    RowSchema`)."""
    from bmoe.formats.parquet import RowSchema

    return RowSchema(COMPUTE_TYPES, COMPUTE_REQUIRED, COMPUTE_IDS)


def io_schema():
    """What the Parquet form of an io trace must hold."""
    from bmoe.formats.parquet import RowSchema

    return RowSchema(IO_TYPES, IO_REQUIRED, IO_IDS)


@dataclass
class ComputeTrace:
    """Per-node (or per-layer-segment, ``op=LAYER``) decode timings."""

    path: str | None
    version: int
    meta: dict[str, Any]
    rows: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def layer_granular(self) -> bool:
        """Every row is a layer segment (``--compute-trace-layers``, ``op=LAYER``)."""
        rows = self.rows
        return len(rows) > 0 and "op" in rows and bool((rows["op"] == "LAYER").all())


@dataclass
class IoTrace:
    """One row per flash read the streamer issued."""

    path: str | None
    version: int
    meta: dict[str, Any]
    rows: pd.DataFrame
    warnings: list[str] = field(default_factory=list)


def _preamble(sec, tag: str) -> tuple[int, dict[str, Any]]:
    version = 0
    meta: dict[str, Any] = {}
    for line, text in sec.preamble():
        if text.startswith(tag):
            parts = text.split()
            if len(parts) > 1 and parts[1][1:].isdigit():
                version = int(parts[1][1:])
            continue
        meta.update(kv.parse_checked(text, sec.path, line))
    return version, meta


def read_compute_trace(source: PathLike | bytes) -> ComputeTrace:
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        p = parquet.read_parts(source, "compute", schema=compute_schema())
        return ComputeTrace(p.name, p.version, p.meta, p.rows, p.warnings)
    sec = load_sections(source, verify=False)
    version, meta = _preamble(sec, "compute_trace")
    rows = frame_or_empty(sec, COMPUTE_TYPES, COMPUTE_REQUIRED)
    check_int32(sec, rows, COMPUTE_IDS)
    return ComputeTrace(sec.path, version, meta, rows, sec.warnings)


def read_io_trace(source: PathLike | bytes) -> IoTrace:
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        p = parquet.read_parts(source, "io", schema=io_schema())
        return IoTrace(p.name, p.version, p.meta, p.rows, p.warnings)
    sec = load_sections(source, verify=False)
    version, meta = _preamble(sec, "io_trace")
    rows = frame_or_empty(sec, IO_TYPES, IO_REQUIRED)
    check_int32(sec, rows, IO_IDS)
    return IoTrace(sec.path, version, meta, rows, sec.warnings)


# ----------------------------------------------------------------------------- writing


class _TraceWriter:
    tag = ""

    def __init__(self, out: TextIO, meta: Mapping[str, Any], columns: tuple[str, ...]):
        self.out = out
        self.columns = list(columns)
        out.write(f"# {self.tag} v1\n")
        if meta:
            out.write("# " + kv.format_tokens(dict(meta)) + "\n")
        out.write(",".join(self.columns) + "\n")

    def rows(self, rows: pd.DataFrame) -> None:
        self.out.write(format_rows(rows[self.columns]))

    def flush(self) -> None:
        self.out.flush()


class ComputeTraceWriter(_TraceWriter):
    tag = "compute_trace"

    def __init__(self, out: TextIO, meta: Mapping[str, Any], columns=COMPUTE_COLUMNS):
        super().__init__(out, meta, columns)


class IoTraceWriter(_TraceWriter):
    tag = "io_trace"

    def __init__(self, out: TextIO, meta: Mapping[str, Any], columns=IO_COLUMNS):
        super().__init__(out, meta, columns)


def write_compute_trace(trace: ComputeTrace, dest: PathLike | TextIO) -> None:
    if isinstance(dest, str | os.PathLike):
        with open(dest, "w", encoding="utf-8", newline="\n") as fh:
            write_compute_trace(trace, fh)
        return
    ComputeTraceWriter(dest, trace.meta, tuple(trace.rows.columns)).rows(trace.rows)


def write_io_trace(trace: IoTrace, dest: PathLike | TextIO) -> None:
    if isinstance(dest, str | os.PathLike):
        with open(dest, "w", encoding="utf-8", newline="\n") as fh:
            write_io_trace(trace, fh)
        return
    IoTraceWriter(dest, trace.meta, tuple(trace.rows.columns)).rows(trace.rows)
