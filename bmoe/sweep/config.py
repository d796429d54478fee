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
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.sweep.tomltext import KeyPath, key_lines, line_of

ENGINES = ("embedded", "native")
#: Where the runs are scheduled: threads on this host, or tasks on a Ray cluster (a farm).
EXECUTORS = ("local", "ray")
#: The custom resource a farm host advertises for each target it can reach, by default.
RESOURCE_PREFIX = "bmoe_target_"
#: Resource names Ray keeps for itself.
RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
ORDERS = ("as-written", "reverse", "alternate", "shuffle")
TARGET_KINDS = ("local", "adb", "ssh")
KILL_MODES = ("pidfile", "name", "off")

#: Flags whose value is a file the engine writes: the sweep chooses the path (inside the sweep
#: folder); the configuration only says whether to record it (``true``/``false``).
OUTPUT_FLAGS = ("csv", "route_trace", "compute_trace", "compute_trace_layers", "io_trace")
#: Flags the driver owns; a configuration may not set them.
DRIVER_FLAGS = ("progress", "session", "help", "version", "list_archs")
#: Keys of [base] / [[cells]] that are not engine flags.
CELL_META_KEYS = ("prompt_file", "tags")
#: Keys a session request carries (they vary per turn without restarting the engine).
SESSION_KEYS = ("prompt", "n_predict")

Scalar = str | int | float | bool


class ConfigError(BmoeError):
    """A problem in a sweep configuration, located by file, line and key."""

    def __init__(self, path: str, line: int | None, key: str, problem: str):
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


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


@dataclass(frozen=True)
class GateSettings:
    """Wait before each cell until the device is cool and has memory back, up to a bound."""

    max_cpu_temp_c: float | None = None
    min_mem_available_mb: float | None = None
    poll_s: float = 5.0
    max_wait_s: float = 300.0

    @property
    def active(self) -> bool:
        return self.max_cpu_temp_c is not None or self.min_mem_available_mb is not None


@dataclass(frozen=True)
class TargetSpec:
    """Where cells run. ``local`` is this host; ``adb`` a device over adb; ``ssh`` a host."""

    name: str
    kind: str = "local"
    tags: frozenset[str] = frozenset()
    workdir: str | None = None
    binary: str | None = None
    python: str | None = None
    model_dir: str | None = None
    models: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    kill_strays: str = "pidfile"
    keep_remote: bool = False
    # adb
    serial: str | None = None
    adb: str = "adb"
    # ssh
    host: str | None = None
    user: str | None = None
    port: int = 22
    identity: str | None = None
    ssh: str = "ssh"
    ssh_options: tuple[str, ...] = ()
    # a farm (executor "ray"): the custom resource its host advertises
    resource: str | None = None

    def can_run(self, tags: frozenset[str]) -> bool:
        return tags <= self.tags

    @property
    def ray_resource(self) -> str:
        """The Ray resource the host that reaches this target advertises (one unit)."""
        return self.resource or f"{RESOURCE_PREFIX}{self.name}"


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


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ----------------------------------------------------------------------------- checking


class _Checker:
    """Type checks that raise a located :class:`ConfigError`."""

    def __init__(self, path: str, lines: dict[KeyPath, int]):
        self.path = path
        self.lines = lines

    def fail(self, key: KeyPath, problem: str) -> ConfigError:
        return ConfigError(self.path, line_of(self.lines, key), dotted(key), problem)

    def table(self, value: Any, key: KeyPath) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {_describe(value)}")
        return value

    def known(self, table: Mapping[str, Any], allowed: tuple[str, ...], key: KeyPath) -> None:
        for name in table:
            if name not in allowed:
                hint = _closest(name, allowed)
                raise self.fail(
                    (*key, name),
                    "unknown key"
                    + (f" (did you mean {hint!r}?)" if hint else "")
                    + f"; expected one of: {', '.join(allowed)}",
                )

    def string(self, value: Any, key: KeyPath, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_describe(value)}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def integer(self, value: Any, key: KeyPath, minimum: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"expected an integer, got {_describe(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def number(self, value: Any, key: KeyPath, positive: bool = False) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.fail(key, f"expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise self.fail(key, f"expected a finite number, got {value}")
        if positive and value <= 0:
            raise self.fail(key, f"must be greater than 0, got {value}")
        return float(value)

    def boolean(self, value: Any, key: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_describe(value)}")
        return value

    def strings(self, value: Any, key: KeyPath) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expected a list of strings, got {_describe(value)}")
        return list(value)

    def scalar(self, value: Any, key: KeyPath) -> Scalar:
        if isinstance(value, list):
            raise self.fail(key, "a list of values belongs in [grid] (one cell per value)")
        if not isinstance(value, str | int | float | bool):
            raise self.fail(key, f"expected a string, number or boolean, got {_describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"expected a finite number, got {value}")
        return value

    def no_nul(self, value: Any, key: KeyPath) -> None:
        """Refuse a NUL character anywhere in `value` (no command line or environment can
        carry one: the run would fail mid-sweep)."""
        if isinstance(value, str):
            if "\x00" in value:
                raise self.fail(key, "contains a NUL character (\\u0000), which no command "
                                "line or environment can carry")  # fmt: skip
        elif isinstance(value, dict):
            for k, v in value.items():
                self.no_nul(k, (*key, k))
                self.no_nul(v, (*key, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.no_nul(v, (*key, i) if value and isinstance(v, dict) else key)

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
                    f"(got {_describe(value)})",
                )
            return value
        return self.scalar(value, key)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return type(value).__name__


def _closest(name: str, allowed: tuple[str, ...]) -> str | None:
    import difflib

    found = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return found[0] if found else None


SWEEP_KEYS = (
    "name", "engine", "repeats", "order", "seed", "output", "timeout_s", "retries", "session",
    "base_dir", "executor", "address", "min_repeats", "max_repeats", "target_interval",
    "warmup", "profile",
)  # fmt: skip
#: Defaults of repeats = "auto" (as hyperfine and pyperf: a few runs at least, a bound).
AUTO_MIN_REPEATS, AUTO_MAX_REPEATS, AUTO_TARGET_INTERVAL = 3, 10, 0.05
GATE_KEYS = ("max_cpu_temp_c", "min_mem_available_mb", "poll_s", "max_wait_s")
TARGET_KEYS = {
    "common": (
        "name", "kind", "tags", "workdir", "binary", "python", "model_dir", "models", "env",
        "kill_strays", "keep_remote", "resource",
    ),
    "local": (),
    "adb": ("serial", "adb"),
    "ssh": ("host", "user", "port", "identity", "ssh", "ssh_options"),
}  # fmt: skip
TOP_KEYS = ("sweep", "base", "grid", "cells", "exclude", "limit", "pair", "gate", "targets")


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep configuration file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BmoeError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BmoeError(f"{path}: cannot read: {exc}") from None
    return parse_config(text, str(path), base_dir=path.resolve().parent)


def parse_config(text: str, path: str = "<config>", base_dir: str | Path = ".") -> SweepConfig:
    """Validate configuration `text` (`path` names it in errors; relative paths in it are
    taken from `base_dir` unless ``[sweep] base_dir`` says otherwise)."""
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
            if target.kind == "adb":
                raise check.fail(
                    ("targets", i, "kind"),
                    "the embedded engine runs where Python runs (local or ssh), not over adb",
                )
    return SweepConfig(
        path, text, settings, base, grid, cells, exclude, limits, pair_axis, gate, targets, lines
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
        kw["timeout_s"] = check.number(table["timeout_s"], ("sweep", "timeout_s"), positive=True)
    if "retries" in table:
        kw["retries"] = check.integer(table["retries"], ("sweep", "retries"), minimum=0)
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
    if "profile" in table:
        kw["profile"] = check.string(table["profile"], ("sweep", "profile"))
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
        if not isinstance(values, list):
            raise check.fail(here, f"expected a list of values, got {_describe(values)}")
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


def _read_prompt_lines(
    check: _Checker, source: str, key: KeyPath, settings: SweepSettings
) -> list[str]:
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = Path(settings.base_dir) / path
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise check.fail(key, f"cannot read {path}: {exc}") from None
    if "\x00" in text:
        raise check.fail(key, f"{path} contains a NUL character, which no command line can carry")
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise check.fail(key, f"{path} holds no prompt (one per line)")
    if len(set(prompts)) != len(prompts):
        raise check.fail(key, f"{path} repeats a prompt")
    return prompts


def _table_list(check: _Checker, value: Any, key: KeyPath) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise check.fail(key, f"expected [[{dotted(key)}]] tables, got {_describe(value)}")
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
        kw["poll_s"] = check.number(table["poll_s"], ("gate", "poll_s"), positive=True)
    if "max_wait_s" in table:
        kw["max_wait_s"] = check.number(table["max_wait_s"], ("gate", "max_wait_s"))
        if kw["max_wait_s"] < 0:
            raise check.fail(("gate", "max_wait_s"), "must not be negative")
    gate = GateSettings(**kw)
    if table and not gate.active:
        raise check.fail(
            ("gate",), "set max_cpu_temp_c and/or min_mem_available_mb (the condition to wait for)"
        )
    return gate


def _targets(check: _Checker, value: Any, settings: SweepSettings) -> list[TargetSpec]:
    if value is None:
        return [TargetSpec(name="local", kind="local")]
    tables = _table_list(check, value, ("targets",))
    if not tables:
        raise check.fail(("targets",), "at least one target")
    out: list[TargetSpec] = []
    names: set[str] = set()
    for index, table in enumerate(tables):
        key: KeyPath = ("targets", index)
        kind = check.string(table.get("kind", "local"), (*key, "kind"), TARGET_KINDS)
        check.known(table, TARGET_KEYS["common"] + TARGET_KEYS[kind], key)
        kw: dict[str, Any] = {"kind": kind}
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
            if settings.executor != "ray":
                raise check.fail(
                    (*key, "resource"), 'a Ray resource only applies to executor = "ray"'
                )
            resource = check.string(table["resource"], (*key, "resource"))
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*", resource):
                raise check.fail((*key, "resource"), "use letters, digits, '_', '.', ':', '/', '-'")
            if resource in RAY_OWN_RESOURCES or resource.startswith("node:"):
                raise check.fail((*key, "resource"), f"{resource!r} is one of Ray's own resources")
            kw["resource"] = resource
        if kind == "adb":
            if "serial" in table:
                kw["serial"] = check.string(table["serial"], (*key, "serial"))
            if "adb" in table:
                kw["adb"] = check.string(table["adb"], (*key, "adb"))
            kw.setdefault("workdir", "/data/local/tmp/bmoe")
            kw.setdefault("kill_strays", "name")
            if "binary" not in kw and settings.engine == "native":
                raise check.fail(key, "an adb target needs 'binary' (bmoe-cli on the device)")
        if kind == "ssh":
            if "host" not in table:
                raise check.fail(key, "an ssh target needs 'host'")
            kw["host"] = check.string(table["host"], (*key, "host"))
            if "port" in table:
                kw["port"] = check.integer(table["port"], (*key, "port"), minimum=1)
            if "ssh" in table:
                kw["ssh"] = check.string(table["ssh"], (*key, "ssh"))
            if "ssh_options" in table:
                options = check.strings(table["ssh_options"], (*key, "ssh_options"))
                kw["ssh_options"] = tuple(options)
            kw.setdefault("workdir", "/tmp/bmoe-sweep")
            if "binary" not in kw and settings.engine == "native":
                raise check.fail(key, "an ssh target needs 'binary' (bmoe-cli on that host)")
        if kind == "local" and "workdir" in kw:
            raise check.fail((*key, "workdir"), "a local target writes into the sweep folder")
        default_name = {"local": "local", "adb": f"adb-{kw.get('serial') or 'device'}",
                        "ssh": f"ssh-{kw.get('host')}"}[kind]  # fmt: skip
        name = check.string(table.get("name", default_name), (*key, "name"))
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise check.fail((*key, "name"), "use letters, digits, '.', '_' and '-'")
        if name in names:
            raise check.fail((*key, "name"), f"two targets are named {name!r}")
        names.add(name)
        kw["name"] = name
        spec = TargetSpec(**kw)
        if settings.executor == "ray":
            other = next((t for t in out if t.ray_resource == spec.ray_resource), None)
            if other is not None:
                raise check.fail(
                    (*key, "resource") if "resource" in table else (*key, "name"),
                    f"targets {other.name!r} and {name!r} both use the Ray resource "
                    f"{spec.ray_resource!r}: one resource names one device",
                )
        out.append(spec)
    return out


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
        if t.kind == "adb":
            item["adb"] = t.adb
            if t.serial:
                item["serial"] = t.serial
        if t.kind == "ssh":
            item.update({"host": t.host, "port": t.port, "ssh": t.ssh})
            if t.ssh_options:
                item["ssh_options"] = list(t.ssh_options)
        targets.append(item)
    doc["targets"] = targets
    return doc


def resolved_toml(config: SweepConfig) -> str:
    from bmoe.sweep.tomltext import dumps, format_value

    # The path as a TOML string: a newline (or anything else) in it cannot break the file.
    header = f"# resolved by bmoe sweep from {format_value(str(config.path))}"
    return dumps(resolved_document(config), header=header)
