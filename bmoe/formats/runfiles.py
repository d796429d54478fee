"""A metrics file together with what was recorded beside it, read.

A run's meaning depends on its neighbours: the ``.metrics`` pressure sidecar (same stem) adds
the device's pressure table, and a route, compute or io trace written alongside
(``<stem>.route.csv``, ``<stem>.io.csv``, ...) means the run was instrumented, so its
timings are not benchmark figures. A sweep's run folder adds its ``record.json``, and the
engine's ``.log`` / ``.out`` its end-of-run lines.

Two readers: :func:`load_run_files` (the metrics, the sidecar and the names of the traces:
what a table of many runs needs) and :func:`read_recorded_runs` (every file beside each run
read: what the device profile is built from). The analyses take what they return.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.archive import files_beside, find_metrics_files, record_of
from bmoe.formats.csvtable import PathLike
from bmoe.formats.detect import detect_bytes
from bmoe.formats.load import load_file, read_head
from bmoe.formats.metrics import MetricsRun, read_metrics
from bmoe.formats.sidecar import pressure_sidecar_for, read_pressure
from bmoe.units import MIB

TRACE_KINDS = ("route", "compute", "io")
#: The engine's output files beside a metrics file, in the order their figures are taken.
OUTPUT_SUFFIXES = (".log", ".out")
#: An output file larger than this is not a run's log (it is passed over).
MAX_OUTPUT_BYTES = 64 * MIB


@dataclass
class RunFiles:
    """One run: its metrics, its pressure sidecar (or None) and the traces recorded with it."""

    run: MetricsRun
    pressure: dict[str, Any] | None = None
    traces: list[str] = field(default_factory=list)

    @property
    def path(self) -> str | None:
        return self.run.path


@dataclass
class RecordedRun:
    """One run with every file recorded beside it read: its metrics, its traces by kind
    (``route``, ``io``, ``compute``), the sweep's ``record.json`` (None for a loose file),
    the end-of-run figures and pressure lines of its ``.log`` / ``.out`` (the sidecar's
    pressure under them) and the keys of the engine's ``expert streaming ON`` line."""

    metrics: MetricsRun
    traces: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    pressure: dict[str, Any] = field(default_factory=dict)
    streaming_line: dict[str, Any] = field(default_factory=dict)


def traces_beside(path: PathLike) -> list[str]:
    """Route / compute / io traces among the files recorded beside the metrics file `path`
    (:func:`bmoe.formats.archive.files_beside`)."""
    return [name for name, _ in _traces_beside(path)]


def _traces_beside(path: PathLike) -> list[tuple[str, str]]:
    """(file, kind) of the traces recorded beside the metrics file `path`."""
    found = []
    for sibling in files_beside(path):
        if sibling.suffix in (".metrics", ".log", ".state", ".out", ".err", ".png"):
            continue
        try:
            kind = detect_bytes(read_head(sibling, 4096))
        except OSError:
            continue
        if kind in TRACE_KINDS:
            found.append((str(sibling), kind))
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


def _read_output(log: Path, run: RecordedRun) -> None:
    """Add the end-of-run figures, pressure and streaming line of one ``.log`` / ``.out``
    (read once) under what `run` has already."""
    from bmoe.formats.runlog import read_run_output, streaming_line

    try:
        data = log.read_bytes()
    except OSError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            output = read_run_output(data)
        except BmoeError:
            return
    run.figures = {**output.figures, **run.figures}
    run.pressure = {**output.pressure, **run.pressure}
    if not run.streaming_line:
        run.streaming_line = streaming_line(data.decode("utf-8", errors="replace"))


def read_recorded_run(path: PathLike) -> RecordedRun:
    """The metrics file `path` and what was recorded beside it, each found by name: its
    traces, the sweep's record.json (a run folder), the end-of-run lines (``.log`` first,
    then ``.out``) and the pressure sidecar. A side file that cannot be read is passed
    over; the metrics file's own errors are raised."""
    run = RecordedRun(load_file(path, "metrics"))
    for trace, kind in _traces_beside(path):
        run.traces[kind] = load_file(trace, kind)
    run.record = record_of(path)
    for suffix in OUTPUT_SUFFIXES:
        log = Path(path).with_suffix(suffix)
        if log.is_file() and log.stat().st_size <= MAX_OUTPUT_BYTES:
            _read_output(log, run)
    sidecar = pressure_sidecar_for(path)
    if sidecar is not None:
        with contextlib.suppress(BmoeError, OSError):
            run.pressure = {**read_pressure(sidecar), **run.pressure}
    return run


def read_recorded_runs(paths: Iterable[str | os.PathLike]) -> list[RecordedRun]:
    """:func:`read_recorded_run` of every metrics file among `paths`: metrics files, or
    folders (every metrics file inside, recursively). None found is an error."""
    paths = list(paths)
    found = find_metrics_files(paths)
    if not found:
        raise BmoeError(f"no metrics CSV in {', '.join(map(str, paths))}")
    return [read_recorded_run(path) for path in found]


__all__ = [
    "MAX_OUTPUT_BYTES",
    "OUTPUT_SUFFIXES",
    "TRACE_KINDS",
    "RecordedRun",
    "RunFiles",
    "load_run_files",
    "read_recorded_run",
    "read_recorded_runs",
    "read_with_pressure",
    "traces_beside",
]
