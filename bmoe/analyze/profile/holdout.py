"""The model's own error: each configuration the profile's runs measured is held out in turn,
the others make a profile (the same sections, the same read units), and that profile predicts
each held-out run from the reads it recorded itself, with its own configuration. A held-out
run's relative error ``e`` of decode time is taken as normal around 0 with the variance its
prediction's spread states (``s^2``) plus the model's own (``m^2``): ``m`` is the maximum
likelihood estimate over the held-out runs (a grid search; 0 when the spreads explain the
errors). Weighing each error by its own spread matters: one held-out prediction with a wide
spread must not hide another's large error made with a narrow one. The number of
configurations held out is how well ``m`` is known (see :mod:`bmoe.analyze.predict.interval`).
The held-out configurations whose read volume a token lies inside the range the others'
compute points span give ``m`` again on their own (``sd_rel_inside``): a configuration at an
end of the range is predicted by extrapolation, the configurations a profile is asked about
mostly by interpolation.

Whole configurations are held out, not single runs, because a prediction is asked of
configurations never run: a repeat of a configuration the profile already measured would be
easier to predict than the configurations the profile is used for.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bmoe.analyze.predict import interval_z, measured_reads, predict_cell, read_range, unpriced
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
        config = ev.configs[run.name]
        key = (
            tuple(config.axes().items()),
            config.n_expert_used,
            run.metrics.params.get("dense_weights"),
        )
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def _why_not(run: ProfileRun, ev: Evidence, others: DeviceProfile) -> str | None:
    """Why the others' profile cannot predict `run` (None: it can)."""
    config = ev.configs[run.name]
    why = not_comparable(run, config, others, None)
    if why is None and config.overlap and not others.overlap:
        why = "an --overlap run: the others used no --overlap"
    return why or unpriced(others, config.overlap)


def _held_out(run: ProfileRun, ev: Evidence, others: DeviceProfile) -> dict[str, Any]:
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
    mib = float(figures["mib_per_token"])
    span = read_range(others)
    return {
        "run": run.name,
        "measured_tok_s": measured,
        "predicted_tok_s": predicted,
        "error_pct": 100.0 * (predicted / measured - 1.0),  # the decode time's, relative
        "spread_pct": 100.0 * spread,
        "read_mib": mib,
        "inside": bool(span is not None and span[0] <= mib <= span[1]),
    }


def _fold(
    ev: Evidence, group: list[ProfileRun], model: dict, allow_traced: bool
) -> list[dict[str, Any]]:
    """The held-out records of one configuration's runs."""
    held = {id(r) for r in group}
    rest = [r for r in ev.runs if id(r) not in held]
    try:
        others = measure(
            ev.subset(rest), model, allow_traced=allow_traced, coverage=DEFAULT_COVERAGE
        )
    except BmoeError as exc:
        return [{"run": r.name, "why": f"the other runs make no profile ({exc})"} for r in group]
    return [_held_out(r, ev, others) for r in group]


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


def _unknown(why: str, held: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "method": METHOD,
        "sd_rel": None,
        "configurations": 0,
        "rms_pct": None,
        "spread_rms_pct": None,
        "held_out": held,
        "why": why,
        "sd_rel_inside": None,
        "configurations_inside": 0,
    }


def model_error_section(ev: Evidence, model: dict, *, allow_traced: bool) -> dict[str, Any]:
    """The profile's ``model_error`` section (see the module docstring): ``sd_rel`` the
    relative sd of a prediction's decode time beyond its stated spread (the held-out runs'
    mean square error less their mean square spread, never below 0), ``configurations`` how
    many held-out configurations it comes from, the same inside the others' read range
    (``sd_rel_inside``, ``configurations_inside``), ``held_out`` each run's record; unknown,
    with ``why``, for one run, one configuration, or when none could be predicted."""
    if len(ev.runs) < 2:
        return _unknown("one run: no other run to predict it from", [])
    groups = _groups(ev)
    if len(groups) < 2:
        return _unknown("every run measured one configuration: nothing held out to predict", [])
    held: list[dict[str, Any]] = []
    k = k_inside = 0
    for group in groups:
        records = _fold(ev, group, model, allow_traced)
        k += any("error_pct" in r for r in records)
        k_inside += any(r.get("inside") for r in records)
        held.extend(records)
    scored = [r for r in held if "error_pct" in r]
    if not scored:
        reasons = sorted({str(r["why"]) for r in held})
        return _unknown(f"no held-out run could be predicted from the others ({reasons[0]})", held)
    errors = np.array([r["error_pct"] for r in scored]) / 100.0
    spreads = np.array([r["spread_pct"] for r in scored]) / 100.0
    mean_square = float(np.mean(errors**2))
    spread_square = float(np.mean(spreads**2))
    inside = np.array([bool(r.get("inside")) for r in scored])
    return {
        "method": METHOD,
        "sd_rel": most_likely_sd(errors, spreads),
        "configurations": k,
        "sd_rel_inside": most_likely_sd(errors[inside], spreads[inside]) if k_inside else None,
        "configurations_inside": k_inside,
        "rms_pct": 100.0 * math.sqrt(mean_square),
        "spread_rms_pct": 100.0 * math.sqrt(spread_square),
        "held_out": held,
        "why": None,
    }


__all__ = ["METHOD", "SD_GRID", "model_error_section", "most_likely_sd"]
