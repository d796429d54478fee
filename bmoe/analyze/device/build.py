"""build_profile: runs to a device profile, and its error with each configuration held out.

The model's own error: each configuration the profile's runs measured is held out in turn,
the others make a profile (the same sections, the same read units), and that profile predicts
each held-out run from the reads it recorded itself, with its own configuration.

A prediction errs more the further its configuration lies from the ones the profile measured:
a configuration that reads what a measured one read, at its lanes, is predicted about as well
as a repeat; one between two measured ones, from both; one beyond them, by holding the
nearest. The distance is ``|ln(read_mib / nearest)|``, the nearest being the measured
configuration at the same io lanes (any, when none used them) whose read volume a token is
closest. A held-out run's relative error ``e`` of decode time is taken as normal around 0
with the variance its prediction's spread states (``s^2``) plus the model's own: a part that
does not depend on distance (``z^2``: configurations that read alike but differ otherwise,
in cache budget or policy) and a part that grows in proportion to it (``u^2 d``: the error of
a random walk, a linear variogram). ``z`` and ``u`` (``sd_rel_zero``, ``sd_rel_unit``) are the
maximum likelihood estimates over the held-out runs, each at its distance from the
configurations left in (a grid search; 0 when the spreads explain the errors). Holding a
configuration out leaves its neighbours twice as far apart as they are in the whole profile;
a model error that ignored distance took the held-out errors, made across those wide gaps,
as the error of every configuration, and its intervals were wider than their coverage
needed. ``sd_rel`` is the same estimate without distance, for a configuration whose
reads are not known; weighing each error by its own spread matters in both: one held-out
prediction with a wide spread must not hide another's large error made with a narrow one.
The number of configurations held out is how well the model error is known (see
:mod:`bmoe.analyze.device.interval`).

Whole configurations are held out, not single runs, because a prediction is asked of
configurations never run: a repeat of a configuration the profile already measured would be
easier to predict than the configurations the profile is used for.

Build the device profile from the runs: a short sequence of named sections (see the
package docstring for what each term is measured from).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.cells import measured_reads
from bmoe.analyze.device.evidence import Evidence, token_frame, token_reads
from bmoe.analyze.device.interval import interval_z, model_error, read_distance
from bmoe.analyze.device.lanes import request_latency_ms, unpriced
from bmoe.analyze.device.levers import lever_term, split_runs
from bmoe.analyze.device.runs import ProfileRun, RunConfig, not_comparable, run_config
from bmoe.analyze.device.sections import measure, model_section
from bmoe.analyze.device.state import run_state, scaled, slowdowns
from bmoe.analyze.device.timing import predict_cell
from bmoe.errors import BmoeError
from bmoe.formats.profile import DEFAULT_COVERAGE, DeviceProfile, profile_from_dict
from bmoe.formats.route import RouteTrace

METHOD = "leave one configuration out"


def _groups(ev: Evidence) -> list[list[ProfileRun]]:
    """The runs by configuration (the grid axes, dense weights and top-k), in order."""
    groups: dict[tuple, list[ProfileRun]] = {}
    for run in ev.runs:
        groups.setdefault(ev.config_key(run), []).append(run)
    return list(groups.values())


def _why_not(run: ProfileRun, ev: Evidence, others: DeviceProfile) -> str | None:
    """Why the others' profile cannot predict `run` (None: it can)."""
    config = ev.configs[run.name]
    why = not_comparable(run, config, others, None)
    if why is None and config.overlap and not others.overlap:
        why = "an --overlap run: the others used no --overlap"
    return why or unpriced(others, config.overlap)


def held_out_record(run: ProfileRun, ev: Evidence, others: DeviceProfile) -> dict[str, Any]:
    """One held-out run predicted by the others' profile: measured and predicted tok/s, the
    relative error of the predicted decode time, and the spread the prediction stated."""
    why = _why_not(run, ev, others)
    if why is not None:
        return {"run": run.name, "why": why}
    config = ev.configs[run.name]
    tokens, _ = token_reads(run, others.read_unit_bytes, None)
    hit = run.figure("cache_hit_pct")
    cell, read_bytes = measured_reads(others, tokens, float(hit) if hit is not None else np.nan)
    figures = predict_cell(
        others,
        cell,
        config.io_threads,
        read_bytes,
        overlap=config.overlap,
        cache_mb=config.cache_mb,
    )
    wall = float(np.nansum(ev.frame(run)["wall_ms"]))
    measured = 1000.0 * len(ev.frame(run)) / wall if wall > 0 else float("nan")
    predicted = float(figures["tok_s"])
    spread = float(figures["spread_pct"]) / 100.0 / interval_z(others.coverage)
    return {
        "run": run.name,
        "measured_tok_s": measured,
        "predicted_tok_s": predicted,
        "error_pct": 100.0 * (predicted / measured - 1.0),  # the decode time's, relative
        "spread_pct": 100.0 * spread,
        "read_mib": float(figures["mib_per_token"]),
        "io_threads": int(config.io_threads),
    }


def _fold(
    ev: Evidence,
    group: list[ProfileRun],
    model: dict,
    allow_traced: bool,
    flash: pd.DataFrame | None,
) -> list[dict[str, Any]]:
    """The held-out records of one configuration's runs. Where its lane count is one the
    other runs never measured, the others' flash table takes the whole profile's row at
    those lanes (`flash`): the lane count is a lever the profile measured, and holding it
    out would measure that lever's effect instead of the error of the predictions the
    profile prices (what is left to test is the rest: compute, management, how the flash
    wait follows the reads)."""
    held = {id(r) for r in group}
    rest = [r for r in ev.runs if id(r) not in held]
    try:
        others = measure(
            ev.subset(rest), model, allow_traced=allow_traced, coverage=DEFAULT_COVERAGE
        )
    except BmoeError as exc:
        return [{"run": r.name, "why": f"the other runs make no profile ({exc})"} for r in group]
    lanes = ev.configs[group[0].name].io_threads
    row = flash[flash["lanes"] == lanes] if flash is not None and len(flash) else None
    kept = row is not None and len(row) > 0 and lanes not in set(others.flash["lanes"])
    if kept:
        others.flash = pd.concat([others.flash, row], ignore_index=True).sort_values(
            ["lanes", "req_bytes"], ignore_index=True
        )
    untraced = [r for r in group if not r.traced and r.io is None]
    records: list[dict[str, Any]] = [
        held_out_record(r, ev, others)
        if not untraced or r in untraced
        else {"run": r.name, "why": TRACED_TWIN}
        for r in group
    ]
    if kept:
        for record in records:
            record["lanes_from_profile"] = True
    return records


#: Why a traced run whose configuration was also run without traces is not scored: a
#: prediction is of runs without traces, and a trace slows the run that writes it (by a
#: third at one lane on the laptop), an error of no prediction the profile makes.
TRACED_TWIN = "a traced run: its configuration's runs without traces are scored instead"


#: The model errors (relative sd) the likelihood is searched over: 0, then 1e-4 to 4.
SD_GRID = np.concatenate([[0.0], np.geomspace(1e-4, 4.0, 4000)])


def most_likely_sd(errors: np.ndarray, spreads: np.ndarray) -> float:
    """The model error ``m`` that makes `errors` most likely when each is normal around 0 with
    variance ``spread^2 + m^2`` (searched over :data:`SD_GRID`)."""
    errors = np.asarray(errors, dtype=np.float64)
    spreads = np.asarray(spreads, dtype=np.float64)
    var = np.maximum(spreads[None, :] ** 2 + SD_GRID[:, None] ** 2, 1e-12)
    log_lik = -0.5 * (np.log(var) + errors[None, :] ** 2 / var).sum(axis=1)
    return float(SD_GRID[int(np.argmax(log_lik))])


#: The model errors at distance 0 and per unit distance searched (relative sd): 0, then
#: 1e-3 to 4.
PAIR_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 4.0, 400)])


def _best_pair(
    errors: np.ndarray,
    spreads: np.ndarray,
    distances: np.ndarray,
    zeros: np.ndarray,
    units: np.ndarray,
) -> tuple[float, float]:
    """The (zero, unit) of `zeros` x `units` whose variance makes `errors` most likely."""
    grow = units[:, None] ** 2 * distances[None, :]  # (unit, run)
    best, at = -np.inf, (0.0, 0.0)
    for zero in zeros:
        var = np.maximum(spreads[None, :] ** 2 + zero**2 + grow, 1e-12)
        log_lik = -0.5 * (np.log(var) + errors[None, :] ** 2 / var).sum(axis=1)
        i = int(np.argmax(log_lik))
        if log_lik[i] > best:
            best, at = float(log_lik[i]), (float(zero), float(units[i]))
    return at


def most_likely_by_distance(
    errors: np.ndarray, spreads: np.ndarray, distances: np.ndarray
) -> tuple[float, float]:
    """The model error at distance 0 (``z``) and per unit distance (``u``) that make `errors`
    most likely when each is normal around 0 with variance ``spread^2 + z^2 + u^2 *
    distance``: searched over :data:`PAIR_GRID` squared, then again on a grid a hundred times
    finer about the best pair."""
    e, s, d = (np.asarray(a, dtype=np.float64) for a in (errors, spreads, distances))
    zero, unit = _best_pair(e, s, d, PAIR_GRID, PAIR_GRID)
    step = float(PAIR_GRID[2] / PAIR_GRID[1])  # the coarse grid's ratio

    def around(x: float) -> np.ndarray:
        if x == 0.0:
            return np.concatenate([[0.0], np.linspace(PAIR_GRID[1] / 100, PAIR_GRID[1], 100)])
        return np.geomspace(x / step, x * step, 101)

    return _best_pair(e, s, d, around(zero), around(unit))


def _unknown(why: str, held: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "method": METHOD,
        "sd_rel": None,
        "configurations": 0,
        "rms_pct": None,
        "spread_rms_pct": None,
        "held_out": held,
        "why": why,
        "sd_rel_zero": None,
        "sd_rel_unit": None,
        "configurations_at": [],
    }


def model_error_section(
    ev: Evidence, model: dict, *, allow_traced: bool, flash: pd.DataFrame | None = None
) -> dict[str, Any]:
    """The profile's ``model_error`` section (see the module docstring): ``sd_rel`` the
    relative sd of a prediction's decode time beyond its stated spread (maximum likelihood
    over the held-out runs), ``configurations`` how many held-out configurations it comes
    from, ``sd_rel_zero`` and ``sd_rel_unit`` the model error at distance 0 and its growth
    per unit distance (see the module docstring), ``configurations_at`` the lanes and read
    volume a token of each configuration (what a prediction's distance is measured from),
    ``held_out`` each run's record with its ``distance``; unknown, with ``why``, for one
    run, one configuration, or when none could be predicted."""
    if len(ev.runs) < 2:
        return _unknown("one run: no other run to predict it from", [])
    groups = _groups(ev)
    if len(groups) < 2:
        return _unknown("every run measured one configuration: nothing held out to predict", [])
    held: list[dict[str, Any]] = []
    folds: list[list[dict[str, Any]]] = []
    for group in groups:
        records = _fold(ev, group, model, allow_traced, flash)
        folds.append([r for r in records if "error_pct" in r])
        held.extend(records)
    scored = [r for fold in folds for r in fold]
    if not scored:
        reasons = sorted({str(r["why"]) for r in held})
        return _unknown(f"no held-out run could be predicted from the others ({reasons[0]})", held)
    points = [_configuration_at(fold) for fold in folds]
    for i, fold in enumerate(folds):
        others = [p for j, p in enumerate(points) if j != i and p is not None]
        for record in fold:
            record["distance"] = read_distance(record["read_mib"], record["io_threads"], others)
    errors = np.array([r["error_pct"] for r in scored]) / 100.0
    spreads = np.array([r["spread_pct"] for r in scored]) / 100.0
    distances = np.array([r["distance"] for r in scored], dtype=np.float64)
    known = np.isfinite(distances)
    zero, unit = (
        most_likely_by_distance(errors[known], spreads[known], distances[known])
        if known.any()
        else (None, None)
    )
    return {
        "method": METHOD,
        "sd_rel": most_likely_sd(errors, spreads),
        "configurations": sum(1 for fold in folds if fold),
        "sd_rel_zero": zero,
        "sd_rel_unit": unit,
        "configurations_at": [
            {"io_threads": p[0], "read_mib": p[1]} for p in sorted(p for p in points if p)
        ],
        "rms_pct": 100.0 * math.sqrt(float(np.mean(errors**2))),
        "spread_rms_pct": 100.0 * math.sqrt(float(np.mean(spreads**2))),
        "held_out": held,
        "why": None,
    }


def _configuration_at(records: list[dict[str, Any]]) -> tuple[int, float] | None:
    """A configuration's io lanes and read MiB a token (its predicted runs' mean), None when
    none of its runs was predicted."""
    if not records:
        return None
    return int(records[0]["io_threads"]), float(np.mean([r["read_mib"] for r in records]))


def _refuse_unusable(run: ProfileRun, config: RunConfig) -> None:
    rows = run.metrics.rows
    need = [c for c in ("wall_ms", "compute_ms") if c not in rows]
    if need:
        raise BmoeError(f"{run.name}: no {need[0]} column (a profile needs per-token times)")
    if not len(rows):
        raise BmoeError(f"{run.name}: no token rows")
    if not config.streaming:
        raise BmoeError(
            f"{run.name}: a run without expert streaming (plain mmap) measures no flash reads "
            "or cache: nothing of it applies to a streaming configuration"
        )
    if "io_ms" not in rows and run.io is None:
        raise BmoeError(
            f"{run.name}: no io_ms column and no io trace: the flash wait of its tokens is "
            "unknown (a profile needs it)"
        )


def _configs(runs: Sequence[ProfileRun]) -> dict[str, RunConfig]:
    """Each run's configuration; runs that cannot be profiled, or at different top-k, are
    refused."""
    if not runs:
        raise BmoeError("no runs to build a profile from")
    configs = {r.name: run_config(r) for r in runs}
    for run in runs:
        _refuse_unusable(run, configs[run.name])
    ks = {c.n_expert_used for c in configs.values() if c.n_expert_used}
    if len(ks) > 1:
        named = ", ".join(f"{n} (top-{c.n_expert_used})" for n, c in configs.items())
        raise BmoeError(f"the runs ran at different top-k: {named}; one profile per top-k")
    return configs


def _evidence(runs: Sequence[ProfileRun], configs: dict[str, RunConfig], model: dict) -> Evidence:
    """Per run its tokens in the model's read units and its system state; a contended run's
    token times scaled to the machine uncontended (see
    :mod:`bmoe.analyze.device.state`)."""
    sized = bool(model["expert_bytes"])
    unit = float(model["read_unit_bytes"])
    n_layers = len(model["expert_bytes"]) or None
    slices = model["slices_per_expert"]
    req = float(np.median(list(model["expert_bytes"].values()))) / slices if sized else unit
    tokens = {r.name: token_frame(r, unit, n_layers) for r in runs}
    states = [run_state(r, tokens[r.name].frame, configs[r.name]) for r in runs]
    factors = slowdowns(runs, tokens, configs, states)
    for state in states:
        state["slowdown"] = factors.get(state["name"])
    tokens = {n: scaled(t, factors[n]) if n in factors else t for n, t in tokens.items()}
    ev = Evidence(list(runs), configs, tokens, states, slices, req)
    if factors:
        named = ", ".join(f"{n} {f:.2f}x" for n, f in factors.items())
        ev.caveats.append(
            f"contended runs' token times divided by their compute's slowdown ({named}): an "
            "estimate of the machine uncontended"
        )
    return ev


def _input_caveats(ev: Evidence, sized: bool) -> None:
    """What the profile does not know (expert sizes) and what it assumed of the runs."""
    if not sized:
        ev.caveats.append(
            "expert sizes unknown (no route trace, model file or preamble said): reads are "
            "priced per MiB and a route trace cannot be predicted with this profile; give "
            "--trace ROUTE_TRACE of this model (or its GGUF) to price reads"
        )
    assumed: dict[tuple[str, str], list[str]] = {}
    for name, config in ev.configs.items():
        for key, how in config.assumed.items():
            if key in ("io_threads", "threads", "prefetch", "cache_mb"):
                assumed.setdefault((key, how), []).append(name)
    for (key, how), names in assumed.items():
        ev.caveats.append(f"{key} {how} ({', '.join(names)})")


def build_profile(
    runs: Sequence[ProfileRun],
    *,
    allow_traced: bool = False,
    trace: RouteTrace | None = None,
    expert_sizes: Mapping[int, int] | None = None,
    sizes_from: str | None = None,
    coverage: float = DEFAULT_COVERAGE,
    model_meta: Mapping[str, Any] | None = None,
) -> DeviceProfile:
    """The device profile these runs measure (see the package docstring). `trace` is a route
    trace of the same model (its expert sizes); `expert_sizes` sizes read from the model
    file (`sizes_from` says which; `model_meta` its ``n_layer`` and ``n_expert``, refused
    when a run's differ); `coverage` the coverage the prediction intervals of the profile
    are to have. The profile's ``model_error`` is measured by holding out each configuration
    its runs measured (see :mod:`bmoe.analyze.device.build`)."""
    configs = _configs(runs)
    model = model_section(runs, trace, expert_sizes, sizes_from, model_meta)
    ev = _evidence(runs, configs, model)
    _input_caveats(ev, bool(model["expert_bytes"]))
    base, at_base, variants, mixed = split_runs(ev)
    if variants or mixed:
        profile = _with_lever_terms(ev, model, base, at_base, variants, mixed, allow_traced,
                                    coverage)  # fmt: skip
    else:
        profile = measure(ev, model, allow_traced=allow_traced, coverage=coverage)
        profile.model_error = model_error_section(
            ev, model, allow_traced=allow_traced, flash=profile.flash
        )
        profile.levers = {"baseline": base, "terms": []}
    if (gap := two_configuration_gap(profile)) is not None:
        profile.caveats.append(gap)
    return profile_from_dict(json.loads(json.dumps(profile.to_dict())))  # validated


#: Compute a token that differs by more than this factor between a profile's read volumes
#: is more than a one-configuration profile can carry from one to the other.
COMPUTE_GAP = 1.25


def two_configuration_gap(profile: DeviceProfile) -> str | None:
    """Why the model error of a profile of two configurations overstates what lies between
    them, where it does: each held out is predicted from the other alone, a profile of one
    read volume, which cannot have the compute per read volume the pair measures; when that
    compute differs by more than :data:`COMPUTE_GAP` between them, the held-out errors are
    mostly that gap, and every interval carries them. None otherwise."""
    error = profile.model_error or {}
    if int(error.get("configurations") or 0) != 2 or error.get("sd_rel") is None:
        return None
    by_read: Any = (profile.compute or {}).get("by_read") or []
    points = [(float(p["read_mib"]), float(p["token_ms"])) for p in by_read]
    if len(points) != 2 or min(ms for _, ms in points) <= 0:
        return None
    (mib_a, ms_a), (mib_b, ms_b) = sorted(points)
    if max(ms_a, ms_b) / min(ms_a, ms_b) <= COMPUTE_GAP or min(mib_a, mib_b) <= 0:
        return None
    between = math.sqrt(mib_a * mib_b)
    return (
        f"model error: {100 * float(error['sd_rel']):.0f} % from 2 configurations, each "
        f"predicted from the other alone, without the compute per read volume the two measure "
        f"together ({ms_a:.3g} ms a token at {mib_a:.3g} MiB read, {ms_b:.3g} ms at "
        f"{mib_b:.3g}): it is the error of crossing that gap unpriced, and every interval "
        f"carries it; a third configuration reading about {between:.3g} MiB a token would "
        "measure the error between them"
    )


def _with_lever_terms(
    ev: Evidence,
    model: dict,
    base: dict[str, str],
    at_base: list[ProfileRun],
    variants: dict[tuple[str, str], list[ProfileRun]],
    mixed: list[str],
    allow_traced: bool,
    coverage: float,
) -> DeviceProfile:
    """The profile of the baseline runs, with a term per other value of a lever measured on
    its runs (see :mod:`bmoe.analyze.device.levers`); every run listed in ``runs``. Without
    baseline runs that make a profile, the profile of every run, and a caveat that the
    levers' values were not told apart."""

    sub = ev.subset(at_base)
    sub.caveats = list(ev.caveats)
    try:
        profile = measure(sub, model, allow_traced=allow_traced, coverage=coverage)
    except BmoeError as exc:
        profile = measure(ev, model, allow_traced=allow_traced, coverage=coverage)
        profile.model_error = model_error_section(
            ev, model, allow_traced=allow_traced, flash=profile.flash
        )
        profile.levers = {"baseline": base, "terms": []}
        profile.caveats.append(
            "the runs mix "
            + ", ".join(f"{lever} {value}" for lever, value in sorted(variants))
            + f" with the baseline, whose runs alone make no profile ({exc}): every run's "
            "terms pooled, the levers' costs not told apart"
        )
        return profile
    profile.model_error = model_error_section(
        sub, model, allow_traced=allow_traced, flash=profile.flash
    )
    terms, notes = [], []
    for (lever, value), runs in sorted(variants.items()):
        records = [held_out_record(r, ev, profile) for r in runs]
        for record in records:
            if "error_pct" in record:
                error = model_error(profile, record["read_mib"], record["io_threads"])
                record["model_sd"] = error.sd_rel or 0.0
        term = lever_term(records, lever, value)
        names = ", ".join(Path(r.name).name for r in runs)
        if term is None:
            why = "; ".join(sorted({str(r.get("why")) for r in records}))
            notes.append(f"{lever} {value} ({names}): no term, its runs cannot be priced ({why})")
            continue
        terms.append(term)
        notes.append(
            f"{lever} {value}: x{term['factor']:.3g} the decode time the baseline prices from "
            f"its own reads (+-{100 * term['sd_rel']:.0f} %; {names})"
        )
    if mixed:
        notes.append(f"runs that differ from the baseline in two levers, used by no term: "
                     f"{', '.join(Path(n).name for n in mixed)}")  # fmt: skip
    profile.caveats.append(
        "levers: the terms come from the runs at "
        + ", ".join(f"{lever} {value}" for lever, value in base.items())
        + "; " + "; ".join(notes)
    )  # fmt: skip
    terms_of = {r: f"{t['lever']} {t['value']}" for t in terms for r in t["runs"]}
    profile.runs = [{**state, "lever_term": terms_of.get(state["name"])} for state in ev.states]
    profile.sources = [r.name for r in ev.runs]
    profile.levers = {"baseline": base, "terms": terms}
    return profile


def with_probe(profile: DeviceProfile, flash: pd.DataFrame, where: str) -> DeviceProfile:
    """`profile` with its flash latencies replaced by a probe's (`where` it was measured);
    the per-batch overhead the runs measured (the engine's, not the device's) is kept, per
    lane count as the prediction interpolates it; the runs' per-volume flash excess, measured
    against the runs' table, is dropped."""
    table = flash.copy()
    req = float(table["req_bytes"].median())
    table["batch_overhead_ms"] = [
        request_latency_ms(profile.flash, req, int(lanes))[1] for lanes in table["lanes"]
    ]
    table["source"] = "probe"
    data = profile.to_dict()
    data["flash"] = table.to_dict(orient="records")
    data["flash_by_read"] = []  # measured against the runs' table, not the probe's
    data["caveats"] = [*profile.caveats, f"flash latency measured by probe on {where}"]
    if "flash" in data.get("terms", {}):
        data["terms"]["flash"]["note"] = f"probe on {where}"
    return profile_from_dict(data)


__all__ = [
    "METHOD",
    "PAIR_GRID",
    "SD_GRID",
    "TRACED_TWIN",
    "build_profile",
    "held_out_record",
    "model_error_section",
    "most_likely_by_distance",
    "most_likely_sd",
    "with_probe",
]
