"""One entry point for every format: detect, then read."""

from __future__ import annotations

from typing import Any

from bmoe.formats.csvtable import PathLike
from bmoe.formats.detect import detect_bytes
from bmoe.formats.errors import FormatError


def readers() -> dict[str, Any]:
    from bmoe.formats.decode import read_compute_trace, read_io_trace
    from bmoe.formats.metrics import read_metrics
    from bmoe.formats.route import read_route_trace

    return {
        "metrics": read_metrics,
        "route": read_route_trace,
        "compute": read_compute_trace,
        "io": read_io_trace,
    }


def load_file(path: PathLike, kind: str | None = None) -> Any:
    """Read `path` as `kind` (detected from the content when not given)."""
    name = str(path)
    head = read_head(path)
    kind = kind or detect_bytes(head)
    if kind is None:
        raise FormatError(name, None, "not a telemetry file bmoe knows (unrecognised content)")
    if kind == "parquet":
        from bmoe.formats.parquet import read_parquet

        return read_parquet(path)
    table = readers()
    if kind not in table:
        raise FormatError(name, None, f"{kind} files have no reader yet")
    return table[kind](path)


def read_head(path: PathLike, size: int = 65536) -> bytes:
    """The first `size` bytes of `path`, with missing files and directories as FormatError."""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except FileNotFoundError:
        raise FormatError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise FormatError(str(path), None, "is a directory, not a file") from None
    except OSError as exc:
        raise FormatError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
