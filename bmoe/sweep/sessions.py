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
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bmoe.engine.native import StreamState, engine_args, output_files
from bmoe.engine.session import SessionClient, SessionError, SessionRequestError
from bmoe.errors import BmoeError
from bmoe.formats.metrics import MetricsRun, read_metrics, write_metrics
from bmoe.formats.sidecar import write_pressure
from bmoe.sweep.archive import csv_complete, fsync_dir, write_atomic
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
from bmoe.sweep.gate import EntryState, parse_entry_state, parse_samples, pressure_from_samples
from bmoe.sweep.plan import Run, Unit
from bmoe.sweep.targets import Target, TargetError

SESSIONS = "sessions"


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
    config, archive = ctx.config, ctx.archive
    settings = config.settings
    session_id = _session_id(runs)
    sessions = archive.root / SESSIONS
    sessions.mkdir(exist_ok=True)
    n = 1
    while (
        any(sessions.glob(f"{session_id}.a{n}*"))
        or (sessions / f".{session_id}.a{n}.staging").exists()
    ):
        n += 1
    staging = sessions / f".{session_id}.a{n}.staging"
    staging.mkdir()
    log = AttemptLog(staging / "session.log")
    turn_lines: list[bytes] = []
    out_file = open(staging / "session.out", "ab")  # noqa: SIM115 (closed below)

    def on_line(line: bytes) -> None:
        out_file.write(line)
        out_file.flush()
        turn_lines.append(line)

    results: list[dict[str, Any]] = []
    reached = 0
    proc = None
    session_error: BmoeError | None = None
    entry = EntryState()
    try:
        strays = target.kill_strays(settings.engine)
        if strays:
            log(f"killed stray engine processes: {strays}")
        from bmoe.sweep.gate import wait_for_gate

        entry = wait_for_gate(
            lambda: parse_entry_state(target.read_state_text()), config.gate, stop=ctx.stop.is_set
        )
        run_dir = target.run_dir(staging, f"{archive.root.name}/{SESSIONS}-{session_id}.a{n}")
        target.prepare(run_dir)
        params = dict(runs[0].cell.params)
        outputs = output_files(params)
        model = target.model_path(str(params["model"]), settings.base_dir)
        argv = target.engine_program(settings.engine) + engine_args(
            params, outputs, model=model, session=True
        )
        (staging / "command.json").write_text(
            json.dumps({"argv": argv, "cwd": run_dir, "target": target.name}, indent=1,
                       ensure_ascii=False) + "\n", encoding="utf-8")  # fmt: skip
        log(f"start on {target.name}: {target.describe(argv, run_dir)}")
        proc = target.start(argv, run_dir, staging, stdin=True)
        err_pump = pump(proc.stderr, staging / "session.err", None)
        assert proc.stdin is not None and proc.stdout is not None  # started with pipes
        client = SessionClient(proc.stdin, proc.stdout, on_line=on_line)
        client.wait_ready(timeout=settings.timeout_s)
        for index, run in enumerate(runs):
            if ctx.stop.is_set():
                break
            attempt = archive.next_attempt(run.id)
            files = archive.staging(run.id, attempt)
            turn_entry = entry if index == 0 else parse_entry_state(target.read_state_text())
            ctx.sink.run_started(target.name, run, attempt)
            turn_lines.clear()
            state = StreamState()

            def progress(data: dict[str, Any], state=state, run=run) -> None:
                state.step = int(data.get("step", state.step))
                state.steps = data.get("steps", state.steps)
                wall = data.get("wall_ms")
                if isinstance(wall, int | float):
                    state.wall_ms_total += float(wall)
                    state.tokens_seen += 1
                ctx.sink.run_progress(target.name, run, state)

            started, t0 = now_iso(), time.monotonic()
            status, error, turn = "error", None, None
            reached = index + 1
            try:
                turn = client.generate(
                    str(run.cell.params.get("prompt", "")),
                    n_predict=run.cell.params.get("n_predict"),
                    timeout=settings.timeout_s,
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
                session_error = exc
            results.append({
                "run": run, "attempt": attempt, "files": files, "entry": turn_entry,
                "turn": turn, "status": status, "error": error, "started": started,
                "ended": now_iso(), "duration_s": round(time.monotonic() - t0, 3),
                "lines": list(turn_lines), "tok_s": state.tok_s, "tokens": state.tokens_seen,
            })  # fmt: skip
            if session_error is not None:
                break
        if session_error is None:
            client.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            target.stop(proc, ctx.stop_grace_s)
        if ctx.stop.is_set() and proc.poll() is None:
            target.stop(proc, ctx.stop_grace_s)
        err_pump.join(timeout=30)
        wanted = [*outputs.values(), "pressure.samples"]
        target.fetch(run_dir, wanted, staging)
        target.cleanup(run_dir)
    except (TargetError, SessionError, BmoeError) as exc:
        log(f"session failed: {exc}")
        if proc is not None and proc.poll() is None:
            target.stop(proc, ctx.stop_grace_s)
        for result in results:
            if result["status"] == "ok":
                result["status"], result["error"] = "error", f"session failed: {exc}"
        session_error = exc
        if not results and runs:
            # The session never reached a turn: the first run carries the failure.
            attempt = archive.next_attempt(runs[0].id)
            results.append({
                "run": runs[0], "attempt": attempt, "files": archive.staging(runs[0].id, attempt),
                "entry": entry, "turn": None, "error": str(exc), "started": now_iso(),
                "status": "crashed" if isinstance(exc, SessionError) else "error",
                "ended": now_iso(), "duration_s": 0.0, "lines": list(turn_lines),
                "tok_s": None, "tokens": 0,
            })  # fmt: skip
            reached = 1
    finally:
        out_file.close()
    exit_code = proc.returncode if proc is not None else None
    pressure: dict[str, int] = {}
    samples = staging / "pressure.samples"
    if samples.is_file():
        pressure = pressure_from_samples(parse_samples(samples.read_text(errors="replace")))
        write_pressure(pressure, staging / "session.metrics")
    turns = split_turns(staging / "run.csv") if (staging / "run.csv").is_file() else []
    rel = f"{SESSIONS}/{session_id}.a{n}"
    done_index = 0
    for result in results:
        run, files, turn = result["run"], result["files"], result["turn"]
        dest = files.staging
        (dest / "run.out").write_bytes(b"".join(result["lines"]))
        shutil.copyfile(staging / "command.json", dest / "command.json")
        if pressure:
            write_pressure(pressure, dest / "run.metrics")
        status, error = result["status"], result["error"]
        if turn is not None and turn.done:
            if done_index < len(turns):
                write_metrics(turns[done_index], dest / "run.csv")
            done_index += 1
            if status == "ok":
                if (dest / "run.csv").is_file():
                    ok, why = csv_complete(dest / "run.csv")
                    if not ok:
                        status, error = "invalid", why
                else:
                    status, error = "invalid", "the session CSV has no rows for this turn"
        (dest / "run.log").write_text(
            f"{result['started']} turn of session {rel} on {target.name}\n"
            f"{result['ended']} status {status}" + (f": {error}" if error else "") + "\n",
            encoding="utf-8",
        )
        entry_state: EntryState = result["entry"]
        record = {
            "run": run.id, "cell": run.cell.id, "repeat": run.repeat,
            "attempt": result["attempt"], "order": run.order, "round": run.round,
            "reversed": run.reversed, "target": target.name, "target_kind": target.spec.kind,
            "engine": settings.engine, "host": socket.gethostname(),
            "params": dict(run.cell.params),
            "axes": dict(run.cell.axes), "tags": sorted(run.cell.tags),
            "started": result["started"], "ended": result["ended"],
            "duration_s": result["duration_s"], "status": status, "exit_code": exit_code,
            "error": error, "entry": entry_state.to_json(),
            "entry_columns": entry_state.columns(), "pressure": pressure,
            "pressure_scope": "session", "session": rel,
            "stream": {"tokens": result["tokens"], "tok_s": result["tok_s"],
                       "done": turn.done if turn is not None else None},
        }  # fmt: skip
        record = archive.finalize(files, printable(record))
        ctx.sink.run_finished(target.name, run, record)
        emit(record)
    log("session ended" + (f": {session_error}" if session_error else ""))
    log.close()
    final = sessions / f"{session_id}.a{n}"
    staging.rename(final)
    fsync_dir(sessions)
    write_atomic(final / "runs.json", json.dumps([r["run"].id for r in results]) + "\n")
    unreached = runs[reached:] if session_error is not None or ctx.stop.is_set() else []
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
