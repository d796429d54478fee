"""``bmoe tune``: find the best configuration of a device in a fraction of a grid's runs.

Round by round, over the folder of a sweep archive:

1. calibrate: a traced run of the unmodified reference cell (route and io traces, and the
   fidelity reference on the embedded engine when fidelity is constrained or a lossy lever is
   an axis) gives the routing and the device profile (:func:`bmoe.analyze.device.
   build_profile`); or ``[tune] trace`` and ``profile`` are taken as given;
2. predict every candidate cell (:func:`bmoe.analyze.device.predict`), correct the
   predictions by the measured cells, and decide (:func:`bmoe.analyze.device.tune.decide`) which
   runs can still change the answer;
3. run them through the sweep's own runner (:func:`bmoe.sweep.runner.run_sweep`: any target,
   several targets, the Ray farm, the archive, resume after a kill);
4. refit the profile from every run so far (kept when it predicts the measured cells better
   than the one before), and go on until the best cell is settled or the budget is spent.

Every round's decision is written to ``tune.json`` before its runs start; ``bmoe tune DIR``
re-plans the runs chosen so far (the runner skips those complete) and carries on.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device import tune as decide_mod
from bmoe.errors import BmoeError
from bmoe.formats.archive import OUTPUT_FILES, RUN_ERR, RUN_OUT, TUNE_STATE, write_atomic
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.attempt import NullSink, ProgressSink
from bmoe.sweep.plan import Cell, Plan, Run, Unit, cell_id, expand
from bmoe.sweep.results import results_frame
from bmoe.sweep.runner import Executor, executor_for, run_sweep
from bmoe.sweep.tune_config import LOSSY_FLAGS, TuneConfig

TUNE_FILE = TUNE_STATE
PROFILE_FILE = "profile.json"
CALIBRATE = "calibrate"
#: Axes the profile prices (the rest are corrected per group of their values).
PRICED_AXES = ("cache_mb", "io_threads", "prefetch", "drop_cold_experts")
#: The value of each lossy flag that leaves the output as the model makes it.
LOSSLESS: dict[str, Any] = {
    "drop_cold_experts": 0.0,
    "n_expert_used": 0,
    "drop_no_renorm": False,
    "drop_in_prefill": False,
}
#: Flags that are not part of a recommendation (files and the fidelity reference).
NOT_RECOMMENDED = (
    "fidelity_ref",
    "fidelity_save",
    "csv",
    "route_trace",
    "io_trace",
    "compute_trace",
    "compute_trace_layers",
)


@dataclass
class TuneOutcome:
    """What a tune found (also in ``tune.json``)."""

    root: Path
    state: dict[str, Any]

    @property
    def result(self) -> dict[str, Any]:
        return self.state.get("result") or {}

    @property
    def runs(self) -> pd.DataFrame:
        """Predicted against measured for every run the tune chose."""
        return pd.DataFrame(self.state.get("runs") or [])


def read_state(root: Path) -> dict[str, Any] | None:
    """``tune.json`` of a tune folder (None when there is none yet)."""
    path = Path(root) / TUNE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BmoeError(f"{path}: unreadable ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != "bmoe_tune":
        raise BmoeError(f"{path}: not the record of a tune")
    return state


def _write_state(root: Path, state: dict[str, Any]) -> None:
    write_atomic(root / TUNE_FILE, json.dumps(state, indent=1, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class Tuner:
    """One tune over one archive folder (see the module docstring)."""

    def __init__(
        self,
        config: TuneConfig,
        archive: ArchiveWriter,
        *,
        sink: ProgressSink | None = None,
        executor: Executor | None = None,
        stop: threading.Event | None = None,
        say: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.sweep = config.sweep
        self.tune = config.tune
        self.archive = archive
        self.root = archive.root
        self.sink = sink or NullSink()
        self.executor = executor
        self.stop = stop or threading.Event()
        self.say = say or self.sink.message
        column, lower, predicted = decide_mod.objective_of(self.tune.objective)
        self.column, self.lower, self.predicted_column = column, lower, predicted
        self.grid_cells = expand(self.sweep)
        self.axes = list(self.sweep.grid)
        # fidelity: teacher-forced on the embedded engine (a results column), else generated
        # tokens against the reference run's (the native engine; see native_fidelity)
        self.fidelity = self.tune.needs_fidelity or any(a in LOSSY_FLAGS for a in self.axes)
        self.teacher_forced = self.fidelity and self.sweep.settings.engine == "embedded"
        self.state: dict[str, Any] = read_state(self.root) or {
            "format": "bmoe_tune",
            "version": 1,
            "objective": self.tune.objective,
            "column": column,
            "lower_is_better": lower,
            "constraints": [c.text() for c in self.tune.constraints],
            "confidence": self.tune.confidence,
            "budget": {"runs": self.tune.budget_runs, "device_s": self.tune.budget_s},
            "grid_cells": len(self.grid_cells),
            "axes": self.axes,
            "rounds": [],
            "runs": [],
            "stop": None,
        }
        self.plan_runs: list[Run] = []
        self.profile: Any = None
        self.trace: Any = None

    @staticmethod
    def cells_to_check(config: TuneConfig) -> list[Cell]:
        """Every cell a tune of `config` may run (the grid and the calibration run), for the
        flag check before anything starts."""
        tuner = Tuner.__new__(Tuner)
        tuner.config, tuner.sweep, tuner.tune = config, config.sweep, config.tune
        tuner.grid_cells = expand(config.sweep)
        tuner.axes = list(config.sweep.grid)
        tuner.fidelity = tuner.teacher_forced = False
        return [*tuner.grid_cells, tuner.reference_cell()]

    # ------------------------------------------------------------------------- running

    def _run(self, runs: Sequence[Run], retries: int | None = None) -> None:
        """Run `runs` through the sweep runner, each retried at most `retries` times (the
        sweep's own setting when None). A run that failed is not run again: its cell is
        infeasible, and a retry in a later round would spend the budget twice."""
        planned = {p.id for p in self.plan_runs}
        self.plan_runs += [r for r in runs if r.id not in planned]
        if not runs:
            return
        units = [Unit((r,), r.cell.tags, False) for r in runs]
        cells = list({r.cell.id: r.cell for r in runs}.values())
        plan = Plan(cells, units, self.axes)
        config = self.sweep
        if retries is not None and retries != config.settings.retries:
            config = replace(config, settings=replace(config.settings, retries=retries))
        if self.executor is None:
            self.executor = executor_for(self.sweep)
        run_sweep(
            config,
            plan,
            self.archive,
            sink=self.sink,
            executor=self.executor,
            stop=self.stop,
            flags_checked=True,
            keep_going=True,
        )

    def _unfinished(self, runs: Sequence[Run]) -> list[Run]:
        """The planned runs a resumed tune still owes: never attempted, or cut short by a
        stop or a kill (a run that completed or failed is done)."""
        last: dict[str, str] = {}
        for record in self.archive.manifest():
            if isinstance(record.get("run"), str) and record.get("status") != "set_aside":
                last[record["run"]] = str(record.get("status"))
        owed = ("killed", "interrupted", "lost")
        return [r for r in runs if last.get(r.id, "killed") in owed]

    def _retries_within_budget(self, n_runs: int) -> int:
        """The retries each of `n_runs` runs may take without the attempts passing the run
        budget (every attempt counts against it)."""
        retries = self.sweep.settings.retries
        if self.tune.budget_runs is None or n_runs == 0:
            return retries
        used, _ = self.used()
        return min(retries, max(self.tune.budget_runs - used - n_runs, 0) // n_runs)

    def _same_failure(self, runs: Sequence[Run]) -> str | None:
        """When no candidate cell was ever measured and every attempt of `runs` failed with
        one same error (a mistake every cell shares, as in a sweep), what to say."""
        from bmoe.sweep.attempt import FAILED

        ids = {r.id for r in runs}
        records = [r for r in self.archive.manifest() if r.get("run") in ids]
        if not records or self._ok_dirs():
            return None
        keys = {(r.get("status"), r.get("exit_code"), r.get("error")) for r in records}
        if len(keys) != 1 or records[0].get("status") not in FAILED:
            return None
        record = records[-1]
        error = f": {record['error']}" if record.get("error") else ""
        return (
            f"every attempt ({len(records)}) of the {len(runs)} run(s) of round "
            f"{runs[0].round} failed the same way: {record.get('status')}{error} "
            f"(see {self.root / str(record.get('dir'))}/{RUN_ERR})"
        )

    def _new_run(self, cell: Cell, round_no: int) -> Run:
        repeat = 1 + sum(1 for r in self.plan_runs if r.cell.id == cell.id)
        return Run(cell, repeat, round_no, False, len(self.plan_runs))

    # ------------------------------------------------------------------------- cells

    def reference_cell(self) -> Cell:
        """The calibration run's cell: the unmodified reference (no lossy flag; the
        smallest cache and the most read lanes of the grid, for the most reads to time),
        traced."""
        params: dict[str, Any] = dict(self.grid_cells[0].params)
        for axis, values in self.sweep.grid.items():
            numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if axis == "cache_mb" and numeric:
                params[axis] = min(numeric)
            elif axis == "io_threads" and numeric:
                params[axis] = max(numeric)
        for flag in LOSSY_FLAGS:  # the lossless value (an axis keeps a value in every cell)
            if flag in self.sweep.grid:
                params[flag] = LOSSLESS[flag]
            else:
                params.pop(flag, None)
        params.update(self.tune.reference)
        if self.tune.trace is None:
            params.update(route_trace=True, io_trace=True)
        if self.teacher_forced and not self.tune.fidelity_ref:
            params["fidelity_save"] = True
        axes = {a: params[a] for a in self.axes if a in params}
        return Cell(
            f"{CALIBRATE}-{cell_id(params, axes)}", -1, params, axes, self.grid_cells[0].tags
        )

    def candidates(self, fidelity_ref: str | None) -> list[Cell]:
        """The grid's cells, each comparing itself with the fidelity reference if any.

        The reference is named in the cell's id as `fidelity_ref` says it (inside the
        archive, relative to its folder, so that the ids do not depend on where the tune runs
        from) and given to the engine as an absolute path: every run works in a folder of its
        own."""
        if not fidelity_ref:
            return list(self.grid_cells)
        absolute = str(self.in_archive(fidelity_ref))
        out = []
        for cell in self.grid_cells:
            named = {**cell.params, "fidelity_ref": fidelity_ref}
            params = {**cell.params, "fidelity_ref": absolute}
            out.append(replace(cell, id=cell_id(named, cell.axes), params=params))
        return out

    def in_archive(self, path: str) -> Path:
        """A path ``tune.json`` keeps, as an absolute path: relative ones are inside the
        archive (as an earlier version wrote them: relative to the working directory)."""
        p = Path(path)
        if p.is_absolute():
            return p
        inside = (self.root / p).absolute()
        return inside if inside.exists() or not p.exists() else p.absolute()

    def _archive_relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # ------------------------------------------------------------------------- calibrate

    def calibrate(self) -> str | None:
        """The routing trace and profile (from the calibration run, or given); returns the
        fidelity reference every candidate compares itself with."""
        tune = self.tune
        need_run = tune.trace is None or (self.fidelity and not tune.fidelity_ref)
        need_run = need_run or (self.fidelity and not self.teacher_forced)
        ref_cell = self.reference_cell()
        calib = self.state.setdefault("calibration", {})
        if need_run:
            run = Run(ref_cell, 1, 0, False, 0)
            if not self.archive.validate_run(run.id)[0]:
                what = "a traced run" if tune.trace is None else "the fidelity reference run"
                self.say(f"calibrating: {what} of the reference cell ({run.id})")
            self._run([run])
            ok, why = self.archive.validate_run(run.id)
            if not ok:
                raise BmoeError(
                    f"the calibration run {run.id} did not complete ({why}); see "
                    f"{self.archive.run_final(run.id)}"
                )
            calib["run"] = run.id
        folder = self.archive.run_final(f"{ref_cell.id}/r1")
        inside = self._archive_relative(folder)  # paths kept relative to the archive
        if tune.trace is not None:
            calib.update(trace=tune.trace, profile=tune.profile)
        elif not calib.get("trace"):
            calib.update(trace=f"{inside}/{OUTPUT_FILES['route_trace']}")
        fidelity_ref = tune.fidelity_ref
        if self.teacher_forced and not fidelity_ref:
            fidelity_ref = calib.get("fidelity_ref") or f"{inside}/{OUTPUT_FILES['fidelity_save']}"
        if self.fidelity and not self.teacher_forced and not calib.get("reference_output"):
            calib["reference_output"] = f"{inside}/{RUN_OUT}"
        calib["fidelity_ref"] = fidelity_ref
        self._load_model_of_device(self.in_archive(inside) if tune.trace is None else None)
        return fidelity_ref

    def check_columns(self) -> None:
        """Refuse a constraint on a column the calibration run's results do not have (the
        engine does not produce it), naming those it does."""
        from bmoe.analyze.verdict import outcome_columns

        results = results_frame(self.root)
        if results.empty:
            return
        have = set(decide_mod.derived_columns(results).columns)
        for con in self.tune.constraints:
            if con.column not in have and not con.column.startswith("fidelity"):
                known = ", ".join(outcome_columns(results)[:40])
                raise BmoeError(
                    f"[tune] {con.name}: the runs have no column {con.column!r} "
                    f"(columns: rss_mb, mem_available_mb, {known})"
                )

    def _load_model_of_device(self, calib_folder: Path | None) -> None:
        from bmoe.formats.profile import read_profile, write_profile
        from bmoe.formats.route import read_route_trace

        calib = self.state["calibration"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.trace = read_route_trace(self.in_archive(calib["trace"]))
        current = self.root / PROFILE_FILE
        if current.is_file():
            self.profile = read_profile(current)
        elif calib_folder is None:
            self.profile = read_profile(self.in_archive(calib["profile"]))
            write_profile(self.profile, current)
        else:
            from bmoe.analyze.device import build_profile, profile_runs
            from bmoe.formats.runfiles import read_recorded_runs

            self.profile = build_profile(profile_runs(read_recorded_runs([calib_folder])))
            write_profile(self.profile, current)
        calib["profile_file"] = PROFILE_FILE

    def refit(self, candidates: pd.DataFrame, measured: pd.DataFrame) -> str:
        """Refit the profile from every completed run; keep it when it predicts the measured
        cells better than the current one. Returns what was done (for ``tune.json``)."""
        from bmoe.analyze.device import build_profile, profile_runs
        from bmoe.formats.profile import write_profile
        from bmoe.formats.runfiles import read_recorded_runs

        if measured.empty:
            return "no run to refit from yet"
        folders = [self.root / str(d) for d in self._ok_dirs()]
        calib = self.state["calibration"].get("run")
        if calib:
            folders.insert(0, self.archive.run_final(calib))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = build_profile(profile_runs(read_recorded_runs(folders)))
        except BmoeError as exc:
            return f"refit failed, profile kept: {exc}"
        old = _error(candidates, measured)
        new_candidates = self.predict(self.current_cells, fitted)
        new = _error(new_candidates, measured)
        if new is not None and (old is None or new < old):
            self.profile = fitted
            write_profile(fitted, self.root / PROFILE_FILE)
            return f"refitted from {len(folders)} runs (median error {old} -> {new} %)"
        return f"refit from {len(folders)} runs predicted worse ({new} % against {old} %): kept"

    def _ok_dirs(self) -> list[str]:
        out = []
        for record in self.archive.manifest():
            usable = record.get("status") == "ok" and isinstance(record.get("dir"), str)
            if usable and not str(record.get("cell", "")).startswith(CALIBRATE):
                out.append(record["dir"])
        return out

    # ------------------------------------------------------------------------- predict

    def predict(self, cells: Sequence[Cell], profile: Any = None) -> pd.DataFrame:
        """Each candidate's predicted score and interval from the profile (NaN where the
        profile cannot price it: not streamed, no cache_mb, an objective it does not model)."""
        from bmoe.analyze.device import predict

        profile = profile if profile is not None else self.profile
        rows = []
        for cell in cells:
            p = cell.params
            rows.append(
                {
                    "cell": cell.id,
                    **{a: cell.axes.get(a) for a in self.axes},
                    "_cache": _finite(p.get("cache_mb")),
                    "_lanes": int(p.get("io_threads", 4)),
                    "_prefetch": int(p.get("prefetch", 0) or 0),
                    "_drop": _finite(p.get("drop_cold_experts")) or 0.0,
                    "_priced": bool(p.get("moe_stream")) and _finite(p.get("cache_mb")) is not None,
                }
            )
        frame = pd.DataFrame(rows)
        # the replay prices dropping or prefetching, not both at once: such a cell is priced
        # with dropping alone and corrected by the measured cells of its own kind
        both = (frame["_drop"] > 0) & (frame["_prefetch"] > 0)
        frame["unpriced"] = np.where(both, "prefetch with dropping", "")
        frame.loc[both, "_prefetch"] = 0
        frame["predicted"] = np.nan
        frame["predicted_low"] = np.nan
        frame["predicted_high"] = np.nan
        col = self.predicted_column
        priced = frame[frame["_priced"]]
        if col in ("tok_s", "steady_tok_s") and len(priced):
            for drop, group in priced.groupby("_drop"):
                grid = pd.DataFrame(
                    {
                        "cache_mb": group["_cache"],
                        "io_threads": group["_lanes"],
                        "prefetch": group["_prefetch"],
                    }
                )
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = predict(self.trace, profile, grid, drop=float(drop) or None)
                except BmoeError as exc:
                    self.say(f"note: no prediction for drop {drop}: {exc}")
                    continue
                frame.loc[group.index, "predicted"] = out[col].to_numpy()
                mid = out[col].to_numpy()
                frame.loc[group.index, "predicted_low"] = np.fmin(out[f"{col}_low"], mid)
                frame.loc[group.index, "predicted_high"] = np.fmax(out[f"{col}_high"], mid)
        elif col in ("prefill_tps", "ttft_s"):
            pre = profile.prefill
            value = (
                pre.get("tok_s")
                if col == "prefill_tps"
                else ((pre.get("load_s") or 0.0) + (pre.get("prefill_s") or 0.0))
            )
            frame.loc[frame["_priced"], ["predicted", "predicted_low", "predicted_high"]] = value
        if self.lower:  # a time: the score is its inverse (higher is better)
            frame["predicted"] = 1.0 / frame["predicted"]
            low = 1.0 / frame["predicted_high"]
            frame["predicted_high"] = 1.0 / frame["predicted_low"]
            frame["predicted_low"] = low
        return frame.drop(columns=[c for c in frame.columns if c.startswith("_")])

    # ------------------------------------------------------------------------- the loop

    def used(self) -> tuple[int, float]:
        """Device runs attempted (the calibration run included) and their device seconds."""
        return device_use(self.archive.manifest())

    def run(self) -> TuneOutcome:
        """Calibrate (or resume), then rounds until settled or out of budget."""
        self.state["stop"] = None
        fidelity_ref = self.calibrate()
        self.check_columns()
        self.current_cells = self.candidates(fidelity_ref)
        by_id = {c.id: c for c in self.current_cells}
        for planned in self.state["runs"]:  # a resumed tune: its runs planned so far
            cell = by_id.get(planned["cell"])
            if cell is None:
                raise BmoeError(
                    f"{self.root / TUNE_FILE}: cell {planned['cell']} is not in the "
                    "configuration any more"
                )
            self.plan_runs.append(
                Run(cell, planned["repeat"], planned["round"], False, len(self.plan_runs))
            )
        if self.plan_runs:
            self._run(self._unfinished(self.plan_runs))
        while not self.stop.is_set():
            decision, table = self.round_decision()
            if decision is None:
                break
            runs = [self._new_run(by_id[c], len(self.state["rounds"])) for c, _ in decision.chosen]
            for run, (_, why) in zip(runs, decision.chosen, strict=True):
                row = table.set_index("cell").loc[run.cell.id]
                self.state["runs"].append(
                    {
                        "run": run.id,
                        "cell": run.cell.id,
                        "short": "/".join(
                            [*(str(run.cell.params.get(a)) for a in self.axes), f"r{run.repeat}"]
                        ),
                        "repeat": run.repeat,
                        "round": run.round,
                        "why": why,
                        "source": row["source"],
                        "predicted": _finite(self._value(row["predicted"])),
                        "estimate": _finite(self._value(row["estimate"])),
                    }
                )
            _write_state(self.root, self.state)
            self._run(runs, self._retries_within_budget(len(runs)))
            failure = self._same_failure(runs)
            if failure:
                self.say(f"stopping: {failure}")
                self.state["stop"] = {"reason": "failed", "sentence": failure}
                break
        return self.finish()

    def _value(self, score: Any) -> Any:
        """A score back in the objective's unit."""
        v = _finite(score)
        return None if v is None else (1.0 / v if self.lower and v else v)

    def round_decision(self) -> tuple[decide_mod.Decision | None, pd.DataFrame]:
        """Read the archive, refit, predict and decide one round; records it. None when the
        tune stops (settled, budget, nothing left)."""
        tune = self.tune
        results = results_frame(self.root)
        if self.fidelity and not self.teacher_forced:
            results = native_fidelity(results, self.root, self.state["calibration"])
        ids = [c.id for c in self.current_cells]
        measured = decide_mod.measured_cells(
            results, ids, self.column, self.lower, tune.constraints
        )
        failed = self._failed(results, set(measured["cell"]) if len(measured) else set())
        candidates = self.predict(self.current_cells)
        refit = self.refit(candidates, measured) if self._new_since_refit() else None
        if refit and refit.startswith("refitted"):
            candidates = self.predict(self.current_cells)
        groups = [a for a in self.axes if a not in PRICED_AXES] + ["unpriced"]
        table = decide_mod.estimates(candidates, measured, tune.confidence, groups)
        feasible = (
            dict(zip(measured["cell"], measured["feasible"], strict=True)) if len(measured) else {}
        )
        feasible.update(dict.fromkeys(failed, False))
        excluded = decide_mod.excluded_by_fidelity(
            candidates, self.axes, measured, tune.constraints
        )
        slots = max(tune.per_round, len(self.sweep.targets))
        labels = {c.id: _label(c, self.axes) for c in self.current_cells}
        lossless = [c.id for c in self.current_cells if self._lossless(c)]
        decision = decide_mod.decide(
            table,
            feasible,
            excluded,
            confidence=tune.confidence,
            slots=slots,
            min_repeats=tune.min_repeats,
            max_repeats=tune.max_repeats,
            labels=labels,
            lossless=lossless,
        )
        used_runs, used_s = self.used()
        chosen = self._within_budget(decision.chosen, table, measured, used_runs, used_s)
        stop = None
        if decision.settled:
            stop = "settled"
        elif not decision.chosen:
            stop = "exhausted" if decision.incumbent else "infeasible"
        elif not chosen:
            stop = "budget"
        record = {
            "round": len(self.state["rounds"]) + 1,
            "used_runs": used_runs,
            "used_device_s": round(used_s, 3),
            "refit": refit,
            "scatter": round(float(table.attrs.get("scatter", float("nan"))), 4),
            "incumbent": decision.incumbent,
            "contenders": len(decision.contenders),
            "excluded": dict(excluded),
            "infeasible": {
                c: (
                    measured.set_index("cell").at[c, "broken"]
                    if c in set(measured["cell"])
                    else "every attempt failed"
                )
                for c, ok in feasible.items()
                if not ok
            },
            "sentence": decision.sentence,
            "chosen": [{"cell": c, "why": why} for c, why in chosen],
            "stop": stop,
        }
        self.state["rounds"].append(record)
        self.say(
            f"round {record['round']}: {decision.sentence}"
            + (f"; running {len(chosen)}" if chosen and not stop else "")
            + (f" ({refit})" if refit else "")
        )
        self.last = (decision, table, measured, feasible, excluded)
        if stop:
            self.state["stop"] = {"reason": stop, "sentence": _stop_sentence(stop, decision)}
            return None, table
        decision.chosen = chosen
        return decision, table

    def _lossless(self, cell: Cell) -> bool:
        """Whether `cell` leaves the output as the reference run makes it."""
        for flag, value in LOSSLESS.items():
            if cell.params.get(flag, value) != value:
                return False
        model = self.tune.reference.get("model")
        return model is None or cell.params.get("model") == model

    def _new_since_refit(self) -> bool:
        done = len(self._ok_dirs())
        last = self.state.get("_refit_runs", 0)
        self.state["_refit_runs"] = done
        return done > last

    def _failed(self, results: pd.DataFrame, measured: set[str]) -> list[str]:
        if results.empty or "cell" not in results:
            return []
        tried = set(results["cell"].astype(str)) - measured
        ids = {c.id for c in self.current_cells}
        return sorted(c for c in tried if c in ids)

    def _within_budget(self, chosen, table, measured, used_runs: int, used_s: float):
        tune = self.tune
        out = list(chosen)
        if tune.budget_runs is not None:
            out = out[: max(tune.budget_runs - used_runs, 0)]
        if tune.budget_s is not None:
            t = table.set_index("cell")
            kept, total = [], used_s
            results = results_frame(self.root)
            # a run is given the longer of its prediction and the longest run so far: a busy
            # machine runs slower than predicted, and the budget is a bound
            longest = 0.0
            if "duration_s" in results:
                longest = float(pd.to_numeric(results["duration_s"], errors="coerce").max())
                longest = longest if math.isfinite(longest) else 0.0
            for cell, why in out:
                need = max(self.run_seconds(t.at[cell, "estimate"], results), longest)
                if total + need > tune.budget_s:
                    break
                kept.append((cell, why))
                total += need
            out = kept
        return out

    def run_seconds(
        self, score: Any, results: pd.DataFrame | None = None, worst: bool = True
    ) -> float:
        """A run's predicted device time: the fixed part the runs so far took (start, load,
        prefill; the longest with `worst`, to keep a time budget, else the median) plus the
        decode at the estimated rate; a whole run so far when the rate is not the objective."""
        pick = np.max if worst else np.median
        results = results_frame(self.root) if results is None else results
        if results.empty or "duration_s" not in results:
            return 0.0
        ok = results[results["status"] == "ok"]
        durations = pd.to_numeric(ok["duration_s"], errors="coerce").dropna()
        if durations.empty:
            return 0.0
        n_predict = float(self.sweep.base.get("n_predict", 128))
        rate = _finite(self._value(score))
        if (
            rate
            and self.column in ("tok_s_reported", "steady_tok_s_mean")
            and "tok_s_reported" in ok
        ):
            measured = pd.to_numeric(ok["tok_s_reported"], errors="coerce")
            fixed = (
                pd.to_numeric(ok["duration_s"], errors="coerce") - n_predict / measured
            ).dropna()
            if len(fixed):
                return max(float(pick(fixed)) + n_predict / rate, 0.0)
        return float(pick(durations))

    # ------------------------------------------------------------------------- the answer

    def finish(self) -> TuneOutcome:
        """The recommendation, the runner-up, device time against the grid's, and predicted
        against measured per run; written to ``tune.json``."""
        if self.stop.is_set() and not self.state.get("stop"):
            self.state["stop"] = {"reason": "interrupted", "sentence": "interrupted"}
        decision, table, measured, feasible, excluded = self.last
        t = table.set_index("cell")
        results = results_frame(self.root)
        by_id = {c.id: c for c in self.current_cells}
        result: dict[str, Any] = {"stop": self.state["stop"]}
        used_runs, used_s = self.used()
        result.update(used_runs=used_runs, used_device_s=round(used_s, 1))
        result.update(self._grid_time(table))
        result["cells_measured"] = len(measured)
        if not decision.settled and (self.state["stop"] or {}).get("reason") == "budget":
            result["settle_runs"] = decision.more_runs
        labels = {c.id: _label(c, self.axes) for c in self.current_cells}
        broken = measured.set_index("cell")["broken"] if len(measured) else pd.Series()
        result["infeasible"] = {
            labels.get(c, c): broken.get(c) or "every attempt failed"
            for c, ok in feasible.items()
            if not ok
        }
        result["excluded"] = len(excluded)
        costs = {c.id: decide_mod.cost_key(c.params, self._lossless(c)) for c in self.current_cells}
        rec = decide_mod.recommend(
            table, feasible, confidence=self.tune.confidence, min_repeats=self.tune.min_repeats,
            costs=costs, labels=labels, unit=self._value,
        )  # fmt: skip
        result["reasons"] = rec.reasons
        best = rec.cell
        if best is not None:
            cell = by_id[best]
            n = int(t.at[best, "n"])
            mean, low, high = (self._value(t.at[best, k]) for k in ("mean", "low", "high"))
            if self.lower:
                low, high = high, low
            result["best"] = {
                "cell": best,
                "label": _label(cell, self.axes),
                "flags": _flags(cell),
                "command": command_line(cell, self.sweep.settings.engine),
                "toml": toml_snippet(cell, self.axes),
                "runs": n,
                "objective": mean,
                "low": low,
                "high": high,
                "confidence": self.tune.confidence,
                **{
                    f"worst_{c.column}": _finite(
                        measured.set_index("cell").at[best, f"worst_{c.column}"]
                    )
                    for c in self.tune.constraints
                },
            }
            if rec.runner_up is not None and rec.ratio is not None:
                ru = by_id[rec.runner_up]
                ratio, rlow, rhigh = rec.ratio
                result["runner_up"] = {
                    "cell": ru.id,
                    "label": _label(ru, self.axes),
                    "objective": self._value(t.at[ru.id, "mean"]),
                    "runs": int(t.at[ru.id, "n"]),
                    "ratio": _finite(ratio),
                    "ratio_low": _finite(rlow),
                    "ratio_high": _finite(rhigh),
                    "distinguishable": rec.distinguishable,
                }
        else:
            result["best"] = None
        self.state["runs"] = _predicted_vs_measured(self.state["runs"], results, self.column)
        self.state["result"] = result
        self.state.pop("_refit_runs", None)
        _write_state(self.root, self.state)
        return TuneOutcome(self.root, self.state)

    def _grid_time(self, table: pd.DataFrame) -> dict[str, Any]:
        """The full grid's predicted device time (every cell, ``[sweep] repeats`` times)."""
        repeats = self.sweep.settings.repeats
        results = results_frame(self.root)
        seconds = sum(self.run_seconds(s, results, worst=False) for s in table["estimate"])
        seconds *= repeats
        return {
            "grid_runs": len(self.grid_cells) * repeats,
            "grid_predicted_device_s": round(seconds, 1),
        }


def output_pieces(path: Path) -> list[str]:
    """The answer text of each generated token of a run (its ``BMOE_PROGRESS`` deltas)."""
    from bmoe.formats.protocol import iter_events

    try:
        with open(path, "rb") as fh:
            return [
                str(e.data.get("delta_text", "")) for e in iter_events(fh) if e.tag == "PROGRESS"
            ]
    except (OSError, BmoeError):
        return []


def native_fidelity(results: pd.DataFrame, root: Path, calibration: dict[str, Any]) -> pd.DataFrame:
    """`results` with the fidelity columns of every completed run that has none, from its
    generated tokens against the unmodified reference run's
    (:func:`bmoe.analyze.fidelity.token_agreement`): the identical-token share and the first
    step where they differ."""
    from bmoe.analyze.fidelity import token_agreement

    ref = Path(calibration.get("reference_output") or "")
    reference = output_pieces(ref if ref.is_absolute() else Path(root) / ref) if ref.name else []
    if not reference or results.empty or "dir" not in results:
        return results
    out = results.copy()
    for column in ("fidelity", "fidelity_first_miss", "fidelity_steps"):
        if column not in out:
            out[column] = np.nan
    for index in out.index[(out["status"] == "ok") & out["fidelity"].isna()]:
        pieces = output_pieces(root / str(out.at[index, "dir"]) / RUN_OUT)
        for key, value in token_agreement(reference, pieces).items():
            out.at[index, key] = value
    return out


def _error(candidates: pd.DataFrame, measured: pd.DataFrame) -> float | None:
    """Median absolute error (%) of the predictions of the measured cells."""
    if measured.empty:
        return None
    m = candidates.merge(measured[["cell", "mean"]], on="cell")
    err = (100.0 * (m["predicted"] - m["mean"]) / m["mean"]).abs().dropna()
    return round(float(err.median()), 1) if len(err) else None


def _stop_sentence(reason: str, decision: decide_mod.Decision) -> str:
    return {
        "settled": f"settled: {decision.sentence}",
        "budget": (
            f"budget spent before the answer was settled: {len(decision.contenders)} cell(s) "
            "could still reach the best measured"
        ),
        "exhausted": f"nothing left to run: {decision.sentence}",
        "infeasible": "no cell satisfies the constraints",
    }.get(reason, reason)


def device_use(records: Sequence[dict[str, Any]]) -> tuple[int, float]:
    """Attempts in manifest `records` and their device seconds, each attempt (a run and its
    attempt number) once however many lines it has: a copied or replayed line is not a run.
    Lines set aside stand for an attempt counted by its other line."""
    seconds: dict[tuple[str, Any], float] = {}
    for record in records:
        run = record.get("run")
        if record.get("status") == "set_aside" or not isinstance(run, str):
            continue
        attempt = record.get("attempt")
        key = (run, attempt if isinstance(attempt, int | str) else repr(attempt))
        spent = _finite(record.get("duration_s")) or 0.0
        seconds[key] = max(seconds.get(key, 0.0), max(spent, 0.0))
    return len(seconds), float(sum(seconds.values()))


def _label(cell: Cell, axes: Sequence[str]) -> str:
    return " ".join(f"{a}={cell.params.get(a)}" for a in axes)


def _flags(cell: Cell) -> dict[str, Any]:
    return {k: v for k, v in cell.params.items() if k not in NOT_RECOMMENDED}


def command_line(cell: Cell, engine: str) -> str:
    """The recommended flags as one command line (``bmoe run`` or ``bmoe-cli``), quoted to
    paste."""
    from bmoe.engine.native import flag_name, format_flag_value
    from bmoe.sweep.shelltext import shell_join

    args = ["bmoe", "run"] if engine == "embedded" else ["bmoe-cli"]
    for key, value in _flags(cell).items():
        if value is False:
            continue
        args.append(flag_name(key))
        if value is not True:
            args.append(format_flag_value(value))
    return shell_join(args)


def toml_snippet(cell: Cell, axes: Sequence[str]) -> str:
    """The recommended values of the searched axes as a ``[base]`` TOML snippet."""
    from bmoe.sweep.tomltext import dumps

    return dumps({"base": {a: cell.params[a] for a in axes if a in cell.params}})


def _predicted_vs_measured(
    planned: list[dict[str, Any]], results: pd.DataFrame, column: str
) -> list[dict[str, Any]]:
    if results.empty or "run" not in results:
        return planned
    ok = results[results["status"] == "ok"].set_index("run")
    out = []
    for row in planned:
        row = dict(row)
        measured = (
            _finite(ok.at[row["run"], column]) if row["run"] in ok.index and column in ok else None
        )
        row["measured"] = measured
        pred = row.get("predicted")
        row["error_pct"] = (
            round(100.0 * (pred - measured) / measured, 1)
            if (pred is not None and measured)
            else None
        )
        out.append(row)
    return out
