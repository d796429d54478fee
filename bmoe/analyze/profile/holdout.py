"""The model's own error: each configuration the profile's runs measured is held out in turn,
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
:mod:`bmoe.analyze.predict.interval`).

Whole configurations are held out, not single runs, because a prediction is asked of
configurations never run: a repeat of a configuration the profile already measured would be
easier to predict than the configurations the profile is used for.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import (
    interval_z,
    measured_reads,
    predict_cell,
    read_distance,
    unpriced,
)
from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.matching import not_comparable
from bmoe.analyze.profile.runs import ProfileRun
from bmoe.analyze.profile.sections import measure
from bmoe.analyze.profile.tokens import token_reads
from bmoe.errors import BmoeError
from bmoe.formats.profile import DEFAULT_COVERAGE, DeviceProfile

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


__all__ = [
    "METHOD",
    "PAIR_GRID",
    "SD_GRID",
    "TRACED_TWIN",
    "held_out_record",
    "model_error_section",
    "most_likely_by_distance",
    "most_likely_sd",
]
