"""The configuration of ``bmoe tune``: a sweep configuration (targets, gate, ``[base]``, the
``[grid]`` as the search space) plus a ``[tune]`` table, validated with the file, line and key
of every problem.

``[tune]`` keys: ``objective`` (``tok_s``, the default; ``steady_tok_s``, ``prefill_tps``,
``ttft_s``), ``budget`` (runs: ``14`` or ``"14 runs"``; device time: ``"20 min"``, ``"90 s"``,
``"1 h"``), ``confidence`` (0.95), ``max_rss_mb``, ``min_mem_available_mb``, ``min_fidelity``,
``[tune.constraints]`` (``max_<column>`` / ``min_<column>`` for any results column),
``per_round`` (runs per round, 3), ``min_repeats`` (3) and ``max_repeats`` (5) per cell,
``trace`` and ``profile`` (a routing trace and a device profile instead of a calibration run),
``fidelity_ref`` (a reference from ``bmoe run --fidelity-save`` instead of a reference run) and
``[tune.reference]`` (flags of the unmodified reference run over ``[base]``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.analyze.device.tune import OBJECTIVES, Constraint
from bmoe.errors import BmoeError
from bmoe.sweep.checking import Checker, describe
from bmoe.sweep.config import SweepConfig, config_text, parse_config, resolved_document
from bmoe.sweep.tomltext import KeyPath, dumps, format_value, key_lines

TUNE_KEYS = (
    "objective",
    "budget",
    "confidence",
    "max_rss_mb",
    "min_mem_available_mb",
    "min_fidelity",
    "constraints",
    "per_round",
    "min_repeats",
    "max_repeats",
    "trace",
    "profile",
    "fidelity_ref",
    "reference",
)
#: The shortcuts of ``[tune]`` -> (results column, kind).
SHORTCUTS = {
    "max_rss_mb": ("rss_mb", "max"),
    "min_mem_available_mb": ("mem_available_mb", "min"),
    "min_fidelity": ("fidelity", "min"),
}
#: Grid axes a tune cannot vary: every cell must share the prompt its predictions replay.
FIXED_AXES = ("prompt", "n_predict")
#: Flags whose value changes the model's output (a fidelity reference runs without them).
LOSSY_FLAGS = ("drop_cold_experts", "n_expert_used", "drop_no_renorm", "drop_in_prefill")
#: The shortest decode with a steady state (the run analysis's rule).
STEADY_MIN_TOKENS = 32


@dataclass(frozen=True)
class TuneSettings:
    objective: str = "tok_s"
    budget_runs: int | None = None
    budget_s: float | None = None
    confidence: float = 0.95
    constraints: tuple[Constraint, ...] = ()
    per_round: int = 3
    min_repeats: int = 3
    max_repeats: int = 5
    trace: str | None = None
    profile: str | None = None
    fidelity_ref: str | None = None
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def needs_fidelity(self) -> bool:
        return any(c.column.startswith("fidelity") for c in self.constraints)


@dataclass
class TuneConfig:
    sweep: SweepConfig
    tune: TuneSettings
    table: dict[str, Any]  # [tune] as written (for the folder's sweep.toml)

    @property
    def lossy_axes(self) -> list[str]:
        return [a for a in self.sweep.grid if a in LOSSY_FLAGS or a == "model"]


def load_tune_config(path: str | Path) -> TuneConfig:
    """Read and validate a tune configuration file."""
    path = Path(path)
    return parse_tune_config(config_text(path), str(path), base_dir=path.resolve().parent)


def parse_tune_config(text: str, path: str = "<config>", base_dir: str | Path = ".") -> TuneConfig:
    """Validate a tune configuration's `text` (the sweep part as :func:`parse_config` does)."""
    sweep = parse_config(text, path, base_dir)
    doc = tomllib.loads(text)
    check = Checker(path, key_lines(text))
    if "tune" not in doc:
        raise check.fail(("tune",), "missing [tune] table (objective, budget, constraints)")
    table = check.table(doc["tune"], ("tune",))
    tune = _settings(check, table, sweep)
    _check_sweep(check, sweep, tune)
    return TuneConfig(sweep, tune, table)


def _settings(check: Checker, table: dict[str, Any], sweep: SweepConfig) -> TuneSettings:
    key: KeyPath = ("tune",)
    check.known(table, TUNE_KEYS, key)
    kw: dict[str, Any] = {}
    if "objective" in table:
        name = check.string(table["objective"], (*key, "objective"))
        if name not in OBJECTIVES and name not in {v[0] for v in OBJECTIVES.values()}:
            raise check.fail((*key, "objective"), f"{name!r}: one of {', '.join(OBJECTIVES)}")
        kw["objective"] = next(k for k, v in OBJECTIVES.items() if name in (k, v[0]))
    if "budget" in table:
        kw.update(_budget(check, table["budget"], (*key, "budget"), sweep.settings.max_runs))
    if "confidence" in table:
        level = check.number(table["confidence"], (*key, "confidence"), positive=True)
        if not 0.5 <= level < 1:
            raise check.fail((*key, "confidence"), f"a level from 0.5 to below 1, got {level}")
        kw["confidence"] = level
    for name in ("per_round", "min_repeats", "max_repeats"):
        if name in table:
            kw[name] = check.integer(
                table[name],
                (*key, name),
                minimum=1 if name != "min_repeats" else 2,
                maximum=sweep.settings.max_runs,
            )
    if kw.get("max_repeats", 5) < kw.get("min_repeats", 2):
        raise check.fail((*key, "max_repeats"), "must be at least min_repeats")
    constraints = []
    for name, (column, kind) in SHORTCUTS.items():
        if name in table:
            constraints.append(Constraint(column, kind, check.number(table[name], (*key, name))))
    if "constraints" in table:
        sub = check.table(table["constraints"], (*key, "constraints"))
        for name, value in sub.items():
            m = re.fullmatch(r"(max|min)_([a-z][a-z0-9_]*)", name)
            here = (*key, "constraints", name)
            if not m:
                raise check.fail(here, "a constraint is max_<column> or min_<column>")
            constraints.append(Constraint(m.group(2), m.group(1), check.number(value, here)))
    kw["constraints"] = tuple(constraints)
    for name in ("trace", "profile", "fidelity_ref"):
        if name in table:
            value = check.string(table[name], (*key, name))
            resolved = sweep.resolve_local(value)
            try:
                _check_input(name, str(resolved))
            except BmoeError as exc:
                raise check.fail((*key, name), str(exc)) from None
            kw[name] = str(resolved)
    if ("trace" in kw) != ("profile" in kw):
        raise check.fail(
            (*key, "trace" if "trace" in kw else "profile"),
            "give both a trace and a profile, or neither (a calibration run records both)",
        )
    if "reference" in table:
        ref = check.table(table["reference"], (*key, "reference"))
        kw["reference"] = {k: check.scalar(v, (*key, "reference", k)) for k, v in ref.items()}
    return TuneSettings(**kw)


def _check_input(name: str, path: str) -> None:
    """A ``[tune]`` file checked before the first run (every run would fail on it alike):
    a regular file (what it is, else), and a route trace, a device profile or a fidelity
    reference by its content (a reference by its declared sizes, nothing inflated)."""
    from bmoe.formats.detect import detect
    from bmoe.formats.inputs import regular_file

    regular_file(path)
    if name == "trace":
        kind = detect(path)
        if kind != "route":
            raise BmoeError(f"{path}: not a route trace ({kind or 'unknown'} content)")
    elif name == "profile":
        from bmoe.formats.profile import read_profile

        read_profile(path)
    else:
        from bmoe.engine.embedded.fidelity import check_reference

        check_reference(path)


#: The longest device-time budget (seconds): 30 days.
MAX_BUDGET_S = 30 * 86400


def _budget(check: Checker, value: Any, key: KeyPath, max_runs: int) -> dict[str, Any]:
    """Runs (at most the sweep's ``max_runs``) or device time (at most 30 days), in ASCII
    digits."""
    runs_limit = f"at most {max_runs} runs ([sweep] max_runs)"
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise check.fail(key, "at least one run")
        if value > max_runs:
            raise check.fail(key, f"{runs_limit}, got {value}")
        return {"budget_runs": value}
    if not isinstance(value, str):
        raise check.fail(
            key, f'a number of runs or a device time ("20 min"), got {describe(value)}'
        )
    m = re.fullmatch(r"\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*([a-z]*)\s*", value.lower(), re.ASCII)
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hour": 3600, "hours": 3600}
    if not m or (m.group(2) not in units and m.group(2) not in ("run", "runs")):
        raise check.fail(
            key,
            f'{value!r}: a number of runs ("14 runs") or a device time ("90 s", "20 min", "1 h")',
        )
    amount = float(m.group(1))
    if amount <= 0:
        raise check.fail(key, "must be positive")
    if m.group(2) in ("run", "runs"):
        if amount > max_runs:
            raise check.fail(key, f"{runs_limit}, got {value!r}")
        return {"budget_runs": int(amount)}
    seconds = amount * units[m.group(2)]
    if seconds > MAX_BUDGET_S:
        raise check.fail(key, f"at most 30 days of device time, got {value!r}")
    return {"budget_s": seconds}


def _check_sweep(check: Checker, sweep: SweepConfig, tune: TuneSettings) -> None:
    """Refuse what a tune cannot do with a sweep configuration, and objectives or
    constraints the engine cannot produce."""
    s = sweep.settings
    if s.adaptive:
        raise check.fail(("sweep", "repeats"), 'a tune chooses repeats itself: not "auto"')
    if s.session:
        raise check.fail(("sweep", "session"), "a tune runs one-shot runs: not session mode")
    if s.warmup:
        raise check.fail(("sweep", "warmup"), "a tune has no warm-up runs")
    if sweep.pair_axis:
        raise check.fail(("pair", "axis"), "a tune does not pair cells")
    if sweep.cells:
        raise check.fail(
            ("cells",), "a tune searches the [grid]; explicit [[cells]] are not supported"
        )
    if not sweep.grid:
        raise check.fail(("grid",), "a tune needs a [grid]: the search space")
    for axis in FIXED_AXES:
        if axis in sweep.grid:
            raise check.fail(
                ("grid", axis),
                f"{axis!r} must be the same in every cell of a "
                "tune (the predictions replay one routing)",
            )
    n_predict = int(sweep.base.get("n_predict", 128))
    if tune.objective == "steady_tok_s" and n_predict < STEADY_MIN_TOKENS:
        raise check.fail(
            ("tune", "objective"),
            f"steady_tok_s needs n_predict >= {STEADY_MIN_TOKENS} (a shorter "
            f"decode has no steady state; [base] n_predict = {n_predict})",
        )
    for con in tune.constraints:
        if con.column.startswith("fidelity_kl") and s.engine != "embedded":
            raise check.fail(
                ("tune",),
                f"{con.text()}: the KL divergence is measured teacher-forced by "
                "the embedded engine; the native engine gives the identical-token share (fidelity)",
            )
    lossy = tune.needs_fidelity or any(a in LOSSY_FLAGS for a in sweep.grid)
    if "model" in sweep.grid and lossy and "model" not in tune.reference and not tune.fidelity_ref:
        raise check.fail(
            ("grid", "model"),
            "with the model as an axis, name the unmodified one "
            'the fidelity is measured against: [tune.reference] model = "..."',
        )
    if any(k in sweep.base for k in ("fidelity_save", "fidelity_ref")):
        raise check.fail(
            ("base",),
            "the tune sets the fidelity flags itself ([tune] "
            "fidelity_ref for a reference of your own)",
        )


def resolved_tune_toml(config: TuneConfig) -> str:
    """The folder's ``sweep.toml``: the sweep as it runs and the ``[tune]`` table (paths
    absolute), so that ``bmoe tune DIR`` resumes it and ``bmoe sweep`` runs its grid."""
    doc = resolved_document(config.sweep)
    table = dict(config.table)
    for name in ("trace", "profile", "fidelity_ref"):
        value = getattr(config.tune, name)
        if value:
            table[name] = value
    doc["tune"] = table
    header = f"# resolved by bmoe tune from {format_value(str(config.sweep.path))}"
    return dumps(doc, header=header)
