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

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bmoe.formats.errors import FormatError
from bmoe.formats.inputs import is_regular_file, regular_file

if TYPE_CHECKING:
    import pandas as pd

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


def _open(source: Any, columns: frozenset[str] | None = None) -> tuple[pa.Table, str | None]:
    import pyarrow.parquet as pq

    name = None if isinstance(source, bytes | bytearray | memoryview) else str(source)
    src = pa.BufferReader(bytes(source)) if name is None else regular_file(name)
    try:
        if columns is None:
            return pq.read_table(src), name
        # only the columns asked for are decoded (the metadata comes with the schema)
        names = pq.read_schema(pa.BufferReader(bytes(source)) if name is None else name).names
        return pq.read_table(src, columns=[c for c in names if c in columns]), name
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None


def _metadata(table: pa.Table, name: str | None, want: str | None) -> dict[bytes, bytes]:
    meta = dict(table.schema.metadata or {})
    kind = meta.get(KIND, b"").decode()
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
    except json.JSONDecodeError:
        raise FormatError(name, None, f"corrupt {key.decode()} in the Parquet metadata") from None


def release_unused() -> None:
    """Hand the memory Arrow's pool holds but no longer uses back to the system. Rows read
    from Parquet live in that pool: dropping them frees nothing visible until this runs."""
    pa.default_memory_pool().release_unused()


def _rows(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    # The decoded columns are freed into Arrow's pool, which keeps them unless told: a
    # 10 M-row trace would hold ~140 MiB it no longer uses through everything that follows.
    release_unused()
    return frame


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
) -> ParquetParts:
    """Read a Parquet file written by :func:`write_table` (of `kind`, when given); with
    `columns`, only those of its row columns. `source` may be a table read already (from
    the file `name`)."""
    if isinstance(source, pa.Table):
        table = source
    else:
        table, name = _open(source, columns)
    meta = _metadata(table, name, kind)
    found = meta[KIND].decode()
    try:
        version = int(meta.get(VERSION, b"0"))
    except ValueError:
        raise FormatError(name, None, "corrupt bmoe.version in the Parquet metadata") from None
    parts = ParquetParts(
        kind=found,
        name=name,
        version=version,
        meta=_json(meta, META, {}, name),
        rows=_rows(table),
        warnings=_json(meta, WARNINGS, [], name),
    )
    if found == "metrics":
        parts.summaries = _json(meta, SUMMARIES, [], name)
    if found == "route":
        layers = meta.get(LAYERS, b'[{"name": "layer", "dtype": "int64", "values": []}]')
        parts.layers = _frame_from_json(layers.decode())
    return parts


def read_meta(source: str | os.PathLike, kind: str | None = None) -> ParquetParts:
    """What :func:`read_parts` gives, its rows left on disk (an empty frame of the columns):
    only the footer is read."""
    import pyarrow.parquet as pq

    name = str(source)
    try:
        schema = pq.read_schema(regular_file(name))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None
    return read_parts(schema.empty_table(), kind, name=name)


def iter_rows(
    source: str | os.PathLike, rows: int, columns: frozenset[str] | None = None
) -> Iterator[pd.DataFrame]:
    """The rows of a bmoe Parquet file in blocks of `rows` (only `columns`, when given), read
    from disk as they are used."""
    import pyarrow.parquet as pq

    name = str(source)
    try:
        # without pre-buffering: with it, memory grows with the row groups read (~100 MiB
        # over 100 M rows), without it, it stays that of one batch
        fh = pq.ParquetFile(regular_file(name), pre_buffer=False)
        keep = None if columns is None else [c for c in fh.schema_arrow.names if c in columns]
        for batch in fh.iter_batches(batch_size=rows, columns=keep):
            yield batch.to_pandas()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(name, None, f"unreadable Parquet ({str(exc).splitlines()[0]})") from None


def parquet_kind(source: Any) -> str | None:
    """The kind recorded in a Parquet file's metadata, without reading its rows."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(
            source if not isinstance(source, bytes) else pa.BufferReader(source)
        )
    except (pa.ArrowException, OSError, ValueError):
        return None
    kind = (schema.metadata or {}).get(KIND, b"").decode()
    return kind if kind in KINDS else None
