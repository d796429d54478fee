"""Running a planned sweep: the plan's runs not yet complete onto the targets through an
executor, the folder brought to a consistent state before (resume) and ``results.parquet``
written after, with live progress and Ctrl-C.

The top of the sweep package, which is a one-way chain: the runner, then the executors
(:class:`~bmoe.sweep.local.LocalExecutor`, threads on this host; ``executor = "ray"``,
:mod:`bmoe.sweep.farm` and its :mod:`~bmoe.sweep.shipping`, imported only then), then the
units (:func:`bmoe.sweep.units.run_unit`, plain or :mod:`~bmoe.sweep.sessions`), then one
run's attempts (:mod:`bmoe.sweep.attempts`) and what every attempt shares
(:mod:`bmoe.sweep.attempt`). Each module imports only those below it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bmoe.formats.archive import RESULTS, write_results
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.attempt import (
    CellContext,
    NullSink,
    ProgressSink,
    now_iso,
)
from bmoe.sweep.config import SweepConfig
from bmoe.sweep.flags import check_flags
from bmoe.sweep.local import LocalExecutor
from bmoe.sweep.plan import Plan, Unit
from bmoe.sweep.results import results_frame
from bmoe.sweep.system import MachineFacts
from bmoe.sweep.targets import Target, TargetSpec, open_target


class Executor(Protocol):
    """Schedules units onto targets (one unit at a time per target) and yields each attempt's
    record as it is archived (by :func:`bmoe.sweep.units.run_unit` with `ctx`). Stopping: set
    ``ctx.stop``; running attempts end as interrupted."""

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
        return RayExecutor(config.settings.address or "auto")
    return LocalExecutor()


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
            "run": f"{cell}/{rep}", "cell": cell, "repeat": int(rep[1:]) if rep[1:].isdigit()
            else None, "attempt": attempt, "status": "killed",
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
            sink.message(f"could not write {RESULTS}: {exc.strerror or exc} "
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
