"""One run of a sweep, attempted until it completes: the engine started on its target with
its log, output pumps and record (:func:`run_attempt`), and the retries around it
(:func:`run_with_retries`).

Below the units (:mod:`bmoe.sweep.units`), which run a unit's runs one after another, and
above what every attempt shares (:mod:`bmoe.sweep.attempt`).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bmoe.engine.native import StreamFollower, engine_args, output_files
from bmoe.errors import BmoeError
from bmoe.formats.archive import COMMAND, RUN_CSV, RUN_ERR, RUN_LOG, RUN_OUT, RUN_SIDECAR, SAMPLES
from bmoe.formats.sidecar import write_pressure
from bmoe.sweep.archive import AttemptPaths, csv_complete
from bmoe.sweep.attempt import (
    RETRYABLE,
    AttemptLog,
    CellContext,
    attempt_record,
    check_same_failure,
    err_tail,
    now_iso,
    printable,
    pump,
    show_failure,
)
from bmoe.sweep.flags import attached_values
from bmoe.sweep.gate import (
    EntryState,
    parse_entry_state,
    parse_samples,
    pressure_from_samples,
    wait_for_gate,
)
from bmoe.sweep.plan import Run
from bmoe.sweep.system import engine_cpu_share, system_warnings
from bmoe.sweep.targets import Target, TargetError


def _command_for(run: Run, target: Target, ctx: CellContext, run_dir: str) -> list[str]:
    params = dict(run.cell.params)
    outputs = output_files(params)
    model = target.model_path(str(params["model"]), ctx.config.settings.base_dir)
    engine = ctx.config.settings.engine
    args = engine_args(params, outputs, model=model)
    if engine == "embedded":
        args = attached_values(args)
    return target.engine_program(engine) + args


def planned_command(run: Run, target: Target, ctx: CellContext) -> str:
    """The exact command a run would execute (for ``--dry-run``)."""
    run_dir = target.run_dir(ctx.archive.run_final(run.id), f"{ctx.archive.root.name}/{run.id}")
    return target.describe(_command_for(run, target, ctx, run_dir), run_dir)


def run_attempt(run: Run, attempt: int, target: Target, ctx: CellContext) -> dict[str, Any]:
    """Run one attempt of `run` on `target` and archive it; returns its manifest record.

    Before (:func:`_enter`): kill stray engines, wait at the gate, log the entry state.
    During (:func:`_start`, :func:`_watch`): the sampler beside the engine, the progress stream
    followed live, a timeout. After (:func:`_bring_home`, :func:`_decide`, :func:`_warn`): the
    files brought home, the ``.metrics`` sidecar written, the status decided, the folder
    renamed into place.
    """
    archive, settings = ctx.archive, ctx.config.settings
    files: AttemptPaths = archive.staging(run.id, attempt)
    staging = files.staging
    log = AttemptLog(staging / RUN_LOG)
    record = attempt_record(run, attempt, target.spec, settings.engine)
    ctx.sink.run_started(target.name, run, attempt)
    follower = StreamFollower()
    status, exit_code, error = "error", None, None
    entry = EntryState()
    t0 = time.monotonic()
    try:
        entry = _enter(run, target, ctx, log, record)
        if ctx.stop.is_set():
            raise _Interrupted
        run_dir = target.run_dir(staging, f"{archive.root.name}/{run.id}.a{attempt}")
        t0, proc = _start(run, target, ctx, run_dir, staging, log)
        outcome, exit_code = _watch(
            proc, run, target, ctx, staging, follower, log, t0 + settings.timeout_s
        )
        damaged, missing = _bring_home(run, target, run_dir, staging, record)
        status, error = _decide(outcome, exit_code, damaged, missing, staging, follower)
    except _Interrupted:
        status, error = "interrupted", "stopped before the engine started"
    except TargetError as exc:
        status, error = "error", str(exc)
    except BmoeError as exc:
        status, error = "error", str(exc)
    duration = time.monotonic() - t0
    _warn(run, target, ctx, record, entry, status, staging, log)
    state = follower.state
    record.update({
        "ended": now_iso(), "duration_s": round(duration, 3), "status": status,
        "exit_code": exit_code, "error": error, "entry": entry.to_json(),
        "entry_columns": entry.columns(),
        "stream": {"tokens": state.tokens_seen, "steps": state.steps,
                   "tok_s": state.tok_s, "done": state.done, "errors": state.errors},
        "run_lines": follower.run_figures(),
    })  # fmt: skip
    log(f"status {status}" + (f": {error}" if error else ""))
    log.close()
    record = archive.finalize(files, printable(record))
    ctx.sink.run_finished(target.name, run, record)
    return record


def _enter(
    run: Run, target: Target, ctx: CellContext, log: AttemptLog, record: dict[str, Any]
) -> EntryState:
    """Before the engine: stray engines killed, the machine's facts in `record`, the gate
    passed; returns the entry state."""
    strays = target.kill_strays(ctx.config.settings.engine)
    if strays:
        log(f"killed stray engine processes: {strays}")
    record["strays_killed"] = strays
    # Before the gate: finding the metadata (hashing the model the first time) may warm
    # the device, and the gate waits for it to cool.
    record.update(_facts(run, target, ctx))
    entry = wait_for_gate(
        lambda: parse_entry_state(target.read_state_text()), ctx.config.gate, stop=ctx.stop.is_set
    )
    log(f"entry state: {json.dumps(entry.to_json())}")
    return entry


def _start(
    run: Run, target: Target, ctx: CellContext, run_dir: str, staging: Path, log: AttemptLog
) -> tuple[float, subprocess.Popen]:
    """The engine started in `run_dir` (its command kept in ``command.json``); returns when it
    started (monotonic) and its process."""
    target.prepare(run_dir)
    argv = _command_for(run, target, ctx, run_dir)
    (staging / COMMAND).write_text(
        json.dumps({"argv": argv, "cwd": run_dir, "target": target.name}, indent=1,
                   ensure_ascii=False) + "\n", encoding="utf-8")  # fmt: skip
    log(f"start on {target.name}: {target.describe(argv, run_dir)}")
    t0 = time.monotonic()
    return t0, target.start(argv, run_dir, staging)


def _watch(
    proc: subprocess.Popen,
    run: Run,
    target: Target,
    ctx: CellContext,
    staging: Path,
    follower: StreamFollower,
    log: AttemptLog,
    deadline: float,
) -> tuple[str | None, int | None]:
    """The engine running: its output copied and its progress followed live until it exits,
    or is stopped at the sweep's stop or at `deadline` (monotonic). Returns how it was
    stopped (``interrupted``, ``timeout``; None when it exited) and its exit status."""

    def on_line(line: bytes) -> None:
        if follower.feed(line) is not None:
            ctx.sink.run_progress(target.name, run, follower.state)

    pumps = [
        pump(proc.stdout, staging / RUN_OUT, on_line),
        pump(proc.stderr, staging / RUN_ERR, None),
    ]
    outcome = None
    exited = threading.Event()

    def wait_exit() -> None:
        proc.wait()
        exited.set()

    threading.Thread(target=wait_exit, daemon=True).start()
    while True:
        if exited.wait(timeout=0.2):
            exit_code = proc.returncode
            break
        if ctx.stop.is_set():
            outcome = "interrupted"
        elif time.monotonic() > deadline:
            outcome = "timeout"
        if outcome:
            log(f"{outcome}: stopping the engine")
            target.stop(proc, ctx.stop_grace_s)
            exit_code = proc.returncode
            break
    for thread in pumps:
        thread.join(timeout=30)
    for thread in pumps:
        if getattr(thread, "error", None) is not None:
            raise thread.error  # type: ignore[attr-defined]
    return outcome, exit_code


def _bring_home(
    run: Run, target: Target, run_dir: str, staging: Path, record: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The engine's files fetched (checked) into `staging`, the sampler's readings written as
    the ``.metrics`` sidecar (and into `record`), the far side cleaned; returns the files that
    arrived damaged and the outputs missing."""
    wanted = [*output_files(run.cell.params).values(), SAMPLES]
    fetched, damaged = target.fetch_checked(run_dir, wanted, staging)
    missing = sorted(set(wanted) - set(fetched) - {SAMPLES})
    samples_path = staging / SAMPLES
    if samples_path.is_file():
        samples = parse_samples(samples_path.read_text(encoding="utf-8", errors="replace"))
        pressure = pressure_from_samples(samples)
        write_pressure(pressure, staging / RUN_SIDECAR)
        record["pressure"] = pressure
    target.cleanup(run_dir)
    return damaged, missing


def _decide(
    outcome: str | None,
    exit_code: int | None,
    damaged: list[str],
    missing: list[str],
    staging: Path,
    follower: StreamFollower,
) -> tuple[str, str | None]:
    """The attempt's status and error, from how the engine ended and what came home."""
    error = None
    if outcome:
        status = outcome
    elif exit_code != 0:
        status = "crashed"
        error = f"engine exited with status {exit_code}"
        last = err_tail(staging / RUN_ERR, 1)
        if last:
            error = f"{error}: {last[-1]}"
    elif damaged:
        status, error = "invalid", f"transfer check: {'; '.join(damaged)}"
    elif missing:
        status, error = "invalid", f"missing output: {', '.join(missing)}"
    else:
        ok, why = csv_complete(staging / RUN_CSV)
        status, error = ("ok", None) if ok else ("invalid", why)
    fatal = [e for e in follower.state.errors if e.get("fatal", True)]
    if fatal and status != "ok":
        msg = f"BMOE_ERROR: {fatal[-1].get('msg')}"
        error = f"{error}; {msg}" if error else msg
    return status, error


def _warn(
    run: Run,
    target: Target,
    ctx: CellContext,
    record: dict[str, Any],
    entry: EntryState,
    status: str,
    staging: Path,
    log: AttemptLog,
) -> None:
    """The system warnings of the attempt (busy machine, hot device) into `record` and its
    log; each kind shown once per sweep."""
    share = engine_cpu_share(staging / RUN_CSV) if status == "ok" else None
    temp = record.get("pressure", {}).get("cpu_temp_max_mC")
    warnings = system_warnings(entry, share, temp / 1000.0 if temp is not None else None)
    record.update({"engine_cpu_share": share, "system_warnings": warnings})
    for warning in warnings:
        log(f"warning: {warning}")
        kind = warning.rsplit(": ", 1)[-1]
        if kind not in ctx.shown_warnings:
            ctx.shown_warnings.add(kind)
            ctx.sink.message(f"{run.id} on {target.name}: {warning} (results may vary)")


def _facts(run: Run, target: Target, ctx: CellContext) -> dict[str, Any]:
    """Machine metadata for a run's record (never a reason for a run to fail)."""
    settings = ctx.config.settings
    try:
        model = target.model_path(str(run.cell.params["model"]), settings.base_dir)
        return ctx.facts.record_fields(target, settings.engine, model, settings.base_dir)
    except Exception as exc:  # metadata is best effort
        return {"machine": {}, "facts_error": f"{type(exc).__name__}: {exc}"}


class _Interrupted(Exception):
    pass


def run_with_retries(
    run: Run, target: Target, ctx: CellContext, emit: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Attempts until one completes, the retries are spent, or the sweep is stopped.

    Unless ``ctx.keep_going``, a run whose every attempt failed with the same error stops
    the sweep (:class:`CellFailed`): a configuration mistake fails once, not in every cell.
    """
    retries = ctx.config.settings.retries
    record: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    for _ in range(retries + 1):
        attempt = ctx.archive.next_attempt(run.id)
        record = run_attempt(run, attempt, target, ctx)
        emit(record)
        show_failure(run, record, ctx)
        records.append(record)
        if record["status"] not in RETRYABLE or ctx.stop.is_set():
            break
    check_same_failure(run, records, ctx)
    return record
