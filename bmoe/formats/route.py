"""The routing trace (``route_trace v1``): one row per routed expert, sizes in the preamble."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bmoe.formats import kv
from bmoe.formats.csvtable import PathLike, check_int32, frame_or_empty, load_sections
from bmoe.formats.errors import FormatError

COLUMNS = (
    "turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes",
    "dropped",
)  # fmt: skip

COLUMN_TYPES: dict[str, pa.DataType] = {
    "turn": pa.int16(),
    "phase": pa.int8(),
    "step": pa.int32(),
    "layer": pa.int16(),
    "slot": pa.int8(),
    "expert": pa.int16(),
    "weight": pa.float32(),
    "residency": pa.int8(),
    "expert_bytes": pa.int32(),
    "dropped": pa.int8(),
}

REQUIRED = ("step", "layer", "expert")


@dataclass
class RouteTrace:
    """A routing trace: run facts, per-layer sizes and the routing rows."""

    path: str | None
    version: int
    meta: dict[str, Any]  # model, arch, n_layer, n_expert, n_expert_used, ... (typed)
    layers: pd.DataFrame  # one row per `# layer=` line: layer, expert_bytes, dense_bytes, ...
    rows: pd.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def n_expert_used(self) -> int | None:
        k = self.meta.get("n_expert_used")
        return int(k) if k is not None else None

    def expert_bytes(self) -> dict[int, int]:
        """Bytes of one expert per MoE layer, from the preamble (absent layers are absent)."""
        if "expert_bytes" not in self.layers:
            return {}
        sizes = self.layers.dropna(subset=["expert_bytes"])
        return dict(zip(sizes["layer"].astype(int), sizes["expert_bytes"].astype(int), strict=True))

    def dense_bytes(self) -> dict[int, int]:
        if "dense_bytes" not in self.layers:
            return {}
        sizes = self.layers.dropna(subset=["dense_bytes"])
        return dict(zip(sizes["layer"].astype(int), sizes["dense_bytes"].astype(int), strict=True))

    @property
    def recorded_with_dropping(self) -> bool:
        return "dropped" in self.rows and bool((self.rows["dropped"] != 0).any())


def _parse_preamble(sec) -> tuple[int, dict[str, Any], pd.DataFrame]:
    version = 0
    meta: dict[str, Any] = {}
    layer_rows: list[dict[str, Any]] = []
    for line, text in sec.preamble():
        if text.startswith("route_trace"):
            parts = text.split()
            if len(parts) > 1 and parts[1].startswith("v") and parts[1][1:].isdigit():
                version = int(parts[1][1:])
            continue
        values = kv.parse_checked(text, sec.path, line)
        if "layer" in values:
            if not isinstance(values["layer"], int):
                raise FormatError(sec.path, line, f"layer={values['layer']!r} is not an integer")
            layer_rows.append(values)
        else:
            meta.update(values)
    layers = pd.DataFrame(layer_rows)
    if len(layers):
        layers = layers.sort_values("layer", kind="stable").reset_index(drop=True)
    else:
        layers = pd.DataFrame({"layer": pd.Series([], dtype="int64")})
    return version, meta, layers


def read_route_trace(source: PathLike | bytes) -> RouteTrace:
    """Read a route trace (CSV or its Parquet form)."""
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        return parquet.read_route_parquet(source)
    sec = load_sections(source, verify=False)
    version, meta, layers = _parse_preamble(sec)
    rows = frame_or_empty(sec, COLUMN_TYPES, REQUIRED)
    check_int32(sec, rows, ("turn", "phase", "step", "layer", "slot", "expert"))
    return RouteTrace(sec.path, version, meta, layers, rows, sec.warnings)


# ----------------------------------------------------------------------------- writing


def format_preamble(meta: Mapping[str, Any], layers: pd.DataFrame | None) -> list[str]:
    lines = ["# route_trace v1", "# " + kv.format_tokens(dict(meta))]
    if layers is not None:
        for rec in layers.to_dict("records"):
            clean = {k: _plain(v) for k, v in rec.items() if not _missing(v)}
            lines.append("# " + kv.format_tokens(clean))
    return lines


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _plain(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        f = float(v)
        return int(f) if f.is_integer() else f
    return v


def format_rows(rows: pd.DataFrame) -> str:
    """CSV text of trace rows: integers as written, floats as printf ``%g`` (``nan`` kept).

    Each column becomes an Arrow string array and the rows are joined by Arrow, so the cost
    per row is a few hundred nanoseconds, almost all of it the ``%g`` of float columns.
    """
    if not len(rows):
        return ""
    columns = []
    for col in rows.columns:
        series = rows[col]
        if pd.api.types.is_float_dtype(series):
            values = series.to_numpy(np.float64).tolist()
            text = pa.array([f"{v:g}" for v in values], pa.string())
        elif _is_int(series):
            text = pc.cast(pa.array(series.to_numpy(np.int64)), pa.string())
        else:
            text = pa.array(series.astype(str).tolist(), pa.string())
        columns.append(text)
    lines = pc.binary_join_element_wise(*columns, ",")
    whole = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    return pc.binary_join(whole, "\n")[0].as_py() + "\n"


def _is_int(series: pd.Series) -> bool:
    return pd.api.types.is_integer_dtype(series) or pd.api.types.is_bool_dtype(series)


class RouteTraceWriter:
    """Incremental writer: preamble first, then blocks of rows as the engine routes them."""

    def __init__(
        self,
        out: TextIO,
        meta: Mapping[str, Any],
        layers: pd.DataFrame | None,
        columns: tuple[str, ...] = COLUMNS,
    ):
        self.out = out
        self.columns = list(columns)
        for line in format_preamble(meta, layers):
            out.write(line + "\n")
        out.write(",".join(self.columns) + "\n")

    def rows(self, rows: pd.DataFrame) -> None:
        self.out.write(format_rows(rows[self.columns]))

    def flush(self) -> None:
        self.out.flush()


def write_route_trace(trace: RouteTrace, dest: PathLike | TextIO) -> None:
    if isinstance(dest, str | os.PathLike):
        with open(dest, "w", encoding="utf-8", newline="\n") as fh:
            write_route_trace(trace, fh)
        return
    writer = RouteTraceWriter(dest, trace.meta, trace.layers, tuple(trace.rows.columns))
    writer.rows(trace.rows)
