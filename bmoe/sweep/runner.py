"""Running a planned sweep: cells onto targets, one at a time per target, with retries,
timeouts, Ctrl-C, resume and live progress.

The scheduler sits behind :class:`Executor` (targets and units in, attempt records out); the
code that runs a unit next to its target (:func:`run_unit`, then :func:`run_attempt` per
attempt) does not know which executor called it. :class:`LocalExecutor` gives each target a
thread that takes the next unit it may run from a shared queue; ``executor = "ray"`` runs the
same code on the hosts of a Ray cluster (:mod:`bmoe.sweep.farm`, imported only then).
"""

from __future__ import annotations

import contextlib
import errno
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bmoe.engine.native import StreamFollower, engine_args, output_files
from bmoe.errors import BmoeError
from bmoe.formats.sidecar import write_pressure
from bmoe.sweep.archive import (
    ArchiveWriter,
    AttemptPaths,
    csv_complete,
    results_frame,
    write_results,
)
from bmoe.sweep.attempt import (
    RETRYABLE,
    AttemptLog,
    CellContext,
    NullSink,
    ProgressSink,
    attempt_record,
    check_same_failure,
    err_tail,
    now_iso,
    printable,
    pump,
    show_failure,
)
from bmoe.sweep.config import SweepConfig, TargetSpec
from bmoe.sweep.flags import attached_values, check_flags
from bmoe.sweep.gate import (
    EntryState,
    parse_entry_state,
    parse_samples,
    pressure_from_samples,
    wait_for_gate,
)
from bmoe.sweep.plan import Plan, Run, Unit
from bmoe.sweep.system import MachineFacts, engine_cpu_share, system_warnings
from bmoe.sweep.targets import Target, TargetError, open_target


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

    Before: kill stray engines, wait at the gate, log the entry state. During: the sampler
    beside the engine, the progress stream followed live, a timeout. After: the files brought
    home, the ``.metrics`` sidecar written, the status decided, the folder renamed into place.
    """
    config, archive = ctx.config, ctx.archive
    settings = config.settings
    files: AttemptPaths = archive.staging(run.id, attempt)
    staging = files.staging
    log = AttemptLog(staging / "run.log")
    record = attempt_record(run, attempt, target.spec, settings.engine)
    ctx.sink.run_started(target.name, run, attempt)
    follower = StreamFollower()
    status, exit_code, error = "error", None, None
    entry = EntryState()
    t0 = time.monotonic()
    try:
        strays = target.kill_strays(settings.engine)
        if strays:
            log(f"killed stray engine processes: {strays}")
        record["strays_killed"] = strays
        # Before the gate: finding the metadata (hashing the model the first time) may warm
        # the device, and the gate waits for it to cool.
        record.update(_facts(run, target, ctx))
        entry = wait_for_gate(
            lambda: parse_entry_state(target.read_state_text()), config.gate, stop=ctx.stop.is_set
        )
        log(f"entry state: {json.dumps(entry.to_json())}")
        if ctx.stop.is_set():
            raise _Interrupted
        run_dir = target.run_dir(staging, f"{archive.root.name}/{run.id}.a{attempt}")
        target.prepare(run_dir)
        argv = _command_for(run, target, ctx, run_dir)
        (staging / "command.json").write_text(
            json.dumps({"argv": argv, "cwd": run_dir, "target": target.name}, indent=1,
                       ensure_ascii=False) + "\n", encoding="utf-8")  # fmt: skip
        log(f"start on {target.name}: {target.describe(argv, run_dir)}")
        t0 = time.monotonic()
        proc = target.start(argv, run_dir, staging)

        def on_line(line: bytes) -> None:
            if follower.feed(line) is not None:
                ctx.sink.run_progress(target.name, run, follower.state)

        pumps = [
            pump(proc.stdout, staging / "run.out", on_line),
            pump(proc.stderr, staging / "run.err", None),
        ]
        deadline = t0 + settings.timeout_s
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
        wanted = [*output_files(run.cell.params).values(), "pressure.samples"]
        fetched, damaged = target.fetch_checked(run_dir, wanted, staging)
        missing = sorted(set(wanted) - set(fetched) - {"pressure.samples"})
        samples_path = staging / "pressure.samples"
        if samples_path.is_file():
            samples = parse_samples(samples_path.read_text(encoding="utf-8", errors="replace"))
            pressure = pressure_from_samples(samples)
            write_pressure(pressure, staging / "run.metrics")
            record["pressure"] = pressure
        target.cleanup(run_dir)
        if outcome:
            status = outcome
        elif exit_code != 0:
            status = "crashed"
            error = f"engine exited with status {exit_code}"
            last = err_tail(staging / "run.err", 1)
            if last:
                error = f"{error}: {last[-1]}"
        elif damaged:
            status, error = "invalid", f"transfer check: {'; '.join(damaged)}"
        elif missing:
            status, error = "invalid", f"missing output: {', '.join(missing)}"
        else:
            ok, why = csv_complete(staging / "run.csv")
            status, error = ("ok", None) if ok else ("invalid", why)
        fatal = [e for e in follower.state.errors if e.get("fatal", True)]
        if fatal and status != "ok":
            msg = f"BMOE_ERROR: {fatal[-1].get('msg')}"
            error = f"{error}; {msg}" if error else msg
    except _Interrupted:
        status, error = "interrupted", "stopped before the engine started"
    except TargetError as exc:
        status, error = "error", str(exc)
    except BmoeError as exc:
        status, error = "error", str(exc)
    duration = time.monotonic() - t0
    share = engine_cpu_share(staging / "run.csv") if status == "ok" else None
    temp = record.get("pressure", {}).get("cpu_temp_max_mC")
    warnings = system_warnings(entry, share, temp / 1000.0 if temp is not None else None)
    record.update({"engine_cpu_share": share, "system_warnings": warnings})
    for warning in warnings:
        log(f"warning: {warning}")
        kind = warning.rsplit(": ", 1)[-1]
        if kind not in ctx.shown_warnings:
            ctx.shown_warnings.add(kind)
            ctx.sink.message(f"{run.id} on {target.name}: {warning} (results may vary)")
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


def run_unit(
    unit: Unit, target: Target, ctx: CellContext, emit: Callable[[dict[str, Any]], None]
) -> None:
    """Run the runs of `unit` back to back on `target` (turns of one engine process in
    session mode), archiving each attempt and passing its record to `emit`."""
    try:
        if unit.session:
            from bmoe.sweep.sessions import run_session_unit

            run_session_unit(unit, target, ctx, emit)
            return
        for run in unit.runs:
            if ctx.stop.is_set():
                return
            run_with_retries(run, target, ctx, emit)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        ctx.stop.set()  # the other targets end their attempts too
        where = f" writing {exc.filename}" if exc.filename else ""
        raise DiskFull(
            f"{ctx.archive.root}: no space left on the device{where}; the sweep stopped "
            f"(free space, then resume with: bmoe sweep {ctx.archive.root})"
        ) from None


class DiskFull(BmoeError):
    """The sweep folder's filesystem is full: the sweep stops (completed runs are kept)."""


class Executor(Protocol):
    """Schedules units onto targets (one unit at a time per target) and yields each attempt's
    record as it is archived (by :func:`run_unit` with `ctx`). Stopping: set ``ctx.stop``;
    running attempts end as interrupted."""

    def check(self, targets: Sequence[Target], ctx: CellContext) -> None:
        """Fail early (a :class:`BmoeError`) when a target cannot run; before any run."""
        ...

    def execute(
        self, units: Sequence[Unit], targets: Sequence[Target], ctx: CellContext
    ) -> Iterator[dict[str, Any]]: ...


def executor_for(config: SweepConfig) -> Executor:
    """The executor ``[sweep] executor`` names (the farm's module, and Ray, load only then)."""
    if config.settings.executor == "ray":
        try:
            from bmoe.sweep.farm import RayExecutor
        except ModuleNotFoundError as exc:
            if exc.name != "ray":
                raise
            raise config.error(
                ("sweep", "executor"), "needs Ray on every host: pip install 'bmoe[farm]'"
            ) from None
        return RayExecutor(config.settings.address or "auto", run_unit)
    return LocalExecutor()


class LocalExecutor:
    """One thread per target, taking the next unit it may run (by tags) in plan order."""

    def check(self, targets, ctx):
        for target in targets:
            target.check()

    def execute(self, units, targets, ctx):
        stop = ctx.stop
        pending = list(units)
        lock = threading.Lock()
        results: queue.Queue = queue.Queue()
        done_marker = object()

        def take(target: Target) -> Unit | None:
            with lock:
                for i, unit in enumerate(pending):
                    if target.spec.can_run(unit.tags):
                        return pending.pop(i)
            return None

        def worker(target: Target) -> None:
            try:
                while not stop.is_set():
                    unit = take(target)
                    if unit is None:
                        break
                    run_unit(unit, target, ctx, results.put)
            except BaseException as exc:  # surfaced in the driver thread
                results.put(exc)
            finally:
                results.put(done_marker)

        threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        alive = len(threads)
        interrupted = False
        failure: BaseException | None = None
        while alive:
            try:
                item = results.get(timeout=0.25)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                # Keep draining: the running attempts end as interrupted and are archived.
                interrupted = True
                stop.set()
                continue
            if item is done_marker:
                alive -= 1
            elif isinstance(item, BaseException):
                # Stop the other targets and wait for their attempts to be archived (no
                # engine left running, no thread dying mid-write); then raise the first.
                stop.set()
                failure = failure or item
            else:
                yield item
        if failure is not None:
            raise failure
        if interrupted:
            raise KeyboardInterrupt


@dataclass
class SweepOutcome:
    root: Path
    records: list[dict[str, Any]]
    skipped: int
    total: int
    interrupted: bool = False

    @property
    def completed(self) -> int:
        return self.skipped + sum(1 for r in self.records if r["status"] == "ok")

    @property
    def failed_runs(self) -> list[str]:
        last: dict[str, str] = {}
        for r in self.records:
            last[r["run"]] = r["status"]
        return sorted(run for run, status in last.items() if status != "ok")

    @property
    def not_run(self) -> int:
        """Runs this pass did not attempt (a farm whose hosts left, or a stop)."""
        return self.total - self.completed - len(self.failed_runs)


def prepare_resume(archive: ArchiveWriter, plan: Plan, sink: ProgressSink) -> set[str]:
    """Bring the folder to a consistent state; returns the ids of runs already complete.

    Staging folders of a killed sweep get a manifest line (status ``killed``); a completed
    folder missing from the manifest (killed between rename and append) gets its line back;
    a folder that no longer validates is set aside and its run is done again.
    """
    manifest = [r for r in archive.manifest() if isinstance(r, dict)]
    ok_in_manifest = {(r.get("run"), r.get("attempt")) for r in manifest if r.get("status") == "ok"}
    for killed in archive.clear_stale_staging():
        cell = killed.parent.name
        rep, attempt = killed.name.split(".")[0], int(killed.name.split(".")[1][1:])
        archive.append_manifest({
            "run": f"{cell}/{rep}", "cell": cell, "attempt": attempt, "status": "killed",
            "error": "the sweep stopped while this attempt ran", "dir": str(
                killed.relative_to(archive.root)), "ended": now_iso(),
        })  # fmt: skip
        sink.message(f"{cell}/{rep} attempt {attempt}: the sweep was killed while it ran")
    ok_attempts: dict[str, set[Any]] = {}
    for run_key, ok_attempt in ok_in_manifest:
        ok_attempts.setdefault(str(run_key), set()).add(ok_attempt)
    done: set[str] = set()
    for run in plan.runs:
        ok, why = archive.validate_run(run.id)
        if ok:
            done.add(run.id)
            record = archive.completed_record(run.id) or {}
            kept = record.get("attempt")
            if ok_attempts.get(run.id, set()) - {kept}:
                # At most one ok per run: the folder's attempt is the one that counts.
                archive.retract_ok(run.id, "another attempt of this run is the completed one",
                                   keep_attempt=kept)  # fmt: skip
            if record and (run.id, kept) not in ok_in_manifest:
                archive.append_manifest(record)
        elif archive.run_final(run.id).exists():
            moved = archive.set_aside(run.id, why)
            archive.retract_ok(run.id, why, moved_to=moved)
            sink.message(f"{run.id}: {why}; set aside as {moved.name if moved else '?'}, rerun")
        elif run.id in ok_attempts:
            why = "its folder is missing"
            archive.retract_ok(run.id, why)
            sink.message(f"{run.id}: {why}; rerun")
    return done


def run_sweep(
    config: SweepConfig,
    plan: Plan,
    archive: ArchiveWriter,
    *,
    sink: ProgressSink | None = None,
    executor: Executor | None = None,
    stop: threading.Event | None = None,
    flags_checked: bool = False,
    keep_going: bool = False,
) -> SweepOutcome:
    """Run every run of `plan` not already complete in `archive`; write ``results.parquet``.

    Before the first run every cell's flags are checked against the engine (unless the
    caller did: `flags_checked`). A cell whose every attempt fails with the same error stops
    the sweep with that error (:class:`CellFailed`) unless `keep_going`.

    On KeyboardInterrupt the running engines are stopped, their attempts archived as
    ``interrupted``, the results written, and the interrupt re-raised.
    """
    from bmoe.sweep.lock import folder_lock

    with folder_lock(archive.root) as lock:  # one runner per folder (on the driver)
        if lock.stale:
            sink_ = sink or NullSink()
            sink_.message(f"took over the lock left by pid {lock.stale.get('pid')} on host "
                          f"{lock.stale.get('host')}, which is gone")  # fmt: skip
        return _run_sweep_locked(
            config, plan, archive, sink, executor, stop, flags_checked, keep_going
        )


def _run_sweep_locked(
    config: SweepConfig,
    plan: Plan,
    archive: ArchiveWriter,
    sink: ProgressSink | None,
    executor: Executor | None,
    stop: threading.Event | None,
    flags_checked: bool,
    keep_going: bool,
) -> SweepOutcome:
    sink = sink or NullSink()
    stop = stop or threading.Event()
    executor = executor or executor_for(config)
    facts = MachineFacts(archive.state_dir / "model-digests.json")
    ctx = CellContext(config, archive, stop, sink, keep_going=keep_going, facts=facts)
    done = prepare_resume(archive, plan, sink)
    units = []
    for unit in plan.units:
        runs = tuple(r for r in unit.runs if r.id not in done)
        if runs:
            units.append(Unit(runs, unit.tags, unit.session))
    targets = [open_target(spec, archive.state_dir / "targets") for spec in config.targets]
    needed = {t.name for t in targets if any(t.spec.can_run(u.tags) for u in units)}
    if config.settings.adaptive:  # later rounds may run any cell
        needed |= {t.name for t in targets if any(t.spec.can_run(u.tags) for u in plan.units)}
    records: list[dict[str, Any]] = []
    total = len(plan.runs)
    interrupted = False
    try:
        usable = [t for t in targets if t.name in needed]
        executor.check(usable, ctx)
        if not flags_checked:
            local = config.settings.executor == "local"  # a farm's targets are not reachable
            for note in check_flags(config, plan.cells, usable, probe=local):
                sink.message(note)
        sink.sweep_started(total, len(done), [t.name for t in usable])
        try:
            for record in executor.execute(units, usable, ctx):
                records.append(record)
            while config.settings.adaptive:
                more = _next_round(config, plan, archive, ctx, total)
                if more is None:
                    break
                more_runs = [run for unit in more for run in unit.runs]
                total += len(more_runs)
                sink.message(f"another round for {len({r.cell.id for r in more_runs})} cell(s) "
                             "whose mean is not settled yet")  # fmt: skip
                done_now = len(done) + sum(1 for r in records if r["status"] == "ok")
                sink.sweep_started(total, done_now, [t.name for t in usable])
                for record in executor.execute(more, usable, ctx):
                    records.append(record)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            raise
    finally:
        for target in targets:
            with contextlib.suppress(Exception):
                target.close()
        try:
            finish_results(archive, plan, config)
        except OSError as exc:
            sink.message(f"could not write results.parquet: {exc.strerror or exc} "
                         f"(bmoe analyze sweep rebuilds it from the manifest)")  # fmt: skip
    return SweepOutcome(archive.root, records, len(done), total, interrupted)


def _next_round(
    config: SweepConfig, plan: Plan, archive: ArchiveWriter, ctx: CellContext, position: int
) -> list[Unit] | None:
    """The units of one more round for the cells whose mean tok/s is not yet within the
    target interval (``repeats = "auto"``); None when every cell is settled or at its bound
    (runs attempted, whatever their status), or the sweep was stopped."""
    from bmoe.sweep.adaptive import cells_needing_more
    from bmoe.sweep.plan import cell_groups, round_units

    if ctx.stop.is_set():
        return None
    settings = config.settings
    rounds: dict[str, int] = {}
    for record in archive.manifest():
        if not isinstance(record, dict) or record.get("warmup"):
            continue
        if not isinstance(record.get("repeat"), int):
            continue
        cell = str(record.get("cell"))
        rounds[cell] = max(rounds.get(cell, 0), record["repeat"])
    ids = [c.id for c in plan.cells if rounds.get(c.id, 0) < settings.max_repeats]
    need = set(cells_needing_more(results_frame(archive.root), ids, settings.target_interval))
    if not need:
        return None
    round_no = min(rounds.get(c, 0) for c in need) + 1
    groups = [g for g in cell_groups(config, plan.cells) if any(c.id in need for c in g)]
    units = []
    for unit in round_units(config, groups, round_no, position):
        runs = tuple(r for r in unit.runs if r.cell.id in need or len(unit.runs) > 1)
        if runs:
            units.append(Unit(runs, unit.tags, unit.session))
    return units or None


def finish_results(archive: ArchiveWriter, plan: Plan, config: SweepConfig) -> Path | None:
    """Write ``results.parquet`` from the manifest (nothing when no attempt ran)."""
    frame = results_frame(archive.root)
    if frame.empty:
        return None
    return write_results(archive.root, frame, plan.axes, config.settings.name)


def assign_targets(plan: Plan, specs: Sequence[TargetSpec]) -> dict[str, str]:
    """A predicted unit -> target assignment (targets taking units in turn), for dry runs."""
    out: dict[str, str] = {}
    busy = {s.name: 0 for s in specs}
    for unit in plan.units:
        options = [s for s in specs if s.can_run(unit.tags)]
        chosen = min(options, key=lambda s: busy[s.name])
        busy[chosen.name] += len(unit.runs)
        for run in unit.runs:
            out[run.id] = chosen.name
    return out
