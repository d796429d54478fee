"""Parsing and writing of every telemetry format; nothing else lives here.

The names below load on first use, so a module that needs only the protocol or a file's
preamble (``bmoe info`` on a small file) imports no pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bmoe.formats.errors import FormatError, FormatWarning
    from bmoe.formats.metrics import MetricsRun, read_metrics, write_metrics

__all__ = ["FormatError", "FormatWarning", "MetricsRun", "read_metrics", "write_metrics"]

_HOMES = {
    "FormatError": "errors",
    "FormatWarning": "errors",
    "MetricsRun": "metrics",
    "read_metrics": "metrics",
    "write_metrics": "metrics",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'bmoe.formats' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"bmoe.formats.{home}"), name)
