"""The per-token metrics CSV (``bmoe_metrics`` v0, v1, v2): reader and writer.

v0 has no preamble (8, 9 or 11 columns), v1 starts ``# bmoe_metrics v1`` (about 22
columns), v2 adds ``# engine=`` and the speculation / route-ahead columns (29). Every column is
read by name and optional. A session CSV carries one ``# summary`` trailer per turn.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import pandas as pd
import pyarrow as pa

from bmoe.formats import kv
from bmoe.formats.csvtable import PathLike, frame_or_empty, load_sections, split_sections
from bmoe.formats.errors import FormatError, warn
from bmoe.formats.metrics_columns import (
    FLOAT_COLUMNS,
    INT_COLUMN_BITS,
    ROW_PRECISION,
    SUMMARY_PRECISION,
    native_columns,
    run_unfinished,
)

#: v2 column order, as the native engine writes it (the column table's native columns).
COLUMNS_V2 = native_columns(2)
#: v1 stops after swap_free_mib.
COLUMNS_V1 = native_columns(1)

INT_COLUMNS: dict[str, pa.DataType] = {
    name: getattr(pa, f"int{bits}")() for name, bits in INT_COLUMN_BITS.items()
}

#: Arrow types for known columns (metrics files are small: float64 keeps printed digits exact).
COLUMN_TYPES: dict[str, pa.DataType] = {
    **INT_COLUMNS,
    **{name: pa.float64() for name in FLOAT_COLUMNS},
}

#: The columns every metrics file has (and detection looks for).
REQUIRED = ("step", "wall_ms")

_SUMMARY_FLOAT_KEYS = frozenset(SUMMARY_PRECISION)
#: Keys that open a new preamble line in the native engine's files.
_LINE_STARTS = frozenset({"model", "moe_stream", "temp"})
_VERSION = re.compile(r"^bmoe_metrics\s+v(\d+)\s*$")


@dataclass
class MetricsRun:
    """One metrics CSV: run parameters, per-token rows, summary trailer(s)."""

    path: str | None
    version: int  # 0 (no preamble), 1, 2, ...
    params: dict[str, Any]  # typed preamble keys (``engine`` included in v2), file order
    rows: pd.DataFrame
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per turn (session mode)
    warnings: list[str] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any]:
        """The last ``# summary`` trailer (the run's, or the last turn's); empty if none."""
        return self.summaries[-1] if self.summaries else {}

    @property
    def engine(self) -> str | None:
        return self.params.get("engine")

    @property
    def steps(self) -> int | None:
        """The target token count the rows say (``steps`` of the last row)."""
        if "steps" in self.rows and len(self.rows):
            return int(self.rows["steps"].iloc[-1])
        return None

    @property
    def tokens(self) -> int:
        return len(self.rows)

    @property
    def partial(self) -> bool:
        """The run did not finish (:func:`~bmoe.formats.metrics_columns.run_unfinished`)."""
        turns = self.rows["turn"].nunique() if "turn" in self.rows else 1
        return run_unfinished(self.summaries, len(self.rows), self.steps, turns)


def _summary_value(key: str, text: str) -> Any:
    value = kv.parse_value(key, text)
    if key in _SUMMARY_FLOAT_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def parse_summary(text: str) -> dict[str, Any]:
    """Typed keys of one ``# summary`` line (without the leading ``summary``)."""
    out: dict[str, Any] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key:
            out[key] = _summary_value(key, value)
    return out


def read_metrics(source: PathLike | bytes) -> MetricsRun:
    """Read a metrics CSV of any version (or its Parquet form) into a :class:`MetricsRun`."""
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        p = parquet.read_parts(source, "metrics", schema=parquet.RowSchema(COLUMN_TYPES, REQUIRED))
        return MetricsRun(p.name, p.version, p.meta, p.rows, p.summaries, p.warnings)
    sec = load_sections(source)
    version = 0
    params: dict[str, Any] = {}
    summaries: list[dict[str, Any]] = []
    for line, text in sec.preamble():
        m = _VERSION.match(text)
        if m:
            version = int(m.group(1))
        elif text.startswith("summary"):
            continue
        else:
            params.update(kv.parse_checked(text, sec.path, line))
    trailer = sec.trailer()
    for n, (line, text, _rows) in enumerate(trailer):
        if text.startswith("summary"):
            body = text[len("summary") :]
            if sec.cut and sec.last_is_comment and n == len(trailer) - 1:
                tokens = body.split()
                if tokens:
                    sec.warnings.append(
                        warn(sec.path, line, f"summary line is cut short; dropped {tokens[-1]!r}")
                    )
                body = " ".join(tokens[:-1])
            summaries.append(parse_summary(body))
    if not sec.header_line:
        raise FormatError(sec.path, None, "no header row: not a metrics CSV")
    if any(c not in sec.header for c in REQUIRED):
        raise FormatError(
            sec.path, sec.header_line, "header lacks 'step' and 'wall_ms': not a metrics CSV"
        )
    rows = frame_or_empty(sec, COLUMN_TYPES)
    run = MetricsRun(sec.path, version, params, rows, summaries, sec.warnings)
    return run


# ----------------------------------------------------------------------------- writing


def format_row(row: Mapping[str, Any], columns: Iterable[str]) -> str:
    """One CSV row with the native engine's number formatting."""
    out = []
    for col in columns:
        value = row.get(col, 0)
        digits = ROW_PRECISION.get(col)
        if digits is None:
            if isinstance(value, float) and not value.is_integer():
                out.append(f"{value:g}")
            else:
                out.append(str(int(value)) if _is_number(value) else str(value))
        else:
            out.append(f"{float(value):.{digits}f}")
    return ",".join(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))


def format_summary(summary: Mapping[str, Any]) -> str:
    return "# summary " + kv.format_tokens(dict(summary), SUMMARY_PRECISION)


def format_preamble(params: Mapping[str, Any], version: int = 2) -> list[str]:
    """Preamble lines (without newlines) for `params`, grouped the way the engine groups them."""
    if version == 0:
        return []
    lines = [f"# bmoe_metrics v{version}"]
    rest = dict(params)
    if version >= 2:
        lines.append(f"# engine={rest.pop('engine', 'unknown')}")
    group: dict[str, Any] = {}
    for key, value in rest.items():
        if key in _LINE_STARTS and group:
            lines.append("# " + kv.format_tokens(group))
            group = {}
        group[key] = value
    if group:
        lines.append("# " + kv.format_tokens(group))
    return lines


class MetricsWriter:
    """Incremental writer: preamble now, one row per token as it happens, summary at the end.

    A run killed half way leaves exactly what the native engine would: the rows so far and no
    trailer (each line is flushed).
    """

    def __init__(
        self,
        out: TextIO,
        params: Mapping[str, Any],
        columns: Iterable[str] = COLUMNS_V2,
        version: int = 2,
    ):
        self.out = out
        self.columns = list(columns)
        for line in format_preamble(params, version):
            out.write(line + "\n")
        out.write(",".join(self.columns) + "\n")
        out.flush()

    def row(self, values: Mapping[str, Any]) -> None:
        self.out.write(format_row(values, self.columns) + "\n")
        self.out.flush()

    def summary(self, values: Mapping[str, Any]) -> None:
        self.out.write(format_summary(values) + "\n")
        self.out.flush()


def write_metrics(run: MetricsRun, dest: PathLike | TextIO) -> None:
    """Write a whole :class:`MetricsRun` (rows, then each turn's summary after its rows)."""
    if isinstance(dest, str | os.PathLike):
        with open(dest, "w", encoding="utf-8", newline="\n") as fh:
            write_metrics(run, fh)
        return
    writer = MetricsWriter(dest, run.params, list(run.rows.columns), run.version)
    records = run.rows.to_dict("records")
    turns = run.rows["turn"].to_numpy() if "turn" in run.rows and len(run.summaries) > 1 else None
    s = 0
    for i, rec in enumerate(records):
        writer.row(rec)
        last_of_turn = turns is not None and (i + 1 == len(records) or turns[i + 1] != turns[i])
        if last_of_turn and s < len(run.summaries) - 1:
            writer.summary(run.summaries[s])
            s += 1
    for summary in run.summaries[s:]:
        writer.summary(summary)


def metrics_to_text(run: MetricsRun) -> str:
    buf = io.StringIO()
    write_metrics(run, buf)
    return buf.getvalue()


def metrics_from_text(text: str, path: str | None = None) -> MetricsRun:
    """Parse metrics CSV text already in memory (tests, streams)."""
    run = read_metrics(text.encode("utf-8"))
    run.path = path
    return run


__all__ = [
    "COLUMNS_V1",
    "COLUMNS_V2",
    "MetricsRun",
    "MetricsWriter",
    "format_row",
    "format_summary",
    "metrics_from_text",
    "metrics_to_text",
    "parse_summary",
    "read_metrics",
    "split_sections",
    "write_metrics",
]
