"""The routing trace (``route_trace v1``): one row per routed expert, sizes in the preamble.

:func:`read_route_trace` gives the rows as a DataFrame; :func:`read_route_columns` gives them
as numpy columns without importing pandas (what a command that prints a few tables needs)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias

import numpy as np

from bmoe.formats import kv
from bmoe.formats.csvtable import (
    PathLike,
    Sections,
    check_int32,
    frame_or_empty,
    load_sections,
    read_options,
)
from bmoe.formats.errors import FormatError
from bmoe.formats.lazy import lazy_module

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
else:  # imported when pyarrow parses rows (the compiled loop stopped) or Parquet is read
    pa = lazy_module("pyarrow")
    pacsv = lazy_module("pyarrow.csv")

COLUMNS = (
    "turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes",
    "dropped",
)  # fmt: skip

#: each column's compact type (as numpy dtypes; :data:`COLUMN_TYPES`: as pyarrow types)
NUMPY_TYPES: dict[str, np.dtype] = {
    "turn": np.dtype(np.int16),
    "phase": np.dtype(np.int8),
    "step": np.dtype(np.int32),
    "layer": np.dtype(np.int16),
    "slot": np.dtype(np.int8),
    "expert": np.dtype(np.int16),
    "weight": np.dtype(np.float32),
    "residency": np.dtype(np.int8),
    "expert_bytes": np.dtype(np.int32),
    "dropped": np.dtype(np.int8),
}


@functools.cache
def column_types() -> dict[str, pa.DataType]:
    """:data:`NUMPY_TYPES` as pyarrow types (``COLUMN_TYPES``; pyarrow imported here)."""
    return {c: pa.from_numpy_dtype(t) for c, t in NUMPY_TYPES.items()}


def __getattr__(name: str) -> Any:
    if name == "COLUMN_TYPES":  # made on first use: reading a plain trace needs no pyarrow
        return column_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


REQUIRED = ("step", "layer", "expert")
#: Ids and indices that must fit 32 bits.
IDS = ("turn", "phase", "step", "layer", "slot", "expert")


def parquet_schema():
    """What the Parquet form of a route trace must hold (:class:`~bmoe.formats.parquet.
    RowSchema`)."""
    from bmoe.formats.parquet import RowSchema

    return RowSchema(column_types(), REQUIRED, IDS)


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
        return _layer_sizes(self.layers, "expert_bytes")

    def dense_bytes(self) -> dict[int, int]:
        return _layer_sizes(self.layers, "dense_bytes")

    def column(self, name: str) -> np.ndarray | None:
        """One column of the rows as a numpy array; None when the trace has no such column."""
        return self.rows[name].to_numpy() if name in self.rows else None

    @property
    def recorded_with_dropping(self) -> bool:
        return "dropped" in self.rows and bool((self.rows["dropped"] != 0).any())


def _layer_sizes(layers: pd.DataFrame, name: str) -> dict[int, int]:
    """layer -> `name` (a preamble size) for the layers that give it."""
    return _record_sizes(layers.to_dict("records"), name) if name in layers else {}


@dataclass
class RouteColumns:
    """A routing trace with its rows as numpy columns (name -> array, all of one length) and
    its per-layer preamble lines as records: :class:`RouteTrace` without pandas. The route
    views take either; :meth:`to_trace` gives the DataFrame form."""

    path: str | None
    version: int
    meta: dict[str, Any]
    layers: list[dict[str, Any]]  # one record per `# layer=` line
    columns: dict[str, np.ndarray]
    warnings: list[str] = field(default_factory=list)

    @property
    def n_expert_used(self) -> int | None:
        k = self.meta.get("n_expert_used")
        return int(k) if k is not None else None

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def expert_bytes(self) -> dict[int, int]:
        """Bytes of one expert per MoE layer, from the preamble (absent layers are absent)."""
        return _record_sizes(self.layers, "expert_bytes")

    def dense_bytes(self) -> dict[int, int]:
        return _record_sizes(self.layers, "dense_bytes")

    def column(self, name: str) -> np.ndarray | None:
        """One column of the rows; None when the trace has no such column."""
        return self.columns.get(name)

    @property
    def recorded_with_dropping(self) -> bool:
        dropped = self.columns.get("dropped")
        return dropped is not None and bool(dropped.any())

    def to_trace(self) -> RouteTrace:
        """The same trace with its rows and layers as DataFrames."""
        import pandas as pd

        rows = pd.DataFrame(self.columns, copy=False)
        return RouteTrace(
            self.path, self.version, self.meta, _layers_frame(self.layers), rows, self.warnings
        )

    @classmethod
    def of(cls, trace: RouteTrace) -> RouteColumns:
        """`trace`'s rows as columns (no copy where the DataFrame holds numpy arrays)."""
        columns = {str(c): trace.rows[c].to_numpy() for c in trace.rows.columns}
        layers = trace.layers.to_dict("records")
        return cls(trace.path, trace.version, trace.meta, layers, columns, trace.warnings)


def _record_sizes(layers: list[dict[str, Any]], name: str) -> dict[int, int]:
    """layer -> `name` from the per-layer preamble records, for the layers that give it."""
    return {
        int(rec["layer"]): int(rec[name])
        for rec in layers
        if rec.get(name) is not None and rec[name] == rec[name]  # NaN: not given
    }


def _layers_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The per-layer preamble lines as a frame ordered by layer (typed empty without any)."""
    import pandas as pd

    if not records:
        return pd.DataFrame({"layer": pd.Series([], dtype="int64")})
    return pd.DataFrame(records).sort_values("layer", kind="stable").reset_index(drop=True)


def _parse_preamble(sec) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
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
    return version, meta, layer_rows


def read_route_trace(source: PathLike | bytes, columns: Iterable[str] | None = None) -> RouteTrace:
    """Read a route trace (CSV or its Parquet form).

    With `columns`, the rows keep only those of them the file has (in file order): a large
    file's other columns are never held in memory, e.g. a replay's 8 of 10 columns."""
    from bmoe.formats import parquet

    keep = None if columns is None else frozenset(columns)
    if parquet.is_parquet(source):
        p = parquet.read_parts(source, "route", columns=keep, schema=parquet_schema())
        return RouteTrace(p.name, p.version, p.meta, p.layers, p.rows, p.warnings)
    sec = load_sections(source, verify=False)
    version, meta, layers = _parse_preamble(sec)
    columns = _stream_columns(sec, keep)
    if columns is None:
        rows = frame_or_empty(sec, column_types(), REQUIRED)
        if keep is not None:
            rows = rows.drop(columns=[c for c in rows.columns if c not in keep])
    else:
        import pandas as pd

        rows = pd.DataFrame(columns, copy=False)
    check_int32(sec, rows, IDS)
    parquet.release_unused()  # the parse's buffers, freed into Arrow's pool, back to the system
    return RouteTrace(sec.path, version, meta, _layers_frame(layers), rows, sec.warnings)


def read_route_columns(
    source: PathLike | bytes, columns: Iterable[str] | None = None
) -> RouteColumns:
    """Read a route trace as numpy columns (only `columns` of them the file has, when given).
    A plain CSV trace (rows under one header, no ``#`` line among them, every row parsing with
    the compact types) is parsed straight into columns, without pandas; any other file
    (Parquet, a file that needs the careful reader) is read by :func:`read_route_trace` and
    its frame's columns are taken: the same rows and the same errors either way."""
    from bmoe.formats import parquet

    keep = None if columns is None else frozenset(columns)
    if not parquet.is_parquet(source):
        sec = load_sections(source, verify=False)
        version, meta, layers = _parse_preamble(sec)
        parsed = _stream_columns(sec, keep, in_memory=True)
        if parsed is not None:
            if "pyarrow" in sys.modules:  # pyarrow parsed some rows: as parquet.release_unused
                pa.default_memory_pool().release_unused()
            return RouteColumns(sec.path, version, meta, layers, parsed, sec.warnings)
    return RouteColumns.of(read_route_trace(source, keep))


def read_route_preamble(source: PathLike) -> RouteTrace:
    """A route trace's run facts and per-layer sizes (CSV or Parquet), its rows left on disk
    (an empty frame of its columns): the preamble for :func:`iter_route_rows`' blocks."""
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        p = parquet.read_meta(source, "route", parquet_schema())
        return RouteTrace(p.name, p.version, p.meta, p.layers, p.rows, p.warnings)
    sec = load_sections(source, verify=False)
    version, meta, layers = _parse_preamble(sec)
    types = {c: column_types().get(c, pa.string()) for c in dict.fromkeys(sec.header)}
    rows = pa.schema(list(types.items())).empty_table().to_pandas()
    return RouteTrace(sec.path, version, meta, _layers_frame(layers), rows, sec.warnings)


def read_route_head(source: PathLike) -> RouteColumns:
    """:func:`read_route_preamble` as :class:`RouteColumns` (no rows; without pandas for a
    CSV): the preamble for :func:`iter_route_columns`' blocks."""
    from bmoe.formats import parquet

    if parquet.is_parquet(source):
        return RouteColumns.of(read_route_preamble(source))
    sec = load_sections(source, verify=False)
    version, meta, layers = _parse_preamble(sec)
    columns = {c: np.empty(0, dtype=NUMPY_TYPES.get(c, object)) for c in dict.fromkeys(sec.header)}
    return RouteColumns(sec.path, version, meta, layers, columns, sec.warnings)


def iter_route_columns(
    source: PathLike, rows: int = 1 << 20, columns: Iterable[str] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """:func:`iter_route_rows` as numpy columns (name -> array) in blocks of about `rows`
    rows: a plain CSV trace's parsed straight into them (no pandas), Parquet's batches
    taken as their arrays. Anything else is read as :func:`iter_route_rows` reads it (the
    same rows and errors)."""
    from bmoe.formats import parquet

    keep = None if columns is None else frozenset(columns)
    if parquet.is_parquet(source):
        yield from parquet.iter_columns(source, rows, keep, parquet_schema())
        return
    sec = load_sections(source, verify=False)
    if not _streamable(sec):
        yield _frame_columns(read_route_trace(source, keep).rows)
        return
    assert sec.source is not None
    types = {c: NUMPY_TYPES[c] for c in sec.header}
    wanted = None if keep is None else [c for c in sec.header if c in keep]
    parts: list[dict[str, np.ndarray]] = []
    held = given = 0
    try:
        for batch in _batches(sec.source, sec.spans[0][0], types, wanted, rows):
            block = _block_columns(batch)
            if block is None:  # nulls: the careful read below names them
                raise pa.ArrowInvalid("null")
            parts.append(block)
            held += len(next(iter(block.values()))) if block else 0
            if held >= rows:
                yield _joined(parts)
                given += held
                parts, held = [], 0
    except (pa.ArrowInvalid, OSError):
        pass  # the careful read below names the problem, or widens a column
    else:
        if parts:
            yield _joined(parts)
        return
    yield _frame_columns(read_route_trace(source, keep).rows.iloc[given:])


def _frame_columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return {str(c): frame[c].to_numpy() for c in frame.columns}


def _joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def iter_route_rows(
    source: PathLike, rows: int = 1 << 20, columns: Iterable[str] | None = None
) -> Iterator[pd.DataFrame]:
    """The rows of a route trace (CSV or Parquet) in blocks of about `rows` (only `columns`
    of them, when given), read from disk as they are used (a trace larger than memory can
    be walked this way, once per call). A CSV that cannot stream (not a plain trace, a row
    that does not parse) is read whole and given as one block; its errors are the reader's."""
    import pandas as pd

    from bmoe.formats import parquet

    keep = None if columns is None else frozenset(columns)
    if parquet.is_parquet(source):
        yield from parquet.iter_rows(source, rows, keep, parquet_schema())
        return
    sec = load_sections(source, verify=False)
    if _streamable(sec):
        assert sec.source is not None
        types = {c: NUMPY_TYPES[c] for c in sec.header}
        wanted = None if keep is None else [c for c in sec.header if c in keep]
        parts: list[pd.DataFrame] = []
        held = given = 0
        try:
            for batch in _batches(sec.source, sec.spans[0][0], types, wanted, rows):
                block = batch if isinstance(batch, dict) else batch.to_pandas()
                parts.append(pd.DataFrame(block, copy=False))
                held += len(parts[-1])
                if held >= rows:
                    yield pd.concat(parts, ignore_index=True)
                    given += held
                    parts, held = [], 0
        except (pa.ArrowInvalid, OSError):
            pass  # the careful read below names the problem, or widens a column
        else:
            if parts:
                yield pd.concat(parts, ignore_index=True)
            return
        yield read_route_trace(source, keep).rows.iloc[given:].reset_index(drop=True)
        return
    yield read_route_trace(source, keep).rows


def _streamable(sec: Sections, in_memory: bool = False) -> bool:
    """The rows can be parsed straight from the file with the compact types (`in_memory`:
    or from the file's bytes, when they were read whole and hold no ``#`` line among the
    rows)."""
    header = sec.header
    whole = sec.streamed() or (in_memory and sec.data is not None and len(sec.spans) == 1)
    return (
        whole
        and not sec.cut
        and bool(sec.header_line)
        and all(c in NUMPY_TYPES for c in header)
        and len(set(header)) == len(header)
        and all(c in header for c in REQUIRED)
    )


#: a block of rows: numpy columns (name -> array) from the compiled loop, or pyarrow's batch
Block: TypeAlias = "dict[str, np.ndarray] | pa.RecordBatch"


def _batches(
    source: str | memoryview,
    start: int,
    types: dict[str, np.dtype],
    keep: list[str] | None = None,
    rows: int | None = None,
) -> Iterator[Block]:
    """The rows of a file (a path, from byte `start`, its header line) or of bytes in memory,
    block by block; the columns named as `types` names them (the header split and stripped),
    of the types :data:`NUMPY_TYPES` gives them.

    The compiled loop of :mod:`~bmoe.formats.numeric_csv` parses them (numpy columns, `rows`
    a block, all of them in one by default; about four times pyarrow's speed) up to the
    first row it does not take; pyarrow's reader parses on from there (RecordBatches),
    naming any problem."""
    from bmoe.formats import numeric_csv

    end = os.path.getsize(source) if isinstance(source, str) else len(source)
    if rows is None:  # a row takes two bytes a column at least
        rows = (end - start) // (2 * len(types)) + 1
    layout = numeric_csv.Layout(list(types), NUMPY_TYPES, None if keep is None else set(keep))
    try:
        yield from numeric_csv.iter_blocks(source, start, end, layout, rows)
        return
    except numeric_csv.Stopped as stopped:
        at = stopped.at
    options = read_options(list(types), use_threads=False)
    if at > start:  # within the rows: no header line to skip
        options.skip_rows = 0
    with pa.OSFile(source) if isinstance(source, str) else pa.BufferReader(source) as fh:
        fh.seek(at)
        reader = pacsv.open_csv(
            fh,
            # one thread: the blocks are small and decoded as they come, so threads only
            # add their hand-over (about a third more CPU time for the same wall time)
            read_options=options,
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: column_types()[c] for c in types},
                null_values=[],
                strings_can_be_null=False,
                include_columns=keep,
            ),
            memory_pool=pa.system_memory_pool(),
        )
        yield from reader


def _stream_columns(
    sec: Sections, keep: frozenset[str] | None = None, in_memory: bool = False
) -> dict[str, np.ndarray] | None:
    """The rows of a large trace parsed batch by batch into columns allocated up front, so
    the peak is the columns plus one batch (parsing the whole file into Arrow and converting
    held every row twice). The columns are sized for the most rows the file can hold (each
    row takes at least two bytes per column); pages never written are never resident.

    Only the columns in `keep` are parsed and held, when given. `in_memory`: a small file
    read whole is parsed the same way from its bytes.

    None when the careful path must read it instead: not a plain file streamed from disk (or
    read whole, with `in_memory`), a header with unknown, duplicate or missing columns, or
    rows that do not parse.
    """
    header = sec.header
    if not _streamable(sec, in_memory):
        return None
    start, end = sec.spans[0]
    source: str | memoryview
    if sec.streamed():
        assert sec.source is not None
        source = sec.source
    else:
        assert sec.data is not None
        source, start, end = memoryview(sec.data)[start:end], 0, end - start
    types = {c: NUMPY_TYPES[c] for c in header}
    most = (end - start) // (2 * len(header)) + 1
    wanted = [c for c in header if keep is None or c in keep]
    columns: dict[str, np.ndarray] | None = None  # the first block's, until a second comes
    n = 0
    try:
        for batch in _batches(source, start, types, None if keep is None else wanted):
            block = _block_columns(batch)
            if block is None:
                return None
            m = len(next(iter(block.values()))) if block else 0
            if columns is None:
                columns, n = block, m
                continue
            if n + m > most:
                return None
            if len(next(iter(columns.values()), ())) < most:  # room for every row
                room = {c: np.empty(most, dtype=NUMPY_TYPES[c]) for c in wanted}
                for c in wanted:
                    room[c][:n] = columns[c][:n]
                columns = room
            for c in wanted:
                columns[c][n : n + m] = block[c]
            n += m
    except (pa.ArrowInvalid, OSError):
        return None
    if columns is None:
        return {c: np.empty(0, dtype=NUMPY_TYPES[c]) for c in wanted}
    return {c: a[:n] for c, a in columns.items()}


def _block_columns(batch: Block) -> dict[str, np.ndarray] | None:
    """A block's columns as numpy arrays (no copy); None when pyarrow's has nulls."""
    if isinstance(batch, dict):
        return batch
    if any(column.null_count for column in batch.columns):
        return None
    return {
        name: _values(column, NUMPY_TYPES[name])
        for name, column in zip(batch.schema.names, batch.columns, strict=True)
    }


def _values(column: pa.Array, dtype: np.dtype) -> np.ndarray:
    """A primitive Arrow array without nulls as a numpy view of its buffer (pyarrow's own
    conversion imports pandas to look for extension types)."""
    return np.frombuffer(
        column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize
    )


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
    import pandas as pd
    import pyarrow.compute as pc

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
    import pandas as pd

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
