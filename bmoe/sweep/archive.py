"""The sweep folder: atomic run folders, ``manifest.jsonl``, ``results.parquet``.

Layout of ``<output>/<date>-<name>/``::

    sweep.toml              the resolved configuration (defaults filled in, base_dir fixed)
    manifest.jsonl          one fsync'd JSON line per attempt
    cells/<cell>/r<k>/      a completed run: run.csv, traces, run.metrics, run.out, run.err,
                            run.log, command.json, record.json
    cells/<cell>/r<k>.a<n>.<status>/   an attempt that did not complete (kept to inspect)
    results.parquet         one row per attempt
    summary.md

A run's files are written into a hidden staging folder and the folder is renamed into place
when complete, so a completed run is always whole; the manifest line follows the rename.
Resume trusts the folder: a run counts as done when its ``record.json`` says ok and every file
it lists has the recorded size and checksum and its CSV reads as a finished run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bmoe.errors import BmoeError

MANIFEST = "manifest.jsonl"
CONFIG = "sweep.toml"
RESULTS = "results.parquet"
SUMMARY = "summary.md"
RECORD = "record.json"
CELLS = "cells"

#: ``lost``: the host running the attempt (a farm node) or the task on it died.
STATUSES = (
    "ok", "crashed", "timeout", "invalid", "error", "interrupted", "rejected", "killed", "lost",
)  # fmt: skip


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `path` under a temporary name, fsync, rename into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
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


_TMP_NAME = re.compile(r"^\..+\.tmp-(\d+)-\d+$")


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


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_name(name: str, when: dt.date | None = None) -> str:
    return f"{(when or dt.date.today()).isoformat()}-{name}"


def new_folder(output: Path, name: str) -> Path:
    """The folder a new sweep `name` would get under `output` now (``-2``, ``-3``... when
    the day's folder is taken), as :meth:`ArchiveWriter.create` chooses it."""
    base = folder_name(name)
    root = Path(output) / base
    n = 2
    while root.exists():
        root = Path(output) / f"{base}-{n}"
        n += 1
    return root


def find_latest(root: Path, name: str) -> Path | None:
    """The most recent ``<date>-<name>`` folder under `root` holding a sweep."""
    pattern = re.compile(r"^\d{4}-\d{2}-\d{2}-" + re.escape(name) + r"(-\d+)?$")
    found = [p for p in root.glob(f"*-{name}*") if pattern.match(p.name) and (p / CONFIG).is_file()]
    return max(found, key=lambda p: (p.name[:10], (p / CONFIG).stat().st_mtime)) if found else None


@dataclass
class AttemptPaths:
    """Where one attempt's files go."""

    final: Path  # cells/<cell>/r<k>
    staging: Path  # cells/<cell>/.r<k>.a<n>.staging


class ArchiveWriter:
    """One sweep folder. Thread-safe for the appends and renames the runner makes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock = threading.Lock()
        self._attempts: dict[str, int] | None = None  # run -> highest attempt in the manifest

    # -- creation
    @classmethod
    def create(cls, output: Path, name: str, config_text: str) -> ArchiveWriter:
        """A new folder ``<output>/<date>-<name>`` (``-2``, ``-3``... if taken)."""
        output.mkdir(parents=True, exist_ok=True)
        base = folder_name(name)
        root = output / base
        n = 2
        while True:
            try:
                root.mkdir()
                break
            except FileExistsError:
                root = output / f"{base}-{n}"
                n += 1
        archive = cls(root)
        write_atomic(root / CONFIG, config_text)
        (root / CELLS).mkdir(exist_ok=True)
        return archive

    @classmethod
    def open(cls, root: Path) -> ArchiveWriter:
        root = Path(root)
        if not (root / CONFIG).is_file():
            raise BmoeError(f"{root}: not a sweep folder (no {CONFIG})")
        (root / CELLS).mkdir(exist_ok=True)
        clear_stale_tmp(root)
        return cls(root)

    @property
    def state_dir(self) -> Path:
        return self.root / ".state"

    # -- runs
    def run_final(self, run_id: str) -> Path:
        cell, rep = run_id.split("/")
        return self.root / CELLS / cell / rep

    def attempts_of(self, run_id: str) -> list[Path]:
        final = self.run_final(run_id)
        return sorted(final.parent.glob(f"{final.name}.a*")) if final.parent.is_dir() else []

    def next_attempt(self, run_id: str) -> int:
        """1 + the highest attempt number this run has used so far: in the manifest, in its
        attempt and staging folders, and in the record of its folder, current or set aside
        (a re-run never reuses a number, even when the earlier folder is gone)."""
        final = self.run_final(run_id)
        numbers = [0, self._manifest_attempts().get(run_id, 0)]
        if final.parent.is_dir():
            for p in final.parent.iterdir():
                m = re.match(re.escape(final.name) + r"\.a(\d+)\.", p.name) or re.match(
                    r"\." + re.escape(final.name) + r"\.a(\d+)\.staging", p.name
                )
                if m:
                    numbers.append(int(m.group(1)))
            records = [final / RECORD, *final.parent.glob(f"{final.name}.*/{RECORD}")]
            for record in records:
                if record.is_file():
                    with contextlib.suppress(ValueError, OSError, KeyError, TypeError):
                        numbers.append(int(json.loads(record.read_text())["attempt"]))
        return max(numbers) + 1

    def _manifest_attempts(self) -> dict[str, int]:
        """The highest attempt number of each run in the manifest (read once, then kept)."""
        with self._lock:
            if self._attempts is None:
                self._attempts = {}
                for record in self.manifest():
                    self._note_attempt(record)
            return dict(self._attempts)

    def _note_attempt(self, record: Mapping[str, Any]) -> None:
        if self._attempts is None or not isinstance(record, Mapping):
            return
        run, attempt = record.get("run"), record.get("attempt")
        if isinstance(run, str) and isinstance(attempt, int) and not isinstance(attempt, bool):
            self._attempts[run] = max(self._attempts.get(run, 0), attempt)

    def staging(self, run_id: str, attempt: int) -> AttemptPaths:
        final = self.run_final(run_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = final.parent / f".{final.name}.a{attempt}.staging"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        return AttemptPaths(final, staging)

    def clear_stale_staging(self) -> list[Path]:
        """Staging folders left by a sweep that was killed: renamed ``.killed`` for the record."""
        moved = []
        for staging in (self.root / CELLS).glob("*/.*.staging"):
            m = re.match(r"\.([rw]\d+\.a\d+)\.staging$", staging.name)
            if not m:
                continue
            dest = staging.parent / f"{m.group(1)}.killed"
            if dest.exists():
                shutil.rmtree(dest)
            staging.rename(dest)
            moved.append(dest)
        for staging in (self.root / "sessions").glob(".*.staging"):
            staging.rename(staging.with_name(staging.name[1:].replace(".staging", ".killed")))
        return moved

    def finalize(self, files: AttemptPaths, record: dict[str, Any]) -> dict[str, Any]:
        """Record checksums, rename the staging folder into place, append the manifest line.

        A completed run takes the run's name; any other attempt keeps its files under
        ``r<k>.a<n>.<status>``. Returns the record with its final ``dir`` and ``files``.
        """
        staging = files.staging
        listing = {}
        for path in sorted(staging.iterdir()):
            if path.is_file() and path.name != RECORD:
                listing[path.name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
                with open(path, "rb+") as fh:
                    os.fsync(fh.fileno())
        record = {**record, "files": listing}
        status = record["status"]
        final = files.final
        if status != "ok":
            final = final.with_name(f"{final.name}.a{record['attempt']}.{status}")
        record["dir"] = str(final.relative_to(self.root))
        write_atomic(staging / RECORD, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        with self._lock:
            if final.exists():
                aside = final.with_name(f"{final.name}.replaced-{record['attempt']}")
                if aside.exists():
                    shutil.rmtree(aside)
                final.rename(aside)
            staging.rename(final)
            fsync_dir(final.parent)
            self._append_manifest(record)
        return record

    def _append_manifest(self, record: Mapping[str, Any]) -> None:
        self._note_attempt(record)
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"
        fd = os.open(self.root / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)

    def append_manifest(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            self._append_manifest(record)

    def retract_ok(self, run_id: str, reason: str, keep_attempt: int | None = None,
                   moved_to: Path | None = None) -> int:  # fmt: skip
        """Mark the manifest's ``ok`` lines of `run_id` (but the one of `keep_attempt`) as
        ``set_aside`` with `reason`, so that the manifest holds at most one ``ok`` per run.

        The line stays (its measurement is kept, under ``was``); the manifest is rewritten
        atomically. `moved_to` is where the attempt's folder now is. Returns the lines changed.
        """
        path = self.root / MANIFEST
        with self._lock:
            try:
                lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            except FileNotFoundError:
                return 0
            changed = 0
            out = []
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    out.append(line)
                    continue
                if (
                    isinstance(record, dict)
                    and record.get("run") == run_id
                    and record.get("status") == "ok"
                    and record.get("attempt") != keep_attempt
                ):
                    record.update({"status": "set_aside", "was": "ok", "set_aside": reason})
                    if moved_to is not None:
                        record["dir"] = str(moved_to.relative_to(self.root))
                    line = json.dumps(record, ensure_ascii=False, separators=(",", ":"),
                                      default=str) + "\n"  # fmt: skip
                    changed += 1
                out.append(line if line.endswith("\n") else line + "\n")
            if changed:
                write_atomic(path, "".join(out))
            return changed

    # -- reading back
    def manifest(self) -> list[dict[str, Any]]:
        return read_manifest(self.root / MANIFEST)

    def validate_run(self, run_id: str) -> tuple[bool, str]:
        """Whether the run's folder holds a complete, intact, finished run (and why not)."""
        final = self.run_final(run_id)
        record_path = final / RECORD
        if not record_path.is_file():
            return False, "no completed folder"
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            return False, f"record.json unreadable: {exc}"
        if record.get("status") != "ok":
            return False, f"status {record.get('status')}"
        for name, meta in record.get("files", {}).items():
            path = final / name
            if not path.is_file():
                return False, f"{name} missing"
            if path.stat().st_size != meta.get("bytes") or file_digest(path) != meta.get("sha256"):
                return False, f"{name} changed since it was written"
        csv = final / "run.csv"
        if not csv.is_file():
            return False, "no run.csv"
        ok, why = csv_complete(csv)
        return ok, why

    def completed_record(self, run_id: str) -> dict[str, Any] | None:
        path = self.run_final(run_id) / RECORD
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def set_aside(self, run_id: str, reason: str) -> Path | None:
        """Move a run folder that does not validate out of the way (kept, renamed)."""
        final = self.run_final(run_id)
        if not final.exists():
            return None
        n = 1
        while (dest := final.with_name(f"{final.name}.invalid-{n}")).exists():
            n += 1
        final.rename(dest)
        (dest / "INVALID").write_text(reason + "\n", encoding="utf-8")
        return dest


def csv_complete(path: Path) -> tuple[bool, str]:
    """Whether a run's metrics CSV reads and says the run finished."""
    import warnings

    from bmoe.formats.metrics import read_metrics

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = read_metrics(path)
    except BmoeError as exc:
        return False, str(exc)
    if run.tokens == 0:
        return False, f"{path.name}: no token rows"
    ended = run.summary.get("tokens") == run.tokens  # fewer than asked: end of generation
    if run.partial and not ended:
        return False, f"{path.name}: the run did not finish ({run.tokens} rows, no summary)"
    return True, "ok"


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """Manifest lines; a cut last line (a sweep killed mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):  # a damaged line may parse as a list or a number
            out.append(record)
    return out


def iter_completed(root: Path) -> Iterator[dict[str, Any]]:
    """record.json of every completed run folder under `root`."""
    for record in sorted((Path(root) / CELLS).glob(f"*/r*/{RECORD}")):
        try:
            yield json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue


# ----------------------------------------------------------------------------- results


def _flat(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value


def results_frame(root: Path) -> pd.DataFrame:
    """One row per attempt: parameters, target, entry state, summary figures, pressure.

    Built from the manifest, reading each completed run's CSV and ``.metrics`` sidecar for the
    summary figures (:func:`bmoe.analyze.metrics.run_summary`).
    """
    root = Path(root)
    records = read_manifest(root / MANIFEST)
    params_keys: list[str] = []
    rows = []
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("run"), str):
            continue  # not the record of an attempt (a damaged line)
        if record.get("warmup"):
            continue  # warm-up runs stay in the archive, out of the results
        row: dict[str, Any] = {}
        for key in ("run", "cell", "repeat", "attempt", "order", "round", "reversed", "target",
                    "target_kind", "host", "node", "engine", "status", "exit_code", "started",
                    "ended", "duration_s", "error", "dir"):  # fmt: skip
            row[key] = record.get(key)
        row.update(_mapping(record.get("entry_columns")))
        row["engine_cpu_share"] = record.get("engine_cpu_share")
        warnings = record.get("system_warnings")
        row["system_warnings"] = "; ".join(map(str, warnings)) if warnings else None
        for key in ("model_sha256", "bmoe_version", "config_commit"):
            row[key] = record.get(key)
        machine = record.get("machine")
        for key, value in machine.items() if isinstance(machine, dict) else ():
            row[f"machine_{key}"] = value
        params = _mapping(record.get("params"))
        for key, value in params.items():
            if key not in params_keys:
                params_keys.append(key)
            row[key] = _flat(value)
        figures = _summary_for(root, record) if record.get("status") == "ok" else {}
        if record.get("status") == "ok" and not figures:
            row["status"] = "invalid"
            row["error"] = "its run.csv is missing or unreadable"
        for key, value in figures.items():
            row[key if key not in row else f"summary_{key}"] = _flat(value)
        for key, value in _mapping(record.get("pressure")).items():
            row.setdefault(key, value)
        for key, value in _mapping(record.get("stream")).items():
            row.setdefault(f"stream_{key}", _flat(value))
        rows.append(row)
    _one_ok_per_run(rows)
    frame = pd.DataFrame(rows)
    frame.attrs["params"] = params_keys
    return frame


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _one_ok_per_run(rows: list[dict[str, Any]]) -> None:
    """Keep one ``ok`` row per run, its latest attempt; earlier ones become ``superseded``
    (a folder from before the manifest kept one ok per run must not count a run twice)."""
    latest: dict[Any, dict[str, Any]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        best = latest.get(row.get("run"))
        if best is None or _attempt_number(row) >= _attempt_number(best):
            if best is not None:
                best["status"] = "superseded"
            latest[row.get("run")] = row
        else:
            row["status"] = "superseded"


def _attempt_number(row: Mapping[str, Any]) -> int:
    attempt = row.get("attempt")
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0


def _summary_for(root: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    import warnings

    from bmoe.analyze.metrics import run_summary
    from bmoe.formats.metrics import read_metrics
    from bmoe.formats.sidecar import read_pressure

    if not isinstance(record.get("dir"), str):
        return {}
    folder = root / record["dir"]
    csv = folder / "run.csv"
    if not csv.is_file():
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run = read_metrics(csv)
        except BmoeError:
            return {}
        sidecar = folder / "run.metrics"
        pressure = read_pressure(sidecar) if sidecar.is_file() else None
        figures = dict(run_summary(run, pressure))
    figures["file"] = str(csv.relative_to(root))
    for key in ("n_expert_used", "arch", "n_layer", "n_expert", "o_direct", "engine"):
        if key in run.params:
            figures.setdefault(key, run.params[key])
    return figures


def write_results(root: Path, frame: pd.DataFrame, axes: list[str], name: str) -> Path:
    """``results.parquet`` (atomically), with the axes and parameters in schema metadata."""
    frame = _uniform_columns(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[b"bmoe_sweep"] = json.dumps(
        {"name": name, "axes": axes, "params": frame.attrs.get("params", [])}
    ).encode("utf-8")
    table = table.replace_schema_metadata(meta)
    path = Path(root) / RESULTS
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
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
    out = frame.copy()
    out.attrs = dict(frame.attrs)
    for name in [c for c in out.columns if pd.api.types.is_object_dtype(out[c].dtype)]:
        column = out[name]
        kinds = column.dropna().map(type).unique()
        if len(kinds) > 1:
            out[name] = column.map(lambda v: v if v is None else str(v))
    return out


def load_results(root: Path) -> pd.DataFrame:
    """A sweep's results table (``results.parquet``, or rebuilt from the manifest when the
    sweep did not get as far as writing it). ``attrs`` carry ``axes`` and ``params``."""
    root = Path(root)
    if not root.is_dir():
        raise BmoeError(f"{root}: no such folder")
    path = root / RESULTS
    if path.is_file():
        try:
            table = pq.read_table(path)
            frame = table.to_pandas()
            meta = json.loads((table.schema.metadata or {}).get(b"bmoe_sweep", b"{}"))
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise BmoeError(f"{path}: unreadable ({str(exc).splitlines()[0]})") from None
        meta = meta if isinstance(meta, dict) else {}
        frame.attrs["axes"] = meta.get("axes", [])
        frame.attrs["params"] = meta.get("params", [])
        frame.attrs["name"] = meta.get("name")
        return frame
    if not (root / MANIFEST).is_file():
        raise BmoeError(f"{root}: not a sweep folder (no {RESULTS} or {MANIFEST})")
    frame = results_frame(root)
    frame.attrs["axes"] = _varying_columns(frame, frame.attrs.get("params", []))
    return frame


def _varying_columns(frame: pd.DataFrame, params: list[str]) -> list[str]:
    return [p for p in params if p in frame and frame[p].astype(str).nunique(dropna=False) > 1]
