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
from typing import TYPE_CHECKING

import numpy as np

from bmoe.formats.errors import FormatError, warn
from bmoe.formats.inputs import check_room, regular_file
from bmoe.formats.lazy import lazy_module

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
else:  # imported when a row is parsed by pyarrow
    pa = lazy_module("pyarrow")
    pacsv = lazy_module("pyarrow.csv")

BOM = b"\xef\xbb\xbf"

PathLike = str | os.PathLike


@dataclass
class Sections:
    """A telemetry file cut into its ``#`` lines, header and data rows.

    The rows are kept as byte spans of the file (header row included), so the common file (a
    preamble, then rows to the end) reaches the CSV parser without a copy.
    """

    path: str | None
    comments: list[tuple[int, str]]  # (1-based line, text after '#', stripped)
    header_line: int  # 1-based line of the header row, 0 if there is none
    header: list[str]
    data: bytes | None  # the whole file (None once released)
    spans: list[tuple[int, int]]  # [start, end) byte ranges of header and data rows
    rows_before_comment: list[int] = field(default_factory=list)  # data rows preceding each comment
    warnings: list[str] = field(default_factory=list)
    cut: bool = False  # the file does not end with a newline: its last line may be cut short
    last_is_comment: bool = False  # ... and that last line is a '#' line
    source: str | None = None  # set when `data` was not read: the rows stream from this file
    verified: bool = True  # False: only the head was read; '#' lines among the rows unchecked

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

    def _bytes(self) -> bytes:
        """The file's bytes, read (and the file split again) now if only its head was read;
        refused when the file is too large to hold (:func:`whole_limit`)."""
        if self.data is None and self.source is not None:
            check_whole(self.source, self.path)
            whole = split_sections(read_bytes(self.source)[0], self.path)
            whole.warnings[:0] = self.warnings
            self.__dict__.update(whole.__dict__)
        return self.data or b""

    def streamed(self) -> bool:
        """The rows are one span reaching the end of a file not held in memory."""
        return self.data is None and self.source is not None and len(self.spans) == 1

    @property
    def body(self) -> bytes:
        """Header row and data rows, ``#`` lines removed, each line ending in a newline."""
        data = self._bytes()
        parts = [data[a:b] for a, b in self.spans]
        return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts)

    def body_lines(self) -> int:
        """Lines in :attr:`body` (header included), counted without copying."""
        data = self._bytes()
        return sum(
            data.count(b"\n", a, b) + (0 if b > a and data[b - 1] == 0x0A else 1)
            for a, b in self.spans
            if b > a
        )

    def has_rows(self) -> bool:
        """Whether any non-blank line follows the header row (without counting them all)."""
        if self.streamed():
            return True  # only files well past their header are streamed
        data = self._bytes()
        for i, (a, b) in enumerate(self.spans):
            start = a
            if i == 0:
                nl = data.find(b"\n", a, b)
                if nl < 0:
                    continue
                start = nl + 1
            if _NON_SPACE.search(data, start, b):
                return True
        return False

    def buffer(self) -> pa.Buffer:
        """:attr:`body` for the CSV parser: a zero-copy view when the rows are one span."""
        data = self._bytes()
        if len(self.spans) == 1:
            a, b = self.spans[0]
            return pa.py_buffer(data)[a:b]
        return pa.py_buffer(self.body)

    def release(self) -> None:
        """Drop the file's bytes once the rows are parsed (the comments are kept)."""
        self.data = None
        self.source = None


def read_bytes(source: PathLike | bytes) -> tuple[bytes, str | None]:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), None
    path = regular_file(source)
    try:
        check_room(path, os.path.getsize(path), "the file read whole")
        return Path(path).read_bytes(), path
    except FileNotFoundError:
        raise FormatError(path, None, "no such file") from None
    except IsADirectoryError:
        raise FormatError(path, None, "is a directory, not a file") from None
    except OSError as exc:
        raise FormatError(path, None, f"cannot read: {exc.strerror or exc}") from None


_NON_SPACE = re.compile(rb"[^ \t\r\n\x0b\x0c]")


def whole_limit() -> int:
    """The largest file the careful path reads into memory at once (bytes): a quarter of the
    memory available now (the rows it parses take about as much again), at most 8 GiB."""
    limit = 8 << 30
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    limit = min(limit, int(line.split()[1]) * 1024 // 4)
                    break
    except (OSError, ValueError, IndexError):
        pass
    return limit


def check_whole(path: str, name: str | None = None) -> None:
    """Refuse to read `path` whole when it is larger than :func:`whole_limit`: such a file
    reaches the careful path only when its rows do not stream (a bad row, a ``#`` line among
    them), and reading it would exhaust memory before that could be said."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return
    limit = whole_limit()
    if size > limit:
        raise FormatError(
            name or path, None,
            f"{size / 2**30:.1f} GiB whose rows do not parse as they stream; too large to read "
            f"whole here ({limit / 2**30:.1f} GiB); a damaged or binary file?",
        )  # fmt: skip


def check_text(data: bytes, path: str | None, start: int = 0) -> None:
    """Reject empty and binary input (from byte `start`, e.g. after a BOM)."""
    if not _NON_SPACE.search(data, start):
        raise FormatError(path, None, "file is empty")
    head = data[start : start + 4096]
    if b"\x00" in head:
        raise FormatError(path, None, "binary data, not a text telemetry file")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a multi-byte character cut at 4096 is fine
            line = head[: exc.start].count(b"\n") + 1
            raise FormatError(path, line, "binary data, not a text telemetry file") from None


def split_sections(data: bytes, path: str | None) -> Sections:
    """Find the ``#`` lines (preamble, trailers) and the header without scanning every row."""
    pos = len(BOM) if data.startswith(BOM) else 0
    check_text(data, path, pos)
    comments: list[tuple[int, str]] = []
    rows_before: list[int] = []
    spans: list[tuple[int, int]] = []
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
        if not header_line:
            first_end = data.find(b"\n", pos)
            first_end = n if first_end < 0 else first_end
            first = data[pos:first_end]
            if not first.strip():  # blank lines before the header
                pos = first_end + 1
                line += 1
                continue
            header_line = line
            header = [h.strip() for h in first.decode("utf-8", "replace").strip().split(",")]
            rows_seen -= 1  # the header is not a data row
        # A run of non-comment lines: up to the next line that starts with '#'.
        nxt = data.find(b"\n#", pos)
        end = n if nxt < 0 else nxt + 1
        nlines = data.count(b"\n", pos, end) + (0 if data[end - 1] == 0x0A else 1)
        spans.append((pos, end))
        rows_seen += nlines
        line += nlines
        pos = end
    last = n - 1
    while last >= 0 and data[last] in b" \t":
        last -= 1
    cut = last < 0 or data[last] != 0x0A
    end = n
    while end > 0 and data[end - 1] == 0x0A:
        end -= 1
    last_is_comment = data.startswith(b"#", data.rfind(b"\n", 0, end) + 1)
    return Sections(
        path, comments, header_line, header, data, spans, rows_before, [], cut, last_is_comment
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
    if not sec.spans:
        return
    data = sec._bytes()
    a, b = sec.spans[-1]
    if b > a and data[b - 1] == 0x0A:
        return
    start = data.rfind(b"\n", a, b) + 1
    if start <= a and len(sec.spans) == 1:
        return  # the header itself: nothing but it
    n_rows = sec.body_lines() - 1
    line = _line_of_row(sec, n_rows - 1)
    sec.spans[-1] = (a, start)
    if start <= a:
        sec.spans.pop()
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
        if not sec.has_rows():
            return empty_frame(types, sec.header)
    col_types = {k: v for k, v in types.items() if k in sec.header}
    table = _read_streamed(sec, col_types) if _can_stream(sec, col_types) else None
    while table is None:
        try:
            table = pacsv.read_csv(
                pa.BufferReader(sec.buffer()),
                read_options=read_options(sec.header),
                parse_options=pacsv.ParseOptions(newlines_in_values=False),
                convert_options=_convert_options(col_types),
                memory_pool=pa.system_memory_pool(),
            )
        except pa.ArrowInvalid as exc:
            m = _CONV.search(str(exc))
            if m and m.group(2).startswith(("int", "uint")) and _is_int_text(m.group(3)):
                name = sec.header[int(m.group(1))]
                if col_types.get(name) != pa.int64():
                    col_types[name] = pa.int64()  # wider than the compact type: widen, retry
                    continue
            raise _locate(sec, col_types) from None
    sec.release()  # the rows are in Arrow now: free the file before building the DataFrame
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    del table
    return frame


def read_options(header: list[str], *, use_threads: bool = True) -> pacsv.ReadOptions:
    """pyarrow's CSV options for rows under `header`: the header line is skipped and its
    names given as split by :func:`split_sections` (blanks around a name stripped), so a
    column is known by the name every other part of the reader uses."""
    return pacsv.ReadOptions(
        block_size=BLOCK_SIZE, column_names=list(header), skip_rows=1, use_threads=use_threads
    )


def _convert_options(col_types: dict[str, pa.DataType]) -> pacsv.ConvertOptions:
    return pacsv.ConvertOptions(
        column_types=col_types,
        null_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )


def _can_stream(sec: Sections, col_types: dict[str, pa.DataType]) -> bool:
    """Rows can be parsed from disk: one span to the end, and either checked for ``#`` lines
    or led by a numeric column (on which a ``#`` line fails to parse)."""
    if not sec.streamed():
        return False
    first = col_types.get(sec.header[0]) if sec.header else None
    numeric = first is not None and (pa.types.is_integer(first) or pa.types.is_floating(first))
    return sec.verified or numeric


def _read_streamed(sec: Sections, col_types: dict[str, pa.DataType]) -> pa.Table | None:
    """Parse the rows straight from the file (never held whole in memory); None when they
    need the careful path (a bad row, a number too wide for its compact type)."""
    assert sec.source is not None
    start = sec.spans[0][0]
    try:
        with pa.OSFile(sec.source) as fh:
            fh.seek(start)
            return pacsv.read_csv(
                fh,
                read_options=read_options(sec.header),
                parse_options=pacsv.ParseOptions(newlines_in_values=False),
                convert_options=_convert_options(col_types),
                memory_pool=pa.system_memory_pool(),
            )
    except (pa.ArrowInvalid, OSError):
        return None


def scan_sections(path: str, head_size: int, chunk: int, verify: bool) -> Sections | None:
    """Sections of a large file from its head (and, to `verify` that no ``#`` line follows the
    header, one pass over the rest), without keeping the file in memory.

    Applies to the usual trace: a ``#`` preamble, the header, rows to a final newline. Returns
    None for anything else (a ``#`` line among the rows, a cut last line, ...), which the
    caller reads whole instead.
    """
    with open(path, "rb", buffering=0) as fh:
        head = fh.read(head_size)
        whole_lines = head[: head.rfind(b"\n") + 1]
        if not whole_lines:  # a large file is never read whole on the strength of no line
            if b"\x00" in head[:65536]:
                raise FormatError(path, 1, "binary data, not a text telemetry file")
            if len(head) >= head_size:
                raise FormatError(
                    path, 1, f"no line in its first {_mib(head_size)}, not a text telemetry file"
                )
            return None  # all of it is this short line: the careful read says what it is
        sec = split_sections(whole_lines, path)
        rest = head[len(whole_lines) :]
        nul = rest.find(b"\x00")
        if nul >= 0:  # binary past the header (a sparse file, a damaged one): said now
            line = whole_lines.count(b"\n") + 1 + rest.count(b"\n", 0, nul)
            raise FormatError(path, line, "binary data, not a text telemetry file")
        if len(sec.spans) != 1 or not sec.header_line or sec.trailer():
            return None
        if b"\n#" in head[len(whole_lines) - 1 :]:
            return None
        start, _end = sec.spans[0]
        prev_newline = head.endswith(b"\n")
        size = len(head)
        last = head[-1:]
        if not verify:
            size = fh.seek(0, os.SEEK_END)
            if size > len(head):
                fh.seek(size - 1)
                last = fh.read(1)
        while verify and (block := fh.read(chunk)):
            if b"\x00" in block:
                at = size + block.index(b"\x00")
                raise FormatError(
                    path, None, f"binary data at byte {at}, not a text telemetry file"
                )
            if b"\n#" in block or (prev_newline and block.startswith(b"#")):
                return None
            prev_newline = block.endswith(b"\n")
            last = block[-1:]
            size += len(block)
    if last == b"\x00":  # a sparse or damaged end: the careful read would take it whole
        raise FormatError(path, None, f"binary data at byte {size - 1}, not a text telemetry file")
    if last != b"\n":
        return None
    sec.data = None
    sec.source = path
    sec.spans = [(start, size)]
    sec.verified = verify
    return sec


def _mib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} bytes"


#: Files above this size are scanned and streamed rather than read whole (bytes).
STREAM_ABOVE = 8 << 20
#: How much of such a file is read to find its preamble and header, and the scan's chunk.
SCAN_HEAD, SCAN_CHUNK = 1 << 20, 8 << 20
#: pyarrow's CSV block size (small blocks keep the parser's temporaries small).
BLOCK_SIZE = 1 << 20


def load_sections(source: PathLike | bytes, *, verify: bool = True) -> Sections:
    """The sections of a file (or of bytes). A large file is not read whole: its head gives the
    preamble and header and the rows are parsed from disk later. ``verify=False`` skips the
    pass that checks no ``#`` line follows the header, for readers whose rows cannot hold one
    (a numeric first column makes such a line a parse error, and the careful path takes over);
    readers that need the trailer (the metrics summary) keep the default."""
    if not isinstance(source, bytes | bytearray | memoryview):
        path = regular_file(source)
        try:
            large = os.path.getsize(path) > STREAM_ABOVE
        except OSError:
            large = False
        if large:
            try:
                sec = scan_sections(path, SCAN_HEAD, SCAN_CHUNK, verify)
            except OSError:
                sec = None
            if sec is not None:
                return sec
    data, name = read_bytes(source)
    return split_sections(data, name)


def empty_frame(types: dict[str, pa.DataType], columns: list[str]) -> pd.DataFrame:
    """An empty DataFrame with the compact dtypes (for files with a header but no rows)."""
    schema = pa.schema([(c, types.get(c, pa.string())) for c in dict.fromkeys(columns)])
    return schema.empty_table().to_pandas()


def frame_or_empty(sec: Sections, types: dict[str, pa.DataType], required=()) -> pd.DataFrame:
    if sec.header_line and not sec.has_rows():
        missing = [c for c in required if c not in sec.header]
        if missing:
            raise FormatError(
                sec.path, sec.header_line, f"header lacks required column(s): {', '.join(missing)}"
            )
        return empty_frame(types, sec.header)
    return read_rows(sec, types, required)


def as_int_array(series: pd.Series) -> np.ndarray:
    return series.to_numpy(dtype=np.int64, copy=False)


INT32 = (-(2**31), 2**31 - 1)


def check_int32(sec: Sections, frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    """FormatError at the first row whose id or index in `columns` does not fit 32 bits.

    The compact types are widened for values that overflow them (see :func:`read_rows`);
    ids, layers and steps past int32 are outside the contract, and every analysis that
    builds keys from them would overflow. Only widened columns are scanned.
    """
    for column in columns:
        if column not in frame or frame[column].dtype != np.int64:
            continue
        values = frame[column].to_numpy()
        bad = (values < INT32[0]) | (values > INT32[1])
        if bad.any():
            row = int(np.argmax(bad))
            raise FormatError(
                sec.path,
                _line_of_row(sec, row),
                f"{column}={values[row]} is beyond the 32-bit range of the contract",
            )


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
