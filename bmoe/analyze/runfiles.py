"""A metrics CSV together with what was recorded beside it.

A run's meaning depends on its neighbours: the ``.metrics`` pressure sidecar (same stem) adds
the device's pressure table, and a route, compute or io trace written alongside
(``<stem>.route.csv``, ``<stem>.io.csv``, ...) means the run was instrumented, so its
timings are not benchmark figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bmoe.formats.archive import files_beside
from bmoe.formats.csvtable import PathLike
from bmoe.formats.detect import detect_bytes
from bmoe.formats.load import read_head
from bmoe.formats.metrics import MetricsRun, read_metrics
from bmoe.formats.sidecar import pressure_sidecar_for, read_pressure

TRACE_KINDS = ("route", "compute", "io")


@dataclass
class RunFiles:
    """One run: its metrics, its pressure sidecar (or None) and the traces recorded with it."""

    run: MetricsRun
    pressure: dict[str, Any] | None = None
    traces: list[str] = field(default_factory=list)

    @property
    def path(self) -> str | None:
        return self.run.path


def traces_beside(path: PathLike) -> list[str]:
    """Route / compute / io traces among the files recorded beside the metrics file `path`
    (:func:`bmoe.formats.archive.files_beside`)."""
    found = []
    for sibling in files_beside(path):
        if sibling.suffix in (".metrics", ".log", ".state", ".out", ".err", ".png"):
            continue
        try:
            kind = detect_bytes(read_head(sibling, 4096))
        except OSError:
            continue
        if kind in TRACE_KINDS:
            found.append(str(sibling))
    return found


def read_with_pressure(path: PathLike) -> tuple[MetricsRun, dict[str, Any] | None]:
    """A metrics file and its ``.metrics`` pressure sidecar's figures (None without one)."""
    run = read_metrics(path)
    sidecar = pressure_sidecar_for(path)
    return run, read_pressure(sidecar) if sidecar else None


def load_run_files(path: PathLike) -> RunFiles:
    """Read a metrics CSV, its ``.metrics`` sidecar and the list of traces recorded with it."""
    run, pressure = read_with_pressure(path)
    return RunFiles(run, pressure, traces_beside(path))


__all__ = ["RunFiles", "load_run_files", "read_with_pressure", "traces_beside"]
