"""Convert a row-format file between its CSV form and Parquet (``bmoe convert``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bmoe.errors import BmoeError
from bmoe.formats.csvtable import PathLike
from bmoe.formats.errors import FormatError
from bmoe.formats.load import detect_kind, load_file, write_parquet
from bmoe.formats.outputs import check_output, same_file

TARGETS = ("parquet", "csv")


def _writer(obj):
    from bmoe.formats.metrics import MetricsRun, write_metrics
    from bmoe.formats.op_traces import ComputeTrace, write_compute_trace, write_io_trace
    from bmoe.formats.route import RouteTrace, write_route_trace

    if isinstance(obj, MetricsRun):
        return write_metrics
    if isinstance(obj, RouteTrace):
        return write_route_trace
    if isinstance(obj, ComputeTrace):
        return write_compute_trace
    return write_io_trace


def output_path(source: PathLike, to: str, out_dir: PathLike | None = None) -> Path:
    """Where :func:`convert_file` writes: the source's name with the target's suffix."""
    src = Path(source)
    suffix = ".parquet" if to == "parquet" else ".csv"
    return Path(out_dir or src.parent) / (src.stem + suffix)


def convert_file(
    source: PathLike,
    to: str = "parquet",
    out_dir: PathLike | None = None,
    *,
    force: bool = True,
    inputs: Sequence[PathLike] = (),
) -> Path:
    """Write `source` (a metrics CSV or a route / compute / io trace, CSV or Parquet) as `to`.

    Returns the path written. Parquet keeps the preamble and summaries in the schema metadata,
    so converting back to CSV gives the original bytes. The output is never `source` or one of
    `inputs` (the other files of the same command); without `force` it must not exist yet.
    """
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace

    if to not in TARGETS:
        raise BmoeError(f"cannot convert to {to!r} (choose {' or '.join(TARGETS)})")
    kind = detect_kind(source)
    if kind not in ("metrics", "route", "compute", "io", "parquet"):
        obj = None
    else:
        obj = load_file(source, kind)
    if not isinstance(obj, MetricsRun | RouteTrace | ComputeTrace | IoTrace):
        what = f"a {kind} file" if kind else "an unrecognised file"
        raise FormatError(
            str(source), None, f"is {what}; only metrics CSVs and route/compute/io traces convert"
        )
    dest = output_path(source, to, out_dir)
    if same_file(dest, source):
        raise FormatError(str(source), None, f"is already {to}; nothing to convert")
    check_output(dest, [source, *inputs], force=force)
    try:
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
        if to == "parquet":
            return write_parquet(obj, dest)
        _writer(obj)(obj, dest)
    except OSError as exc:
        raise FormatError(str(dest), None, f"cannot write: {exc.strerror or exc}") from None
    return dest
