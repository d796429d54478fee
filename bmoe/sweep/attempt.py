"""What every attempt of a sweep run shares, wherever it runs: the context, the progress
sink, the attempt's log and output pumps, the first fields of its record, and which outcomes
are retried.

The runner, session mode (:mod:`bmoe.sweep.sessions`), the executors
(:mod:`bmoe.sweep.farm`) and the farm hosts (:mod:`bmoe.sweep.shipping`) all import these
from here, so none of them imports another for them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from bmoe.engine.native import StreamState
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.config import SweepConfig, TargetSpec
from bmoe.sweep.plan import Run, Unit
from bmoe.sweep.targets import Target

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
    line to `on_line` (whose errors never stop the copy); returns the started thread."""
    if stream is None:
        raise ValueError("the process has no such pipe")

    def work() -> None:
        with open(sink_file, "ab") as out:
            for line in iter(stream.readline, b""):
                out.write(line)
                out.flush()
                if on_line is not None:
                    with contextlib.suppress(Exception):  # never stop the capture
                        on_line(line)
        stream.close()

    thread = threading.Thread(target=work, daemon=True)
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


#: How an executor runs one unit next to its target (:func:`bmoe.sweep.runner.run_unit`):
#: the unit, the target, the context, and where each attempt's record goes.
UnitRunner = Callable[[Unit, Target, CellContext, Callable[[dict[str, Any]], None]], None]
