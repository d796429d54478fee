"""Parsing and writing of every telemetry format; nothing else lives here."""

from bmoe.formats.errors import FormatError, FormatWarning
from bmoe.formats.metrics import MetricsRun, read_metrics, write_metrics

__all__ = ["FormatError", "FormatWarning", "MetricsRun", "read_metrics", "write_metrics"]
