"""Session mode: the runs of a unit are turns of one ``--session`` engine process.

The model loads once and the expert cache stays warm while the prompts (and ``n_predict``)
vary. The session's own files (its stdout, stderr, whole CSV, traces, sampler readings, the
command) are kept under ``sessions/<id>.a<n>/``; each turn becomes an ordinary run folder whose
``run.csv`` holds that turn's rows and ``# summary`` (split from the session's CSV), whose
``run.out`` holds that turn's protocol lines, and whose record carries the turn's
``BMOE_DONE``. A turn the engine rejects (``BMOE_ERROR``, not fatal) is ``rejected``; a
session that dies takes its running turn with it (``crashed``) and the runs it did not reach
go to a new session.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bmoe.engine.native import StreamState, engine_args, output_files
from bmoe.engine.session import SessionClient, SessionError, SessionRequestError
from bmoe.errors import BmoeError
from bmoe.formats.archive import (
    COMMAND,
    RUN_CSV,
    RUN_LOG,
    RUN_OUT,
    RUN_SIDECAR,
    SAMPLES,
    SESSIONS,
    fsync_dir,
    write_atomic,
)
from bmoe.formats.metrics import MetricsRun, read_metrics, write_metrics
from bmoe.formats.sidecar import write_pressure
from bmoe.sweep.archive import csv_complete
from bmoe.sweep.attempt import (
    RETRYABLE,
    AttemptLog,
    CellContext,
    check_same_failure,
    now_iso,
    printable,
    pump,
    show_failure,
)
from bmoe.sweep.gate import (
    EntryState,
    parse_entry_state,
    parse_samples,
    pressure_from_samples,
    wait_for_gate,
)
from bmoe.sweep.plan import Run, Unit
from bmoe.sweep.targets import Target, TargetError


def split_turns(path: Path) -> list[MetricsRun]:
    """A session CSV as one :class:`MetricsRun` per turn (its rows and its summary)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = read_metrics(path)
    rows = whole.rows
    if "turn" not in rows or rows.empty:
        return []
    turns = list(dict.fromkeys(rows["turn"].tolist()))
    out = []
    for index, turn in enumerate(turns):
        part = rows[rows["turn"] == turn].reset_index(drop=True)
        summaries = [whole.summaries[index]] if index < len(whole.summaries) else []
        out.append(MetricsRun(None, whole.version, dict(whole.params), part, summaries))
    return out


def _session_id(unit_runs: list[Run]) -> str:
    digest = hashlib.sha256("+".join(r.id for r in unit_runs).encode()).hexdigest()[:10]
    return f"{unit_runs[0].cell.id.rsplit('-', 1)[0][:40]}-{digest}"


def run_session(
    runs: list[Run], target: Target, ctx: CellContext, emit: Callable[[dict[str, Any]], None]
) -> list[Run]:
    """One session over `runs` (in order); archives each turn; returns the runs it did not
    reach (the engine died first) so the caller can give them another session."""
    session = _Session(runs, target, ctx)
    try:
        client = session.start()
        session.run_turns(client)
        session.end(client)
    except (TargetError, SessionError, BmoeError) as exc:
        session.failed(exc)
    finally:
        session.out_file.close()
    session.archive_turns(emit)
    return session.close()


class _Session:
    """One session as it goes through its phases: its folder (on creation), the engine started
    (:meth:`start`), the turns (:meth:`run_turns`), the engine ended (:meth:`end`, or
    :meth:`failed`), each turn archived as a run (:meth:`archive_turns`), the folder put in
    place (:meth:`close`)."""

    def __init__(self, runs: list[Run], target: Target, ctx: CellContext):
        self.runs, self.target, self.ctx = runs, target, ctx
        self.settings = ctx.config.settings
        self.id = _session_id(runs)
        self.folder = ctx.archive.root / SESSIONS
        self.folder.mkdir(exist_ok=True)
        n = 1
        while (
            any(self.folder.glob(f"{self.id}.a{n}*"))
            or (self.folder / f".{self.id}.a{n}.staging").exists()
        ):
            n += 1
        self.n = n
        self.staging = self.folder / f".{self.id}.a{n}.staging"
        self.staging.mkdir()
        self.log = AttemptLog(self.staging / "session.log")
        #: The protocol lines of the running turn (each turn's ``run.out``).
        self.turn_lines: list[bytes] = []
        self.out_file = open(self.staging / "session.out", "ab")  # noqa: SIM115 (closed by run_session)
        #: One per turn reached: its run, attempt, files, outcome and lines.
        self.results: list[dict[str, Any]] = []
        self.reached = 0
        self.proc: subprocess.Popen | None = None
        self.error: BmoeError | None = None
        self.entry = EntryState()
        self.run_dir = ""
        self.outputs: dict[str, str] = {}
        self.err_pump: threading.Thread | None = None

    def on_line(self, line: bytes) -> None:
        self.out_file.write(line)
        self.out_file.flush()
        self.turn_lines.append(line)

    def start(self) -> SessionClient:
        """Kill strays, wait at the gate, start the engine in session mode; once it is ready,
        the client that asks it for turns."""
        target, ctx, settings, staging = self.target, self.ctx, self.settings, self.staging
        strays = target.kill_strays(settings.engine)
        if strays:
            self.log(f"killed stray engine processes: {strays}")
        self.entry = wait_for_gate(
            lambda: parse_entry_state(target.read_state_text()),
            ctx.config.gate,
            stop=ctx.stop.is_set,
        )
        self.run_dir = target.run_dir(
            staging, f"{ctx.archive.root.name}/{SESSIONS}-{self.id}.a{self.n}"
        )
        target.prepare(self.run_dir)
        params = dict(self.runs[0].cell.params)
        self.outputs = output_files(params)
        model = target.model_path(str(params["model"]), settings.base_dir)
        argv = target.engine_program(settings.engine) + engine_args(
            params, self.outputs, model=model, session=True
        )
        (staging / COMMAND).write_text(
            json.dumps({"argv": argv, "cwd": self.run_dir, "target": target.name}, indent=1,
                       ensure_ascii=False) + "\n", encoding="utf-8")  # fmt: skip
        self.log(f"start on {target.name}: {target.describe(argv, self.run_dir)}")
        self.proc = proc = target.start(argv, self.run_dir, staging, stdin=True)
        self.err_pump = pump(proc.stderr, staging / "session.err", None)
        assert proc.stdin is not None and proc.stdout is not None  # started with pipes
        client = SessionClient(proc.stdin, proc.stdout, on_line=self.on_line)
        client.wait_ready(timeout=settings.timeout_s)
        return client

    def run_turns(self, client: SessionClient) -> None:
        """One turn per run, in order, until the sweep stops or the engine dies."""
        for index, run in enumerate(self.runs):
            if self.ctx.stop.is_set():
                break
            self.results.append(self._turn(client, index, run))
            if self.error is not None:
                break

    def _turn(self, client: SessionClient, index: int, run: Run) -> dict[str, Any]:
        target, ctx, archive = self.target, self.ctx, self.ctx.archive
        attempt = archive.next_attempt(run.id)
        files = archive.staging(run.id, attempt)
        turn_entry = self.entry if index == 0 else parse_entry_state(target.read_state_text())
        ctx.sink.run_started(target.name, run, attempt)
        self.turn_lines.clear()
        state = StreamState()

        def progress(data: dict[str, Any]) -> None:
            state.step = int(data.get("step", state.step))
            state.steps = data.get("steps", state.steps)
            wall = data.get("wall_ms")
            if isinstance(wall, int | float):
                state.wall_ms_total += float(wall)
                state.tokens_seen += 1
            ctx.sink.run_progress(target.name, run, state)

        started, t0 = now_iso(), time.monotonic()
        status, error, turn = "error", None, None
        self.reached = index + 1
        try:
            turn = client.generate(
                str(run.cell.params.get("prompt", "")),
                n_predict=run.cell.params.get("n_predict"),
                timeout=self.settings.timeout_s,
                on_progress=progress,
            )
            if ctx.stop.is_set() and turn.cancelled:
                status = "interrupted"
            elif turn.timed_out:
                status, error = "timeout", "cancelled after the per-run timeout"
            elif turn.cancelled:
                status, error = "interrupted", "the engine cancelled the turn"
            else:
                status = "ok"
        except SessionRequestError as exc:
            status, error = "rejected", f"BMOE_ERROR: {exc.message}"
        except SessionError as exc:
            status, error = "crashed", str(exc)
            self.error = exc
        return {
            "run": run, "attempt": attempt, "files": files, "entry": turn_entry,
            "turn": turn, "status": status, "error": error, "started": started,
            "ended": now_iso(), "duration_s": round(time.monotonic() - t0, 3),
            "lines": list(self.turn_lines), "tok_s": state.tok_s, "tokens": state.tokens_seen,
        }  # fmt: skip

    def end(self, client: SessionClient) -> None:
        """Let the engine end (stop it when it does not, or the sweep stopped), then bring
        its files home."""
        target, ctx, proc = self.target, self.ctx, self.proc
        assert proc is not None and self.err_pump is not None  # started
        if self.error is None:
            client.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            target.stop(proc, ctx.stop_grace_s)
        if ctx.stop.is_set() and proc.poll() is None:
            target.stop(proc, ctx.stop_grace_s)
        self.err_pump.join(timeout=30)
        wanted = [*self.outputs.values(), SAMPLES]
        target.fetch(self.run_dir, wanted, self.staging)
        target.cleanup(self.run_dir)

    def failed(self, exc: BmoeError) -> None:
        """The session failed (`exc`): stop the engine; no turn counts as complete, and when
        no turn was reached the first run carries the failure."""
        archive, runs = self.ctx.archive, self.runs
        self.log(f"session failed: {exc}")
        if self.proc is not None and self.proc.poll() is None:
            self.target.stop(self.proc, self.ctx.stop_grace_s)
        for result in self.results:
            if result["status"] == "ok":
                result["status"], result["error"] = "error", f"session failed: {exc}"
        self.error = exc
        if not self.results and runs:
            attempt = archive.next_attempt(runs[0].id)
            self.results.append({
                "run": runs[0], "attempt": attempt, "files": archive.staging(runs[0].id, attempt),
                "entry": self.entry, "turn": None, "error": str(exc), "started": now_iso(),
                "status": "crashed" if isinstance(exc, SessionError) else "error",
                "ended": now_iso(), "duration_s": 0.0, "lines": list(self.turn_lines),
                "tok_s": None, "tokens": 0,
            })  # fmt: skip
            self.reached = 1

    def archive_turns(self, emit: Callable[[dict[str, Any]], None]) -> None:
        """Each turn reached as an ordinary run folder (its rows of the session's CSV, its
        protocol lines, the session's pressure), archived and passed to `emit`."""
        staging = self.staging
        pressure: dict[str, int] = {}
        samples = staging / SAMPLES
        if samples.is_file():
            pressure = pressure_from_samples(parse_samples(samples.read_text(errors="replace")))
            write_pressure(pressure, staging / "session.metrics")
        turns = split_turns(staging / RUN_CSV) if (staging / RUN_CSV).is_file() else []
        done_index = 0
        for result in self.results:
            files, turn = result["files"], result["turn"]
            dest = files.staging
            (dest / RUN_OUT).write_bytes(b"".join(result["lines"]))
            shutil.copyfile(staging / COMMAND, dest / COMMAND)
            if pressure:
                write_pressure(pressure, dest / RUN_SIDECAR)
            status, error = result["status"], result["error"]
            if turn is not None and turn.done:
                if done_index < len(turns):
                    write_metrics(turns[done_index], dest / RUN_CSV)
                done_index += 1
                if status == "ok":
                    if (dest / RUN_CSV).is_file():
                        ok, why = csv_complete(dest / RUN_CSV)
                        if not ok:
                            status, error = "invalid", why
                    else:
                        status, error = "invalid", "the session CSV has no rows for this turn"
            (dest / RUN_LOG).write_text(
                f"{result['started']} turn of session {self.rel} on {self.target.name}\n"
                f"{result['ended']} status {status}" + (f": {error}" if error else "") + "\n",
                encoding="utf-8",
            )
            record = self._turn_record(result, status, error, pressure)
            record = self.ctx.archive.finalize(files, printable(record))
            self.ctx.sink.run_finished(self.target.name, result["run"], record)
            emit(record)

    @property
    def rel(self) -> str:
        """The session's folder, relative to the sweep folder (the turns' records name it)."""
        return f"{SESSIONS}/{self.id}.a{self.n}"

    def _turn_record(
        self, result: dict[str, Any], status: str, error: str | None, pressure: dict[str, int]
    ) -> dict[str, Any]:
        run, turn, target = result["run"], result["turn"], self.target
        entry_state: EntryState = result["entry"]
        exit_code = self.proc.returncode if self.proc is not None else None
        return {
            "run": run.id, "cell": run.cell.id, "repeat": run.repeat,
            "attempt": result["attempt"], "order": run.order, "round": run.round,
            "reversed": run.reversed, "target": target.name, "target_kind": target.spec.kind,
            "engine": self.settings.engine, "host": socket.gethostname(),
            "params": dict(run.cell.params),
            "axes": dict(run.cell.axes), "tags": sorted(run.cell.tags),
            "started": result["started"], "ended": result["ended"],
            "duration_s": result["duration_s"], "status": status, "exit_code": exit_code,
            "error": error, "entry": entry_state.to_json(),
            "entry_columns": entry_state.columns(), "pressure": pressure,
            "pressure_scope": "session", "session": self.rel,
            "stream": {"tokens": result["tokens"], "tok_s": result["tok_s"],
                       "done": turn.done if turn is not None else None},
        }  # fmt: skip

    def close(self) -> list[Run]:
        """Put the session's folder in place; returns the runs a dead session did not reach
        (none when the sweep stopped)."""
        ctx = self.ctx
        self.log("session ended" + (f": {self.error}" if self.error else ""))
        self.log.close()
        final = self.folder / f"{self.id}.a{self.n}"
        self.staging.rename(final)
        fsync_dir(self.folder)
        write_atomic(final / "runs.json", json.dumps([r["run"].id for r in self.results]) + "\n")
        unreached = self.runs[self.reached :] if self.error is not None or ctx.stop.is_set() else []
        return [r for r in unreached if not ctx.stop.is_set()]


def run_session_unit(
    unit: Unit, target: Target, ctx: CellContext, emit: Callable[[dict[str, Any]], None]
) -> None:
    """Sessions over the unit's runs until each completed, was rejected, or spent its
    retries; runs a dead session did not reach get a new one."""
    retries = ctx.config.settings.retries
    tries: dict[str, int] = {r.id: 0 for r in unit.runs}
    failures: dict[str, list[dict[str, Any]]] = {r.id: [] for r in unit.runs}
    pending = list(unit.runs)
    while pending and not ctx.stop.is_set():
        collected: list[dict[str, Any]] = []
        unreached = run_session(pending, target, ctx, collected.append)
        by_id = {r.id: r for r in pending}
        for record in collected:
            emit(record)
            if record["run"] in by_id:
                show_failure(by_id[record["run"]], record, ctx)
        again = []
        for record in collected:
            tries[record["run"]] += 1
            failures.setdefault(record["run"], []).append(record)
            if record["status"] in RETRYABLE and tries[record["run"]] <= retries:
                again.append(record["run"])
            elif record["run"] in by_id:
                check_same_failure(by_id[record["run"]], failures[record["run"]], ctx)
        nxt = [by_id[i] for i in again] + [r for r in unreached if r.id not in again]
        if not collected and nxt == pending:
            break  # the session could not start at all; do not loop forever
        pending = sorted(nxt, key=lambda r: r.order)
