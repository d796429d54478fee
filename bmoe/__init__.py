"""bmoe: benchmark and analysis toolkit for mixture-of-experts models streaming experts from flash.

Open anything with :func:`load` (a file) or :func:`load_archive` (a sweep folder, or a folder
of loose engine files); the analyses live in :mod:`bmoe.analyze`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bmoe._version import __version__

if TYPE_CHECKING:
    from bmoe.sweep.reader import Archive


def load(path: str | Path) -> Any:
    """Read any telemetry file, whatever its format (detected from content, not name).

    Returns a :class:`~bmoe.formats.metrics.MetricsRun`, :class:`~bmoe.formats.route.RouteTrace`,
    :class:`~bmoe.formats.op_traces.ComputeTrace`, :class:`~bmoe.formats.op_traces.IoTrace`, a
    :class:`~bmoe.formats.runlog.RunOutput` (``--progress`` / ``--session`` streams and run
    logs), the pressure sidecar's figures (dict) or a ``.state`` snapshot; the Parquet form of
    a row format reads as the same object. A folder opens as :func:`load_archive`.
    """
    if Path(path).is_dir():
        return load_archive(path)
    from bmoe.formats.load import load_file

    return load_file(path)


def load_archive(path: str | Path) -> Archive:
    """An archived sweep folder (or a folder of loose engine files) as a
    :class:`~bmoe.sweep.reader.Archive`: ``.cells`` (one row per run attempt: parameters,
    entry state, outcomes), and each run's metrics and traces read lazily by cell or run id
    (``.metrics(cell)``, ``.trace(cell, "route")``, ``.run(cell, repeat)``)."""
    from bmoe.sweep.reader import open_archive

    return open_archive(path)


__all__ = ["__version__", "load", "load_archive"]
