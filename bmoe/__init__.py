"""bmoe: benchmark and analysis toolkit for mixture-of-experts models streaming experts from flash.

Open anything with :func:`load`; the analyses live in :mod:`bmoe.analyze`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def load(path: str | Path) -> Any:
    """Read any telemetry file, whatever its format (detected from content, not name).

    Returns a :class:`~bmoe.formats.metrics.MetricsRun`, :class:`~bmoe.formats.route.RouteTrace`,
    :class:`~bmoe.formats.decode.ComputeTrace` or :class:`~bmoe.formats.decode.IoTrace`.
    """
    from bmoe.formats.load import load_file

    return load_file(path)


def load_archive(path: str | Path) -> Any:
    """A sweep folder's results: one row per attempt (parameters, target, entry state, summary
    figures, pressure), as :func:`bmoe.sweep.archive.load_results` reads them."""
    from bmoe.sweep.archive import load_results

    return load_results(Path(path))


__all__ = ["__version__", "load", "load_archive"]
