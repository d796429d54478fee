"""Runs from metrics files and folders, with what was recorded beside each: its traces, the
sweep's ``record.json``, the end-of-run lines (``.log`` / ``.out``) and the pressure
sidecar. Finding the metrics files (:func:`bmoe.formats.archive.find_metrics_files`) and parsing
what is found (:mod:`bmoe.formats.runlog` and the other readers) are the formats layer's;
this module puts a run's files together as one :class:`ProfileRun`."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from bmoe.analyze.profile.runs import ProfileRun
from bmoe.errors import BmoeError
from bmoe.units import MIB


def _record(path: Path, run: ProfileRun) -> None:
    """The sweep's record.json of a run folder's metrics file."""
    from bmoe.formats.archive import record_of

    run.record = record_of(path)


def _run_output(log: Path, run: ProfileRun) -> None:
    """The end-of-run figures, pressure and streaming line of one ``.log`` / ``.out``."""
    from bmoe.formats.runlog import read_run_output, streaming_line

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            output = read_run_output(log)
        except (BmoeError, OSError):
            return
    run.log = {**output.figures, **run.log}
    run.pressure = {**output.pressure, **run.pressure}
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    run.streaming_line = run.streaming_line or streaming_line(text)


def _beside(path: Path, run: ProfileRun) -> None:
    """Fill `run` with what was recorded beside its metrics file: the sweep's record.json
    (a run folder), the end-of-run lines (``.log`` / ``.out``) and the pressure sidecar."""
    from bmoe.formats.sidecar import pressure_sidecar_for, read_pressure

    _record(path, run)
    for suffix in (".log", ".out"):
        log = path.with_suffix(suffix)
        if log.is_file() and log.stat().st_size <= 64 * MIB:
            _run_output(log, run)
    sidecar = pressure_sidecar_for(path)
    if sidecar is not None:
        with contextlib.suppress(BmoeError, OSError):
            run.pressure = {**read_pressure(sidecar), **run.pressure}


def read_runs(paths: Iterable[str | os.PathLike]) -> list[ProfileRun]:
    """Runs from metrics CSVs (their traces, end-of-run lines, pressure sidecar and sweep
    record beside them are found by name) or folders (every metrics CSV inside,
    recursively)."""
    from bmoe.analyze.runfiles import traces_beside
    from bmoe.formats.archive import find_metrics_files
    from bmoe.formats.detect import detect_bytes
    from bmoe.formats.load import load_file, read_head

    paths = list(paths)
    found = find_metrics_files(paths)
    if not found:
        raise BmoeError(f"no metrics CSV in {', '.join(map(str, paths))}")
    runs = []
    for path in found:
        run = ProfileRun(load_file(path, "metrics"))
        for trace in traces_beside(path):
            kind = detect_bytes(read_head(trace, 4096))
            if kind is not None:
                setattr(run, kind, load_file(trace, kind))
        _beside(path, run)
        runs.append(run)
    return runs


__all__ = ["read_runs"]
