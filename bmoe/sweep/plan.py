"""From a configuration to the ordered list of work: cells, repeats, pairs, execution order.

A *cell* is one set of engine flags. A *run* is one repeat of a cell (``<cell>/r<k>``); it may
take several attempts. A *unit* is what one target executes back to back: a single run, or
the runs of a matched group (cells differing only in the ``[pair]`` axis) in one round.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.sweep.config import MAX_ARG_BYTES, SESSION_KEYS, SweepConfig, read_prompt
from bmoe.sweep.targets import TargetSpec


@dataclass(frozen=True)
class Cell:
    """One combination of engine flags (what a sweep varies), with the tags it needs."""

    id: str
    index: int  # position in the as-written order
    params: Mapping[str, Any]  # engine flags, long names with '_' (prompt resolved)
    axes: Mapping[str, Any]  # the values of the keys that vary between cells
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Run:
    """One repeat of a cell."""

    cell: Cell
    repeat: int  # 1-based
    round: int  # 1-based pass over the cells
    reversed: bool  # this round runs in reverse order
    order: int  # 0-based position in the planned execution sequence
    warmup: bool = False  # a warm-up run (``w<k>``): archived, left out of the results

    @property
    def id(self) -> str:
        return f"{self.cell.id}/{'w' if self.warmup else 'r'}{self.repeat}"


@dataclass(frozen=True)
class Unit:
    """Runs one target executes back to back (a matched group is one unit)."""

    runs: tuple[Run, ...]
    tags: frozenset[str] = field(default=frozenset())
    session: bool = False  # the runs are turns of one --session engine process

    @property
    def id(self) -> str:
        return "+".join(r.id for r in self.runs)


@dataclass
class Plan:
    cells: list[Cell]
    units: list[Unit]
    axes: list[str]

    @property
    def runs(self) -> list[Run]:
        return [run for unit in self.units for run in unit.runs]


def _canonical(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def cell_id(params: Mapping[str, Any], axes: Mapping[str, Any]) -> str:
    """A readable, stable, filesystem-safe id: the varying values, then a content hash."""
    digest = hashlib.sha256(_canonical(params).encode("utf-8")).hexdigest()[:8]
    parts = []
    for key, value in axes.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if key == "prompt" or len(text) > 24:
            text = hashlib.sha256(text.encode("utf-8")).hexdigest()[:6]
        parts.append(f"{key}-{text}")
    slug = re.sub(r"[^A-Za-z0-9.=-]+", "_", "_".join(parts)).strip("_.")[:64]
    return f"{slug}-{digest}" if slug else f"cell-{digest}"


def _matches(params: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    for key, want in where.items():
        if key not in params:
            return False
        have = params[key]
        options = want if isinstance(want, list) else [want]
        if not any(type(have) is type(o) and have == o for o in options):
            # 8 and 8.0 are the same setting; True and 1 are not.
            numeric = [o for o in options if isinstance(o, int | float) and not isinstance(o, bool)]
            if not (
                isinstance(have, int | float)
                and not isinstance(have, bool)
                and any(have == o for o in numeric)
            ):
                return False
    return True


def expand(config: SweepConfig) -> list[Cell]:
    """Every cell of the sweep, in as-written order (grid product first, then [[cells]])."""
    raw: list[tuple[dict[str, Any], tuple]] = []
    names = list(config.grid)
    if names:
        for combo in itertools.product(*(config.grid[n] for n in names)):
            raw.append(({**config.base, **dict(zip(names, combo, strict=True))}, ("grid",)))
    elif not config.cells:
        raw.append((dict(config.base), ("base",)))
    for index, written in enumerate(config.cells):
        raw.append(({**config.base, **written}, ("cells", index)))

    resolved: list[tuple[dict[str, Any], frozenset[str], tuple]] = []
    for params, origin in raw:
        params = dict(params)
        tags = frozenset(params.pop("tags", ()))
        if "prompt_file" in params:
            source = params.pop("prompt_file")
            path = config.resolve_local(source)
            where = (*origin, "prompt_file") if origin[0] == "cells" else ("base", "prompt_file")
            try:
                params["prompt"] = read_prompt(Path(path))
            except BmoeError as exc:
                raise config.error(where, str(exc)) from None
        if "model" not in params:
            raise config.error(origin, "no 'model' for this cell (set it in [base])")
        prompt = params.get("prompt")
        if isinstance(prompt, str) and not config.settings.session:
            size = len(prompt.encode("utf-8"))
            if size > MAX_ARG_BYTES:
                raise config.error(
                    ("base", "prompt_file") if "prompt_file" in config.base else origin,
                    f"a prompt of {size} bytes: the engine takes it as one argument, at most "
                    f"{MAX_ARG_BYTES} bytes (session = true sends it on stdin instead)",
                )
        resolved.append((params, tags, origin))

    for exclusion_index, exclusion in enumerate(config.exclude):
        known = set().union(*(p.keys() for p, _, _ in resolved)) if resolved else set()
        for key in exclusion.where:
            if key not in known:
                raise config.error(
                    ("exclude", exclusion_index, key), "no cell sets this key: it excludes nothing"
                )
        kept = [item for item in resolved if not _matches(item[0], exclusion.where)]
        if len(kept) == len(resolved):
            raise config.error(("exclude", exclusion_index), "matches no cell")
        resolved = kept
    if not resolved:
        raise config.error(("exclude",), "every cell is excluded")

    seen: dict[str, tuple] = {}
    for params, _, origin in resolved:
        key = _canonical(params)
        if key in seen:
            raise config.error(origin, "duplicates another cell (same flags)")
        seen[key] = origin

    varying = _varying([p for p, _, _ in resolved])
    cells = []
    for index, (params, tags, _origin) in enumerate(resolved):
        for limit_index, limit in enumerate(config.limits):
            if _matches(params, limit.where):
                tags = tags | limit.tags
            del limit_index
        axes = {k: params[k] for k in varying if k in params}
        cells.append(Cell(cell_id(params, axes), index, params, axes, tags))

    for limit_index, limit in enumerate(config.limits):
        if not any(_matches(c.params, limit.where) for c in cells):
            raise config.error(("limit", limit_index, "where"), "matches no cell")
    for cell in cells:
        if not any(t.can_run(cell.tags) for t in config.targets):
            raise config.error(
                ("limit",) if config.limits else ("targets",),
                f"no target carries the tags {sorted(cell.tags)} that cell {cell.id} needs",
            )
    return cells


def _varying(params_list: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for params in params_list:
        for key in params:
            if key not in keys:
                keys.append(key)
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in params_list}) > 1]


def _groups(cells: list[Cell], apart: tuple[str, ...]) -> list[list[Cell]]:
    """Cells grouped so that a matched group (same flags but those in `apart`) stays together,
    groups ordered by their first member. No `apart`: one cell per group."""
    if not apart:
        return [[c] for c in cells]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = {k: v for k, v in cell.params.items() if k not in apart}
        groups.setdefault(_canonical(rest), []).append(cell)
    return list(groups.values())


def make_plan(config: SweepConfig, cells: list[Cell] | None = None) -> Plan:
    """Cells, repeats and order: the units each target executes, in execution order.

    ``as-written`` repeats the whole list each round; ``reverse`` runs every round backwards;
    ``alternate`` reverses every second round (a reversed-order repeat to check order effects
    against); ``shuffle`` draws a new order each round from the seed. Within a matched group
    the order follows the round's direction, so an A/B pair alternates AB, BA. In session
    mode the cells that differ only in prompt / n_predict form a group: the turns of one
    engine process.
    """
    cells = expand(config) if cells is None else cells
    settings = config.settings
    groups = cell_groups(config, cells)
    rng = random.Random(settings.seed)
    units: list[Unit] = []
    for round_no in range(1, settings.repeats + 1):
        units += round_units(config, groups, round_no, sum(len(u.runs) for u in units), rng)
    axes = list(_varying([dict(c.params) for c in cells]))
    return Plan(cells, units, axes)


def cell_groups(config: SweepConfig, cells: list[Cell]) -> list[list[Cell]]:
    """The cells that run back to back (a matched pair, a session's turns), or one each."""
    if config.settings.session:
        return _groups(cells, SESSION_KEYS)
    return _groups(cells, (config.pair_axis,) if config.pair_axis else ())


def round_units(
    config: SweepConfig,
    groups: list[list[Cell]],
    round_no: int,
    position: int,
    rng: random.Random | None = None,
) -> list[Unit]:
    """The units of round `round_no` over `groups`, in the configured order, their runs
    numbered from `position`. Round 1 starts each cell with its ``warmup`` runs. Without
    `rng` a shuffled round draws from the seed and the round number (rounds added later)."""
    settings = config.settings
    backwards = settings.order == "reverse" or (settings.order == "alternate" and round_no % 2 == 0)
    ordered = [list(g) for g in groups]
    if settings.order == "shuffle":
        rng = rng or random.Random(f"{settings.seed}:{round_no}")
        rng.shuffle(ordered)
        for group in ordered:
            rng.shuffle(group)
    elif backwards:
        ordered = [list(reversed(g)) for g in reversed(ordered)]
    units = []
    for group in ordered:
        runs = []
        if round_no == 1:
            for cell in group:
                for k in range(1, settings.warmup + 1):
                    runs.append(Run(cell, k, round_no, backwards, position, warmup=True))
                    position += 1
        for cell in group:
            runs.append(Run(cell, round_no, round_no, backwards, position))
            position += 1
        tags = frozenset().union(*(c.tags for c in group))
        if not any(t.can_run(tags) for t in config.targets):
            raise config.error(
                ("pair", "axis"),
                f"no target carries every tag the matched group of {group[0].id} needs "
                f"({sorted(tags)})",
            )
        units.append(Unit(tuple(runs), tags, settings.session))
    return units


def eligible_targets(unit: Unit, targets: list[TargetSpec]) -> list[TargetSpec]:
    return [t for t in targets if t.can_run(unit.tags)]
