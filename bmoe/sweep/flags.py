"""Every flag of every cell checked against the engine before the first run.

The embedded engine's flags are its own table (:mod:`bmoe.engine.embedded.config`): a flag it
does not know, or a native flag it does not implement (``overlap``), is refused with the key
and line that set it, and each cell's whole command line is parsed as the engine will parse it
(values, flags that need ``--moe-stream``). The native engine's flags are what its binary's
``-h`` lists on the target; when the help lists no flags (an old build, a wrapper) the flags
pass through unchecked, as the native driver does, and the sweep says so.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bmoe.engine.native import OUTPUT_FILES, engine_args, flag_name, output_files
from bmoe.errors import BmoeError
from bmoe.sweep.config import CELL_META_KEYS, SweepConfig
from bmoe.sweep.plan import Cell
from bmoe.sweep.targets import Target, TargetError

#: Runs the program and arguments it is given, stderr with stdout (for ``-h``).
HELP_SCRIPT = 'exec "$@" 2>&1'
#: Fewer long flags than this in a help text: it is not a flag table.
MIN_HELP_FLAGS = 5

_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


@dataclass(frozen=True)
class FlagTable:
    """The flags an engine accepts (``--io-threads``, ``-m``), and where that came from."""

    source: str
    known: frozenset[str]
    not_implemented: frozenset[str] = frozenset()


def embedded_flags() -> FlagTable:
    """The embedded engine's own table."""
    from bmoe.engine.embedded.config import _SWITCH, _VALUE, NOT_IMPLEMENTED

    return FlagTable(
        "the embedded engine",
        frozenset(_VALUE) | frozenset(_SWITCH) | {"--version"},
        frozenset(NOT_IMPLEMENTED),
    )


def parse_help(text: str) -> frozenset[str]:
    """The flags a help text names (``-m``, ``--cache-mb``...)."""
    return frozenset(_FLAG.findall(text))


def native_flags(target: Target) -> FlagTable | None:
    """What the native binary's ``-h`` lists on `target`; None when it lists no flag table."""
    program = target.engine_program("native")
    try:
        res = target.shell(HELP_SCRIPT, [*program, "-h"], timeout=60)
    except (TargetError, OSError):
        return None
    flags = parse_help(res.stdout.decode("utf-8", "replace"))
    if sum(1 for f in flags if f.startswith("--")) < MIN_HELP_FLAGS:
        return None
    return FlagTable(f"{PurePosixPath(program[0]).name} -h on target {target.name}", flags)


def _key_of(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _where_set(config: SweepConfig, key: str, cell: Cell) -> tuple:
    if key in config.grid:
        return ("grid", key)
    if key in config.base:
        return ("base", key)
    for index, table in enumerate(config.cells):
        if key in table and all(cell.params.get(k) == v for k, v in table.items() if k != "tags"):
            return ("cells", index, key)
    for index, table in enumerate(config.cells):
        if key in table:
            return ("cells", index, key)
    return ("base",)


def check_cell_flags(config: SweepConfig, cells: Sequence[Cell], table: FlagTable) -> None:
    """Refuse (a located :class:`ConfigError`) a flag `table` does not know in any cell."""
    names = sorted({_key_of(f) for f in table.known if f.startswith("--")})
    for cell in cells:
        for key in cell.params:
            if key in CELL_META_KEYS or key in OUTPUT_FILES:
                continue
            flag = flag_name(key)
            if flag in table.known:
                continue
            where = _where_set(config, key, cell)
            if flag in table.not_implemented:
                raise config.error(
                    where, f"{flag} is a native bmoe-cli flag {table.source} does not implement"
                )
            hint = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            raise config.error(
                where,
                f"{flag} is not a flag of {table.source}"
                + (f" (did you mean {hint[0]!r}?)" if hint else ""),
            )


def attached_values(args: list[str]) -> list[str]:
    """`args` with every flag value that starts with '-' attached as ``--flag=value``, so
    that a prompt such as ``--help`` reaches the embedded engine as a prompt, not a flag."""
    from bmoe.engine.embedded.config import _VALUE

    long_of = {short: long for long, name in _VALUE.items() if long.startswith("--")
               for short, same in _VALUE.items() if same == name}  # fmt: skip
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in long_of and i + 1 < len(args) and args[i + 1].startswith("-"):
            out.append(f"{long_of[arg]}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def check_embedded_cells(
    config: SweepConfig, cells: Sequence[Cell], targets: Sequence[Target]
) -> None:
    """Parse each cell's command line as the embedded engine will (with each target's
    environment): a value it refuses stops the sweep now rather than in every run."""
    from bmoe.engine.embedded.config import parse_args

    for cell in cells:
        args = attached_values(engine_args(cell.params, output_files(cell.params), model="m"))
        for target in targets:
            if not target.spec.can_run(cell.tags):
                continue
            try:
                parse_args(args, env=dict(target.spec.env))
            except BmoeError as exc:
                origin = ("grid",) if config.grid else ("base",)
                problem = f"cell {cell.id} on target {target.name}: {exc}"
                raise config.error(origin, problem) from None


def check_models(config: SweepConfig, cells: Sequence[Cell], targets: Sequence[Target]) -> None:
    """Refuse (a located :class:`ConfigError`) a cell whose model file is not on a local
    target that may run it: every run would fail with the same error."""
    seen: set[str] = set()
    for cell in cells:
        model = cell.params.get("model")
        if not isinstance(model, str):
            continue
        for target in targets:
            if target.spec.kind != "local" or not target.spec.can_run(cell.tags):
                continue
            path = target.model_path(model, config.settings.base_dir)
            if path in seen:
                continue
            seen.add(path)
            if not Path(path).is_file():
                shown = os.path.normpath(path)
                here = os.path.relpath(shown)
                raise config.error(
                    _where_set(config, "model", cell),
                    f"{shown}: no such model file (a generated one: bmoe model synth "
                    f"{shlex.quote(shown if here.startswith('..') else here)} --preset tiny)",
                )


def check_flags(
    config: SweepConfig, cells: Sequence[Cell], targets: Sequence[Target], probe: bool = True
) -> list[str]:
    """Check every cell's flags against the engine on `targets` (the native engine's only
    with `probe`: its binary is asked on the target), and on the embedded engine that each
    local target has the model; returns notes (targets whose native engine lists no flags,
    so its flags pass through unchecked)."""
    notes: list[str] = []
    if config.settings.engine == "embedded":
        check_cell_flags(config, cells, embedded_flags())
        check_embedded_cells(config, cells, targets)
        if probe:
            check_models(config, cells, targets)
        return notes
    if not probe:
        return notes
    for target in targets:
        table = native_flags(target)
        if table is None:
            notes.append(
                f"target {target.name}: the engine's -h lists no flags; flags pass unchecked"
            )
            continue
        check_cell_flags(config, [c for c in cells if target.spec.can_run(c.tags)], table)
    return notes
