"""Parquet form of the row formats, with everything that is not a row kept in the schema metadata.

A metrics CSV or a route / compute / io trace becomes one Parquet table of its rows (the same
compact dtypes) whose schema metadata carries the rest under ``bmoe.*`` keys: the kind, the
format version, the preamble (typed, as JSON), the summary trailers, the route trace's
per-layer sizes, the reader's warnings and the source file name. The readers accept such a file
wherever they accept the CSV and return an equal object.

This module knows the table and its metadata, not the row classes: it reads a file into
:class:`ParquetParts`, from which each reader builds its own object, and writes any object with
the row-file attributes under the kind its caller names (:mod:`bmoe.formats.load` keeps the map
from kind to class).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bmoe.formats import kv
from bmoe.formats.errors import FormatError
from bmoe.formats.inputs import check_room, is_regular_file, regular_file
from bmoe.formats.lazy import lazy_module

if TYPE_CHECKING:
    import json

    import pandas as pd
    import pyarrow as pa
else:  # imported when a Parquet file is read or written (telling one costs nothing)
    json = lazy_module("json")
    pa = lazy_module("pyarrow")

MAGIC = b"PAR1"
#: Schema metadata keys (all values are UTF-8 JSON except kind and version).
KIND = b"bmoe.kind"
VERSION = b"bmoe.version"
META = b"bmoe.meta"
SUMMARIES = b"bmoe.summaries"
LAYERS = b"bmoe.layers"
WARNINGS = b"bmoe.warnings"
SOURCE = b"bmoe.source"
KINDS = ("metrics", "route", "compute", "io")


def is_parquet(source: Any) -> bool:
    """Whether `source` (a path or bytes) starts like a Parquet file."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source[:4]) == MAGIC
    if not is_regular_file(source):
        return False  # the reader it falls through to names the problem
    try:
        with open(source, "rb") as fh:
            return fh.read(4) == MAGIC
    except (OSError, TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- writing


def _frame_json(frame: pd.DataFrame) -> str:
    """A small DataFrame as JSON that rebuilds it with the same dtypes."""
    return json.dumps(
        [
            {"name": str(c), "dtype": str(frame[c].dtype), "values": frame[c].tolist()}
            for c in frame.columns
        ]
    )


def _frame_from_json(text: str) -> pd.DataFrame:
    import pandas as pd

    columns = json.loads(text)
    return pd.DataFrame(
        {c["name"]: pd.Series(c["values"], dtype=c["dtype"]) for c in columns},
        columns=[c["name"] for c in columns],
    )


def to_table(obj: Any, kind: str) -> pa.Table:
    """The Arrow table of a parsed file of `kind`: its rows, with the rest in the schema metadata.

    `obj` has ``rows``, ``version``, ``warnings``, ``path``, and ``params`` and ``summaries``
    (metrics) or ``meta`` (traces; a route trace has ``layers`` too).
    """
    if kind not in KINDS:
        raise TypeError(f"no Parquet form for a {kind} file")
    table = pa.Table.from_pandas(obj.rows, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[KIND] = kind.encode()
    meta[VERSION] = str(obj.version).encode()
    meta[META] = json.dumps(obj.params if kind == "metrics" else obj.meta).encode()
    meta[WARNINGS] = json.dumps(list(obj.warnings)).encode()
    if obj.path:
        meta[SOURCE] = os.path.basename(str(obj.path)).encode()
    if kind == "metrics":
        meta[SUMMARIES] = json.dumps(obj.summaries).encode()
    if kind == "route":
        meta[LAYERS] = _frame_json(obj.layers).encode()
    return table.replace_schema_metadata(meta)


def write_table(obj: Any, kind: str, dest: str | os.PathLike) -> Path:
    """Write a parsed file of `kind` as Parquet (zstd); returns the path written."""
    import pyarrow.parquet as pq  # here: only Parquet input and output pay its import

    dest = Path(dest)
    pq.write_table(to_table(obj, kind), dest, compression="zstd")
    return dest


# ----------------------------------------------------------------------------- reading
# A Parquet file may come from anywhere (another tool, a hand edit): its schema and metadata
# are checked once, here, where it is opened, against what the CSV reader of its kind would
# produce (the reader passes its :class:`RowSchema`), with that reader's messages.


@dataclass(frozen=True)
class RowSchema:
    """What a kind's rows must be: the compact type of each known column, the columns the
    reader requires, and the id columns whose values must fit 32 bits."""

    types: Mapping[str, pa.DataType]
    required: tuple[str, ...] = ()
    int32: tuple[str, ...] = ()


#: The highest format version a bmoe Parquet file can record (the CSV versions are small).
MAX_VERSION = 1000


def _open(
    source: Any,
    columns: frozenset[str] | None = None,
    schema: RowSchema | None = None,
    kind: str | None = None,
) -> tuple[pa.Table, str | None, list[str]]:
    """The table (only `columns`, when given), its file name and every column it has (the
    kind it records and its column names checked against `kind` and `schema` before any
    column is read)."""
    import pyarrow.parquet as pq

    name = None if isinstance(source, bytes | bytearray | memoryview) else str(source)
    src = pa.BufferReader(bytes(source)) if name is None else regular_file(name)
    try:
        found = pq.read_schema(pa.BufferReader(bytes(source)) if name is None else src)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None
    names = found.names
    _metadata(found, name, kind)
    if schema is not None:
        check_names(names, schema, name)
    keep = None if columns is None else [c for c in names if c in columns]
    if name is not None:
        try:
            meta = pq.read_metadata(src)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise FormatError(
                name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})"
            ) from None
        _check_size(meta, found, keep, name)
    try:
        return pq.read_table(src, columns=keep), name, names
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None


def _check_size(meta: Any, schema: pa.Schema, keep: list[str] | None, path: str) -> None:
    """Refuse a file whose rows, once read (Arrow, then a DataFrame), would not fit in what
    the process may still take: priced from the footer (rows x each column's width; a
    column of variable width at its uncompressed size), so a few MB of well-compressed
    Parquet cannot declare their way to a failed malloc at many GB."""
    wanted = schema.names if keep is None else keep
    width = 0
    varying = set()
    for column in schema:
        if column.name not in wanted:
            continue
        try:
            width += max(1, column.type.bit_width // 8)
        except ValueError:  # strings, lists: no fixed width
            varying.add(column.name)
    extra = 0
    if varying:
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema in varying:
                    extra += chunk.total_uncompressed_size
    check_room(path, 2 * (meta.num_rows * width + extra), f"its {meta.num_rows:,} rows")


def check_names(names: list[str], schema: RowSchema, path: str | None) -> None:
    """The file's columns: every required one there, none twice (the CSV reader's messages)."""
    missing = [c for c in schema.required if c not in names]
    if missing:
        raise FormatError(path, None, f"header lacks required column(s): {', '.join(missing)}")
    dupes = sorted({c for c in names if names.count(c) > 1})
    if dupes:
        raise FormatError(path, None, f"duplicate column(s): {', '.join(dupes)}")


def _metadata(
    table: pa.Table | pa.Schema, name: str | None, want: str | None
) -> dict[bytes, bytes]:
    schema = table if isinstance(table, pa.Schema) else table.schema
    meta = dict(schema.metadata or {})
    kind = meta.get(KIND, b"").decode("utf-8", "replace")
    if kind not in KINDS:
        raise FormatError(name, None, "Parquet file without bmoe metadata (not written by bmoe)")
    if want is not None and kind != want:
        raise FormatError(name, None, f"Parquet file holds a {kind} file, not a {want} file")
    return meta


def _json(meta: dict[bytes, bytes], key: bytes, default: Any, name: str | None) -> Any:
    if key not in meta:
        return default
    try:
        return json.loads(meta[key])
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        raise FormatError(name, None, f"corrupt {key.decode()} in the Parquet metadata") from None


def _corrupt(key: bytes, name: str | None, why: str) -> FormatError:
    return FormatError(name, None, f"corrupt {key.decode()} in the Parquet metadata ({why})")


_SCALAR = (str, int, float, bool, type(None))


def _facts(
    value: Any, key: bytes, name: str | None, what: str, contract: bool = True
) -> dict[str, Any]:
    """A preamble or summary from the metadata: an object of plain values, each (with
    `contract`) within what the contract allows its key, as the CSV reader checks a
    preamble's ``key=value`` line."""
    if not isinstance(value, dict):
        raise _corrupt(key, name, f"{what} is not an object")
    for k, v in value.items():
        if not isinstance(v, _SCALAR):
            raise _corrupt(key, name, f"{what} {k!r} is not a plain value")
        problem = kv.contract_problem(k, v) if contract else None
        if problem is not None:
            raise FormatError(name, None, problem)
    return value


def _version(meta: dict[bytes, bytes], name: str | None) -> int:
    try:
        version = int(meta.get(VERSION, b"0"))
    except ValueError:
        raise FormatError(name, None, "corrupt bmoe.version in the Parquet metadata") from None
    if not 0 <= version <= MAX_VERSION:
        raise _corrupt(VERSION, name, f"version {version}")
    return version


def _warnings(meta: dict[bytes, bytes], name: str | None) -> list[str]:
    found = _json(meta, WARNINGS, [], name)
    if not isinstance(found, list) or not all(isinstance(w, str) for w in found):
        raise _corrupt(WARNINGS, name, "not a list of texts")
    return found


def _summaries(meta: dict[bytes, bytes], name: str | None) -> list[dict[str, Any]]:
    found = _json(meta, SUMMARIES, [], name)
    if not isinstance(found, list):
        raise _corrupt(SUMMARIES, name, "not a list")
    return [_facts(item, SUMMARIES, name, "a summary", contract=False) for item in found]


#: dtypes the per-layer sizes may be stored as.
_LAYER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "float32", "float64"})


def _layers(meta: dict[bytes, bytes], name: str | None) -> pd.DataFrame:
    """A route trace's per-layer sizes: columns of plain numbers, ``layer`` indices among them."""
    raw = meta.get(LAYERS, b'[{"name": "layer", "dtype": "int64", "values": []}]')
    found = _json({LAYERS: raw}, LAYERS, [], name)
    if not isinstance(found, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("values"), list)
        and c.get("dtype") in _LAYER_DTYPES
        for c in found
    ):  # fmt: skip
        raise _corrupt(LAYERS, name, "not columns of numbers")
    lengths = {len(c["values"]) for c in found}
    if len(lengths) > 1:
        raise _corrupt(LAYERS, name, "columns of different lengths")
    for column in found:
        for v in column["values"]:
            if v is None or isinstance(v, bool) or not isinstance(v, int | float):
                raise _corrupt(LAYERS, name, f"{column['name']} holds {v!r}")
            problem = kv.contract_problem(column["name"], v)
            if problem is not None:
                raise FormatError(name, None, problem)
    if found and "layer" not in {c["name"] for c in found}:
        raise _corrupt(LAYERS, name, "no layer column")
    try:
        return _frame_from_json(json.dumps(found))
    except (ValueError, TypeError, OverflowError) as exc:
        raise _corrupt(LAYERS, name, str(exc).splitlines()[0][:60]) from None


def release_unused() -> None:
    """Hand the memory Arrow's pool holds but no longer uses back to the system. Rows read
    from Parquet live in that pool: dropping them frees nothing visible until this runs
    (nothing to do where pyarrow was never imported)."""
    if "pyarrow" in sys.modules:
        pa.default_memory_pool().release_unused()


def _rows(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    # The decoded columns are freed into Arrow's pool, which keeps them unless told: a
    # 10 M-row trace would hold ~140 MiB it no longer uses through everything that follows.
    release_unused()
    return frame


def _first(mask: pa.Array | pa.ChunkedArray) -> int:
    """0-based index of the first true value of a boolean array."""
    import pyarrow.compute as pc

    return int(pc.index(mask, True).as_py())


def _refused(name: str | None, column: str, row: int, value: Any, what: str) -> FormatError:
    return FormatError(name, None, f"column {column!r}, row {row + 1}: {value!r} is not {what}")


def _plain_type(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
        or pa.types.is_string(kind) or pa.types.is_large_string(kind)
        or (pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type))
    )  # fmt: skip


def _kind(kind: pa.DataType) -> str:
    """What a column holds, in a message."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
        return "text"
    if pa.types.is_boolean(kind):
        return "true/false"
    if pa.types.is_integer(kind):
        return "integers"
    if pa.types.is_floating(kind):
        return "numbers"
    return f"{kind} values"


def _column(column: pa.ChunkedArray, name: str, want: pa.DataType, path: str | None):
    """`column` as the CSV reader would type it (`want`), or the FormatError saying why not."""
    import pyarrow.compute as pc

    have = column.type
    if pa.types.is_integer(want):
        if pa.types.is_floating(have):
            whole = pc.equal(pc.round(column), column)
            inside = pc.less_equal(pc.abs(column), 9.2e18)  # an int64 holds it
            bad = pc.fill_null(pc.invert(pc.and_(whole, inside)), True)
            if pc.any(bad).as_py():
                row = _first(bad)
                return _refused(path, name, row, column[row].as_py(), "an integer")
            column = pc.cast(column, pa.int64(), safe=False)
            have = column.type
        elif not pa.types.is_integer(have):
            return FormatError(
                path, None, f"column {name!r} holds {_kind(have)} where integers belong"
            )
        if column.null_count:
            row = _first(pc.is_null(column))
            return _refused(path, name, row, None, "an integer")
        try:
            return pc.cast(column, want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return pc.cast(column, pa.int64())  # wider than the compact type: widened
    if pa.types.is_floating(want):
        if not (pa.types.is_integer(have) or pa.types.is_floating(have)):
            return FormatError(
                path, None, f"column {name!r} holds {_kind(have)} where numbers belong"
            )
        return pc.cast(column, want, safe=False)  # an int64 beyond 2**53 rounds, as CSV text
    if pa.types.is_dictionary(want) or pa.types.is_string(want):
        text = have
        if pa.types.is_dictionary(have):
            text = have.value_type
        if not (pa.types.is_string(text) or pa.types.is_large_string(text)):
            return FormatError(
                path, None, f"column {name!r} holds {_kind(have)} where text belongs"
            )
        if column.null_count:
            row = _first(pc.is_null(column))
            return _refused(path, name, row, None, "text")
        return pc.cast(pc.cast(column, pa.string()) if text != pa.string() else column, want)
    return pc.cast(column, want)


def conform(table: pa.Table, schema: RowSchema, names: list[str], path: str | None) -> pa.Table:
    """`table` checked and typed as the CSV reader of its kind would type it: the required
    columns present (among `names`, every column of the file), no column twice, each known
    column of its compact type (integers widened where the file's values do not fit it), ids
    within 32 bits, nothing but plain values anywhere. The CSV reader's messages, with rows
    where it gives lines."""
    import pyarrow.compute as pc

    check_names(names, schema, path)
    for i, field_ in enumerate(table.schema):
        want = schema.types.get(field_.name)
        if want is None:
            if not _plain_type(field_.type):
                raise FormatError(
                    path, None, f"column {field_.name!r} holds {field_.type}, not plain values"
                )
            continue
        typed = _column(table.column(i), field_.name, want, path)
        if isinstance(typed, FormatError):
            raise typed
        if field_.name in schema.int32 and typed.type == pa.int64() and len(typed):
            bad = pc.or_(pc.less(typed, -(2**31)), pc.greater(typed, 2**31 - 1))
            if pc.any(bad).as_py():
                row = _first(bad)
                raise FormatError(
                    path, None, f"row {row + 1}: {field_.name}={typed[row].as_py()} is beyond "
                    "the 32-bit range of the contract",
                )  # fmt: skip
        if typed.type != field_.type:
            table = table.set_column(i, field_.name, typed)
    return table


@dataclass
class ParquetParts:
    """What a bmoe Parquet file holds: the rows and the metadata each reader builds from.

    `meta` is the typed preamble (a metrics file's ``params``, a trace's ``meta``);
    `summaries` is only in metrics files, `layers` only in route traces.
    """

    kind: str
    name: str | None
    version: int
    meta: dict[str, Any]
    rows: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    layers: pd.DataFrame = field(default_factory=lambda: _frame_from_json("[]"))


def read_parts(
    source: Any,
    kind: str | None = None,
    columns: frozenset[str] | None = None,
    *,
    name: str | None = None,
    schema: RowSchema | None = None,
) -> ParquetParts:
    """Read a Parquet file written by :func:`write_table` (of `kind`, when given); with
    `columns`, only those of its row columns. `source` may be a table read already (from
    the file `name`). With `schema` (the reader's), the rows are checked and typed by
    :func:`conform`; the metadata is always checked."""
    if isinstance(source, pa.Table):
        table, names = source, source.column_names
    else:
        table, name, names = _open(source, columns, schema, kind)
    meta = _metadata(table, name, kind)
    found = meta[KIND].decode()
    version = _version(meta, name)
    facts = _facts(_json(meta, META, {}, name), META, name, "the preamble")
    warnings = _warnings(meta, name)
    summaries = _summaries(meta, name) if found == "metrics" else []
    layers = _layers(meta, name) if found == "route" else None
    if schema is not None:
        table = conform(table, schema, names, name)
    parts = ParquetParts(
        kind=found, name=name, version=version, meta=facts, rows=_rows(table), warnings=warnings
    )
    parts.summaries = summaries
    if layers is not None:
        parts.layers = layers
    return parts


def read_meta(
    source: str | os.PathLike, kind: str | None = None, schema: RowSchema | None = None
) -> ParquetParts:
    """What :func:`read_parts` gives, its rows left on disk (an empty frame of the columns):
    only the footer is read."""
    import pyarrow.parquet as pq

    name = str(source)
    try:
        found = pq.read_schema(regular_file(name))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None
    return read_parts(found.empty_table(), kind, name=name, schema=schema)


def iter_rows(
    source: str | os.PathLike,
    rows: int,
    columns: frozenset[str] | None = None,
    schema: RowSchema | None = None,
) -> Iterator[pd.DataFrame]:
    """The rows of a bmoe Parquet file in blocks of `rows` (only `columns`, when given), read
    from disk as they are used; each block checked and typed by :func:`conform` when a
    `schema` is given (with the file's metadata, once)."""
    import pyarrow.parquet as pq

    name = str(source)
    try:
        # without pre-buffering: with it, memory grows with the row groups read (~100 MiB
        # over 100 M rows), without it, it stays that of one batch
        fh = pq.ParquetFile(regular_file(name), pre_buffer=False)
        names = fh.schema_arrow.names
        _metadata(fh.schema_arrow, name, None)
        if schema is not None:
            check_names(names, schema, name)
        read_parts(fh.schema_arrow.empty_table(), None, name=name, schema=schema)
        keep = None if columns is None else [c for c in names if c in columns]
        for batch in fh.iter_batches(batch_size=rows, columns=keep):
            table = pa.Table.from_batches([batch])
            if schema is not None:
                table = conform(table, schema, names, name)
            yield table.to_pandas()
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None


def iter_columns(
    source: str | os.PathLike,
    rows: int,
    columns: frozenset[str] | None = None,
    schema: RowSchema | None = None,
) -> Iterator[dict[str, Any]]:
    """:func:`iter_rows` as numpy columns (name -> array): each batch's arrays as they are
    (a view of a primitive column without nulls), no DataFrame built."""
    import numpy as np

    name = str(source)
    try:
        fh = pq_file(name)
        names = fh.schema_arrow.names
        _metadata(fh.schema_arrow, name, None)
        if schema is not None:
            check_names(names, schema, name)
        read_parts(fh.schema_arrow.empty_table(), None, name=name, schema=schema)
        keep = None if columns is None else [c for c in names if c in columns]
        for batch in fh.iter_batches(batch_size=rows, columns=keep):
            table = pa.Table.from_batches([batch])
            if schema is not None:
                table = conform(table, schema, names, name)
            block = {}
            for field_, column in zip(table.schema, table.columns, strict=True):
                array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
                kind = field_.type
                if array.null_count == 0 and (
                    pa.types.is_integer(kind) or pa.types.is_floating(kind)
                ):
                    dtype = np.dtype(kind.to_pandas_dtype())
                    block[field_.name] = np.frombuffer(
                        array.buffers()[1], dtype=dtype, count=len(array),
                        offset=array.offset * dtype.itemsize,
                    )  # fmt: skip
                else:
                    block[field_.name] = table.column(field_.name).to_pandas().to_numpy()
            yield block
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None


def pq_file(name: str) -> Any:
    """The Parquet file at `name` opened for reading batch by batch."""
    import pyarrow.parquet as pq

    # without pre-buffering: with it, memory grows with the row groups read (~100 MiB over
    # 100 M rows), without it, it stays that of one batch
    return pq.ParquetFile(regular_file(name), pre_buffer=False)


def parquet_kind(source: Any) -> str | None:
    """The kind recorded in a Parquet file's metadata, without reading its rows."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(
            source if not isinstance(source, bytes) else pa.BufferReader(source)
        )
    except (pa.ArrowException, OSError, ValueError):
        return None
    kind = (schema.metadata or {}).get(KIND, b"").decode("utf-8", "replace")
    return kind if kind in KINDS else None
