"""Reading an archive back for a post-mortem: a sweep folder, or a folder of loose engine files.

:func:`open_archive` gives an :class:`Archive`: the cells table (one row per run attempt, the
sweep's ``results.parquet`` columns: parameters, entry state, outcomes) and each run's files,
read only when asked for, by cell or run id::

    archive = bmoe.load_archive("bench-data/2026-11-29-tiny-cache-lanes")
    archive.cells                          # DataFrame: cell, repeat, cache_mb, tok_s_mean, ...
    archive.metrics("cache_mb-2_io_threads-1-954da61e")        # MetricsRun (first repeat)
    archive.trace("cache_mb-2_io_threads-1-954da61e/r2", "route")  # RouteTrace of repeat 2

A folder without ``sweep.toml`` is read as loose files from the native engine: every metrics
CSV (subfolders included) is a run, its cell id the path below the folder without the
suffix, and the files named ``<stem>.*`` beside it (traces, ``.metrics`` sidecar, ``.out`` /
``.log``, ``.state``) are its files, recognised by content.

This module reads; it never runs anything, so importing it does not import the runner.
"""

from __future__ import annotations

import math
import re
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from bmoe.errors import BmoeError
from bmoe.formats.archive import (
    BOOKKEEPING,
    CELLS,
    CONFIG,
    MANIFEST,
    RESULTS,
    files_beside,
    find_metrics_files,
    is_sweep_folder,
    read_manifest,
    run_stem,
)
from bmoe.sweep.results import files_frame, load_results

#: Kinds of file a run can carry, as :attr:`ArchivedRun.files` keys.
FILE_KINDS = ("metrics", "route", "compute", "compute_layers", "io", "pressure", "output", "state")
TRACE_KINDS = ("route", "compute", "compute_layers", "io")

#: Preference among files that hold the engine's stdout / stderr.
_OUTPUT_ORDER = (".out", ".log", ".err")


def _detect(path: Path) -> str | None:
    from bmoe.formats.load import detect_kind

    try:
        return detect_kind(path)
    except BmoeError:
        return None


def classify_files(paths: list[Path]) -> dict[str, Path]:
    """Which of `paths` is the run's metrics, each trace, sidecar, output and state (by
    content); the first of each kind wins, stdout (``.out``) before logs and stderr."""
    found: dict[str, Path] = {}
    outputs: list[tuple[int, int, Path]] = []
    for path in sorted(paths):
        kind = _detect(path)
        if kind == "parquet":
            from bmoe.formats.parquet import parquet_kind

            kind = parquet_kind(path)
        if kind in ("protocol", "log"):
            rank = _OUTPUT_ORDER.index(path.suffix) if path.suffix in _OUTPUT_ORDER else 3
            outputs.append((0 if kind == "protocol" else 1, rank, path))
            continue
        if kind == "compute" and "compute-layers" in path.name:
            kind = "compute_layers"
        if kind in FILE_KINDS and kind not in found:
            found[kind] = path
    if outputs:
        found["output"] = min(outputs)[2]
    return found


@dataclass
class ArchivedRun:
    """One run of an archive: its ids, folder and files; each file is read on first use."""

    run: str  # run id: ``<cell>/r<k>`` in a sweep, the cell id for loose files
    cell: str
    repeat: int
    status: str
    folder: Path
    candidates: list[Path] = field(repr=False, default_factory=list)
    record: dict[str, Any] = field(repr=False, default_factory=dict)

    @cached_property
    def files(self) -> dict[str, Path]:
        """Kind -> path for the files this run has (see :data:`FILE_KINDS`)."""
        return classify_files(self.candidates)

    def has(self, kind: str) -> bool:
        return kind in self.files

    def load(self, kind: str) -> Any:
        """The file of `kind`, read (cached); BmoeError naming the run when it has none."""
        if kind not in FILE_KINDS:
            raise BmoeError(f"unknown file kind {kind!r} (one of {', '.join(FILE_KINDS)})")
        cache = self.__dict__.setdefault("_loaded", {})
        if kind not in cache:
            path = self.files.get(kind)
            if path is None:
                have = ", ".join(self.files) or "no files bmoe reads"
                raise BmoeError(f"run {self.run} has no {kind} file (it has: {have})")
            cache[kind] = _read(path, kind)
        return cache[kind]

    @property
    def metrics(self):
        """The run's :class:`~bmoe.formats.metrics.MetricsRun`."""
        return self.load("metrics")

    @property
    def pressure(self) -> dict[str, Any] | None:
        """The ``.metrics`` pressure sidecar's figures, or None when the run has none."""
        return self.load("pressure") if self.has("pressure") else None

    @property
    def output(self):
        """The engine's stdout as a :class:`~bmoe.formats.runlog.RunOutput`."""
        return self.load("output")

    def trace(self, kind: str = "route"):
        """The run's ``route``, ``compute``, ``compute_layers`` or ``io`` trace."""
        if kind not in TRACE_KINDS:
            raise BmoeError(f"unknown trace kind {kind!r} (one of {', '.join(TRACE_KINDS)})")
        return self.load(kind)

    @property
    def params(self) -> dict[str, Any]:
        """The engine flags the sweep gave this run, else the metrics preamble's."""
        if self.record.get("params"):
            return dict(self.record["params"])
        return dict(self.metrics.params) if self.has("metrics") else {}


def _read(path: Path, kind: str) -> Any:
    from bmoe.formats.load import load_file

    if path.suffix == ".parquet":
        return load_file(path, "parquet")
    return load_file(path, {"compute_layers": "compute", "output": None}.get(kind, kind))


class Archive:
    """An archived sweep (or folder of loose runs): the cells table and each run's files."""

    def __init__(
        self,
        root: Path,
        kind: str,
        cells: pd.DataFrame,
        runs: dict[str, ArchivedRun],
        config_text: str | None = None,
    ):
        self.root = root
        self.kind = kind  # "sweep" or "loose"
        self.cells = cells
        self._runs = runs
        self.config_text = config_text

    # -- what the archive is
    @property
    def name(self) -> str:
        return str(self.cells.attrs.get("name") or self.root.name)

    @property
    def axes(self) -> list[str]:
        """The parameters the sweep varied (for loose files: those that differ between runs)."""
        return [a for a in self.cells.attrs.get("axes", []) if a in self.cells.columns]

    @property
    def params(self) -> list[str]:
        """Every parameter column of :attr:`cells`."""
        return [p for p in self.cells.attrs.get("params", []) if p in self.cells.columns]

    @cached_property
    def config(self) -> dict[str, Any] | None:
        """The resolved ``sweep.toml`` as a dict (None for loose files)."""
        if not self.config_text:
            return None
        try:
            return tomllib.loads(self.config_text)
        except tomllib.TOMLDecodeError as exc:
            raise BmoeError(f"{self.root / CONFIG}: not valid TOML ({exc})") from None

    @cached_property
    def manifest(self) -> list[dict[str, Any]]:
        """The manifest's attempt records (empty for loose files)."""
        return read_manifest(self.root / MANIFEST)

    def __repr__(self) -> str:
        ok = int((self.cells["status"] == "ok").sum()) if "status" in self.cells else 0
        n_cells = self.cells["cell"].nunique() if "cell" in self.cells else 0
        return (
            f"<Archive {self.name!r} ({self.kind}): {n_cells} cells, {len(self._runs)} runs "
            f"({ok} ok), axes {self.axes}, at {self.root}>"
        )

    # -- runs, by id
    def runs(self, cell: str | None = None, status: str | None = "ok") -> list[ArchivedRun]:
        """The runs (of one cell when given) with `status` (None: every attempt)."""
        out = [
            r
            for r in self._runs.values()
            if (cell is None or r.cell == cell) and (status is None or r.status == status)
        ]
        if cell is not None and not out and not any(r.cell == cell for r in self._runs.values()):
            raise self._unknown(cell)
        return out

    def run(self, ref: str, repeat: int | None = None) -> ArchivedRun:
        """A run by run id (``<cell>/r<k>`` or an attempt's folder name), or by cell id and
        `repeat` (default: the cell's first completed repeat, else its last attempt)."""
        if repeat is None and ref in self._runs:
            return self._runs[ref]
        attempts = [r for r in self._runs.values() if r.cell == ref]
        if not attempts:
            raise self._unknown(ref)
        if repeat is not None:
            attempts = [r for r in attempts if r.repeat == repeat]
            if not attempts:
                have = sorted({r.repeat for r in self._runs.values() if r.cell == ref})
                raise BmoeError(f"cell {ref} has no repeat {repeat} (it has {have})")
        done = [r for r in attempts if r.status == "ok"]
        return (done or attempts)[0] if done else attempts[-1]

    def metrics(self, ref: str, repeat: int | None = None):
        """The :class:`~bmoe.formats.metrics.MetricsRun` of a cell or run (see :meth:`run`)."""
        return self.run(ref, repeat).metrics

    def trace(self, ref: str, kind: str = "route", repeat: int | None = None):
        """A cell's or run's ``route``, ``compute``, ``compute_layers`` or ``io`` trace."""
        return self.run(ref, repeat).trace(kind)

    def metrics_runs(self, status: str | None = "ok") -> dict[str, Any]:
        """Run id -> MetricsRun for every run with `status` that has a metrics file."""
        return {r.run: r.metrics for r in self.runs(status=status) if r.has("metrics")}

    def with_file(self, kind: str, status: str | None = "ok") -> list[ArchivedRun]:
        """The runs that carry a file of `kind` (e.g. ``route``)."""
        return [r for r in self.runs(status=status) if r.has(kind)]

    def __iter__(self) -> Iterator[ArchivedRun]:
        return iter(self._runs.values())

    def __len__(self) -> int:
        return len(self._runs)

    def _unknown(self, ref: str) -> BmoeError:
        cells = list(dict.fromkeys(r.cell for r in self._runs.values()))
        shown = ", ".join(cells[:6]) + (", ..." if len(cells) > 6 else "")
        return BmoeError(f"{self.root}: no cell or run {ref!r} (cells: {shown or 'none'})")


# ----------------------------------------------------------------------------- opening


def open_archive(path: str | Path) -> Archive:
    """Open a sweep folder (``sweep.toml``, ``manifest.jsonl`` or ``results.parquet``) or a
    folder of loose engine files (metrics CSVs with their traces and sidecars)."""
    root = Path(path)
    if not root.exists():
        raise BmoeError(f"{root}: no such folder")
    if not root.is_dir():
        raise BmoeError(f"{root}: not a folder (open a single file with bmoe.load)")
    root = root.resolve()
    if is_sweep_folder(root):
        return _open_sweep(root)
    inner = sorted(p.parent for p in root.glob(f"*/{CONFIG}"))
    if inner:
        names = ", ".join(p.name for p in inner[:6]) + (", ..." if len(inner) > 6 else "")
        raise BmoeError(f"{root} holds {len(inner)} sweep folders, open one: {names}")
    return _open_loose(root)


def _open_sweep(root: Path) -> Archive:
    cells = load_results(root)
    config = root / CONFIG
    text = config.read_text(encoding="utf-8", errors="replace") if config.is_file() else None
    runs: dict[str, ArchivedRun] = {}
    records = {_record_key(r): r for r in _records(root)}
    for row in cells.itertuples(index=False):
        values = row._asdict()
        folder = root / str(values.get("dir") or "")
        run_id = str(values.get("run"))
        attempt = values.get("attempt")
        key = run_id if values.get("status") == "ok" else f"{run_id}.a{attempt}"
        record = records.get((run_id, attempt), {})
        candidates = _run_candidates(folder)
        runs[key] = ArchivedRun(
            run=key,
            cell=str(values.get("cell")),
            repeat=_repeat_of(values.get("repeat"), run_id),
            status=str(values.get("status")),
            folder=folder,
            candidates=candidates,
            record=record,
        )
    return Archive(root, "sweep", cells, runs, text)


def _repeat_of(value: Any, run_id: str) -> int:
    """The repeat of an attempt: its results cell, else the ``r<k>`` of its run id (a
    ``killed`` line written by an earlier resume has no ``repeat``), else 1."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return int(value) if value >= 1 else 1
    m = re.search(r"/r(\d{1,9})$", run_id)
    return int(m.group(1)) if m else 1


def _records(root: Path) -> Iterator[dict[str, Any]]:
    yield from read_manifest(root / MANIFEST)


def _record_key(record: dict[str, Any]) -> tuple[str, Any]:
    return str(record.get("run")), record.get("attempt")


def _run_candidates(folder: Path) -> list[Path]:
    if not folder.is_dir() or folder == folder.parent or folder.name == CELLS:
        return []
    return [p for p in folder.iterdir() if p.is_file() and p.name not in BOOKKEEPING]


def _open_loose(root: Path) -> Archive:
    files = find_metrics_files([root])
    if not files:
        raise BmoeError(
            f"{root}: no sweep here (no {CONFIG}, {MANIFEST} or {RESULTS}) and no metrics "
            "files below it"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cells = files_frame(files)
    ids = [_cell_id(root, p, files) for p in files]
    cells["cell"] = ids
    cells.insert(0, "run", ids)
    cells.insert(2, "repeat", 1)
    partial = cells["partial"].astype(bool) if "partial" in cells else False
    cells.insert(3, "status", pd.Series("ok", index=cells.index).where(~partial, "partial"))
    cells.insert(4, "dir", [str(p.parent.relative_to(root)) for p in files])
    params = _loose_params(files)
    cells.attrs["params"] = params
    cells.attrs["axes"] = [
        p for p in params if p in cells and cells[p].astype(str).nunique(dropna=False) > 1
    ]
    cells.attrs["name"] = root.name
    runs = {}
    for cell_id, path, status in zip(ids, files, cells["status"], strict=True):
        runs[cell_id] = ArchivedRun(
            run=cell_id,
            cell=cell_id,
            repeat=1,
            status=str(status),
            folder=path.parent,
            candidates=[path, *files_beside(path, files)],
        )
    return Archive(root, "loose", cells, runs, None)


def _cell_id(root: Path, path: Path, files: list[Path]) -> str:
    rel = path.relative_to(root)
    stem = str(rel.parent / run_stem(path)) if str(rel.parent) != "." else run_stem(path)
    same_stem = [f for f in files if f.parent == path.parent and run_stem(f) == run_stem(path)]
    return str(rel) if len(same_stem) > 1 else stem


def _loose_params(files: list[Path]) -> list[str]:
    """The metrics preambles' keys, in first-seen order."""
    from bmoe.formats.metrics import read_metrics

    keys: dict[str, None] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in files:
            try:
                keys.update(dict.fromkeys(read_metrics(path).params))
            except BmoeError:
                continue
    return list(keys)


__all__ = ["FILE_KINDS", "TRACE_KINDS", "Archive", "ArchivedRun", "classify_files", "open_archive"]
