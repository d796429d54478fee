"""One entry point for every format: detect, then read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bmoe.errors import BmoeError
from bmoe.formats import parquet
from bmoe.formats.csvtable import BOM, PathLike
from bmoe.formats.detect import detect_bytes
from bmoe.formats.errors import FormatError
from bmoe.formats.inputs import regular_file

if TYPE_CHECKING:
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace

    #: A file of one of the row formats (the ones with a Parquet form).
    RowFile = MetricsRun | RouteTrace | ComputeTrace | IoTrace

HEAD_BYTES = 65536


def row_classes() -> dict[str, type]:
    """The class of each row format's parsed file, by kind (the kinds with a Parquet form)."""
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace

    return {"metrics": MetricsRun, "route": RouteTrace, "compute": ComputeTrace, "io": IoTrace}


def row_kind(obj: object) -> str:
    """The kind of a parsed row-format file (``metrics``, ``route``, ``compute``, ``io``)."""
    for kind, cls in row_classes().items():
        if isinstance(obj, cls):
            return kind
    raise TypeError(f"no Parquet form for {type(obj).__name__}")


def write_parquet(obj: RowFile, dest: str | os.PathLike) -> Path:
    """Write a parsed metrics CSV or trace as Parquet (zstd); returns the path written."""
    return parquet.write_table(obj, row_kind(obj), dest)


def read_parquet(source: PathLike | bytes, kind: str | None = None) -> RowFile:
    """Read a Parquet file written by :func:`write_parquet` back into its typed object
    (a `kind` file, when given)."""
    found = parquet.parquet_kind(source)
    if found is None or (kind is not None and found != kind):
        parquet.read_parts(source, kind)  # raises the FormatError that says what is wrong
    return readers()[kind or str(found)](source)


def readers() -> dict[str, Any]:
    """The reader of each kind :func:`~bmoe.formats.detect.detect` returns."""
    from bmoe.formats.metrics import read_metrics
    from bmoe.formats.op_traces import read_compute_trace, read_io_trace
    from bmoe.formats.route import read_route_trace
    from bmoe.formats.runlog import read_run_output
    from bmoe.formats.sidecar import read_pressure, read_state

    return {
        "metrics": read_metrics,
        "route": read_route_trace,
        "compute": read_compute_trace,
        "io": read_io_trace,
        "protocol": read_run_output,
        "log": read_run_output,
        "pressure": read_pressure,
        "state": read_state,
    }


def load_file(path: PathLike, kind: str | None = None) -> Any:
    """Read `path` as `kind` (detected from the content when not given)."""
    name = str(path)
    if kind is None:
        kind = detect_kind(path)
    if kind is None:
        head = read_head(path, 4096)
        if not head.removeprefix(BOM).strip():
            raise FormatError(name, None, "file is empty")
        if b"\x00" in head:
            raise FormatError(name, None, "binary data, not a telemetry file")
        raise FormatError(name, None, "not a telemetry file bmoe knows (unrecognised content)")
    if kind == "parquet":
        return read_parquet(path)
    table = readers()
    if kind not in table:
        raise FormatError(name, None, f"{kind} files have no reader yet")
    return table[kind](path)


def detect_kind(path: PathLike) -> str | None:
    """The kind of the file at `path` (see :func:`~bmoe.formats.detect.detect_bytes`); the
    end of a long log is looked at too, since its run lines come last."""
    head = read_head(path)
    kind = detect_bytes(head)
    if kind is None and len(head) == HEAD_BYTES:
        tail = read_tail(path)
        if detect_bytes(tail) == "log":
            kind = "log"
    return kind


def content_kind(path: PathLike) -> str | None:
    """What the file at `path` holds (see :data:`~bmoe.formats.detect.KINDS`), the kind inside
    a Parquet file included (from its schema metadata); None when it is none of ours or cannot
    be read."""
    try:
        kind = detect_kind(path)
    except (OSError, FormatError):
        return None
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(os.fspath(path)).metadata or {}
        except Exception:  # any unreadable Parquet: not ours
            return None
        kind = meta.get(parquet.KIND, b"").decode() or None
    return kind


def read_tail(path: PathLike, size: int = 16384) -> bytes:
    """The last `size` bytes of `path`, from a line start."""
    with open(regular_file(path), "rb") as fh:
        fh.seek(0, 2)
        end = fh.tell()
        fh.seek(max(0, end - size))
        data = fh.read()
    cut = data.find(b"\n")
    return data[cut + 1 :] if end > size and cut >= 0 else data


def read_head(path: PathLike, size: int = HEAD_BYTES) -> bytes:
    """The first `size` bytes of `path`, with missing files and directories as FormatError."""
    try:
        with open(regular_file(path), "rb") as fh:
            return fh.read(size)
    except FileNotFoundError:
        raise FormatError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise FormatError(str(path), None, "is a directory, not a file") from None
    except OSError as exc:
        raise FormatError(str(path), None, f"cannot read: {exc.strerror or exc}") from None


def metrics_paths(paths: list[os.PathLike | str]) -> list[Path]:
    """The metrics files among `paths` and inside the folders among them (recursively, by
    content: ``.csv``, ``.metrics`` and ``.parquet`` files that read as metrics; a file named
    directly is taken whatever its name)."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            candidates = [path]
        else:
            raise BmoeError(f"{path}: no such file or folder")
        for candidate in candidates:
            if candidate.suffix in (".csv", ".metrics", ".parquet") or candidate == path:
                try:
                    kind = detect_bytes(read_head(candidate, 4096))
                except OSError:
                    continue
                if kind == "metrics":
                    found.append(candidate)
    return found
