"""The runs of an archive, read for the one-row-per-run table: a sweep's attempts (its
manifest's records, each completed run's metrics file and ``.metrics`` sidecar with it), a
folder's loose metrics files (each with its sidecar, the ``BEFORE`` section of its ``.state``
snapshot and its modification time), and a sweep's stored ``results.parquet`` checked against
its manifest.

Only reading happens here; the table and the runs' summary figures are built from what these
return by :mod:`bmoe.analyze.runs_table`. The names of the files are
:mod:`bmoe.formats.archive`'s.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from bmoe.errors import BmoeError
from bmoe.formats import archive as layout
from bmoe.formats.errors import warn
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.sidecar import DeviceState

if TYPE_CHECKING:
    import pandas as pd


class Attempt(NamedTuple):
    """One attempt of a sweep: its manifest record and, for an ``ok`` attempt whose
    ``run.csv`` reads, that run, its sidecar's pressure figures and the file's path relative
    to the sweep folder (None for each otherwise)."""

    record: dict[str, Any]
    run: MetricsRun | None = None
    pressure: dict[str, Any] | None = None
    file: str | None = None


class LooseRun(NamedTuple):
    """One loose metrics file: the run, its sidecar's pressure figures (None without one),
    the ``BEFORE`` section of its ``.state`` snapshot (None without one), its modification
    time (NaN when it cannot be had) and its path relative to the deepest folder the files
    given share (the file's name when there is one file)."""

    run: MetricsRun
    pressure: dict[str, Any] | None
    before: DeviceState | None
    mtime: float
    cell: str


# ----------------------------------------------------------------------------- a sweep's attempts


def read_attempts(root: Path) -> Iterator[Attempt]:
    """The attempts of the sweep folder `root` in manifest order, each ``ok`` one's run read
    as it is reached (one run in memory at a time). A line that is not the record of an
    attempt (damage) and a warm-up run (kept in the archive, out of the results) are passed
    over; a run file that is missing or does not read leaves the attempt without its run."""
    root = Path(root)
    for record in layout.read_manifest(root / layout.MANIFEST):
        if not isinstance(record.get("run"), str):
            continue  # not the record of an attempt (a damaged line)
        if record.get("warmup"):
            continue
        if record.get("status") != "ok" or not isinstance(record.get("dir"), str):
            yield Attempt(record)
            continue
        yield _completed(root, record)


def _completed(root: Path, record: dict[str, Any]) -> Attempt:
    from bmoe.formats.runfiles import read_with_pressure

    csv = root / record["dir"] / layout.RUN_CSV
    if not csv.is_file():
        return Attempt(record)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run, pressure = read_with_pressure(csv)
        except BmoeError:
            return Attempt(record)
    return Attempt(record, run, pressure, str(csv.relative_to(root)))


def read_stored_results(root: Path, required: Sequence[str]) -> pd.DataFrame | None:
    """The sweep folder `root`'s ``results.parquet`` when it has the `required` columns
    (a warning when it holds attempts the manifest does not); None when the table is to be
    rebuilt from the manifest (there is no results file, or it lacks a required column: said
    in a warning). BmoeError when `root` is no sweep folder, or its results file lacks a
    column and there is no manifest to rebuild it from."""
    root = Path(root)
    if not root.is_dir():
        raise BmoeError(f"{root}: no such folder")
    path = root / layout.RESULTS
    manifest = root / layout.MANIFEST
    if path.is_file():
        frame = layout.read_results(root)
        missing = [c for c in required if c not in frame.columns]
        if not missing:
            _check_manifest(root, frame)
            return frame
        what = f"not a sweep's results table (no {', '.join(missing)} column)"
        if not manifest.is_file():
            raise BmoeError(f"{path}: {what}")
        warn(str(path), None, f"{what}; rebuilt from {layout.MANIFEST}")
    elif not manifest.is_file():
        raise BmoeError(f"{root}: not a sweep folder (no {layout.RESULTS} or {layout.MANIFEST})")
    return None


def _check_manifest(root: Path, frame: pd.DataFrame) -> None:
    """Warn when ``results.parquet`` holds attempts its manifest does not (the manifest cut
    short or replaced after the results were written); the manifest's own unreadable lines
    are named as it is read."""
    if not (root / layout.MANIFEST).is_file() or "run" not in frame:
        return
    records = layout.read_manifest(root / layout.MANIFEST)
    listed: set[Any]
    if "attempt" in frame:
        listed = {(str(r.get("run")), str(r.get("attempt"))) for r in records}
        keys = set(zip(frame["run"].astype(str), frame["attempt"].astype(str), strict=True))
    else:
        listed, keys = {str(r.get("run")) for r in records}, set(frame["run"].astype(str))
    extra = len(keys - listed)
    if extra:
        warn(str(root / layout.RESULTS), None, f"{layout.RESULTS} holds {extra} attempts the "
                                               "manifest does not (the manifest cut short or "
                                               "replaced?)")  # fmt: skip


# ----------------------------------------------------------------------------- loose files


def read_loose_runs(paths: Iterable[str | os.PathLike]) -> Iterator[LooseRun]:
    """Each metrics file of `paths` with what the runs table takes from beside it (its
    sidecar, its ``.state`` snapshot's ``BEFORE`` section, its modification time), read as
    it is reached; a metrics file that does not read raises."""
    from bmoe.formats.runfiles import read_with_pressure

    files = [Path(p) for p in paths]
    if not files:
        return
    root = Path(_common_root(files))
    for path in files:
        run, pressure = read_with_pressure(path)
        where = path.resolve()  # the root is of resolved paths: a relative path is under it too
        cell = str(where.relative_to(root)) if root != where else path.name
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = math.nan
        yield LooseRun(run, pressure, _state_before(path), mtime, cell)


def _common_root(paths: Sequence[Path]) -> str:
    parents = [str(p.resolve().parent) for p in paths]
    return os.path.commonpath(parents) if len(parents) > 1 else parents[0]


def _state_before(path: Path) -> DeviceState | None:
    """The ``BEFORE`` section of the ``.state`` snapshot beside the metrics file `path`."""
    from bmoe.formats.sidecar import read_state

    state_path = path.with_name(f"{layout.run_stem(path)}.state")
    if not state_path.is_file() or state_path == path:
        return None
    return read_state(state_path).get("before")


__all__ = [
    "Attempt",
    "LooseRun",
    "read_attempts",
    "read_loose_runs",
    "read_stored_results",
]
