"""Writing a sweep folder: atomic run folders and the ``manifest.jsonl`` appends.

The folder's layout, its names and its readers are :mod:`bmoe.formats.archive`'s; the
results table is read by :mod:`bmoe.sweep.results`. A run's files are written into a
hidden staging folder and the folder is renamed into place when complete, so a completed run
is always whole; the manifest line follows the rename. Resume trusts the folder: a run counts
as done when its ``record.json`` says ok and every file it lists has the recorded size and
checksum and its CSV reads as a finished run.
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.archive import (
    CELLS,
    CONFIG,
    INVALID,
    MANIFEST,
    RECORD,
    RESULT_KEYS,
    RESULTS,
    RUN_CSV,
    SESSIONS,
    STATE,
    STATUSES,
    SUMMARY,
    TORN,
    TUNE_STATE,
    clear_stale_tmp,
    fsync_dir,
    iter_completed,
    manifest_line,
    read_manifest,
    read_record,
    write_atomic,
    write_results,
)
from bmoe.sweep.results import load_results, results_frame
from bmoe.sweep.shelltext import shell_join


def is_tune_folder(root: Path) -> bool:
    """Whether `root` was made by ``bmoe tune``: its ``tune.json``, or a ``[tune]`` table in
    its ``sweep.toml`` (a tune stopped before its first round was recorded)."""
    import tomllib

    root = Path(root)
    if (root / TUNE_STATE).is_file():
        return True
    try:
        with open(root / CONFIG, "rb") as fh:
            head = fh.read(1 << 20)
        return isinstance(tomllib.loads(head.decode("utf-8")).get("tune"), dict)
    except (OSError, ValueError, RecursionError):
        return False


def resume_command(root: Path) -> str:
    """The command that carries on the sweep or tune of folder `root`, quoted to paste."""
    return shell_join(["bmoe", "tune" if is_tune_folder(root) else "sweep", str(root)])


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
        self.mended: str | None = None  # what :meth:`open` did to a torn manifest

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
        archive = cls(root)
        archive.mended = archive.mend_manifest()
        adopted = archive.adopt_unlisted()
        if adopted:
            said = f"{adopted} completed run(s) it did not list (their lines lost); listed again"
            archive.mended = (
                f"{archive.mended}; {said}" if archive.mended else f"{MANIFEST}: {said}"
            )
        return archive

    @property
    def state_dir(self) -> Path:
        return self.root / STATE

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
        for staging in (self.root / SESSIONS).glob(".*.staging"):
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
        line = manifest_line(record)
        fd = os.open(self.root / MANIFEST, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._mend_tail(fd)
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)

    def mend_manifest(self) -> str | None:
        """Set aside a torn last line of the manifest (see :meth:`_mend_tail`); returns what
        was done, or None when the manifest ends whole."""
        path = self.root / MANIFEST
        if not path.is_file():
            return None
        with self._lock:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            try:
                return self._mend_tail(fd)
            finally:
                os.close(fd)

    def _mend_tail(self, fd: int) -> str | None:
        """A manifest whose last line has no newline (a power loss or a kill mid-write) would
        glue the next record to the fragment, losing both. A fragment that reads as a whole
        record only lacks its newline, which is added; any other is moved to
        ``manifest.jsonl.torn`` and cut from the manifest."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return None
        start = size
        while start > 0:  # back to the last newline, a block at a time
            block = os.pread(fd, min(1 << 16, start), max(0, start - (1 << 16)))
            cut = block.rfind(b"\n")
            if cut >= 0:
                start = start - len(block) + cut + 1
                break
            start -= len(block)
        tail = os.pread(fd, size - start, start)
        try:
            whole = isinstance(json.loads(tail), dict)
        except (ValueError, RecursionError):
            whole = False
        if whole:
            os.write(fd, b"\n")
            os.fsync(fd)
            return f"{MANIFEST}: its last line lacked a newline; added"
        with open(self.root / TORN, "ab") as aside:
            aside.write(tail + b"\n")
            aside.flush()
            os.fsync(aside.fileno())
        os.ftruncate(fd, start)
        os.fsync(fd)
        return (
            f"{MANIFEST}: its last line was cut short ({len(tail)} bytes, a kill or power loss "
            f"mid-write); set aside in {TORN}"
        )

    def adopt_unlisted(self) -> int:
        """Give back its ``ok`` line to every completed run folder that validates and that no
        ``ok`` line names (its line torn off and set aside, or the kill came between the
        folder's rename and the append), whether or not the resumed plan holds it: a tune
        plans its rounds from the manifest, so a run it does not list would be lost to it.
        Returns how many lines were appended."""
        listed = {(r.get("run"), r.get("attempt")) for r in self.manifest()
                  if isinstance(r, dict) and r.get("status") == "ok"}  # fmt: skip
        adopted = 0
        for path in sorted((self.root / CELLS).glob(f"*/r*/{RECORD}")):
            run_dir = path.parent
            if not re.fullmatch(r"r\d+", run_dir.name):
                continue  # an attempt set aside (r1.a2.crashed, r1.invalid-1)
            run_id = f"{run_dir.parent.name}/{run_dir.name}"
            record = self.completed_record(run_id)
            if not record or (record.get("run"), record.get("attempt")) in listed:
                continue
            if record.get("run") != run_id or not self.validate_run(run_id)[0]:
                continue
            self.append_manifest(record)
            adopted += 1
        return adopted

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
                    line = manifest_line(record)
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
        csv = final / RUN_CSV
        if not csv.is_file():
            return False, f"no {RUN_CSV}"
        ok, why = csv_complete(csv)
        return ok, why

    def completed_record(self, run_id: str) -> dict[str, Any] | None:
        return read_record(self.run_final(run_id))

    def set_aside(self, run_id: str, reason: str) -> Path | None:
        """Move a run folder that does not validate out of the way (kept, renamed)."""
        final = self.run_final(run_id)
        if not final.exists():
            return None
        n = 1
        while (dest := final.with_name(f"{final.name}.invalid-{n}")).exists():
            n += 1
        final.rename(dest)
        (dest / INVALID).write_text(reason + "\n", encoding="utf-8")
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
    if run.partial:
        said = run.summary.get("tokens") if run.summaries else None
        why = "no summary" if said is None else f"the summary says tokens={said}"
        return False, f"{path.name}: the run did not finish ({run.tokens} rows, {why})"
    return True, "ok"


__all__ = [
    "CELLS",
    "CONFIG",
    "MANIFEST",
    "RECORD",
    "RESULTS",
    "RESULT_KEYS",
    "STATUSES",
    "SUMMARY",
    "TORN",
    "TUNE_STATE",
    "ArchiveWriter",
    "AttemptPaths",
    "csv_complete",
    "file_digest",
    "find_latest",
    "folder_name",
    "is_tune_folder",
    "iter_completed",
    "load_results",
    "new_folder",
    "read_manifest",
    "results_frame",
    "resume_command",
    "write_atomic",
    "write_results",
]  # fmt: skip
