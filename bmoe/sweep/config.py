"""The sweep configuration: a TOML file, validated into typed settings.

Every problem is a :class:`ConfigError` naming the file, the line and the key
(``sweep.toml:12: grid.cache_mb: expected a list of values, got 8``): unknown keys, wrong
types and combinations that cannot run are all refused before anything starts.

Sections: ``[sweep]`` (name, engine, repeats or "auto", warmup, order, output, timeout,
retries, executor),
``[base]``
(engine flags every cell shares), ``[grid]`` (axes whose cartesian product makes cells),
``[[cells]]`` (explicit cells), ``[[exclude]]`` (cells to drop), ``[[limit]]`` (cells only
some targets may run, by tag), ``[pair]`` (cells run back to back on one target), ``[gate]``
(the measured condition each cell waits for) and ``[[targets]]`` (where cells run).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.inputs import read_limited, regular_file
from bmoe.sweep.checking import Checker, ConfigError, Scalar, describe, dotted
from bmoe.sweep.gate import GateSettings
from bmoe.sweep.targets import KINDS, TargetSpec
from bmoe.sweep.tomltext import KeyPath, key_lines, line_of

ENGINES = ("embedded", "native")
#: Where the runs are scheduled: threads on this host, or tasks on a Ray cluster (a farm).
EXECUTORS = ("local", "ray")
#: Resource names Ray keeps for itself.
RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
ORDERS = ("as-written", "reverse", "alternate", "shuffle")
KILL_MODES = ("pidfile", "name", "off")

#: Flags whose value is a file the engine writes: the sweep chooses the path (inside the sweep
#: folder); the configuration only says whether to record it (``true``/``false``).
OUTPUT_FLAGS = (
    "csv", "route_trace", "compute_trace", "compute_trace_layers", "io_trace", "fidelity_save",
)  # fmt: skip
#: Flags the driver owns; a configuration may not set them.
DRIVER_FLAGS = ("progress", "session", "help", "version", "list_archs")
#: Keys of [base] / [[cells]] that are not engine flags.
CELL_META_KEYS = ("prompt_file", "tags")
#: Keys a session request carries (they vary per turn without restarting the engine).
SESSION_KEYS = ("prompt", "n_predict")

#: Runs one configuration may plan unless its ``[sweep] max_runs`` says more: beyond it a
#: typo (an axis of 1000 values, ``repeats = 1000000000``) would cost minutes of planning in
#: silence and a sweep no one can wait for.
DEFAULT_MAX_RUNS = 10_000
#: What else a configuration is held to: retries per run, seconds of a run or a gate's wait,
#: the gate's poll interval, the size of the file itself and of a prompt file.
MAX_RETRIES = 100
MAX_SECONDS = 7 * 86400.0
MAX_POLL_S = 3600.0
MAX_CONFIG_BYTES = 16 << 20
MAX_PROMPT_BYTES = 1 << 20
#: The longest single argument Linux passes to a program (MAX_ARG_STRLEN): the prompt
#: travels as one, unless a session sends it on stdin.
MAX_ARG_BYTES = 131072
#: Engine flags with a numeric meaning: (lowest, highest) of a number given for them. A value
#: beyond is a typo no engine can run (``cache_mb = 1e308``).
FLAG_LIMITS: dict[str, tuple[float, float]] = {
    "cache_mb": (0, 1 << 24),
    "cache_floor_mb": (0, 1 << 24),
    "cache_ceil_mb": (0, 1 << 24),
    "n_predict": (-1, 1 << 24),
    "ctx_size": (0, 1 << 24),
    "ubatch": (0, 1 << 24),
    "threads": (1, 4096),
    "io_threads": (1, 4096),
    "prefetch": (0, 65536),
    "n_expert_used": (0, 65536),
    "predict_spec_max": (0, 65536),
    "route_ahead": (0, 65536),
    "top_k": (0, 1 << 24),
    "top_p": (0, 1),
    "temp": (0, 1e6),
    "seed": (0, 2**64 - 1),
    "drop_cold_experts": (0, 1e6),
}


@dataclass(frozen=True)
class SweepSettings:
    name: str
    engine: str = "native"
    repeats: int = 1  # with adaptive repeats: the first rounds (min_repeats)
    order: str = "as-written"
    seed: int | None = None
    output: str = "bench-data"
    timeout_s: float = 1800.0
    retries: int = 1
    session: bool = False
    base_dir: str = "."
    executor: str = "local"
    address: str | None = None  # the Ray cluster (executor "ray"): "auto" or host:port
    #: repeats = "auto": more rounds for a cell until the 95 % interval of its mean tok/s is
    #: within target_interval (relative half-width) of the mean, up to max_repeats.
    adaptive: bool = False
    max_repeats: int = 1
    target_interval: float = 0.05
    #: Runs per cell before its measured ones, archived but left out of the results.
    warmup: int = 0
    profile: str | None = None  # a device profile: each cell's prediction kept beside it
    max_runs: int = DEFAULT_MAX_RUNS  # the most runs the plan may hold


@dataclass(frozen=True)
class Limit:
    """Cells matching `where` run only on targets carrying all of `tags`."""

    where: Mapping[str, Any]
    tags: frozenset[str]
    line: int | None = None


@dataclass(frozen=True)
class Exclusion:
    """Cells matching every key (a list value matches any of its items) are dropped."""

    where: Mapping[str, Any]
    line: int | None = None


@dataclass
class SweepConfig:
    path: str
    text: str
    settings: SweepSettings
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    cells: list[dict[str, Any]]
    exclude: list[Exclusion]
    limits: list[Limit]
    pair_axis: str | None
    gate: GateSettings
    targets: list[TargetSpec]
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def error(self, path: KeyPath, problem: str) -> ConfigError:
        return ConfigError(self.path, line_of(self.lines, path), dotted(path), problem)

    def resolve_local(self, value: str) -> Path:
        """A path from the configuration, relative paths taken from the config's folder."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else Path(self.settings.base_dir) / path


# ----------------------------------------------------------------------------- checking


def _num(value: float) -> str:
    """A bound or value for a message: whole numbers written out, others as %g."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


class _Checker(Checker):
    """The type checks, and the one for engine flags."""

    def flag(self, name: str, value: Any, key: KeyPath) -> Scalar:
        """One engine flag value (or a cell meta key)."""
        if name in DRIVER_FLAGS:
            raise self.fail(key, "is set by the sweep itself; remove it")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_]*", name):
            raise self.fail(key, "flag names are the engine's long flags with '_' for '-'")
        if name in OUTPUT_FLAGS:
            if not isinstance(value, bool):
                raise self.fail(
                    key,
                    "output files are placed in the sweep folder: set true to record it "
                    f"(got {describe(value)})",
                )
            return value
        scalar = self.scalar(value, key)
        limits = FLAG_LIMITS.get(name)
        if limits and isinstance(scalar, int | float) and not isinstance(scalar, bool):
            low, high = limits
            if not low <= scalar <= high:
                raise self.fail(
                    key, f"must be from {_num(low)} to {_num(high)}, got {_num(scalar)}"
                )
        return scalar


SWEEP_KEYS = (
    "name", "engine", "repeats", "order", "seed", "output", "timeout_s", "retries", "session",
    "base_dir", "executor", "address", "min_repeats", "max_repeats", "target_interval",
    "warmup", "profile", "max_runs",
)  # fmt: skip
#: Defaults of repeats = "auto" (as hyperfine and pyperf: a few runs at least, a bound).
AUTO_MIN_REPEATS, AUTO_MAX_REPEATS, AUTO_TARGET_INTERVAL = 3, 10, 0.05
GATE_KEYS = ("max_cpu_temp_c", "min_mem_available_mb", "poll_s", "max_wait_s")
#: Keys every ``[[targets]]`` table may have; each kind adds its own (``TargetKind.keys``).
TARGET_KEYS = (
    "name", "kind", "tags", "workdir", "binary", "python", "model_dir", "models", "env",
    "kill_strays", "keep_remote", "resource",
)  # fmt: skip
#: ``tune``: read by ``bmoe tune`` (:mod:`bmoe.sweep.tune_config`); a sweep runs the grid.
TOP_KEYS = (
    "sweep", "base", "grid", "cells", "exclude", "limit", "pair", "gate", "targets", "tune",
)  # fmt: skip


def config_text(path: str | Path) -> str:
    """The text of a configuration file (sweep or tune): a regular file of at most
    :data:`MAX_CONFIG_BYTES`, UTF-8 (a one-line error otherwise)."""
    data = read_limited(path, MAX_CONFIG_BYTES, "a sweep configuration is a page of TOML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(str(path), line, "", "not UTF-8 text") from None


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep configuration file (:func:`config_text`)."""
    path = Path(path)
    return parse_config(config_text(path), str(path), base_dir=path.resolve().parent)


def read_prompt(path: Path) -> str:
    """A prompt file's text: a regular file of at most :data:`MAX_PROMPT_BYTES`, UTF-8, no NUL
    (BmoeError otherwise)."""
    try:
        data = read_limited(path, MAX_PROMPT_BYTES, "a prompt file holds text for the engine")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BmoeError(f"cannot read {path}: not UTF-8 text") from None
    except BmoeError as exc:
        raise BmoeError(f"cannot read {exc}") from None
    if "\x00" in text:
        raise BmoeError(f"{path} contains a NUL character, which no command line can carry")
    return text


def parse_config(text: str, path: str = "<config>", base_dir: str | Path = ".") -> SweepConfig:
    """Validate configuration `text` (`path` names it in errors; relative paths in it are
    taken from `base_dir` unless ``[sweep] base_dir`` says otherwise)."""
    try:
        return _parse_config(text, path, base_dir)
    except RecursionError:  # tomllib and the checks descend as deep as the text nests
        raise ConfigError(path, None, "", "nested too deep to be a sweep configuration") from None


def _parse_config(text: str, path: str, base_dir: str | Path) -> SweepConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        line = int(m.group(1)) if m else None
        raise ConfigError(path, line, "", f"not valid TOML: {exc}") from None
    lines = key_lines(text)
    check = _Checker(path, lines)
    check.known(doc, TOP_KEYS, ())
    check.no_nul(doc, ())

    if "sweep" not in doc:
        raise ConfigError(path, None, "sweep", "missing [sweep] table (with at least name)")
    settings = _settings(check, check.table(doc["sweep"], ("sweep",)), base_dir)

    base = _flags(check, check.table(doc.get("base", {}), ("base",)), ("base",))
    grid = _grid(check, check.table(doc.get("grid", {}), ("grid",)), base, settings)
    cells = _cells(check, doc.get("cells", []))
    gate = _gate(check, check.table(doc.get("gate", {}), ("gate",)))
    targets = _targets(check, doc.get("targets"), settings)
    pair_axis = _pair(check, check.table(doc.get("pair", {}), ("pair",)), grid, cells)
    exclude = [
        Exclusion(_where(check, w, ("exclude", i)), line_of(lines, ("exclude", i)))
        for i, w in enumerate(_table_list(check, doc.get("exclude", []), ("exclude",)))
    ]
    limits = []
    for i, item in enumerate(_table_list(check, doc.get("limit", []), ("limit",))):
        check.known(item, ("where", "tags"), ("limit", i))
        if "where" not in item or "tags" not in item:
            raise check.fail(("limit", i), "needs both 'where' (a table) and 'tags' (a list)")
        where = _where(check, check.table(item["where"], ("limit", i, "where")),
                       ("limit", i, "where"))  # fmt: skip
        tags = frozenset(check.strings(item["tags"], ("limit", i, "tags")))
        limits.append(Limit(where, tags, line_of(lines, ("limit", i))))

    if settings.session and (settings.adaptive or settings.warmup):
        key = "warmup" if settings.warmup else "repeats"
        raise check.fail(("sweep", key), f"{key} {'runs' if settings.warmup else '= auto'} "
                         "are not available in session mode")  # fmt: skip
    if settings.session and pair_axis is not None:
        raise check.fail(
            ("pair", "axis"), "session mode already runs the cells of a session back to back"
        )
    if settings.engine == "embedded":
        for i, target in enumerate(targets):
            refusal = KINDS[target.kind].no_embedded
            if refusal:
                raise check.fail(("targets", i, "kind"), refusal)
    _check_size(check, settings, grid, cells, doc)
    return SweepConfig(
        path, text, settings, base, grid, cells, exclude, limits, pair_axis, gate, targets, lines
    )


def planned_runs(
    settings: SweepSettings, grid: Mapping[str, list], n_cells: int
) -> tuple[int, int]:
    """(cells, runs) the plan will hold at most: the grid's product plus the explicit cells
    (before exclusions), times each cell's runs (repeats, or max_repeats, and warm-ups)."""
    cells = (math.prod(len(v) for v in grid.values()) if grid else (0 if n_cells else 1)) + n_cells
    per_cell = (settings.max_repeats if settings.adaptive else settings.repeats) + settings.warmup
    return cells, cells * per_cell


def _check_size(
    check: _Checker, settings: SweepSettings, grid: dict, cells: list, doc: dict
) -> None:
    """Refuse a plan of more than ``max_runs`` runs before it is built."""
    n_cells, runs = planned_runs(settings, grid, len(cells))
    if runs <= settings.max_runs:
        return
    per_cell = runs // n_cells
    key = ("sweep", "max_runs") if "max_runs" in doc["sweep"] else ("grid",) if grid else ("sweep",)
    raise check.fail(
        key,
        f"{n_cells} cells x {per_cell} runs each = {runs} runs, more than max_runs "
        f"({settings.max_runs}); raise [sweep] max_runs if the sweep is meant to be that large",
    )


def _settings(check: _Checker, table: dict[str, Any], base_dir: str | Path) -> SweepSettings:
    check.known(table, SWEEP_KEYS, ("sweep",))
    if "name" not in table:
        raise check.fail(("sweep",), "missing 'name'")
    name = check.string(table["name"], ("sweep", "name"))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", name):
        raise check.fail(
            ("sweep", "name"), "use letters, digits, '.', '_' and '-' (it names the folder)"
        )
    kw: dict[str, Any] = {"name": name}
    if "engine" in table:
        kw["engine"] = check.string(table["engine"], ("sweep", "engine"), ENGINES)
    auto_keys = [k for k in ("min_repeats", "max_repeats", "target_interval") if k in table]
    if table.get("repeats") == "auto":
        kw["adaptive"] = True
        low = table.get("min_repeats", AUTO_MIN_REPEATS)
        kw["repeats"] = check.integer(low, ("sweep", "min_repeats"), minimum=2)
        high = table.get("max_repeats", max(AUTO_MAX_REPEATS, kw["repeats"]))
        kw["max_repeats"] = check.integer(high, ("sweep", "max_repeats"), minimum=kw["repeats"])
        target = check.number(table.get("target_interval", AUTO_TARGET_INTERVAL),
                              ("sweep", "target_interval"), positive=True)  # fmt: skip
        if target >= 1:
            problem = f"a relative half-width below 1 (0.05 = ±5 %), got {target}"
            raise check.fail(("sweep", "target_interval"), problem)
        kw["target_interval"] = target
    elif "repeats" in table:
        if isinstance(table["repeats"], str):
            raise check.fail(("sweep", "repeats"), 'a number of repeats, or "auto"')
        kw["repeats"] = check.integer(table["repeats"], ("sweep", "repeats"), minimum=1)
    if auto_keys and not kw.get("adaptive"):
        raise check.fail(("sweep", auto_keys[0]), 'only applies to repeats = "auto"')
    if "warmup" in table:
        kw["warmup"] = check.integer(table["warmup"], ("sweep", "warmup"), minimum=0)
    if "order" in table:
        kw["order"] = check.string(table["order"], ("sweep", "order"), ORDERS)
    if "seed" in table:
        kw["seed"] = check.integer(table["seed"], ("sweep", "seed"))
        if kw.get("order") != "shuffle":
            raise check.fail(("sweep", "seed"), 'a seed only applies to order = "shuffle"')
    elif kw.get("order") == "shuffle":
        raise check.fail(("sweep", "order"), 'order = "shuffle" needs a seed (an integer)')
    if "output" in table:
        kw["output"] = check.string(table["output"], ("sweep", "output"))
    if "timeout_s" in table:
        kw["timeout_s"] = check.number(
            table["timeout_s"], ("sweep", "timeout_s"), positive=True, maximum=MAX_SECONDS
        )
    if "retries" in table:
        kw["retries"] = check.integer(
            table["retries"], ("sweep", "retries"), minimum=0, maximum=MAX_RETRIES
        )
    if "session" in table:
        kw["session"] = check.boolean(table["session"], ("sweep", "session"))
    if "base_dir" in table:
        kw["base_dir"] = check.string(table["base_dir"], ("sweep", "base_dir"))
    else:
        kw["base_dir"] = str(Path(base_dir).resolve())
    if "executor" in table:
        kw["executor"] = check.string(table["executor"], ("sweep", "executor"), EXECUTORS)
    if "address" in table:
        address = check.string(table["address"], ("sweep", "address")).strip()
        if kw.get("executor") != "ray":
            raise check.fail(("sweep", "address"), 'an address only applies to executor = "ray"')
        if not address:
            raise check.fail(("sweep", "address"), 'give the Ray cluster ("auto" or host:port)')
        kw["address"] = address
    elif kw.get("executor") == "ray":
        kw["address"] = "auto"
    if "max_runs" in table:
        kw["max_runs"] = check.integer(table["max_runs"], ("sweep", "max_runs"), minimum=1)
    if "profile" in table:
        kw["profile"] = check.string(table["profile"], ("sweep", "profile"))
        where = Path(kw["profile"]).expanduser()
        where = where if where.is_absolute() else Path(kw["base_dir"]) / where
        try:  # a FIFO would block the dry run, a device would never end (missing: said later)
            if os.path.lexists(where):
                regular_file(where)
        except BmoeError as exc:
            raise check.fail(("sweep", "profile"), str(exc)) from None
    return SweepSettings(**kw)


def _flags(check: _Checker, table: dict[str, Any], key: KeyPath) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in table.items():
        here = (*key, name)
        if name == "tags":
            out[name] = sorted(set(check.strings(value, here)))
        elif name == "prompt_file":
            out[name] = check.string(value, here)
            if "prompt" in table:
                raise check.fail(here, "give either 'prompt' or 'prompt_file', not both")
        else:
            out[name] = check.flag(name, value, here)
    return out


def _grid(
    check: _Checker, table: dict[str, Any], base: dict[str, Any], settings: SweepSettings
) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for name, values in table.items():
        here = ("grid", name)
        if name == "prompt_lines":
            source = check.string(values, here)
            if "prompt" in table or "prompt" in base or "prompt_file" in base:
                raise check.fail(here, "the prompt is already given elsewhere")
            prompts = _read_prompt_lines(check, source, here, settings)
            grid["prompt"] = prompts
            continue
        if name in CELL_META_KEYS:
            raise check.fail(here, f"{name!r} cannot be a grid axis")
        if isinstance(values, dict):  # a numeric range: {from, to, step} or {from, to, times}
            values = numeric_range(check, values, here)
        if not isinstance(values, list):
            raise check.fail(here, f"expected a list of values, got {describe(values)}")
        if not values:
            raise check.fail(here, "an axis needs at least one value")
        checked = [check.flag(name, v, here) for v in values]
        seen: set[Any] = set()
        for v in checked:
            marker = (type(v).__name__, v)
            if marker in seen:
                raise check.fail(here, f"value {v!r} appears twice")
            seen.add(marker)
        if name in base:
            raise check.fail(here, f"{name!r} is both in [base] and a [grid] axis")
        grid[name] = checked
    return grid


#: The most values a range axis may expand to.
MAX_RANGE_VALUES = 1000


def numeric_range(check: Checker, table: dict[str, Any], key: KeyPath) -> list[Any]:
    """A range axis: ``{from = 1, to = 8, step = 1}`` (arithmetic) or ``{from = 1, to = 64,
    times = 2}`` (geometric), both ends included when reached; integers stay integers."""
    check.known(table, ("from", "to", "step", "times"), key)
    if "from" not in table or "to" not in table or ("step" in table) == ("times" in table):
        raise check.fail(key, "a range needs 'from', 'to' and one of 'step' or 'times'")
    first = check.number(table["from"], (*key, "from"))
    last = check.number(table["to"], (*key, "to"))
    whole = all(isinstance(table[k], int) for k in table if k != "times")
    out: list[float] = []
    if "step" in table:
        step = check.number(table["step"], (*key, "step"), positive=True)
        count = int((last - first) / step + 1e-9) + 1 if last >= first else 0
        out = [first + i * step for i in range(min(count, MAX_RANGE_VALUES + 1))]
    else:
        times = check.number(table["times"], (*key, "times"), positive=True)
        if times <= 1 or first <= 0:
            raise check.fail(key, "a geometric range needs 'from' > 0 and 'times' > 1")
        value = first
        while value <= last * (1 + 1e-9) and len(out) <= MAX_RANGE_VALUES:
            out.append(value)
            value *= times
    if not out:
        raise check.fail(key, f"the range from {first:g} to {last:g} holds no value")
    if len(out) > MAX_RANGE_VALUES:
        raise check.fail(key, f"the range holds more than {MAX_RANGE_VALUES} values")
    return [round(v) if whole and float(v).is_integer() else round(v, 12) for v in out]


def _read_prompt_lines(
    check: _Checker, source: str, key: KeyPath, settings: SweepSettings
) -> list[str]:
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = Path(settings.base_dir) / path
    try:
        text = read_prompt(path)
    except BmoeError as exc:
        raise check.fail(key, str(exc)) from None
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise check.fail(key, f"{path} holds no prompt (one per line)")
    if len(set(prompts)) != len(prompts):
        raise check.fail(key, f"{path} repeats a prompt")
    return prompts


def _table_list(check: _Checker, value: Any, key: KeyPath) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise check.fail(key, f"expected [[{dotted(key)}]] tables, got {describe(value)}")
    return value


def _cells(check: _Checker, value: Any) -> list[dict[str, Any]]:
    out = []
    for index, table in enumerate(_table_list(check, value, ("cells",))):
        if not table:
            raise check.fail(("cells", index), "an explicit cell must set at least one flag")
        out.append(_flags(check, table, ("cells", index)))
    return out


def _where(check: _Checker, table: dict[str, Any], key: KeyPath) -> dict[str, Any]:
    if not table:
        raise check.fail(key, "needs at least one key to match")
    out: dict[str, Any] = {}
    for name, value in table.items():
        here = (*key, name)
        if isinstance(value, list):
            out[name] = [check.scalar(v, here) for v in value]
        else:
            out[name] = check.scalar(value, here)
    return out


def _pair(
    check: _Checker, table: dict[str, Any], grid: dict[str, list[Any]], cells: list[dict]
) -> str | None:
    if not table:
        return None
    check.known(table, ("axis",), ("pair",))
    if "axis" not in table:
        raise check.fail(("pair",), "missing 'axis' (the flag whose values are paired)")
    axis = check.string(table["axis"], ("pair", "axis"))
    varied = len(grid.get(axis, [])) > 1 or len({repr(c.get(axis)) for c in cells}) > 1
    if not varied:
        raise check.fail(("pair", "axis"), f"{axis!r} does not vary between cells: nothing to pair")
    return axis


def _gate(check: _Checker, table: dict[str, Any]) -> GateSettings:
    check.known(table, GATE_KEYS, ("gate",))
    kw: dict[str, Any] = {}
    if "max_cpu_temp_c" in table:
        kw["max_cpu_temp_c"] = check.number(table["max_cpu_temp_c"], ("gate", "max_cpu_temp_c"))
    if "min_mem_available_mb" in table:
        kw["min_mem_available_mb"] = check.number(
            table["min_mem_available_mb"], ("gate", "min_mem_available_mb")
        )
    if "poll_s" in table:
        kw["poll_s"] = check.number(
            table["poll_s"], ("gate", "poll_s"), positive=True, maximum=MAX_POLL_S
        )
    if "max_wait_s" in table:
        kw["max_wait_s"] = check.number(
            table["max_wait_s"], ("gate", "max_wait_s"), maximum=MAX_SECONDS
        )
        if kw["max_wait_s"] < 0:
            raise check.fail(("gate", "max_wait_s"), "must not be negative")
    gate = GateSettings(**kw)
    if table and not gate.active:
        raise check.fail(
            ("gate",), "set max_cpu_temp_c and/or min_mem_available_mb (the condition to wait for)"
        )
    return gate


def _targets(check: _Checker, value: Any, settings: SweepSettings) -> list[TargetSpec]:
    """The ``[[targets]]`` tables, each checked (:func:`_target`), their names unique and, on a
    farm, their Ray resources too."""
    if value is None:
        return [TargetSpec(name="local", kind="local")]
    tables = _table_list(check, value, ("targets",))
    if not tables:
        raise check.fail(("targets",), "at least one target")
    out: list[TargetSpec] = []
    names: set[str] = set()
    for index, table in enumerate(tables):
        key: KeyPath = ("targets", index)
        spec = _target(check, table, key, settings)
        if spec.name in names:
            raise check.fail((*key, "name"), f"two targets are named {spec.name!r}")
        names.add(spec.name)
        if settings.executor == "ray":
            other = next((t for t in out if t.ray_resource == spec.ray_resource), None)
            if other is not None:
                raise check.fail(
                    (*key, "resource") if "resource" in table else (*key, "name"),
                    f"targets {other.name!r} and {spec.name!r} both use the Ray resource "
                    f"{spec.ray_resource!r}: one resource names one device",
                )
        out.append(spec)
    return out


def _target(
    check: _Checker, table: dict[str, Any], key: KeyPath, settings: SweepSettings
) -> TargetSpec:
    """One ``[[targets]]`` table: the keys every kind has, then the kind's own
    (:attr:`TargetKind.check`), then its name."""
    kind = KINDS[check.string(table.get("kind", "local"), (*key, "kind"), tuple(KINDS))]
    check.known(table, TARGET_KEYS + kind.keys, key)
    fields = {"kind": kind.name, **_common_target_fields(check, table, key, settings)}
    kind.check(check, table, key, fields, settings.engine)
    name = check.string(table.get("name", kind.default_name(fields)), (*key, "name"))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise check.fail((*key, "name"), "use letters, digits, '.', '_' and '-'")
    return TargetSpec(**fields, name=name)


def _common_target_fields(
    check: _Checker, table: dict[str, Any], key: KeyPath, settings: SweepSettings
) -> dict[str, Any]:
    """The TargetSpec fields of the keys any kind may have (`known` has refused the keys of
    other kinds, so ``identity`` and ``user`` appear only where they apply)."""
    kw: dict[str, Any] = {}
    for name in ("workdir", "binary", "python", "model_dir", "identity", "user"):
        if name in table:
            kw[name] = check.string(table[name], (*key, name))
    if "tags" in table:
        kw["tags"] = frozenset(check.strings(table["tags"], (*key, "tags")))
    for name in ("models", "env"):
        if name in table:
            sub = check.table(table[name], (*key, name))
            kw[name] = {k: check.string(v, (*key, name, k)) for k, v in sub.items()}
    for env_name in kw.get("env", {}):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env_name):
            raise check.fail((*key, "env", env_name),
                             "an environment variable name is letters, digits and '_' "
                             "(not starting with a digit; no '=')")  # fmt: skip
    if "kill_strays" in table:
        kw["kill_strays"] = check.string(table["kill_strays"], (*key, "kill_strays"),
                                         KILL_MODES)  # fmt: skip
    if "keep_remote" in table:
        kw["keep_remote"] = check.boolean(table["keep_remote"], (*key, "keep_remote"))
    if "resource" in table:
        kw["resource"] = _ray_resource(check, table["resource"], (*key, "resource"), settings)
    return kw


def _ray_resource(check: _Checker, value: Any, key: KeyPath, settings: SweepSettings) -> str:
    if settings.executor != "ray":
        raise check.fail(key, 'a Ray resource only applies to executor = "ray"')
    resource = check.string(value, key)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*", resource):
        raise check.fail(key, "use letters, digits, '_', '.', ':', '/', '-'")
    if resource in RAY_OWN_RESOURCES or resource.startswith("node:"):
        raise check.fail(key, f"{resource!r} is one of Ray's own resources")
    return resource


def resolved_document(config: SweepConfig) -> dict[str, Any]:
    """The configuration as it runs: defaults filled in, ``base_dir`` fixed, prompt lines
    expanded. Written into the sweep folder as ``sweep.toml``; loading it gives the same
    cells."""
    s = config.settings
    sweep: dict[str, Any] = {
        "name": s.name, "engine": s.engine, "repeats": s.repeats, "order": s.order,
        "output": s.output, "timeout_s": s.timeout_s, "retries": s.retries,
        "session": s.session, "base_dir": s.base_dir,
    }  # fmt: skip
    if s.adaptive:
        sweep.update({"repeats": "auto", "min_repeats": s.repeats, "max_repeats": s.max_repeats,
                      "target_interval": s.target_interval})  # fmt: skip
    if s.warmup:
        sweep["warmup"] = s.warmup
    if s.seed is not None:
        sweep["seed"] = s.seed
    if s.executor != "local":
        sweep["executor"] = s.executor
        sweep["address"] = s.address
    if s.profile is not None:
        sweep["profile"] = s.profile
    if s.max_runs != DEFAULT_MAX_RUNS:
        sweep["max_runs"] = s.max_runs
    doc: dict[str, Any] = {"sweep": sweep}
    if config.base:
        doc["base"] = dict(config.base)
    if config.grid:
        doc["grid"] = {k: list(v) for k, v in config.grid.items()}
    if config.cells:
        doc["cells"] = [dict(c) for c in config.cells]
    if config.exclude:
        doc["exclude"] = [dict(e.where) for e in config.exclude]
    if config.limits:
        doc["limit"] = [
            {"where": dict(lim.where), "tags": sorted(lim.tags)} for lim in config.limits
        ]
    if config.pair_axis:
        doc["pair"] = {"axis": config.pair_axis}
    g = config.gate
    if g.active:
        gate = {"poll_s": g.poll_s, "max_wait_s": g.max_wait_s}
        if g.max_cpu_temp_c is not None:
            gate["max_cpu_temp_c"] = g.max_cpu_temp_c
        if g.min_mem_available_mb is not None:
            gate["min_mem_available_mb"] = g.min_mem_available_mb
        doc["gate"] = gate
    targets = []
    for t in config.targets:
        item: dict[str, Any] = {"name": t.name, "kind": t.kind}
        if t.tags:
            item["tags"] = sorted(t.tags)
        for key in ("workdir", "binary", "python", "model_dir", "identity", "user"):
            value = getattr(t, key)
            if value is not None:
                item[key] = value
        if t.models:
            item["models"] = dict(t.models)
        if t.env:
            item["env"] = dict(t.env)
        item["kill_strays"] = t.kill_strays
        if t.keep_remote:
            item["keep_remote"] = True
        if t.resource:
            item["resource"] = t.resource
        item.update(KINDS[t.kind].resolved(t))
        targets.append(item)
    doc["targets"] = targets
    return doc


def resolved_toml(config: SweepConfig) -> str:
    from bmoe.sweep.tomltext import dumps, format_value

    # The path as a TOML string: a newline (or anything else) in it cannot break the file.
    header = f"# resolved by bmoe sweep from {format_value(str(config.path))}"
    return dumps(resolved_document(config), header=header)
