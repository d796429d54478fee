"""The sweep archive's layout: the names of its files, what lies beside a run, and the readers
and writers of its tables (the manifest, ``results.parquet``, ``predictions.csv``, a run's
``record.json``). Every layer that reads or writes an archive takes them from here.

Layout of ``<output>/<date>-<name>/``::

    sweep.toml              the resolved configuration (defaults filled in, base_dir fixed)
    sweep.<n>.toml          an earlier configuration, set aside when a resume changed it
    manifest.jsonl          one fsync'd JSON line per attempt
    cells/<cell>/r<k>/      a completed run: run.csv, traces, run.metrics, run.out, run.err,
                            run.log, command.json, record.json
    cells/<cell>/r<k>.a<n>.<status>/   an attempt that did not complete (kept to inspect)
    results.parquet         one row per attempt
    predictions.csv         each planned run's predicted tok/s (a sweep with a profile)
    summary.md              the analysis of the folder, as markdown
    tune.json               a tune's rounds (a folder made by ``bmoe tune``)

A loose run of the native engine is a metrics CSV and the files named ``<stem>.<anything>``
beside it (:func:`files_beside`); a run folder of a sweep is the same with the stem ``run``.
The runs of an archive, as the one-row-per-run table takes them (a sweep's attempts with each
completed run read, a folder's loose metrics files), are read by
:mod:`bmoe.formats.archive_runs`.

This module imports no pandas until a table is read or written.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bmoe.errors import BmoeError
from bmoe.formats.errors import warn

if TYPE_CHECKING:
    import pandas as pd

CONFIG = "sweep.toml"
MANIFEST = "manifest.jsonl"
#: Where a torn last line of the manifest is set aside.
TORN = "manifest.jsonl.torn"
RESULTS = "results.parquet"
PREDICTIONS = "predictions.csv"
SUMMARY = "summary.md"
RECORD = "record.json"
CELLS = "cells"
#: The sessions of a sweep with ``session = true`` (one folder per engine process).
SESSIONS = "sessions"
#: The runner's own state in a sweep folder (targets, model digests, the lock's witness).
STATE = ".state"
#: A tune's record of its rounds (``bmoe tune``): its folder is resumed by ``bmoe tune``.
TUNE_STATE = "tune.json"

#: ``lost``: the host running the attempt (a farm node) or the task on it died.
STATUSES = (
    "ok", "crashed", "timeout", "invalid", "error", "interrupted", "rejected", "killed", "lost",
)  # fmt: skip

#: Output-file flags of the engine and the file name each gets inside a run's folder.
OUTPUT_FILES = {
    "csv": "run.csv",
    "route_trace": "run.route.csv",
    "compute_trace": "run.compute.csv",
    "compute_trace_layers": "run.compute-layers.csv",
    "io_trace": "run.io.csv",
    "fidelity_save": "run.fidelity.npz",  # the embedded engine's fidelity reference
}
#: A run folder's metrics CSV.
RUN_CSV = OUTPUT_FILES["csv"]
#: Its device-pressure sidecar, the engine's stdout and stderr, and the runner's log.
RUN_SIDECAR = "run.metrics"
RUN_OUT = "run.out"
RUN_ERR = "run.err"
RUN_LOG = "run.log"
#: The command an attempt ran, the pressure samples taken while it ran, and the note left in
#: a folder set aside as invalid.
COMMAND = "command.json"
SAMPLES = "pressure.samples"
INVALID = "INVALID"
#: Files in a run folder that are the sweep's own bookkeeping, not engine output.
BOOKKEEPING = frozenset({RECORD, COMMAND, SAMPLES, RUN_LOG, INVALID})

#: The columns every results table has (what an attempt ran and its outcome).
RESULT_KEYS = ("run", "cell", "status")
#: The columns ``predictions.csv`` must have.
PREDICTION_KEYS = ("cell", "tok_s")

#: Endings of a file that may hold a metrics table (the CSV, a CSV named like the sidecar, and
#: its Parquet form); which of them do is decided by content.
METRICS_SUFFIXES = (".csv", ".metrics", ".parquet")


def is_sweep_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a sweep's folder: it holds ``sweep.toml``, ``manifest.jsonl`` or
    ``results.parquet``."""
    root = Path(path)
    return root.is_dir() and any((root / name).is_file() for name in (CONFIG, MANIFEST, RESULTS))


def config_copy(root: Path) -> Path:
    """Where the configuration a resume replaces is kept: the first free ``sweep.<n>.toml``."""
    n = 1
    while (Path(root) / f"sweep.{n}.toml").exists():
        n += 1
    return Path(root) / f"sweep.{n}.toml"


# ----------------------------------------------------------------------------- a run's files


def run_stem(path: str | os.PathLike) -> str:
    """The stem a run's files share: its metrics file's name without the last suffix
    (``qwen_c1.5.csv`` -> ``qwen_c1.5``, ``run.csv`` -> ``run``). A stem may hold dots, as a
    flag's value does, so the name is cut at its last dot, never its first."""
    name = Path(path).name
    stem, dot, _ = name.rpartition(".")
    return stem if dot and stem else name


def files_beside(path: str | os.PathLike, metrics: Iterable[str | os.PathLike] | None = None
                 ) -> list[Path]:  # fmt: skip
    """The files recorded with the run whose metrics file is `path`: those named
    ``<stem>.<anything>`` beside it (:func:`run_stem`). A file that is another run's (another
    metrics file, or one named after a longer stem: ``run.2.route.csv`` is ``run.2.csv``'s,
    not ``run.csv``'s) is left out. `metrics` are the folder's metrics files when the caller
    has found them; otherwise they are recognised by content."""
    path = Path(path)
    stem = run_stem(path)
    siblings = sorted(
        p for p in path.parent.glob(glob.escape(stem) + ".*") if p != path and p.is_file()
    )
    if metrics is None:
        others = {p for p in siblings if p.suffix in METRICS_SUFFIXES and _holds_metrics(p)}
    else:
        others = {Path(m) for m in metrics} - {path}
    longer = [s + "." for s in map(run_stem, others) if s.startswith(stem + ".")]
    return [p for p in siblings if p not in others and not p.name.startswith(tuple(longer))]


def _holds_metrics(path: Path) -> bool:
    from bmoe.formats.load import content_kind

    return content_kind(path) == "metrics"


def find_metrics_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The metrics files among `paths`, in order: a folder is searched recursively for files
    ending ``.csv``, ``.metrics`` or ``.parquet`` that hold a metrics table (by content; one
    that cannot be read is passed over); a named file is kept when it holds one, and skipped
    with a warning when it does not. A path that does not exist is a BmoeError."""
    found: list[Path] = []
    skipped: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            candidates = sorted(
                p for p in path.rglob("*") if p.suffix in METRICS_SUFFIXES and p.is_file()
            )
            found += [p for p in candidates if _holds_metrics(p)]
        elif path.exists():
            from bmoe.formats.load import read_head

            read_head(path, 1)  # a file that cannot be read says so (FormatError)
            if _holds_metrics(path):
                found.append(path)
            else:
                skipped.append(path)
        else:
            raise BmoeError(f"{path}: no such file or folder")
    stems = {(p.parent.resolve(), run_stem(p) + ".") for p in found}
    skipped = [  # a trace or sidecar named with its run is read as that run's
        s for s in skipped
        if not any(s.parent.resolve() == d and s.name.startswith(t) for d, t in stems)
    ]  # fmt: skip
    if skipped:
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        shown = ", ".join(map(str, skipped[:3])) + more
        warn(None, None, f"not metrics files, skipped: {shown}")
    return found


# ----------------------------------------------------------------------------- writing files


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


_TMP_NAME = re.compile(r"^\..+\.tmp-(\d+)-\d+$")


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `path` under a temporary name, fsync, rename into place."""
    path = Path(path)
    tmp = _tmp_name(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written file left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def clear_stale_tmp(folder: Path) -> list[Path]:
    """Remove the temporary files :func:`write_atomic` left in `folder` from a process that
    is gone (killed while writing); returns them."""
    removed = []
    for path in Path(folder).glob(".*.tmp-*"):
        m = _TMP_NAME.match(path.name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


# ----------------------------------------------------------------------------- the manifest


def manifest_line(record: Mapping[str, Any]) -> str:
    """One manifest line: the attempt's record as compact JSON, newline-terminated."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """Manifest records (`path` is the manifest or its sweep folder); a line that is not one
    (a cut last line of a sweep killed mid-write, damage) is skipped with a warning naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    lines = text.splitlines()
    bad: list[tuple[int, str]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            cut = n == len(lines) and not text.endswith("\n")
            bad.append((n, "cut short (a kill or power loss mid-write)" if cut else "not JSON"))
            continue
        if isinstance(record, dict):  # a damaged line may parse as a list or a number
            out.append(record)
        else:
            bad.append((n, "not a record"))
    for n, why in bad[:3]:
        warn(str(path), n, f"{why}: line skipped")
    if len(bad) > 3:
        warn(str(path), None, f"{len(bad) - 3} more lines skipped (not records)")
    return out


def read_record(folder: Path) -> dict[str, Any] | None:
    """A run folder's ``record.json``, or None when it has none (or it does not read as one)."""
    try:
        data = json.loads((Path(folder) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def record_of(metrics_path: str | os.PathLike) -> dict[str, Any] | None:
    """The sweep's record of the run whose metrics file is `metrics_path` (a run folder's
    ``run.csv``); None for a loose file."""
    path = Path(metrics_path)
    return read_record(path.parent) if path.name == RUN_CSV else None


def iter_completed(root: Path) -> Iterator[dict[str, Any]]:
    """record.json of every completed run folder under `root`."""
    for folder in sorted(p.parent for p in (Path(root) / CELLS).glob(f"*/r*/{RECORD}")):
        record = read_record(folder)
        if record is not None:
            yield record


# ----------------------------------------------------------------------------- results.parquet


def write_results(root: Path, frame: pd.DataFrame, axes: Sequence[str], name: str) -> Path:
    """``results.parquet`` (atomically), with the axes and parameters in schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = _uniform_columns(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"bmoe_sweep"] = json.dumps(
        {"name": name, "axes": list(axes), "params": frame.attrs.get("params", [])}
    ).encode("utf-8")
    table = table.replace_schema_metadata(meta)
    path = Path(root) / RESULTS
    tmp = _tmp_name(path)
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # as write_atomic: nothing half-written left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def _uniform_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with each object column holding one type (mixed values, from a damaged or
    hand-edited manifest, become text) so that it can be written as Parquet."""
    import pandas as pd

    out = frame.copy()
    out.attrs = dict(frame.attrs)
    for name in [c for c in out.columns if pd.api.types.is_object_dtype(out[c].dtype)]:
        column = out[name]
        kinds = column.dropna().map(type).unique()
        if len(kinds) > 1:
            out[name] = column.map(lambda v: v if v is None else str(v))
    return out


def read_results(root: Path) -> pd.DataFrame:
    """``results.parquet`` of the sweep folder `root` as written, its ``attrs`` carrying the
    ``axes``, ``params`` and ``name`` of its metadata; BmoeError when it does not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(root) / RESULTS
    try:
        table = pq.read_table(path)
        frame = table.to_pandas()
        meta = json.loads((table.schema.metadata or {}).get(b"bmoe_sweep", b"{}"))
    except (pa.ArrowException, OSError, ValueError, RecursionError) as exc:
        raise BmoeError(f"{path}: unreadable ({str(exc).splitlines()[0]})") from None
    meta = meta if isinstance(meta, dict) else {}
    frame.attrs["axes"] = meta.get("axes", [])
    frame.attrs["params"] = meta.get("params", [])
    frame.attrs["name"] = meta.get("name")
    return frame


# ----------------------------------------------------------------------------- predictions.csv


def write_predictions(root: Path, table: pd.DataFrame) -> Path:
    """``predictions.csv`` (atomically): each planned run's predicted speed."""
    path = Path(root) / PREDICTIONS
    write_atomic(path, table.to_csv(index=False))
    return path


def read_predictions(root: Path) -> pd.DataFrame | None:
    """The sweep's ``predictions.csv`` (the tok/s its profile predicted per cell), or None
    when it has none; BmoeError when it is not a readable table of predictions."""
    import pandas as pd

    path = Path(root) / PREDICTIONS
    if not path.is_file():
        return None
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise BmoeError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = set(PREDICTION_KEYS) - set(table.columns)
    if missing:
        raise BmoeError(f"{path}: line 1: no {', '.join(sorted(missing))} column")
    return table


__all__ = [
    "BOOKKEEPING", "CELLS", "COMMAND", "CONFIG", "INVALID", "MANIFEST", "OUTPUT_FILES",
    "PREDICTIONS", "RECORD", "RESULTS", "RESULT_KEYS", "RUN_CSV", "RUN_ERR", "RUN_LOG",
    "RUN_OUT", "RUN_SIDECAR", "SAMPLES", "SESSIONS", "STATE", "STATUSES", "SUMMARY", "TORN",
    "TUNE_STATE",
    "clear_stale_tmp", "config_copy", "files_beside", "find_metrics_files", "fsync_dir",
    "is_sweep_folder", "iter_completed", "manifest_line", "read_manifest", "read_predictions",
    "read_record", "read_results", "record_of", "run_stem", "write_atomic", "write_predictions",
    "write_results",
]  # fmt: skip
