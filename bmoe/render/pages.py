"""The pages of the offline HTML report, laid out: a run, a trace, a sweep, a history of
sweeps. Each section function takes what :mod:`bmoe.analyze.pages` computed and places it on
a :class:`bmoe.render.report.Report`: headings, the views under their catalogued titles
(:mod:`bmoe.analyze.views`; a sweep's sections in the order its catalogue lists them), their
notes and the plots. Each section is one function, so a notebook can assemble its own page
with the same pieces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze import pages
from bmoe.analyze.views import HISTORY, METRICS, REPLAY, ROUTE, ROUTE_TRACE, RUN, STALL, SWEEP
from bmoe.render.report import Report

#: Trace kinds whose recording slows a run (its timings are instrumented).
TRACE_KINDS = ("route", "compute", "compute_layers", "io")


def _view(group, slug: str) -> str:
    """The ``data-view`` of a view on a page: its group and slug (``replay mrc_budgets``),
    a slug the catalogue lists."""
    return f"{group.name} {group[slug].slug}"


# ----------------------------------------------------------------------------- run


def run_headline(
    summary: Mapping[str, Any], attribution: pd.DataFrame, params: Mapping[str, Any]
) -> str:
    """A run's answer in a sentence: its decode rate (the steady state's where it has one),
    the time to its first token, what the cache did, and where a token's wall time went."""

    def num(key: str) -> float | None:
        value = summary.get(key)
        try:
            v = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return v if np.isfinite(v) else None

    parts = []
    rate, median = num("tok_s_mean"), num("tok_s_median")
    if rate is not None:
        text = f"{int(num('tokens') or 0)} tokens at {rate:.2f} tok/s"
        steady = num("steady_tok_s_mean")
        text += f" ({steady:.2f} in the steady state)" if steady is not None else (
            f" (median {median:.2f})" if median is not None else ""
        )  # fmt: skip
        parts.append(text)
    if num("ttft_s") is not None:
        parts.append(f"first token after {num('ttft_s'):.2f} s")
    hit, read = num("cache_hit_pct"), num("read_mib_per_token")
    if hit is not None:
        budget = params.get("cache_mb")
        at = f" at {budget} MiB" if budget not in (None, "") else ""
        parts.append(f"cache hit {hit:.1f} %{at}" + (
            f", {read:.3g} MiB read a token" if read is not None else ""
        ))  # fmt: skip
    if len(attribution) and "pct_of_wall" in attribution:
        inside = attribution[attribution["in_wall"].astype(object).eq(True)]
        shares = ", ".join(
            f"{row.component} {float(row.pct_of_wall):.0f} %"
            for row in inside.itertuples()
            if pd.notna(row.pct_of_wall) and float(row.pct_of_wall) >= 0.5
        )
        if shares:
            parts.append(f"a token's wall time: {shares}")
    return "; ".join(parts) + "." if parts else "no decoded tokens to measure"


def run_sections(
    report: Report,
    run,
    pressure: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    traces: Mapping[str, Any] | None = None,
    output=None,
    record: Mapping[str, Any] | None = None,
    lead: bool = False,
) -> None:
    """A run: its answer (:func:`run_headline`) and caveats (before the page's contents with
    `lead`), parameters, summary tables, stall attribution (table and plot), the end-of-run
    lines, then a section per trace recorded with it."""
    from bmoe.analyze.compare import REFUSE
    from bmoe.render.plots.runs import stall_figure
    from bmoe.render.runs import DIGITS

    traces = dict(traces or {})
    name = name or (Path(run.path).name if run.path else "run")
    trace_paths = [str(getattr(t, "path", None) or kind) for kind, t in traces.items()]
    page = pages.run_page(run, pressure, trace_paths=trace_paths, record=record)
    att = page["attribution"]
    report.heading(f"Run {name}")
    report.text(run_headline(page["summary"], att.summary, run.params), cls="verdict")
    lines = [
        f"{reason} (a comparison of runs refuses this one)" if level == REFUSE else reason
        for level, reason in page["concerns"]
    ]
    lines += [f"stall attribution: {note}" for note in att.notes]
    lines += [f"reading: {w}" for w in run.warnings]
    if output is not None and getattr(output, "failure", None):
        lines.append(f"the engine said: {output.failure}")
    report.caveats(lines)
    if lead:
        report.end_lead()

    if page["parameters"]:
        report.figures(page["parameters"], RUN.title("parameters"), view=_view(RUN, "parameters"))
    summary_titles = METRICS.titles()
    for slug, view in page["tables"].items():
        figures = view.drop(columns="run").iloc[0].to_dict()
        title = f"summary: {summary_titles.get(slug, slug)}"
        report.figures(figures, title, DIGITS, view=f"summary {slug}")

    report.heading("stall attribution", 3)
    report.figures(att.figures(), None, view=_view(STALL, "run"))
    report.table(
        att.summary, None, DIGITS, view=_view(STALL, "attribution"),
        notes=["flash wait, cache mgmt, compute and unattributed add up to the wall (waits "
               "first, then compute up to what they left); compute is cpu_ms / threads unless "
               "said otherwise; overlapped is busy time that ran alongside the waits, not "
               "wall time."],
    )  # fmt: skip
    if len(att.tokens):
        report.figure(
            stall_figure(att.tokens, page["memory"], title=f"{name}: stall attribution",
                         compute_label=att.compute_source),  # the parts stack to the wall
            "where each token's time went (and the memory picture, when recorded)",
        )  # fmt: skip
    if output is not None and getattr(output, "figures", None):
        report.figures(output.figures, RUN.title("end_of_run"), view=_view(RUN, "end_of_run"))
    if "route" in traces:
        route_sections(report, traces["route"], budget_mib=pages.budget_of(run), run=run, level=2)
    if "compute" in traces:
        compute_sections(report, traces["compute"], run=run)
    if "compute_layers" in traces:
        compute_sections(report, traces["compute_layers"], run=run)
    if "io" in traces:
        io_sections(report, traces["io"], run=run)


# ----------------------------------------------------------------------------- route


def route_sections(
    report: Report,
    trace,
    *,
    budget_mib: float | None = None,
    run=None,
    level: int = 2,
    replay: bool = True,
) -> None:
    """A route trace: its shape, caveats, every default view (decode phase), the routing
    matrix, the heatmap, reuse and working-set plots, and the cache replay with the exact LRU
    miss-ratio curve against the hit rate the run recorded."""
    from bmoe.render import route as text
    from bmoe.render.plots import route as plots

    name = Path(trace.path).name if trace.path else "route trace"
    report.heading(f"Routing: {name}", level)
    page = pages.route_page(trace, budget_mib=budget_mib)
    phase = page["phase"]
    report.caveats(page["caveats"])
    report.figures(page["shape"], None, view=_view(ROUTE_TRACE, "shape"))
    if "views" not in page:
        return
    views = page["views"]
    n_steps = page["steps"]
    notes = text.view_notes(views, k=trace.n_expert_used, prefill=phase == "all",
                            total_steps=n_steps)  # fmt: skip
    for slug, frame in views.items():
        report.table(
            frame, text.TITLES.get(slug, slug), text.DIGITS,
            notes=notes.get(slug, ()), view=_view(ROUTE, slug),
        )  # fmt: skip

    hits = page["hits"]
    limit = page["matrix_steps"]
    matrix_notes = [
        "each cell: the experts routed at that step and layer in slot order; '*' = the layer "
        "also routed it on the previous row"
        + ("; green = hit, red = miss, blue = prefetch hit" if hits is not None else "")
    ]
    if n_steps > limit:
        matrix_notes.append(f"showing the first {limit} of {n_steps} steps")
    report.matrix(page["matrix"], hits, ROUTE_TRACE.title("matrix", phase=phase), matrix_notes)

    grid_value = page["grid_value"]
    if len(page["grid"]):
        report.figure(plots.routing_heatmap(page["grid"], grid_value),
                      f"routing heatmap ({grid_value})")  # fmt: skip
    if len(page["reuse"]):
        report.figure(plots.reuse_distance_plot(page["reuse"]),
                      "reuse distance per layer, in steps")  # fmt: skip
    if len(page["workset"]):
        report.figure(
            plots.workset_growth_plot(page["workset"], budget_mib),
            "working-set growth: distinct experts' MiB as the steps go on"
            + (f" (the run's budget: {budget_mib:g} MiB)" if budget_mib is not None else ""),
        )
    if replay:
        replay_sections(report, trace, budget_mib=budget_mib, run=run)


def replay_sections(report: Report, trace, *, budget_mib: float | None = None, run=None) -> None:
    """The cache replay of a route trace over budgets that span its model, the exact LRU
    miss-ratio curve, and the recorded hit rate against both."""
    from bmoe.render import replay as text
    from bmoe.render.plots import replay as plots

    report.heading("cache replay", 3)
    page = pages.replay_page(trace, budget_mib=budget_mib, run=run)
    if page is None:
        report.text("no expert sizes in the trace's preamble: nothing to replay")
        return
    views = page["views"]
    shape = views["shape"]
    said = []
    if shape.get("recorded_with_dropping"):
        said.append(
            "recorded with expert dropping on: the replay looks up every expert the router "
            "asked for, dropped ones included"
        )
    if said:
        report.caveats(said, "Replay caveats")
    report.figures(shape, None, text.DIGITS, view=_view(REPLAY, "shape"))
    report.table(
        page["decode_curve"], None, text.DIGITS, view=_view(REPLAY, "curve"),
        notes=["decode-only hit % per budget (MiB) and policy",
               *text.budget_notes(views["curve"], shape.get("t_mib"))],
    )  # fmt: skip
    if "validation" in views:
        report.table(views["validation"], None, text.DIGITS, view=_view(REPLAY, "validation"),
                     notes=[f"the LRU replay at the run's budget ({budget_mib:g} MiB) against "
                            "what the run recorded"])  # fmt: skip
    report.table(views["mrc_budgets"], None, text.DIGITS, view=_view(REPLAY, "mrc_budgets"))
    recorded = None
    hit = shape.get("recorded_hit_pct_decode")
    if budget_mib is not None and hit is not None and hit == hit:
        recorded = (budget_mib, float(hit))
    t_mib = shape.get("t_mib")
    report.figure(
        plots.replay_curve_plot(views["curve"], t_mib=t_mib, recorded=recorded, mrc=views["mrc"]),
        "hit rate by budget and policy (the star: what the run recorded)",
    )
    report.figure(
        plots.mrc_plot(views["mrc"], t_mib=t_mib, recorded=recorded),
        "exact LRU miss-ratio curve against the recorded hit rate",
    )


# ----------------------------------------------------------------------------- decode


def compute_sections(report: Report, trace, *, run=None, level: int = 2) -> None:
    """A compute trace: summary, by op, faults, by layer, by op class (or the segments of a
    layer-granular trace), the per-token join with the run's metrics, and the class plot."""
    from bmoe.render.op_traces import COMPUTE_NOTE, DIGITS, STREAM_NOTE
    from bmoe.render.plots import op_traces as plots

    name = Path(trace.path).name if trace.path else "compute trace"
    report.heading(f"Compute: {name}", level)
    views = pages.compute_page(trace, run=run)["views"]
    granularity = views["summary"]["granularity"]
    notes = [COMPUTE_NOTE[granularity]]
    if granularity == "node":
        notes.append(STREAM_NOTE)
    report.caveats(notes, "Read these figures knowing")
    _views(report, views, DIGITS, "compute", skip=("per_token",))
    if granularity == "layer":
        report.figure(plots.segments_bar(views["segments"]), "time per segment")
    elif len(views.get("class_by_layer", ())):
        report.figure(plots.class_by_layer(views["class_by_layer"]), "time by op class per layer")


def io_sections(report: Report, trace, *, run=None, level: int = 2) -> None:
    """An io trace: summary, latency, sizes, lanes, speculative reads, adjacency (per layer
    too), the per-token join, the latency CDF and the lane timeline of the first decodes."""
    from bmoe.render.op_traces import DIGITS, IO_NOTE
    from bmoe.render.plots import op_traces as plots

    name = Path(trace.path).name if trace.path else "io trace"
    report.heading(f"Flash reads: {name}", level)
    page = pages.io_page(trace, run=run)
    views = page["views"]
    notes = [IO_NOTE]
    _views(report, views, DIGITS, "io", skip=("per_token",))
    if "latency_cdf" not in page:
        report.caveats(["the io trace has no reads"])
        return
    report.figure(
        plots.latency_cdf(page["latency_cdf"], views["latency_us"]),
        "read latency CDF per lane (p50/p90/p99 of all reads marked)",
    )
    if "timeline" in page:
        window, timeline = page["window"], page["timeline"]
        notes += timeline.notes
        if timeline.reconstructed:
            notes.append("the timeline is reconstructed (no start_ns): each lane's reads are "
                         "laid end to end within their step")  # fmt: skip
        report.figure(
            plots.lane_timeline(timeline, f"Flash reads by lane, steps {window[0]}-{window[1]}"),
            f"reads by lane over decode steps {window[0]}-{window[1]}",
        )
    report.caveats(notes, "Read these figures knowing")


def _views(
    report: Report, views: Mapping[str, Any], digits: Mapping[str, int], prefix: str,
    skip: Sequence[str] = (),
) -> None:  # fmt: skip
    from bmoe.analyze.views import GROUPS

    titles = GROUPS[prefix].titles()
    for view_name, result in views.items():
        if view_name in skip:
            continue
        title = titles.get(view_name, view_name).replace("_", " ")
        if isinstance(result, pd.DataFrame):
            if len(result.columns):
                report.table(result, title, digits, view=f"{prefix} {view_name}")
        elif isinstance(result, Mapping):
            report.heading(title, 3)
            report.figures(result, None, digits, view=f"{prefix} {view_name}")


# ----------------------------------------------------------------------------- sweep

#: Why the page shows two order checks.
ORDER_CHECKS = (
    "Two checks look at the execution order. 'Repeats against execution order' compares each "
    "cell's repeats with each other (the rank correlation of each repeat's ratio to its cell's "
    "mean with its position): it needs repeats and assumes nothing about the configuration. "
    "The contamination tell 'execution_order' looks across cells, fitting the configuration's "
    "main effects and testing the position on top: it works with one run per cell but trusts "
    "that additive model. Either firing means the machine changed while the sweep ran."
)

#: What a reader of a sweep's view needs told under its table (by slug).
SWEEP_NOTES: Mapping[str, Sequence[str]] = {
    "neighbours": [
        "ratio of the two means with its 95 % interval (Welch, log scale); 'not "
        "distinguishable' when the interval includes 1; no bounds, and 'too few repeats' below "
        "three runs a cell or 'not measurable' where the interval is wider than the ratio"
    ],
    "stability": [
        "ci_pct: half-width of the 95 % interval of the mean, % of the mean; drift_pct: "
        "reversed rounds against forward ones; off_cpu_pct: share of a token's wall time "
        "neither compute nor a measured wait; cpu_pct: the engine's CPU time over its wall time "
        "(100 = one core)"
    ],
    "stall_by_cell": [
        "ms per token and % of the wall, mean over each cell's completed repeats; compute, "
        "flash wait, cache mgmt and unattributed add up to the wall; overlapped is time the "
        "proxies counted that ran alongside the waits (not wall time)"
    ],
    "recorded_vs_replay": [
        "each run's own routing replayed through the LRU cache at its budget, and the exact "
        "LRU curve there, next to what the run recorded"
    ],
}


def _sweep_digits(slug: str, view: Any) -> Mapping[str, int] | None:
    """The precision a sweep view's columns are printed with: the run figures' (by column
    name) unless the view prints its own columns otherwise."""
    from bmoe.render.runs import DIGITS

    if slug == "neighbours":
        return {"ratio": 3, "ratio_low": 3, "ratio_high": 3}
    if slug == "stability":
        return {c: 1 for c in ("ci_pct", "cv_pct", "drift_pct", "off_cpu_pct", "cpu_pct")}
    if slug == "stall_by_cell":
        return {c: 1 for c in view.columns if c.endswith(("_ms", "_pct"))}
    if slug == "recorded_vs_replay":
        return {c: 2 for c in view.columns if c.endswith(("_pct_decode", "_pct_cum",
                                                           "cache_hit_pct"))}  # fmt: skip
    return DIGITS  # the figures' own precision (render.runs), by column name


def sweep_sections(report: Report, archive, *, outcome: str = "tok_s_mean") -> None:
    """An archived sweep, its answer first: the verdict and its caveats (then the contents),
    then a section per heading of the sweep's catalogue (:data:`bmoe.analyze.views.SWEEP`)
    in its order, each view under its title with its notes and plot: the ranking and the
    outcome over the axes with its spread across repeats, the neighbours compared, stability
    per cell, the axis table, stall attribution per cell, predicted against measured, speed
    against fidelity, both order checks, the recorded hit rates against their replay, and
    last what ran (settings, attempts, shared parameters, the resolved configuration)."""
    from bmoe.analyze.sweep import check_outcome
    from bmoe.formats.archive import read_predictions

    results = archive.cells
    check_outcome(results, outcome, archive.root)
    traced = [r.run for r in archive.runs() if any(r.has(k) for k in TRACE_KINDS)]
    route_runs = archive.with_file("route")
    replayed = (
        (r.run, r.trace("route"), r.metrics if r.has("metrics") else None) for r in route_runs
    )  # each trace read when its turn comes
    page = pages.sweep_page(
        results, outcome, runs=archive.metrics_runs() or None, traced=traced,
        predictions=read_predictions(archive.root),
        replayed=replayed if route_runs else None, axes=archive.axes, source=archive.root,
    )  # fmt: skip
    titles = SWEEP.titles(outcome=outcome)
    for section, views in SWEEP.sections().items():
        if section == "Verdict":  # the answer first; the contents after it
            report.heading(section)
            report.text(page["verdict"].sentence, cls="verdict")
            report.caveats(page["verdict"].caveats)
            report.end_lead()
            continue
        if section == "What ran":
            _what_ran(report, archive, page)
            continue
        shown = [v.slug for v in views if v.slug in page]
        if not shown:
            continue
        report.heading(section)
        if section == "Ranking" and page["ok"].empty:
            report.text("no completed run: nothing to rank")
            _what_ran(report, archive, page)
            return
        if section == "Order and contamination":
            report.text(ORDER_CHECKS)
        for slug in shown:
            title: str | None = titles[slug]
            if title is not None and title.lower() == section.lower():
                title = None  # the section's heading says it
            view = page[slug]
            ident = slug.replace("_", " ")
            if isinstance(view, Mapping):
                report.figures(view, title, view=ident)
            else:
                report.table(view, title, _sweep_digits(slug, view),
                             notes=SWEEP_NOTES.get(slug, ()), view=ident)  # fmt: skip
            _sweep_plot(report, archive, page, slug, outcome)


def _sweep_plot(report: Report, archive, page: Mapping[str, Any], slug: str, outcome: str) -> None:
    """The plot that goes with a sweep's view (none for most), and what its table leaves out."""
    from bmoe.render.plots import sweep as plots

    view = page[slug]
    if slug == "ranking" and archive.kind == "sweep" and page["plot_axes"] and len(view):
        x, by = page["plot_axes"]
        report.figure(
            plots.outcome_lines(view, x, by, outcome=outcome, attempts=page["ok"]),
            f"{outcome} against {x}" + (f" by {by}" if by else "")
            + ": mean per cell, min-max band over its repeats, each repeat a dot",
        )  # fmt: skip
    elif slug == "stall_by_cell":
        report.figure(plots.stall_bars(view), "where each cell's token time went")
    elif slug == "predicted" and len(view):
        from bmoe.render.plots.predict import predicted_vs_measured_plot

        report.figure(predicted_vs_measured_plot(view), "predicted against measured")
    elif slug == "fidelity":
        from bmoe.render.plots.fidelity import speed_against_fidelity_plot

        report.figure(speed_against_fidelity_plot(view, outcome), "speed against fidelity")
    elif slug == "contamination":
        unchecked = view.attrs.get("not_checked", [])
        if unchecked:
            report.text("not checked: " + "; ".join(unchecked))


def _what_ran(report: Report, archive, page: Mapping[str, Any]) -> None:
    """The sweep's folder, settings, attempts, shared parameters and resolved configuration."""
    results = archive.cells
    report.heading("What ran")
    n_cells = results["cell"].nunique() if "cell" in results else 0
    facts = {
        "folder": str(archive.root),
        "kind": "sweep folder" if archive.kind == "sweep" else "loose engine files",
        "cells": n_cells,
        "attempts": len(results),
        "completed runs": len(page["ok"]),
        "axes": ", ".join(archive.axes) or None,
    }
    if archive.config:
        settings = archive.config.get("sweep", {})
        facts.update({f"sweep {k}": v for k, v in settings.items() if not isinstance(v, dict)})
    report.figures(facts, None, view="sweep")
    report.table(page["attempts"], SWEEP.title("attempts"), view="attempts")
    base = (archive.config or {}).get("base")
    if base:
        report.figures(base, "parameters every cell shares", view="base parameters")
    if archive.config_text:
        report.heading("sweep.toml (resolved)", 3)
        report.preformatted(archive.config_text)


# ----------------------------------------------------------------------------- pages


def run_report(
    run,
    pressure: Mapping[str, Any] | None = None,
    traces: Mapping[str, Any] | None = None,
    output=None,
    title: str | None = None,
) -> str:
    """The page for one run (metrics CSV, its sidecar, output and traces)."""
    name = Path(run.path).name if run.path else "run"
    report = Report(title or f"Run report: {name}", run.path)
    run_sections(report, run, pressure, name=name, traces=traces, output=output, lead=True)
    return report.html()


def trace_report(trace, kind: str, title: str | None = None, run=None) -> str:
    """The page for one route, compute or io trace."""
    name = Path(trace.path).name if trace.path else kind
    report = Report(title or f"{kind.capitalize()} trace report: {name}", trace.path)
    if kind == "route":
        route_sections(report, trace, budget_mib=pages.budget_of(run), run=run)
    elif kind in ("compute", "compute_layers"):
        compute_sections(report, trace, run=run)
    elif kind == "io":
        io_sections(report, trace, run=run)
    else:
        raise ValueError(f"no report for {kind!r} files")
    return report.html()


def sweep_report(
    archive, title: str | None = None, runs: Sequence[str] = (), outcome: str = "tok_s_mean"
) -> str:
    """The page for an archived sweep (or a folder of loose runs), with the runs named in
    `runs` (run or cell ids) in full after it."""
    report = Report(title or f"Sweep report: {archive.name}", str(archive.root))
    sweep_sections(report, archive, outcome=outcome)
    for ref in runs:
        run = archive.run(ref)
        run_sections(
            report, run.metrics, run.pressure, name=run.run, record=run.record,
            traces={k: run.trace(k) for k in ("route", "compute", "compute_layers", "io")
                    if run.has(k)},
            output=run.output if run.has("output") else None,
        )  # fmt: skip
    return report.html()


#: What a reader of a history's view needs told under its table (by slug).
HISTORY_NOTES: Mapping[str, Sequence[str]] = {
    "differences": [
        "'not comparable': the sweeps measured different things (base flags, tracing, model or "
        "engine) and no step between them is judged; 'listed': an engine or bmoe version, "
        "commit, host, CPU or kernel, shown for the reader"
    ],
    "steps": [
        "ratio: after / before in the better direction (above 1 is better), with its 95 % "
        "interval; a regression is worse than the threshold with the interval below 1, between "
        "comparable sweeps whose rankings are settled; 'too few repeats' below three runs a side "
        "and 'not measurable' where the interval is wider than the ratio give no bounds"
    ],
}


def history_report(
    archives: Mapping[str, Any],
    links: Mapping[str, str] | None = None,
    outcome: str = "tok_s_mean",
    threshold_pct: float = 5.0,
    title: str | None = None,
) -> str:
    """The index page for several sweeps (`archives`: label -> archive): the regressions into
    the newest sweep and what was not judged, then a section per heading of the history's
    catalogue (:data:`bmoe.analyze.views.HISTORY`): each sweep with its verdict and a link
    to its own page (`links`: label -> file name), what differs between them, the outcome
    per cell across the sweeps as a trend plot and a table, and the steps between
    consecutive sweeps."""
    from bmoe.render.plots.sweep import trend_lines
    from bmoe.render.runs import DIGITS

    sweeps = {label: archive.cells for label, archive in archives.items()}
    report = Report(title or f"Sweep history: {len(sweeps)} sweeps", ", ".join(sweeps))
    found = pages.history_page(sweeps, outcome, threshold_pct)
    views = found.views()
    titles = found.titles()

    report.heading("Regressions")
    report.caveats([f"regression: {s}" for s in found.regressions()["sentence"]],
                   f"Beyond {threshold_pct:g} % into the newest sweep")  # fmt: skip
    report.caveats(found.notes(), "What was not judged")
    digits = {"trend": DIGITS, "steps": {"change_pct": 1, "ratio": 3, "ratio_low": 3,
                                         "ratio_high": 3}}  # fmt: skip
    for section, shown in HISTORY.sections().items():
        report.heading(section)
        for view in shown:
            slug, table = view.slug, views[view.slug]
            heading: str | None = titles[slug]
            if slug == "sweeps":
                table = table.copy()
                table["verdict"] = [found.verdicts[label].sentence for label in table["sweep"]]
                heading = None
            if slug == "trend" and len(found.lined):
                caption = f"{outcome} per cell across the sweeps: mean, min-max over repeats"
                report.figure(trend_lines(found.lined, outcome, breaks=found.not_comparable),
                              caption)  # fmt: skip
            report.table(table, heading, digits.get(slug), notes=HISTORY_NOTES.get(slug, ()),
                         view=slug)  # fmt: skip
            if slug == "sweeps":
                for label in table["sweep"]:
                    if links and label in links:
                        report.link(links[label], f"{label}: the full report")
    return report.html()


__all__ = [
    "compute_sections",
    "history_report",
    "io_sections",
    "replay_sections",
    "route_sections",
    "run_headline",
    "run_report",
    "run_sections",
    "sweep_report",
    "sweep_sections",
    "trace_report",
]
