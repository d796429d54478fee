"""The shared reader under every CSV-shaped telemetry file.

A telemetry file is ``#`` lines (a preamble, and for the metrics CSV ``# summary`` trailers,
possibly between a session's turns), one header row, and data rows. This module separates the
``#`` lines from the rows, hands the rows to pyarrow's CSV reader with compact column types, and
turns pyarrow's terse failures into ``file:line: problem`` errors. A last line cut mid-write is
dropped with a warning; every other bad row is an error.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from bmoe.formats.errors import FormatError, warn

BOM = b"\xef\xbb\xbf"

PathLike = str | os.PathLike


@dataclass
class Sections:
    """A telemetry file cut into its ``#`` lines, header and data rows."""

    path: str | None
    comments: list[tuple[int, str]]  # (1-based line, text after '#', stripped)
    header_line: int  # 1-based line of the header row, 0 if there is none
    header: list[str]
    body: bytes  # header row + data rows, '#' lines removed
    rows_before_comment: list[int] = field(default_factory=list)  # data rows preceding each comment
    warnings: list[str] = field(default_factory=list)
    cut: bool = False  # the file does not end with a newline: its last line may be cut short
    last_is_comment: bool = False  # ... and that last line is a '#' line

    def preamble(self) -> list[tuple[int, str]]:
        """The ``#`` lines above the header."""
        return [(n, t) for n, t in self.comments if n < self.header_line or not self.header_line]

    def trailer(self) -> list[tuple[int, str, int]]:
        """``#`` lines below the header, with how many data rows precede each."""
        return [
            (n, t, r)
            for (n, t), r in zip(self.comments, self.rows_before_comment, strict=True)
            if self.header_line and n > self.header_line
        ]


def read_bytes(source: PathLike | bytes) -> tuple[bytes, str | None]:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), None
    path = str(source)
    try:
        return Path(path).read_bytes(), path
    except FileNotFoundError:
        raise FormatError(path, None, "no such file") from None
    except IsADirectoryError:
        raise FormatError(path, None, "is a directory, not a file") from None
    except OSError as exc:
        raise FormatError(path, None, f"cannot read: {exc.strerror or exc}") from None


def check_text(data: bytes, path: str | None) -> bytes:
    """Reject empty and binary input; strip a UTF-8 BOM."""
    if data.startswith(BOM):
        data = data[len(BOM) :]
    if not data.strip():
        raise FormatError(path, None, "file is empty")
    head = data[:4096]
    if b"\x00" in head:
        raise FormatError(path, None, "binary data, not a text telemetry file")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a multi-byte character cut at 4096 is fine
            line = head[: exc.start].count(b"\n") + 1
            raise FormatError(path, line, "binary data, not a text telemetry file") from None
    return data


def split_sections(data: bytes, path: str | None) -> Sections:
    """Find the ``#`` lines (preamble, trailers) and the header without scanning every row."""
    data = check_text(data, path)
    comments: list[tuple[int, str]] = []
    rows_before: list[int] = []
    pieces: list[bytes] = []
    warnings: list[str] = []
    pos = 0
    line = 1
    header_line = 0
    header: list[str] = []
    rows_seen = 0  # data rows (excluding header) before `pos`
    n = len(data)
    while pos < n:
        if data.startswith(b"#", pos):
            end = data.find(b"\n", pos)
            end = n if end < 0 else end + 1
            text = data[pos + 1 : end].decode("utf-8", "replace").strip()
            comments.append((line, text))
            rows_before.append(rows_seen)
            line += 1
            pos = end
            continue
        # A run of non-comment lines: up to the next line that starts with '#'.
        nxt = data.find(b"\n#", pos)
        end = n if nxt < 0 else nxt + 1
        chunk = data[pos:end]
        nlines = chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
        if not header_line:
            first_end = chunk.find(b"\n")
            first = chunk if first_end < 0 else chunk[:first_end]
            if not first.strip():  # blank lines before the header
                skip = first_end + 1 if first_end >= 0 else len(chunk)
                pos += skip
                line += 1
                continue
            header_line = line
            header = [h.strip() for h in first.decode("utf-8", "replace").strip().split(",")]
            rows_seen -= 1  # the header is not a data row
        pieces.append(chunk if chunk.endswith(b"\n") else chunk + b"\n")
        rows_seen += nlines
        line += nlines
        pos = end
    body = b"".join(pieces)
    cut = not data.rstrip(b" \t").endswith(b"\n")
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    last_is_comment = data.startswith(b"#", last_start)
    return Sections(
        path, comments, header_line, header, body, rows_before, warnings, cut, last_is_comment
    )


def _line_of_row(sec: Sections, row: int) -> int:
    """1-based file line of the 0-based data row `row` (comments between rows counted)."""
    line = sec.header_line + 1 + row
    for (cline, _t), before in zip(sec.comments, sec.rows_before_comment, strict=True):
        if cline > sec.header_line and before <= row:
            line += 1
    return line


_CONV = re.compile(r"In CSV column #(\d+): CSV conversion error to (\w+): invalid value '(.*)'")


def _is_int_text(text: str) -> bool:
    return bool(re.fullmatch(r"\s*[+-]?\d+\s*", text))


def _locate(sec: Sections, types: dict[str, pa.DataType]) -> FormatError:
    """Slow path, only after pyarrow refused the rows: find the first bad line and say why."""
    lines = sec.body.split(b"\n")
    header = sec.header
    width = len(header)
    for row_no, raw in enumerate(lines[1:]):
        text = raw.decode("utf-8", "replace").removesuffix("\r")
        if not text.strip():
            continue
        line = _line_of_row(sec, row_no)
        try:
            fields = next(csv.reader([text]))
        except csv.Error as exc:
            return FormatError(sec.path, line, f"malformed CSV row ({str(exc).split(' - ')[0]})")
        if len(fields) != width:
            return FormatError(
                sec.path, line, f"expected {width} fields (the header's), got {len(fields)}"
            )
        for name, value in zip(header, fields, strict=True):
            kind = types.get(name.strip())
            if kind is None:
                continue
            if pa.types.is_integer(kind) and not _is_int_text(value):
                return FormatError(sec.path, line, f"column {name!r}: {value!r} is not an integer")
            if pa.types.is_floating(kind):
                try:
                    float(value)
                except ValueError:
                    return FormatError(
                        sec.path, line, f"column {name!r}: {value!r} is not a number"
                    )
    return FormatError(sec.path, sec.header_line or None, "rows do not parse as CSV")


def _cut_last_line(sec: Sections) -> None:
    """Drop a final data line that has no newline: the engine ends every row with one, so such
    a line was cut mid-write and even its parsable fields may be cut short (``1.`` of
    ``1.234``)."""
    body = sec.body
    if not body.endswith(b"\n"):
        return
    prev = body.rfind(b"\n", 0, len(body) - 1)
    if prev < 0:
        return
    n_rows = body.count(b"\n") - 1
    line = _line_of_row(sec, n_rows - 1)
    sec.body = body[: prev + 1]
    sec.warnings.append(
        warn(sec.path, line, "last line is cut short (file truncated?); dropped it")
    )


def read_rows(
    sec: Sections,
    types: dict[str, pa.DataType],
    required: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Parse the data rows with pyarrow into a DataFrame with the given compact types.

    Columns not in `types` are kept with the type pyarrow infers. Integers too wide for their
    compact type are widened rather than refused.
    """
    if not sec.header_line:
        raise FormatError(sec.path, None, "no header row (only '#' lines)")
    missing = [c for c in required if c not in sec.header]
    if missing:
        raise FormatError(
            sec.path, sec.header_line, f"header lacks required column(s): {', '.join(missing)}"
        )
    dupes = sorted({h for h in sec.header if sec.header.count(h) > 1})
    if dupes:
        raise FormatError(sec.path, sec.header_line, f"duplicate column(s): {', '.join(dupes)}")
    if sec.cut and not sec.last_is_comment:
        _cut_last_line(sec)
        if sec.body.count(b"\n") <= 1:
            return empty_frame(types, sec.header)
    col_types = {k: v for k, v in types.items() if k in sec.header}
    while True:
        try:
            table = pacsv.read_csv(
                pa.BufferReader(sec.body),
                read_options=pacsv.ReadOptions(block_size=1 << 24),
                parse_options=pacsv.ParseOptions(newlines_in_values=False),
                convert_options=pacsv.ConvertOptions(
                    column_types=col_types,
                    null_values=[],
                    strings_can_be_null=False,
                    quoted_strings_can_be_null=False,
                ),
            )
            break
        except pa.ArrowInvalid as exc:
            m = _CONV.search(str(exc))
            if m and m.group(2).startswith(("int", "uint")) and _is_int_text(m.group(3)):
                name = sec.header[int(m.group(1))]
                if col_types.get(name) != pa.int64():
                    col_types[name] = pa.int64()  # wider than the compact type: widen, retry
                    continue
            raise _locate(sec, col_types) from None
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    return frame


def load_sections(source: PathLike | bytes) -> Sections:
    data, path = read_bytes(source)
    return split_sections(data, path)


def empty_frame(types: dict[str, pa.DataType], columns: list[str]) -> pd.DataFrame:
    """An empty DataFrame with the compact dtypes (for files with a header but no rows)."""
    schema = pa.schema([(c, types.get(c, pa.string())) for c in dict.fromkeys(columns)])
    return schema.empty_table().to_pandas()


def frame_or_empty(sec: Sections, types: dict[str, pa.DataType], required=()) -> pd.DataFrame:
    if sec.header_line and sec.body.count(b"\n") <= 1:
        missing = [c for c in required if c not in sec.header]
        if missing:
            raise FormatError(
                sec.path, sec.header_line, f"header lacks required column(s): {', '.join(missing)}"
            )
        return empty_frame(types, sec.header)
    return read_rows(sec, types, required)


def as_int_array(series: pd.Series) -> np.ndarray:
    return series.to_numpy(dtype=np.int64, copy=False)


def row_lines(sec: Sections, rows: np.ndarray) -> np.ndarray:
    """1-based file lines of 0-based data rows (vectorised :func:`_line_of_row`)."""
    rows = np.asarray(rows, dtype=np.int64)
    before = np.array(
        [
            r
            for (cline, _t), r in zip(sec.comments, sec.rows_before_comment, strict=True)
            if cline > sec.header_line
        ],
        dtype=np.int64,
    )
    return sec.header_line + 1 + rows + np.searchsorted(np.sort(before), rows, side="right")
