"""The profile's model section: which model the runs ran, its expert sizes (from a route
trace, the model file or the preamble, in that order) and the bytes one read moves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import MIB
from bmoe.analyze.profile.runs import ProfileRun, number
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace


def summary_sizes(run: ProfileRun) -> tuple[dict[int, int], str] | None:
    """Expert sizes a run's preamble and summary imply: v2's ``cache_cycle_mb`` (one token's
    worst-case routed bytes) or v1's ``token_demand_MiB`` / ``layer_demand_MiB`` over
    ``n_layer`` x ``n_expert_used`` (every layer taken as MoE, all experts one size)."""
    params = run.metrics.params
    n_layer = number(params.get("n_layer"))
    k = number(params.get("n_expert_used"))
    if not n_layer or not k:
        return None
    cycle = number(params.get("cache_cycle_mb"))
    if cycle:
        per = cycle * MIB / (n_layer * k)
        return {i: round(per) for i in range(int(n_layer))}, "cache_cycle_mb"
    token = number(run.figure("token_demand_MiB"))
    layer = number(run.figure("layer_demand_MiB"))
    if token and layer:
        layers = max(1, round(token / layer))
        per = layer * MIB / k
        return {i: round(per) for i in range(layers)}, "token_demand_MiB, layer_demand_MiB"
    return None


def _check_sizes(sizes: Mapping[int, int], where: str, run: ProfileRun) -> None:
    """Refuse expert sizes whose mean is not the one `run`'s summary implies."""
    implied = summary_sizes(run)
    if implied and sizes:
        theirs_mean = float(np.mean(list(implied[0].values())))
        mine_mean = float(np.mean(list(sizes.values())))
        # the summaries round to 0.1 MiB: allow that and 2 %
        slack = 0.02 * mine_mean + 0.1 * MIB / max(len(implied[0]), 1)
        if abs(theirs_mean - mine_mean) > slack:
            raise BmoeError(
                f"{where} has experts of {mine_mean / MIB:.3f} MiB on average but "
                f"{run.name} implies {theirs_mean / MIB:.3f} MiB ({implied[1]}): runs of "
                "another model (or quantisation)"
            )


def _check_shape(meta: Mapping[str, Any], where: str, run: ProfileRun) -> None:
    """Refuse a model (its ``n_layer`` / ``n_expert``) that is not the one `run` ran."""
    params = run.metrics.params
    for key in ("n_layer", "n_expert"):
        mine, theirs = number(meta.get(key)), number(params.get(key))
        if mine is not None and theirs is not None and mine != theirs:
            raise BmoeError(
                f"{where} ({key}={int(mine)}) and {run.name} ({key}={int(theirs)}) are "
                "runs of different models: a profile describes one model"
            )


def check_model_file(
    meta: Mapping[str, Any], sizes: Mapping[int, int], runs: Sequence[ProfileRun], where: str
) -> bool:
    """Refuse expert sizes read from a model file (`where`) of another model than the runs'
    (their preamble's ``n_layer``, ``n_expert``, or the expert sizes their summaries imply);
    whether any run said enough to check it."""
    checked = False
    for run in runs:
        _check_shape(meta, where, run)
        _check_sizes(sizes, where, run)
        params = run.metrics.params
        checked = checked or any(number(params.get(k)) is not None for k in ("n_layer", "n_expert"))
        checked = checked or summary_sizes(run) is not None
    return checked


def check_against_runs(trace: RouteTrace, runs: Sequence[ProfileRun]) -> None:
    """Refuse a route trace of another model than the runs' (their preamble's n_layer,
    n_expert, top-k, or the expert sizes their summaries imply), naming both files."""
    meta = trace.meta
    where = trace.path or "the route trace"
    for run in runs:
        params = run.metrics.params
        _check_shape(meta, where, run)
        mine_k, theirs_k = number(meta.get("n_expert_used")), number(params.get("n_expert_used"))
        if mine_k is not None and theirs_k is not None and mine_k != theirs_k:
            raise BmoeError(
                f"{where} routes top-{int(mine_k)} but {run.name} ran top-{int(theirs_k)} "
                "(--n-expert-used changes the routing): give a trace recorded at the same top-k"
            )
        _check_sizes(trace.expert_bytes(), where, run)


def _named_traces(
    runs: Sequence[ProfileRun], trace: RouteTrace | None
) -> list[tuple[str, RouteTrace]]:
    """The route traces that say expert sizes: the one given first, then the runs' own."""
    named = [(r.name, r.route) for r in runs if r.route is not None and r.route.expert_bytes()]
    if trace is not None:
        if not trace.expert_bytes():
            raise BmoeError(f"{trace.path or 'the route trace'}: no expert_bytes in its preamble")
        check_against_runs(trace, runs)
        named = [(trace.path or "the route trace", trace), *named]
    return named


def _sizes(
    runs: Sequence[ProfileRun],
    named: list[tuple[str, RouteTrace]],
    expert_sizes: Mapping[int, int] | None,
    sizes_from: str | None,
    model_meta: Mapping[str, Any] | None,
) -> tuple[dict[int, int], str | None, dict[str, Any]]:
    """Expert sizes, where they came from, and the route trace's preamble (if any)."""
    if named:
        first_name, first = named[0]
        sizes = first.expert_bytes()
        for name, other in named[1:]:
            if other.expert_bytes() != sizes:
                raise BmoeError(
                    f"{name} is a run of another model than {first_name} (expert sizes "
                    "differ): a profile describes one model on one device"
                )
        for run in runs:
            if run.route is not None:
                check_against_runs(first, [run])
        return sizes, f"route trace {first.path or first_name}", first.meta
    if expert_sizes:
        sizes = {int(k): int(v) for k, v in expert_sizes.items()}
        where = sizes_from or "the model file"
        if model_meta is not None and not check_model_file(model_meta, sizes, runs, where):
            where += " (not checked: no run records its model)"
        return sizes, where, {}
    for run in runs:
        implied = summary_sizes(run)
        if implied:
            return implied[0], f"the preamble of {run.name} ({implied[1]})", {}
    return {}, None, {}


def _read_per_expert(runs: Sequence[ProfileRun], sizes: dict[int, int]) -> tuple[int, dict]:
    """Slices per expert read and, per layer, the bytes one expert read moved (the io
    traces' median; alignment included)."""
    ios = [r.io for r in runs if r.io is not None and len(r.io.rows)]
    if not ios:
        return 1, {}
    slices = max(int(t.rows["proj"].nunique()) if "proj" in t.rows else 1 for t in ios)
    keys = ["turn", "phase", "step", "layer", "expert", "spec"]
    per = pd.concat(  # bytes one expert read moved, per run, then per layer
        [t.rows.groupby(keys, observed=True)["read_bytes"].sum() for t in ios]
    )
    per = per.groupby(level="layer").median()
    return slices, {str(int(k)): int(v) for k, v in per.items() if int(k) in sizes}


def model_section(
    runs: Sequence[ProfileRun],
    trace: RouteTrace | None,
    expert_sizes: Mapping[int, int] | None,
    sizes_from: str | None,
    model_meta: Mapping[str, Any] | None = None,
) -> dict:
    """The profile's ``model`` section (see :mod:`bmoe.formats.profile`). `model_meta` is
    what the model file the sizes were read from says of its shape (``n_layer``,
    ``n_expert``): checked against the runs."""
    named = _named_traces(runs, trace)
    sizes, source, meta = _sizes(runs, named, expert_sizes, sizes_from, model_meta)
    params = next((r.metrics.params for r in runs if r.metrics.params), {})
    slices, read_per = _read_per_expert(runs, sizes)
    route_path = named[0][1].path if named else None
    values = [float(v) for v in read_per.values()] or [float(v) for v in sizes.values()]
    unit = float(np.median(values)) if values else float(MIB)
    model_name = meta.get("model") or params.get("model") or ""
    return {
        "name": str(model_name).replace("\\", "/").rsplit("/", 1)[-1] or None,
        "route_trace": str(Path(route_path).resolve()) if route_path else None,
        "arch": meta.get("arch", params.get("arch")),
        "n_layer": meta.get("n_layer", params.get("n_layer")),
        "n_expert": meta.get("n_expert", params.get("n_expert")),
        "n_expert_used": meta.get("n_expert_used", params.get("n_expert_used")),
        "expert_bytes": {str(k): int(v) for k, v in sorted(sizes.items())},
        "read_bytes_per_expert": read_per,
        "slices_per_expert": slices,
        "sizes_from": source,
        "read_unit_bytes": round(unit),
    }


__all__ = ["check_against_runs", "check_model_file", "model_section", "summary_sizes"]
