"""Build the device profile from the runs: a short sequence of named sections (see the
package docstring for what each term is measured from)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import request_latency_ms
from bmoe.analyze.profile.contention import scaled, slowdowns
from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.holdout import held_out_record, model_error_section
from bmoe.analyze.profile.levers import lever_term, split_runs
from bmoe.analyze.profile.model import model_section
from bmoe.analyze.profile.runs import ProfileRun, RunConfig, run_config
from bmoe.analyze.profile.sections import measure
from bmoe.analyze.profile.state import run_state
from bmoe.analyze.profile.tokens import token_frame
from bmoe.errors import BmoeError
from bmoe.formats.profile import DEFAULT_COVERAGE, DeviceProfile, profile_from_dict
from bmoe.formats.route import RouteTrace


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
    :mod:`bmoe.analyze.profile.contention`)."""
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
    its runs measured (see :mod:`bmoe.analyze.profile.holdout`)."""
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
    return profile_from_dict(json.loads(json.dumps(profile.to_dict())))  # validated


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
    its runs (see :mod:`bmoe.analyze.profile.levers`); every run listed in ``runs``. Without
    baseline runs that make a profile, the profile of every run, and a caveat that the
    levers' values were not told apart."""
    from bmoe.analyze.predict import model_error

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


__all__ = ["build_profile", "with_probe"]
