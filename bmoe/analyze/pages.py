"""What each page of the HTML report shows, computed: a run, a route trace with its cache
replay, a compute or io trace, a sweep, a history of sweeps. Each function runs the analyses
a page needs and returns their results by name (the views by their slugs in
:mod:`bmoe.analyze.views`, and the data of the page's plots); :mod:`bmoe.render.pages` lays
them out and :class:`bmoe.render.report.Report` writes the document. Nothing here reads a
file beyond what its arguments' own readers do, or writes one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

#: Decode steps the lane timeline shows (its bars are drawn one read at a time).
TIMELINE_STEPS = 2
#: Steps the routing matrix shows.
MATRIX_MAX_STEPS = 512


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def budget_of(run) -> float | None:
    """The cache budget (MiB) a run ran with: its summary's, else its preamble's."""
    if run is None:
        return None
    for key in ("cache_budget_MiB", "cache_mb"):
        value = run.summary.get(key)
        if _is_number(value) and value >= 0:
            return float(value)
    value = run.params.get("cache_mb")
    return float(value) if _is_number(value) and value >= 0 else None


# ----------------------------------------------------------------------------- run


def run_page(
    run,
    pressure: Mapping[str, Any] | None = None,
    *,
    trace_paths: Sequence[str] = (),
    record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's summary figures, stall attribution, the concerns a comparison would raise,
    its parameters (the archive's `record` over the file's), its summary tables and the
    memory picture beside the attribution's tokens."""
    from bmoe.analyze.compare import run_concerns
    from bmoe.analyze.metrics import run_summary, summarize_runs, summary_tables
    from bmoe.analyze.stall import memory_picture, stall_attribution
    from bmoe.formats.runfiles import RunFiles

    att = stall_attribution(run)
    params = {**dict(run.params), **(dict(record.get("params", {})) if record else {})}
    files = RunFiles(run, dict(pressure) if pressure else None, list(trace_paths))
    return {
        "summary": run_summary(run, pressure),
        "attribution": att,
        "concerns": run_concerns(files),
        "parameters": params,
        "tables": summary_tables(summarize_runs([run], [pressure])),
        "memory": memory_picture(run) if len(att.tokens) else None,
    }


# ----------------------------------------------------------------------------- route


def route_page(trace, *, budget_mib: float | None = None) -> dict[str, Any]:
    """A route trace's decode steps (all of them when it has none): its caveats, shape,
    every default view, the routing matrix (and the hits matrix when it recorded
    residency), the routing grid, reuse distances and working-set growth."""
    from bmoe.analyze import route

    selected, phase = route.select(trace, "decode"), "decode"
    if not len(selected.rows):
        selected, phase = route.select(trace, "all"), "all"
    meta = trace.meta
    steps = route.count_steps(selected)
    page: dict[str, Any] = {
        "phase": phase,
        "caveats": route.caveats(trace, selected, phase),
        "shape": {"model": meta.get("model"), "arch": meta.get("arch"),
                  "n_layer": meta.get("n_layer"), "n_expert": meta.get("n_expert"),
                  "n_expert_used": meta.get("n_expert_used"), "phase": phase,
                  "rows": len(selected.rows), "steps": steps},
        "steps": steps,
    }  # fmt: skip
    if not len(selected.rows):
        return page
    limit = min(steps, MATRIX_MAX_STEPS)
    residency = "residency" in selected.rows
    grid_value = "residency" if residency else "expert"
    page.update(
        views=route.route_views(selected, route.DEFAULT_VIEWS),
        matrix_steps=limit,
        matrix=route.matrix(selected, "experts", limit),
        hits=route.matrix(selected, "hit", limit) if residency else None,
        grid_value=grid_value,
        grid=route.routing_grid(selected, grid_value),
        reuse=route.reuse_distances(selected),
        workset=route.workset_curve(selected),
    )
    return page


def replay_page(trace, *, budget_mib: float | None = None, run=None) -> dict[str, Any] | None:
    """The cache replay of a route trace over budgets that span its model, with the exact
    LRU miss-ratio curve and, at the run's budget, the recorded hit rate against both (None
    when the trace's preamble has no expert sizes)."""
    from bmoe.analyze import replay as rp

    budgets = rp.budgets_for(trace, [budget_mib] if budget_mib is not None else [])
    if not budgets:
        return None
    summary = run.summary if run is not None else None
    views = rp.replay(trace, budgets, rp.REFERENCE_POLICIES, mrc=True,
                      validate_mib=budget_mib, metrics_summary=summary)  # fmt: skip
    return {"views": views, "decode_curve": rp.decode_pivot(views["curve"])}


# ----------------------------------------------------------------------------- decode


def compute_page(trace, *, run=None) -> dict[str, Any]:
    """Every compute view (time by op class per layer too), joined with the run's metrics."""
    from bmoe.analyze import op_traces as dec

    return {"views": dec.analyze_compute(trace, metrics=run, class_by_layer=True)}


def io_page(trace, *, run=None) -> dict[str, Any]:
    """Every io view (adjacency per layer too) joined with the run's metrics, the read
    latency's distribution per lane and the lane timeline of the first decode steps."""
    from bmoe.analyze import op_traces as dec
    from bmoe.analyze.timeline import build_timeline

    page: dict[str, Any] = {"views": dec.analyze_io(trace, adjacent=True, metrics=run)}
    if not len(trace.rows):
        return page
    page["latency_cdf"] = dec.io_latency_cdf(trace)
    decode = dec.decode_rows(trace.rows)
    if len(decode):
        first = int(decode["step"].min())
        window = (first, first + TIMELINE_STEPS - 1)
        page["window"] = window
        page["timeline"] = build_timeline(None, trace, decode_only=True, steps=window)
    return page


# ----------------------------------------------------------------------------- sweeps


def sweep_page(
    results: pd.DataFrame,
    outcome: str = "tok_s_mean",
    *,
    runs: Mapping[str, Any] | None = None,
    traced: Sequence[str] = (),
    predictions: pd.DataFrame | None = None,
    replayed: Iterable[tuple[str, Any, Any]] | None = None,
    axes: Sequence[str] | None = None,
    source: object = None,
) -> dict[str, Any]:
    """Every view of a sweep's page by its slug (:data:`bmoe.analyze.views.SWEEP`), from its
    results table: those of :func:`bmoe.analyze.sweep.analyze_sweep` (the neighbours with
    their intervals), stall attribution per cell from the metrics `runs` (run -> metrics),
    predicted against measured (from `predictions`), speed against fidelity and, for each of
    `replayed` (run, route trace, metrics or None; read one at a time when it is a
    generator), its recorded hit rate against its replay. ``verdict`` is
    the :class:`bmoe.analyze.verdict.Verdict` itself; ``ok`` the completed attempts;
    ``plot_axes`` the axes the outcome's plot answers with (of `axes`, when given). An
    unknown `outcome` is refused naming `source` (the sweep's folder)."""
    from bmoe.analyze import sweep as sw
    from bmoe.analyze.fidelity import speed_fidelity
    from bmoe.analyze.stall import stall_by_run

    sw.check_outcome(results, outcome, source)
    # The verdict from the results alone (off-CPU estimated from their per-run figures), as
    # the terminal and summary.md give it, so the three never disagree.
    views = sw.analyze_sweep(results, outcome, traced=traced)
    verdict = sw.sweep_verdict(results, outcome, traced=traced,
                               contamination_flags=views["contamination"])  # fmt: skip
    views.update(verdict=verdict, ok=sw.ok_attempts(results), stability=verdict.stability,
                 plot_axes=sw.main_axes(results, axes))  # fmt: skip
    if len(verdict.neighbours):
        views["neighbours"] = verdict.neighbours
    if runs:
        views["stall_by_cell"] = sw.per_cell(results, stall_by_run(runs))
    if predictions is not None:
        views["predicted"] = sw.predicted_vs_measured(results, predictions)
    fidelity = speed_fidelity(results, outcome)
    if len(fidelity):
        views["fidelity"] = fidelity
    if replayed is not None:
        views["recorded_vs_replay"] = replay_checks(replayed)
    return views


def replay_checks(replayed: Iterable[tuple[str, Any, Any]]) -> pd.DataFrame:
    """Per run (name, route trace, metrics or None) with a known budget: its own routing
    replayed through the LRU cache at that budget and the exact LRU curve there, next to the
    hit rate it recorded."""
    from bmoe.analyze.replay import recorded_vs_replay

    rows = []
    for name, trace, metrics in replayed:
        budget = budget_of(metrics)
        if budget is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            figures = recorded_vs_replay(trace, budget, metrics.summary if metrics else None)
        rows.append({"run": name, **figures})
    return pd.DataFrame(rows)


def history_page(
    sweeps: Mapping[str, pd.DataFrame], outcome: str = "tok_s_mean", threshold_pct: float = 5.0
):
    """The history of `sweeps` (label -> results table) an index page shows: a
    :class:`bmoe.analyze.history.History`, whose ``views()`` are keyed by the slugs of
    :data:`bmoe.analyze.views.HISTORY`."""
    from bmoe.analyze import history as hist

    return hist.history_of(sweeps, outcome, threshold_pct)


__all__ = [
    "budget_of",
    "compute_page",
    "history_page",
    "io_page",
    "replay_checks",
    "replay_page",
    "route_page",
    "run_page",
    "sweep_page",
]
