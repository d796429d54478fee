"""Running a unit on another host and shipping its attempts home, as a stream of messages.

A farm host runs :func:`run_unit_away`: the same code as the local executor
(:func:`bmoe.sweep.units.run_unit`) into a scratch sweep folder, turning what happens into
plain messages (dicts of strings, numbers and bytes) that any transport can carry: ``hello``
(the host), ``started`` / ``progress`` (for live progress), ``file`` (a piece of an attempt's
file), ``record`` (the attempt's manifest record, after its files), ``session_file`` /
``session`` (a session's own folder, before the turns that point at it), ``message`` and
``failed`` (the unit could not run there).

The driver feeds the messages to a :class:`Receiver`, which writes each attempt into the real
sweep folder through the same staging folder and :meth:`ArchiveWriter.finalize` as a local attempt,
so the folder, the manifest and resume are exactly those of a sweep on one host. An attempt
whose host or task died is archived by :meth:`Receiver.fail` (status ``lost``) with whatever
arrived of its files.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.engine.native import StreamState
from bmoe.errors import BmoeError
from bmoe.formats.archive import CELLS, RECORD, RUN_CSV, RUN_LOG, fsync_dir
from bmoe.sweep.archive import ArchiveWriter, AttemptPaths
from bmoe.sweep.attempt import (
    CellContext,
    CellFailed,
    ProgressSink,
    UnitRunner,
    attempt_record,
    now_iso,
    printable,
)
from bmoe.sweep.config import SweepConfig
from bmoe.sweep.plan import Run, Unit
from bmoe.sweep.sessions import SESSIONS
from bmoe.sweep.targets import TargetSpec, open_target
from bmoe.sweep.units import run_unit as run_unit_here

#: Files travel in pieces of at most this many bytes (bounded memory on both sides).
CHUNK_BYTES = 8 << 20
#: How often a running unit asks the driver whether the sweep was stopped.
STOP_POLL_S = 1.0
#: Progress messages per running attempt, at most one per this many seconds.
PROGRESS_EVERY_S = 0.5

_FILE_NAME = re.compile(r"[A-Za-z0-9._=+-]+")
_SESSION_DIR = re.compile(SESSIONS + r"/[A-Za-z0-9._=+-]+")


class HostArchive(ArchiveWriter):
    """A scratch sweep folder on a farm host; attempt numbers continue the driver's."""

    def __init__(self, root: Path, floors: Mapping[str, int]):
        super().__init__(root)
        self.floors = dict(floors)

    def next_attempt(self, run_id: str) -> int:
        return max(super().next_attempt(run_id), self.floors.get(run_id, 1))


def host_state_dir(sweep_name: str) -> Path:
    """Where a farm host keeps a sweep's target state (engine pidfiles) across its tasks, so
    an engine left behind by a task that died is found and killed by the next one."""
    safe = re.sub(r"[^A-Za-z0-9._=+-]+", "_", sweep_name)
    return Path(tempfile.gettempdir()) / "bmoe-farm" / safe / "targets"


class _HostSink:
    """The runner's progress events on a farm host, as messages (progress throttled)."""

    def __init__(self, out: queue.Queue):
        self.out = out
        self._last: dict[str, float] = {}

    def sweep_started(self, total, done, targets):
        pass

    def target_hosts(self, hosts):
        pass

    def run_started(self, target, run, attempt):
        self._last[run.id] = 0.0
        self.out.put({"kind": "started", "run": run.id, "attempt": attempt})

    def run_progress(self, target, run, state):
        now = time.monotonic()
        if now - self._last.get(run.id, 0.0) < PROGRESS_EVERY_S:
            return
        self._last[run.id] = now
        fields = ("step", "steps", "wall_ms_total", "tokens_seen", "read_mb", "cache_hit_pct")
        self.out.put(
            {"kind": "progress", "run": run.id, "state": {k: getattr(state, k) for k in fields}}
        )

    def run_finished(self, target, run, record):
        pass  # the record itself follows, with its files

    def message(self, text):
        self.out.put({"kind": "message", "text": text})


def _file_messages(path: Path, kind: str, key: Mapping[str, Any], chunk: int) -> Iterator[dict]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        offset = 0
        while True:
            data = fh.read(chunk)
            if not data and offset:
                return
            yield {"kind": kind, **key, "name": path.name, "offset": offset, "data": data}
            offset += len(data)
            if offset >= size:
                return


def run_unit_away(
    unit: Unit,
    target_spec: TargetSpec,
    config: SweepConfig,
    sweep_name: str,
    floors: Mapping[str, int],
    stopped: Callable[[], bool],
    *,
    sessions_taken: Sequence[str] = (),
    node: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    state_dir: Path | None = None,
    run_unit: UnitRunner = run_unit_here,
    keep_going: bool = True,
) -> Iterator[dict[str, Any]]:
    """Run `unit` on this host (where `target_spec` is reachable) and yield its messages.

    `sweep_name` is the sweep folder's name (remote run folders are named after it), `floors`
    the first attempt number of each run, `sessions_taken` the session folders the sweep
    already holds (their numbers are not reused); `stopped` says whether the driver stopped
    the sweep (asked every :data:`STOP_POLL_S`). Each attempt's files leave the scratch folder
    as soon as they are shipped. `state_dir` is where the target keeps its state (default
    :func:`host_state_dir`). `run_unit` runs the unit (by default
    :func:`bmoe.sweep.units.run_unit`, as the local executor does).
    Without `keep_going`, a run whose every attempt failed the same way ends the unit with a
    ``cell_failed`` message (the driver stops the sweep).
    """
    scratch = Path(tempfile.mkdtemp(prefix="bmoe-farm-"))
    target = None
    try:
        archive = HostArchive(scratch / sweep_name, floors)
        (archive.root / CELLS).mkdir(parents=True)
        for name in sessions_taken:
            if _FILE_NAME.fullmatch(name):
                (archive.root / SESSIONS / name).mkdir(parents=True, exist_ok=True)
        events: queue.Queue = queue.Queue()
        stop = threading.Event()
        ctx = CellContext(config, archive, stop, _HostSink(events), keep_going=keep_going)
        target = open_target(target_spec, state_dir or host_state_dir(sweep_name))
        yield {"kind": "hello", "host": socket.gethostname(), "node": node, "pid": os.getpid()}
        finished = object()

        def work() -> None:
            try:
                run_unit(unit, target, ctx, lambda r: events.put({"kind": "_record", "record": r}))
            except CellFailed as exc:
                events.put({"kind": "cell_failed", "error": str(exc)})
            except BaseException as exc:  # reported to the driver, never lost in a thread
                events.put({"kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
            finally:
                events.put(finished)

        thread = threading.Thread(target=work, name="bmoe-unit", daemon=True)
        thread.start()
        shipped: set[str] = set()
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if not stop.is_set() and now >= next_poll:
                next_poll = now + STOP_POLL_S
                try:
                    if stopped():
                        stop.set()
                except Exception:  # the driver is gone: stop what runs here
                    stop.set()
            try:
                item = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is finished:
                break
            if item["kind"] != "_record":
                yield item
                continue
            record = item["record"]
            session = record.get("session")
            if session and session not in shipped and (archive.root / session).is_dir():
                shipped.add(session)
                for path in sorted((archive.root / session).iterdir()):
                    if path.is_file():
                        yield from _file_messages(
                            path, "session_file", {"session": session}, chunk_bytes
                        )
                yield {"kind": "session", "session": session}
            folder = archive.root / record["dir"]
            key = {"run": record["run"], "attempt": record["attempt"]}
            for path in sorted(folder.iterdir()):
                if path.is_file() and path.name != RECORD:
                    yield from _file_messages(path, "file", key, chunk_bytes)
            yield {"kind": "record", "record": {**record, "node": node}}
            shutil.rmtree(folder, ignore_errors=True)
        thread.join()
    finally:
        if target is not None:
            with contextlib.suppress(Exception):
                target.close()
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------- driver side


@dataclass
class _InFlight:
    run: Run
    attempt: int
    files: AttemptPaths
    started: str = field(default_factory=now_iso)
    t0: float = field(default_factory=time.monotonic)


@dataclass
class Delivery:
    """What the driver knows of one unit running away: where, and its attempts in flight
    (several at once in session mode, where the turns' records come when the session ends)."""

    unit: Unit
    target: TargetSpec
    host: str | None = None
    node: str | None = None
    open: dict[tuple[str, int], _InFlight] = field(default_factory=dict)
    running: Run | None = None  # the attempt the progress messages are about
    statuses: dict[str, str] = field(default_factory=dict)  # run id -> last status
    lost: set[str] = field(default_factory=set)  # runs whose last attempt died with its host
    session_staging: dict[str, Path] = field(default_factory=dict)

    def unfinished(self) -> list[Run]:
        """The unit's runs without a record yet (to run again elsewhere or later)."""
        return [r for r in self.unit.runs if r.id not in self.statuses]

    def to_retry(self) -> list[Run]:
        """The unit's runs to run again: not reached, or whose last attempt was lost."""
        return [r for r in self.unit.runs if r.id not in self.statuses or r.id in self.lost]


class Receiver:
    """Writes the messages of units run elsewhere into the sweep folder (driver side)."""

    def __init__(self, archive: ArchiveWriter, config: SweepConfig, sink: ProgressSink):
        self.archive = archive
        self.config = config
        self.sink = sink
        #: Why the sweep must stop: a run whose every attempt failed the same way on a host.
        self.cell_failed: str | None = None

    def receive(self, delivery: Delivery, item: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take one message; returns the records of the attempts it completed (archived)."""
        kind = item.get("kind")
        name = delivery.target.name
        if kind == "hello":
            delivery.host, delivery.node = item.get("host"), item.get("node")
        elif kind == "started":
            run, _files = self._open(delivery, item["run"], int(item["attempt"]))
            delivery.running = run
            self.sink.run_started(name, run, int(item["attempt"]))
        elif kind == "progress":
            if delivery.running is not None and delivery.running.id == item.get("run"):
                state = StreamState(**{k: v for k, v in item["state"].items()
                                       if k in StreamState.__dataclass_fields__})  # fmt: skip
                self.sink.run_progress(name, delivery.running, state)
        elif kind == "file":
            _run, files = self._open(delivery, item["run"], int(item["attempt"]))
            _write_piece(files.staging, item)
        elif kind == "session_file":
            _write_piece(self._session_staging(delivery, item["session"]), item)
        elif kind == "session":
            self._session_done(delivery, item["session"])
        elif kind == "record":
            return [self._record(delivery, dict(item["record"]))]
        elif kind == "message":
            self.sink.message(f"{name}: {item.get('text')}")
        elif kind == "failed":
            return self.fail(delivery, "error", f"on host {delivery.host}: {item.get('error')}")
        elif kind == "cell_failed":
            # The executor stops the sweep, lets the other hosts end their attempts, then
            # raises this.
            self.cell_failed = self.cell_failed or f"{item.get('error')} (on host {delivery.host})"
        return []

    def _open(self, delivery: Delivery, run_id: str, attempt: int) -> tuple[Run, AttemptPaths]:
        key = (run_id, attempt)
        if key not in delivery.open:
            run = next((r for r in delivery.unit.runs if r.id == run_id), None)
            if run is None:
                raise BmoeError(f"target {delivery.target.name} sent a run of another unit: "
                                f"{run_id!r}")  # fmt: skip
            delivery.open[key] = _InFlight(run, attempt, self.archive.staging(run.id, attempt))
        flight = delivery.open[key]
        return flight.run, flight.files

    def _session_staging(self, delivery: Delivery, session: str) -> Path:
        if not _SESSION_DIR.fullmatch(session):
            raise BmoeError(f"target {delivery.target.name} sent a bad session folder {session!r}")
        staging = delivery.session_staging.get(session)
        if staging is None:
            parent = self.archive.root / SESSIONS
            parent.mkdir(exist_ok=True)
            staging = parent / f".{session.split('/', 1)[1]}.staging"
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir()
            delivery.session_staging[session] = staging
        return staging

    def _session_done(self, delivery: Delivery, session: str) -> None:
        staging = self._session_staging(delivery, session)
        final = self.archive.root / session
        if final.exists():  # never expected (numbers continue the driver's); keep both
            n = 1
            while final.with_name(f"{final.name}.replaced-{n}").exists():
                n += 1
            final.rename(final.with_name(f"{final.name}.replaced-{n}"))
        staging.rename(final)
        fsync_dir(final.parent)
        delivery.session_staging.pop(session, None)

    def _record(self, delivery: Delivery, record: dict[str, Any]) -> dict[str, Any]:
        run, files = self._open(delivery, record["run"], int(record["attempt"]))
        del delivery.open[(run.id, int(record["attempt"]))]
        listing = record.get("files")
        for key in ("files", "dir"):
            record.pop(key, None)
        record.setdefault("node", delivery.node)
        problem = delivery_problem(files.staging, listing, record.get("status") == "ok")
        if problem is not None:
            earlier = record.get("error")
            record["status"] = "invalid"
            record["error"] = f"delivery check: {problem}" + (f"; {earlier}" if earlier else "")
        record = self.archive.finalize(files, printable(record))
        delivery.statuses[run.id] = record["status"]
        delivery.lost.discard(run.id)
        self.sink.run_finished(delivery.target.name, run, record)
        return record

    def fail(self, delivery: Delivery, status: str, error: str) -> list[dict[str, Any]]:
        """Archive the attempts in flight (or, when none had started, one for the unit's next
        run) as failed with `status` (``lost``: the host or the task died), keeping whatever
        of their files arrived. Returns the records."""
        for staging in delivery.session_staging.values():
            shutil.rmtree(staging, ignore_errors=True)
        delivery.session_staging.clear()
        in_flight = list(delivery.open.values())
        delivery.open.clear()
        delivery.running = None
        if not in_flight:
            left = delivery.unfinished()
            if not left:
                return []
            attempt = self.archive.next_attempt(left[0].id)
            in_flight = [_InFlight(left[0], attempt, self.archive.staging(left[0].id, attempt))]
            self.sink.run_started(delivery.target.name, left[0], attempt)
        records = []
        for flight in in_flight:
            run, files = flight.run, flight.files
            record = attempt_record(run, flight.attempt, delivery.target,
                                    self.config.settings.engine)  # fmt: skip
            ended = now_iso()
            record.update({
                "host": delivery.host, "node": delivery.node, "started": flight.started,
                "ended": ended, "duration_s": round(time.monotonic() - flight.t0, 3),
                "status": status, "exit_code": None, "error": error, "entry": {},
                "entry_columns": {}, "stream": {},
            })  # fmt: skip
            with open(files.staging / RUN_LOG, "a", encoding="utf-8") as log:
                log.write(f"{ended} status {status} on target {delivery.target.name} "
                          f"(host {delivery.host}, node {delivery.node}): {error}\n")  # fmt: skip
            record = self.archive.finalize(files, printable(record))
            delivery.statuses[run.id] = status
            delivery.lost.add(run.id)
            self.sink.run_finished(delivery.target.name, run, record)
            records.append(record)
        return records


def delivery_problem(staging: Path, listing: Any, complete: bool) -> str | None:
    """Why the files that arrived in `staging` are not the attempt the host archived (None
    when they are): every file the host listed, with its size and SHA-256, and for a run the
    host called complete, a metrics CSV that reads as a finished run."""
    from bmoe.sweep.archive import csv_complete, file_digest

    if not isinstance(listing, Mapping):
        return "the host sent no file listing" if complete else None
    for name, meta in listing.items():
        path = staging / str(name)
        if not isinstance(meta, Mapping):
            return f"bad listing entry for {name!r}"
        if not path.is_file():
            return f"{name} did not arrive"
        size = path.stat().st_size
        if size != meta.get("bytes"):
            return f"{name}: {size} bytes arrived, the host wrote {meta.get('bytes')}"
        if file_digest(path) != meta.get("sha256"):
            return f"{name}: checksum differs from the host's"
    if complete:
        csv = staging / RUN_CSV
        if not csv.is_file():
            return f"no {RUN_CSV}"
        ok, why = csv_complete(csv)
        if not ok:
            return why
    return None


def _write_piece(folder: Path, item: Mapping[str, Any]) -> None:
    name = str(item["name"])
    if not _FILE_NAME.fullmatch(name) or name in (".", "..", RECORD):
        raise BmoeError(f"a farm host sent a file with a bad name: {name!r}")
    path = folder / name
    offset = item.get("offset")
    size = path.stat().st_size if path.exists() else 0
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= size:
        # Pieces arrive in order: anything else would leave a hole (or a huge sparse file).
        raise BmoeError(f"a farm host sent a piece of {name} at offset {offset!r} "
                        f"(the file has {size} bytes)")  # fmt: skip
    mode = "r+b" if path.exists() else "wb"
    with open(path, mode) as fh:
        fh.seek(offset)
        fh.write(item["data"])
