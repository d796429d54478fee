"""What every attempt of a sweep run shares, wherever it runs: the context, the progress
sink, the attempt's log and output pumps, the first fields of its record, and which outcomes
are retried.

The bottom of the sweep package's run chain: one run's attempts (:mod:`bmoe.sweep.attempts`),
session mode (:mod:`bmoe.sweep.sessions`), the executors (:mod:`bmoe.sweep.local`,
:mod:`bmoe.sweep.farm`) and the farm hosts (:mod:`bmoe.sweep.shipping`) all import these from
here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from bmoe.engine.native import StreamState
from bmoe.errors import BmoeError
from bmoe.formats.archive import RUN_ERR
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.config import SweepConfig
from bmoe.sweep.plan import Run, Unit
from bmoe.sweep.system import MachineFacts
from bmoe.sweep.targets import Target, TargetSpec

#: The outcomes an attempt is retried after (up to ``[sweep] retries`` times).
RETRYABLE = ("crashed", "timeout", "invalid", "error")


class ProgressSink(Protocol):
    """What the runner reports as it goes (a live display, a plain log, or nothing)."""

    def sweep_started(self, total: int, done: int, targets: Sequence[str]) -> None: ...
    def run_started(self, target: str, run: Run, attempt: int) -> None: ...
    def run_progress(self, target: str, run: Run, state: StreamState) -> None: ...
    def run_finished(self, target: str, run: Run, record: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def target_hosts(self, hosts: dict[str, str]) -> None:
        """Which host runs each target (a farm); called before the first run starts."""


class NullSink:
    """A sink that reports nothing (library use and tests)."""

    def sweep_started(self, total, done, targets):
        pass

    def target_hosts(self, hosts):
        pass

    def run_started(self, target, run, attempt):
        pass

    def run_progress(self, target, run, state):
        pass

    def run_finished(self, target, run, record):
        pass

    def message(self, text):
        pass


def now_iso() -> str:
    """Local time with its UTC offset, to the millisecond: the stamp of records and logs."""
    return dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="milliseconds")


@dataclass
class CellContext:
    """What running a cell needs besides the cell and the target."""

    config: SweepConfig
    archive: ArchiveWriter
    stop: threading.Event = field(default_factory=threading.Event)
    sink: ProgressSink = field(default_factory=NullSink)
    stop_grace_s: float = 3.0
    #: Go on past a cell whose every attempt failed the same way (else the sweep stops).
    keep_going: bool = True
    #: Cells whose failure was already shown (the run.err tail is shown once per cell).
    shown_failures: set[str] = field(default_factory=set)
    #: Machine metadata for the records, found once per sweep.
    facts: MachineFacts = field(default_factory=MachineFacts)
    #: Kinds of system warning already shown (each once per sweep).
    shown_warnings: set[str] = field(default_factory=set)


class AttemptLog:
    """The attempt's own log (``run.log``), one timestamped line per event."""

    def __init__(self, path: Path):
        self.fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def __call__(self, text: str) -> None:
        self.fh.write(f"{now_iso()} {text}\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def pump(
    stream: IO[bytes] | None, sink_file: Path, on_line: Callable[[bytes], None] | None
) -> threading.Thread:
    """Copy `stream` (a process's pipe) line by line into `sink_file` on a thread, passing each
    line to `on_line` (whose errors never stop the copy); returns the started thread. A write
    that fails (disk full) stops the copy but not the draining (the engine never blocks on a
    full pipe); the error is kept on the thread as ``error`` for the attempt to raise."""
    if stream is None:
        raise ValueError("the process has no such pipe")

    def work() -> None:
        out = None
        try:
            out = open(sink_file, "ab")  # noqa: SIM115 (closed below)
        except OSError as exc:
            thread.error = exc  # type: ignore[attr-defined]
        for line in iter(stream.readline, b""):
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except OSError as exc:
                    thread.error = exc  # type: ignore[attr-defined]
                    with contextlib.suppress(OSError):
                        out.close()
                    out = None
            if on_line is not None:
                with contextlib.suppress(Exception):  # never stop the capture
                    on_line(line)
        if out is not None:
            with contextlib.suppress(OSError):
                out.close()
        stream.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.error = None  # type: ignore[attr-defined]
    thread.start()
    return thread


def attempt_record(run: Run, attempt: int, target: TargetSpec, engine: str) -> dict[str, Any]:
    """The fields every attempt's record starts with: which run, where, with what."""
    return {
        "run": run.id, "cell": run.cell.id, "repeat": run.repeat, "attempt": attempt,
        "order": run.order, "round": run.round, "reversed": run.reversed,
        "target": target.name, "target_kind": target.kind, "engine": engine,
        "host": socket.gethostname(), "params": dict(run.cell.params),
        "axes": dict(run.cell.axes), "tags": sorted(run.cell.tags), "started": now_iso(),
        **({"warmup": True} if run.warmup else {}),
    }  # fmt: skip


def printable(value: Any) -> Any:
    """`value` with every string safe to store as UTF-8 (undecodable bytes become U+FFFD)."""
    from bmoe.formats.protocol import printable as text

    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value


#: Lines of run.err shown when a cell first fails.
ERR_TAIL_LINES = 8
#: Statuses that say the engine or its configuration failed (not the clock, not a stop).
FAILED = ("crashed", "invalid", "error")


def err_tail(path: Path, lines: int = ERR_TAIL_LINES) -> list[str]:
    """The last non-empty lines of an engine's stderr (a bounded read of the file's end,
    control characters blanked)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            raw = fh.read()
    except OSError:
        return []
    text = raw.decode("utf-8", "replace")
    kept = []
    for line in text.splitlines():
        line = "".join(ch if ch.isprintable() else " " for ch in line).strip()
        if line:
            kept.append(line[:300])
    return kept[-lines:]


class CellFailed(BmoeError):
    """Every attempt of a cell failed the same way: the sweep stops (``--keep-going`` not)."""


def _failure_key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record.get("status"), record.get("exit_code"), record.get("error"))


def show_failure(run: Run, record: dict[str, Any], ctx: CellContext) -> None:
    """The first failure of a cell: its error and the tail of its run.err, once."""
    if record.get("status") not in FAILED or run.cell.id in ctx.shown_failures:
        return
    ctx.shown_failures.add(run.cell.id)
    text = f"{run.id} attempt {record.get('attempt')}: {record.get('status')}"
    if record.get("error"):
        text += f": {record['error']}"
    tail = err_tail(ctx.archive.root / str(record.get("dir")) / RUN_ERR)
    if tail:
        text += "\n  run.err (last lines):\n" + "\n".join(f"    {line}" for line in tail)
    ctx.sink.message(text)


def check_same_failure(run: Run, records: list[dict[str, Any]], ctx: CellContext) -> None:
    """Stop the sweep (:class:`CellFailed`) when every one of a run's attempts (`records`)
    failed with the same error, unless ``ctx.keep_going``."""
    keys = {_failure_key(r) for r in records}
    if len(keys) != 1 or records[0].get("status") not in FAILED:
        return
    if ctx.keep_going or ctx.stop.is_set():
        return
    ctx.stop.set()
    record = records[-1]
    raise CellFailed(
        f"{run.id}: every attempt ({len(records)}) failed the same way: "
        f"{record.get('status')}"
        + (f": {record['error']}" if record.get("error") else "")
        + f" (see {ctx.archive.root / str(record.get('dir'))}/{RUN_ERR}; "
        "--keep-going runs the other cells anyway)"
    )


#: How an executor runs one unit next to its target (:func:`bmoe.sweep.units.run_unit`):
#: the unit, the target, the context, and where each attempt's record goes.
UnitRunner = Callable[[Unit, Target, CellContext, Callable[[dict[str, Any]], None]], None]
