"""The offline HTML report: one self-contained page for a run, a trace or a sweep.

Everything is inline (styles, tables, plots as base64 PNG); the page loads nothing from
anywhere, so it opens in any browser offline and travels as one attachment. Its tables are
the analyses' DataFrames, shown with the precision the terminal uses; a rounded number keeps
its full value in the cell's tooltip (``title``).

:class:`Report` builds the page; :func:`run_report`, :func:`trace_report` and
:func:`sweep_report` fill it from the analyses (each section one function, so a notebook can
assemble its own page with the same pieces).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.render.messages import printable
from bmoe.render.tables import MISSING, cell_text, plain

#: Rows a table shows before it says how many more there are.
MAX_ROWS = 400
#: Steps the routing matrix shows.
MATRIX_MAX_STEPS = 512
#: Decode steps the lane timeline shows (its bars are drawn one read at a time).
TIMELINE_STEPS = 2
#: Resolution of the embedded plots.
PLOT_DPI = 96

STYLE = """
:root { --fg: #1d2329; --muted: #5f6b76; --line: #d8dee4; --head: #f3f5f7; --warn: #fff6d6;
        --warnline: #e0b100; --hit: #2e7d32; --miss: #c62828; --pre: #1565c0; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: var(--fg); margin: 0 auto; padding: 1.5em 2em 4em; max-width: 1280px; }
h1 { font-size: 1.6em; margin: 0 0 .2em; }
h2 { font-size: 1.3em; margin: 2em 0 .5em; padding-bottom: .2em;
     border-bottom: 2px solid var(--line); }
h3 { font-size: 1.08em; margin: 1.5em 0 .4em; }
p.meta, p.note, figcaption { color: var(--muted); font-size: .92em; }
nav { background: var(--head); padding: .6em 1em; border-radius: 6px; margin: 1em 0; }
nav ol { margin: 0; padding-left: 1.4em; }
nav a { color: inherit; }
nav span.sub { color: var(--muted); font-size: .92em; }
div.caveats { background: var(--warn); border-left: 4px solid var(--warnline);
              padding: .5em 1em; margin: .8em 0; border-radius: 0 6px 6px 0; }
div.caveats ul { margin: .3em 0; padding-left: 1.2em; }
p.verdict { font-size: 1.05em; font-weight: 600; }
div.caveats.none { background: var(--head); border-left-color: var(--line); }
div.scroll { overflow: auto; max-height: 36em; border: 1px solid var(--line);
             border-radius: 4px; margin: .4em 0 1em; }
table { border-collapse: collapse; font-size: .9em; }
th, td { padding: .25em .6em; border-bottom: 1px solid var(--line); text-align: left;
         white-space: nowrap; }
th { background: var(--head); position: sticky; top: 0; z-index: 1; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.missing { color: var(--muted); text-align: center; }
td.none { color: var(--muted); font-style: italic; }
p.verdict { margin: .4em 0 .6em; }
table.matrix td { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .85em; }
table.matrix th:first-child, table.matrix td:first-child { position: sticky; left: 0;
                                                           background: var(--head); }
span.H { color: var(--hit); } span.M { color: var(--miss); font-weight: 600; }
span.P { color: var(--pre); font-weight: 600; }
figure { margin: .8em 0 1.4em; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
pre { background: var(--head); padding: .8em 1em; border-radius: 6px; overflow: auto;
      font-size: .85em; max-height: 30em; }
"""


def _esc(value: Any) -> str:
    return html.escape(printable(value), quote=True)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _full(value: Any) -> str:
    """A number's full value for the tooltip (repr precision, no trailing noise)."""
    value = plain(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


class Report:
    """One HTML page, built section by section; :meth:`html` returns the whole document."""

    def __init__(self, title: str, subtitle: str | None = None):
        self.title = title
        self.subtitle = subtitle
        self.parts: list[str] = []
        self.toc: list[tuple[int, str, str]] = []
        self._ids: set[str] = set()
        self._lead: int | None = None  # the parts before the contents (see end_lead)

    # -- structure
    def anchor(self, text: str) -> str:
        """A unique id made from `text`."""
        base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        name, n = base, 2
        while name in self._ids:
            name, n = f"{base}-{n}", n + 1
        self._ids.add(name)
        return name

    def heading(self, text: str, level: int = 2) -> str:
        """A section (level 2) or sub-section (level 3) heading, listed in the contents."""
        ident = self.anchor(text)
        self.toc.append((level, ident, text))
        self.parts.append(f'<h{level} id="{ident}">{_esc(text)}</h{level}>')
        return ident

    def end_lead(self) -> None:
        """The page's answer ends here: the contents come after what was added so far
        (without a call, before everything)."""
        self._lead = len(self.parts)

    def text(self, text: str, cls: str = "note") -> None:
        self.parts.append(f'<p class="{cls}">{_esc(text)}</p>')

    def caveats(self, lines: Sequence[str], title: str = "Caveats") -> None:
        """The warnings a reader must see before the figures (a quiet box when none)."""
        if not lines:
            self.parts.append(
                f'<div class="caveats none"><strong>{_esc(title)}:</strong> none raised</div>'
            )
            return
        items = "".join(f"<li>{_esc(line)}</li>" for line in collapsed(lines))
        self.parts.append(
            f'<div class="caveats"><strong>{_esc(title)}</strong><ul>{items}</ul></div>'
        )

    def preformatted(self, text: str) -> None:
        self.parts.append(f"<pre>{_esc(text)}</pre>")

    # -- tables
    def figures(
        self,
        values: Mapping[str, Any],
        title: str | None = None,
        digits: Mapping[str, int] | None = None,
        view: str | None = None,
    ) -> None:
        """Named figures as a two-column table (figure, value)."""
        frame = pd.DataFrame(
            {
                "figure": [str(k) for k in values],
                "value": pd.Series(list(values.values()), dtype=object),
            }
        )
        per_row = {i: (digits or {}).get(k) for i, k in enumerate(frame["figure"])}
        self.table(frame, title, view=view or title, row_digits=per_row)

    def table(
        self,
        frame: pd.DataFrame,
        title: str | None = None,
        digits: Mapping[str, int] | None = None,
        notes: Iterable[str] = (),
        view: str | None = None,
        max_rows: int = MAX_ROWS,
        row_digits: Mapping[int, int | None] | None = None,
    ) -> None:
        """A DataFrame as a table (scrollable when large), its title and notes."""
        if title:
            self.heading(title, 3)
        ident = self.anchor(f"table-{view or title or 'table'}")
        shown = frame.iloc[:max_rows]
        cols = [str(c) for c in frame.columns]
        head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
        body = []
        for i, row in enumerate(shown.itertuples(index=False, name=None)):
            cells = []
            for col, value in zip(cols, row, strict=True):
                d = (row_digits or {}).get(i) if row_digits is not None else None
                d = d if d is not None else (digits or {}).get(col)
                cells.append(_cell(value, d))
            body.append("<tr>" + "".join(cells) + "</tr>")
        if not len(shown):  # as the terminal says it
            body = [f'<tr><td class="none" colspan="{max(len(cols), 1)}">(none)</td></tr>']
        data_view = f' data-view="{_esc(view or title or "")}"'
        table = (
            f'<div class="scroll"><table id="{ident}"{data_view}><thead><tr>{head}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table></div>"
        )
        self.parts.append(table)
        notes = list(notes)
        if len(frame) > max_rows:
            notes.append(f"showing the first {max_rows} of {len(frame)} rows")
        for note in notes:
            self.text(note)

    def matrix(
        self,
        frame: pd.DataFrame,
        hits: pd.DataFrame | None = None,
        title: str = "routing matrix",
        notes: Iterable[str] = (),
    ) -> None:
        """The step x layer routing matrix, every cell the experts in slot order; with the
        `hits` matrix of the same steps each id is coloured hit / miss / prefetch hit."""
        self.heading(title, 3)
        ident = self.anchor("table-routing-matrix")
        cols = [str(c) for c in frame.columns]
        head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
        layer_cols = [c for c in cols if re.fullmatch(r"L\d+", c)]
        body = []
        hit_rows = hits.to_dict("records") if hits is not None and len(hits) == len(frame) else None
        for i, record in enumerate(frame.to_dict("records")):
            cells = []
            for col in cols:
                value = record[col]
                if col in layer_cols and hit_rows is not None:
                    cells.append(f"<td>{_coloured(value, hit_rows[i].get(col))}</td>")
                else:
                    cells.append(_cell(value, None))
            body.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append(
            f'<div class="scroll"><table class="matrix" id="{ident}" data-view="matrix">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )
        for note in notes:
            self.text(note)

    # -- plots
    def figure(self, fig, caption: str) -> None:
        """A matplotlib figure as an inline PNG (the figure is closed)."""
        import matplotlib.pyplot as plt

        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format="png", dpi=PLOT_DPI)
        finally:
            plt.close(fig)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.parts.append(
            f'<figure><img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>"
        )

    # -- the page
    def html(self) -> str:
        toc = _toc_html(self.toc)
        when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        from bmoe._version import __version__

        subtitle = f'<p class="meta">{_esc(self.subtitle)}</p>' if self.subtitle else ""
        lead = self._lead or 0
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_esc(self.title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{_esc(self.title)}</h1>{subtitle}"
            f'<p class="meta">report by bmoe {_esc(__version__)}, {_esc(when)}</p></header>'
            f"{''.join(self.parts[:lead])}{toc}{''.join(self.parts[lead:])}</body></html>\n"
        )


#: A number standing as a word (not a digit inside a name such as ``cache_mb-8_io``).
_NUMBER = re.compile(r"(?<![\w.])(?<!\w[-+])[-+]?\d+(?:\.\d+)?(?!\w|\.\d|-\w)")
_RUNS = re.compile(r"\((\d+) of (\d+) runs\)")


def collapsed(lines: Sequence[str]) -> list[str]:
    """Caveats with the near-identical ones (the same words, other numbers) said once: the
    numbers that differ as a range, the run counts of ``(n of N runs)`` added up (each run
    raises a warning once, so lines that differ in a figure come from different runs), and
    how many lines it stands for. Order of first appearance; exact repeats drop."""
    groups: dict[str, list[str]] = {}
    for line in dict.fromkeys(lines):
        groups.setdefault(_NUMBER.sub("#", line), []).append(line)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        runs = [_RUNS.search(line) for line in group]
        bare = [_RUNS.sub("\x00", line, count=1) for line in group]
        columns = zip(*(_NUMBER.findall(line) for line in bare), strict=True)
        spans = iter(
            value[0] if len(set(value)) == 1
            else f"{min(value, key=float)}-{max(value, key=float)}"
            for value in columns
        )  # fmt: skip

        def span(_m: re.Match[str], spans: Iterator[str] = spans) -> str:
            return next(spans)

        said = _NUMBER.sub(span, bare[0])
        if all(runs):
            total = sum(int(m.group(1)) for m in runs if m)
            of = max(int(m.group(2)) for m in runs if m)
            said = said.replace("\x00", f"({min(total, of)} of {of} runs)", 1)
        out.append(f"{said} [{len(group)} alike]")
    return out


def _toc_html(toc: list[tuple[int, str, str]]) -> str:
    """The contents: a line per section, its sub-sections on the same line (a short box, so
    the figures after it come soon)."""
    if not toc:
        return ""
    sections: list[tuple[str, str, list[tuple[str, str]]]] = []
    for level, ident, text in toc:
        if level == 2 or not sections:
            sections.append((ident, text, []))
        else:
            sections[-1][2].append((ident, text))
    out = ["<nav><strong>Contents</strong><ol>"]
    for ident, text, subs in sections:
        links = " · ".join(f'<a href="#{i}">{_esc(t)}</a>' for i, t in subs)
        out.append(
            f'<li><a href="#{ident}">{_esc(text)}</a>'
            + (f'<span class="sub">: {links}</span>' if subs else "")
            + "</li>"
        )
    out.append("</ol></nav>")
    return "".join(out)


def _cell(value: Any, digits: int | None) -> str:
    value = plain(value)
    text = cell_text(value, digits)
    if value is None:
        return f'<td class="missing">{MISSING}</td>'
    if _is_number(value):
        tip = _full(value)
        title = f' title="{_esc(tip)}"' if tip != text else ""
        return f'<td class="n"{title}>{_esc(text)}</td>'
    return f"<td>{_esc(text)}</td>"


def _coloured(experts: Any, hits: Any) -> str:
    """Expert ids (``3 *5``) coloured by their slot's outcome letter (``HM``)."""
    ids = str(experts).split() if experts is not None else []
    letters = [c for c in str(hits or "") if c in "HMP"]
    if not ids or len(ids) != len(letters):
        return _esc(experts if experts is not None else "")
    return " ".join(
        f'<span class="{letter}">{_esc(expert)}</span>'
        for expert, letter in zip(ids, letters, strict=True)
    )


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
    from bmoe.analyze.compare import REFUSE, run_concerns
    from bmoe.analyze.metrics import run_summary, summarize_runs, summary_tables
    from bmoe.analyze.runfiles import RunFiles
    from bmoe.analyze.stall import memory_picture, stall_attribution
    from bmoe.render.plots.runs import stall_figure
    from bmoe.render.runs import DIGITS

    traces = dict(traces or {})
    name = name or (Path(run.path).name if run.path else "run")
    report.heading(f"Run {name}")
    att = stall_attribution(run)
    report.text(run_headline(run_summary(run, pressure), att.summary, run.params), cls="verdict")
    trace_paths = [str(getattr(t, "path", None) or kind) for kind, t in traces.items()]
    concerns = run_concerns(RunFiles(run, dict(pressure) if pressure else None, trace_paths))
    lines = [
        f"{reason} (a comparison of runs refuses this one)" if level == REFUSE else reason
        for level, reason in concerns
    ]
    lines += [f"stall attribution: {note}" for note in att.notes]
    lines += [f"reading: {w}" for w in run.warnings]
    if output is not None and getattr(output, "failure", None):
        lines.append(f"the engine said: {output.failure}")
    report.caveats(lines)
    if lead:
        report.end_lead()

    params = dict(record.get("params", {})) if record else {}
    params = {**{k: v for k, v in run.params.items()}, **params}
    if params:
        report.figures(params, "parameters", view="run parameters")
    frame = summarize_runs([run], [pressure])
    for view_name, view in summary_tables(frame).items():
        figures = view.drop(columns="run").iloc[0].to_dict()
        report.figures(figures, f"summary: {view_name}", DIGITS, view=f"summary {view_name}")

    report.heading("stall attribution", 3)
    report.figures(att.figures(), None, view="stall attribution method")
    report.table(
        att.summary, None, DIGITS, view="stall attribution",
        notes=["flash wait, cache mgmt, compute and unattributed add up to the wall (waits "
               "first, then compute up to what they left); compute is cpu_ms / threads unless "
               "said otherwise; overlapped is busy time that ran alongside the waits, not "
               "wall time."],
    )  # fmt: skip
    if len(att.tokens):
        memory = memory_picture(run)
        report.figure(
            stall_figure(att.tokens, memory, title=f"{name}: stall attribution",
                         compute_label=att.compute_source),  # the parts stack to the wall
            "where each token's time went (and the memory picture, when recorded)",
        )  # fmt: skip
    if output is not None and getattr(output, "figures", None):
        report.figures(output.figures, "end-of-run lines", view="end-of-run lines")
    metrics_for_join = run
    if "route" in traces:
        route_sections(report, traces["route"], budget_mib=_budget_of(run), run=run, level=2)
    if "compute" in traces:
        compute_sections(report, traces["compute"], run=metrics_for_join)
    if "compute_layers" in traces:
        compute_sections(report, traces["compute_layers"], run=metrics_for_join)
    if "io" in traces:
        io_sections(report, traces["io"], run=metrics_for_join)


def _budget_of(run) -> float | None:
    """The cache budget (MiB) a run ran with: its summary's, else its preamble's."""
    if run is None:
        return None
    for key in ("cache_budget_MiB", "cache_mb"):
        value = run.summary.get(key)
        if _is_number(value) and value >= 0:
            return float(value)
    value = run.params.get("cache_mb")
    return float(value) if _is_number(value) and value >= 0 else None


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
    from bmoe.analyze import route
    from bmoe.render import route as text
    from bmoe.render.plots import route as plots

    name = Path(trace.path).name if trace.path else "route trace"
    report.heading(f"Routing: {name}", level)
    selected = route.select(trace, "decode")
    phase = "decode"
    if not len(selected.rows):
        selected, phase = route.select(trace, "all"), "all"
    said = route.caveats(trace, selected, phase)
    report.caveats(said)
    meta = trace.meta
    report.figures(
        {"model": meta.get("model"), "arch": meta.get("arch"), "n_layer": meta.get("n_layer"),
         "n_expert": meta.get("n_expert"), "n_expert_used": meta.get("n_expert_used"),
         "phase": phase, "rows": len(selected.rows), "steps": route.count_steps(selected)},
        None, view="route trace",
    )  # fmt: skip
    if not len(selected.rows):
        return
    views = route.route_views(selected, route.DEFAULT_VIEWS)
    notes = text.view_notes(
        views, k=trace.n_expert_used, prefill=phase == "all",
        total_steps=route.count_steps(selected),
    )  # fmt: skip
    for view_name, frame in views.items():
        report.table(
            frame, text.TITLES.get(view_name, view_name), text.DIGITS,
            notes=notes.get(view_name, ()), view=f"route {view_name}",
        )  # fmt: skip

    n_steps = route.count_steps(selected)
    limit = min(n_steps, MATRIX_MAX_STEPS)
    experts = route.matrix(selected, "experts", limit)
    hits = route.matrix(selected, "hit", limit) if "residency" in selected.rows else None
    matrix_notes = [
        "each cell: the experts routed at that step and layer in slot order; '*' = the layer "
        "also routed it on the previous row"
        + ("; green = hit, red = miss, blue = prefetch hit" if hits is not None else "")
    ]
    if n_steps > limit:
        matrix_notes.append(f"showing the first {limit} of {n_steps} steps")
    report.matrix(experts, hits, f"routing matrix ({phase} steps)", matrix_notes)

    grid_value = "residency" if "residency" in selected.rows else "expert"
    grid = route.routing_grid(selected, grid_value)
    if len(grid):
        report.figure(plots.routing_heatmap(grid, grid_value), f"routing heatmap ({grid_value})")
    reuse = route.reuse_distances(selected)
    if len(reuse):
        report.figure(plots.reuse_distance_plot(reuse), "reuse distance per layer, in steps")
    curve = route.workset_curve(selected)
    if len(curve):
        report.figure(
            plots.workset_growth_plot(curve, budget_mib),
            "working-set growth: distinct experts' MiB as the steps go on"
            + (f" (the run's budget: {budget_mib:g} MiB)" if budget_mib is not None else ""),
        )
    if replay:
        replay_sections(report, trace, budget_mib=budget_mib, run=run)


def replay_sections(report: Report, trace, *, budget_mib: float | None = None, run=None) -> None:
    """The cache replay of a route trace over budgets that span its model, the exact LRU
    miss-ratio curve, and the recorded hit rate against both."""
    from bmoe.analyze import replay as rp
    from bmoe.render import replay as text
    from bmoe.render.plots import replay as plots

    report.heading("cache replay", 3)
    budgets = rp.budgets_for(trace, [budget_mib] if budget_mib is not None else [])
    if not budgets:
        report.text("no expert sizes in the trace's preamble: nothing to replay")
        return
    summary = run.summary if run is not None else None
    views = rp.replay(trace, budgets, rp.REFERENCE_POLICIES, mrc=True,
                      validate_mib=budget_mib, metrics_summary=summary)  # fmt: skip
    shape = views["shape"]
    said = []
    if shape.get("recorded_with_dropping"):
        said.append(
            "recorded with expert dropping on: the replay looks up every expert the router "
            "asked for, dropped ones included"
        )
    if said:
        report.caveats(said, "Replay caveats")
    report.figures(shape, None, text.DIGITS, view="replay shape")
    report.table(
        rp.decode_pivot(views["curve"]), None, text.DIGITS, view="replay curve",
        notes=["decode-only hit % per budget (MiB) and policy",
               *text.budget_notes(views["curve"], shape.get("t_mib"))],
    )  # fmt: skip
    if "validation" in views:
        report.table(views["validation"], None, text.DIGITS, view="replay validation",
                     notes=[f"the LRU replay at the run's budget ({budget_mib:g} MiB) against "
                            "what the run recorded"])  # fmt: skip
    report.table(views["mrc_budgets"], None, text.DIGITS, view="exact lru at the budgets")
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
    from bmoe.analyze import op_traces as dec
    from bmoe.render.op_traces import COMPUTE_NOTE, DIGITS, STREAM_NOTE
    from bmoe.render.plots import op_traces as plots

    name = Path(trace.path).name if trace.path else "compute trace"
    report.heading(f"Compute: {name}", level)
    views = dec.analyze_compute(trace, metrics=run, class_by_layer=True)
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
    from bmoe.analyze import op_traces as dec
    from bmoe.analyze.timeline import build_timeline
    from bmoe.render.op_traces import DIGITS, IO_NOTE
    from bmoe.render.plots import op_traces as plots

    name = Path(trace.path).name if trace.path else "io trace"
    report.heading(f"Flash reads: {name}", level)
    views = dec.analyze_io(trace, adjacent=True, metrics=run)
    notes = [IO_NOTE]
    _views(report, views, DIGITS, "io", skip=("per_token",))
    if not len(trace.rows):
        report.caveats(["the io trace has no reads"])
        return
    report.figure(
        plots.latency_cdf(dec.io_latency_cdf(trace), views["latency_us"]),
        "read latency CDF per lane (p50/p90/p99 of all reads marked)",
    )
    decode = dec.decode_rows(trace.rows)
    if len(decode):
        first = int(decode["step"].min())
        window = (first, first + TIMELINE_STEPS - 1)
        timeline = build_timeline(None, trace, decode_only=True, steps=window)
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
    for view_name, result in views.items():
        if view_name in skip:
            continue
        title = view_name.replace("_", " ")
        if isinstance(result, pd.DataFrame):
            if len(result.columns):
                report.table(result, title, digits, view=f"{prefix} {view_name}")
        elif isinstance(result, Mapping):
            report.heading(title, 3)
            report.figures(result, None, digits, view=f"{prefix} {view_name}")


# ----------------------------------------------------------------------------- sweep


def sweep_sections(report: Report, archive, *, outcome: str = "tok_s_mean") -> None:
    """An archived sweep, its answer first: the verdict and its caveats (then the contents),
    the ranking and the outcome over the axes with its spread across repeats, the neighbours
    compared, stability per cell, the axis table, stall attribution per cell, both order
    checks, the recorded hit rates against their replay, and last what ran (settings,
    attempts, shared parameters, the resolved configuration)."""
    from bmoe.analyze import sweep as sw
    from bmoe.analyze.stall import stall_by_run
    from bmoe.render.plots import sweep as plots
    from bmoe.render.runs import DIGITS

    results = archive.cells
    axes = archive.axes
    sw.check_outcome(results, outcome, archive.root)
    ok = sw.ok_attempts(results)
    runs = archive.metrics_runs()
    stall = sw.per_cell(results, stall_by_run(runs)) if runs else None
    traced = [r.run for r in archive.runs() if any(r.has(k) for k in TRACE_KINDS)]
    # The verdict from the results alone (off-CPU estimated from their per-run figures), as
    # the terminal and summary.md give it, so the three never disagree.
    views = sw.analyze_sweep(results, outcome, traced=traced)
    verdict = sw.sweep_verdict(results, outcome, traced=traced,
                               contamination_flags=views["contamination"])  # fmt: skip
    ranked = views[f"cells ranked by {outcome}"]

    # The answer first: the verdict, the ranking and the plot that answers; what ran last.
    report.heading("Verdict")
    report.text(verdict.sentence, cls="verdict")
    report.caveats(verdict.caveats)
    report.end_lead()

    report.heading("Ranking")
    if ok.empty:
        report.text("no completed run: nothing to rank")
        _what_ran(report, archive, views, ok)
        return
    report.table(ranked, f"cells ranked by {outcome}", DIGITS, view="ranking")
    plot_axes = sw.main_axes(results, axes) if archive.kind == "sweep" else None
    if plot_axes and len(ranked):
        x, by = plot_axes
        report.figure(
            plots.outcome_lines(ranked, x, by, outcome=outcome, attempts=ok),
            f"{outcome} against {x}" + (f" by {by}" if by else "")
            + ": mean per cell, min-max band over its repeats, each repeat a dot",
        )  # fmt: skip
    if len(verdict.neighbours):
        report.table(
            verdict.neighbours, "neighbours in the ranking", {"ratio": 3, "ratio_low": 3,
                                                              "ratio_high": 3},
            view="neighbours",
            notes=["ratio of the two means with its 95 % interval (Welch, log scale); "
                   "'not distinguishable' when the interval includes 1; no bounds, and 'too "
                   "few repeats' below three runs a cell or 'not measurable' where the "
                   "interval is wider than the ratio"],
        )  # fmt: skip
    report.table(
        verdict.stability, "stability per cell", {c: 1 for c in ("ci_pct", "cv_pct",
                                                                 "drift_pct", "off_cpu_pct",
                                                                 "cpu_pct")},
        view="stability",
        notes=["ci_pct: half-width of the 95 % interval of the mean, % of the mean; drift_pct: "
               "reversed rounds against forward ones; off_cpu_pct: share of a token's wall "
               "time neither compute nor a measured wait; cpu_pct: the engine's CPU time over "
               "its wall time (100 = one core)"],
    )  # fmt: skip
    if "outcomes by axis value (means)" in views:
        report.table(views["outcomes by axis value (means)"], "outcomes by axis value (means)",
                     DIGITS, view="axis table")  # fmt: skip

    if stall is not None:
        report.heading("Stall attribution per cell")
        report.table(
            stall, None, {c: 1 for c in stall.columns if c.endswith(("_ms", "_pct"))},
            view="stall by cell",
            notes=["ms per token and % of the wall, mean over each cell's completed repeats; "
                   "compute, flash wait, cache mgmt and unattributed add up to the wall; "
                   "overlapped is time the proxies counted that ran alongside the waits "
                   "(not wall time)"],
        )  # fmt: skip
        report.figure(plots.stall_bars(stall), "where each cell's token time went")

    from bmoe.formats.archive import read_predictions

    predictions = read_predictions(archive.root)
    if predictions is not None:
        from bmoe.render.plots.predict import predicted_vs_measured_plot

        compared = sw.predicted_vs_measured(results, predictions)
        report.heading("Predicted against measured")
        report.table(compared, "tok/s predicted by the sweep's profile", DIGITS, view="predicted")
        if len(compared):
            report.figure(predicted_vs_measured_plot(compared), "predicted against measured")

    _fidelity_section(report, results, outcome)

    report.heading("Order and contamination")
    report.text(ORDER_CHECKS)
    report.figures(views["repeats against execution order"], "repeats against execution order",
                   view="order effect")  # fmt: skip
    if "forward vs reversed rounds" in views:
        report.table(views["forward vs reversed rounds"], "forward vs reversed rounds",
                     DIGITS, view="reversed rounds")  # fmt: skip
    flags = views["contamination"]
    report.table(flags, "contamination tells", view="contamination")
    unchecked = flags.attrs.get("not_checked", [])
    if unchecked:
        report.text("not checked: " + "; ".join(unchecked))

    traced_runs = archive.with_file("route")
    if traced_runs:
        report.heading("Recorded hit rate against the replay")
        table = _replay_checks(traced_runs)
        report.table(
            table, None, {c: 2 for c in table.columns if c.endswith("_pct_decode") or
                          c.endswith("_pct_cum") or c.endswith("cache_hit_pct")},
            view="recorded vs replay",
            notes=["each run's own routing replayed through the LRU cache at its budget, and "
                   "the exact LRU curve there, next to what the run recorded"],
        )  # fmt: skip
    _what_ran(report, archive, views, ok)


def _what_ran(report: Report, archive, views: Mapping[str, Any], ok: pd.DataFrame) -> None:
    """The sweep's folder, settings, attempts, shared parameters and resolved configuration."""
    results = archive.cells
    report.heading("What ran")
    n_cells = results["cell"].nunique() if "cell" in results else 0
    facts = {
        "folder": str(archive.root),
        "kind": "sweep folder" if archive.kind == "sweep" else "loose engine files",
        "cells": n_cells,
        "attempts": len(results),
        "completed runs": len(ok),
        "axes": ", ".join(archive.axes) or None,
    }
    if archive.config:
        settings = archive.config.get("sweep", {})
        facts.update({f"sweep {k}": v for k, v in settings.items() if not isinstance(v, dict)})
    report.figures(facts, None, view="sweep")
    report.table(views["attempts"], "attempts by target and status", view="attempts")
    base = (archive.config or {}).get("base")
    if base:
        report.figures(base, "parameters every cell shares", view="base parameters")
    if archive.config_text:
        report.heading("sweep.toml (resolved)", 3)
        report.preformatted(archive.config_text)


#: Trace kinds whose recording slows a run (its timings are instrumented).
TRACE_KINDS = ("route", "compute", "compute_layers", "io")

#: Why the page shows two order checks.
ORDER_CHECKS = (
    "Two checks look at the execution order. 'Repeats against execution order' compares each "
    "cell's repeats with each other (the rank correlation of each repeat's ratio to its cell's "
    "mean with its position): it needs repeats and assumes nothing about the configuration. "
    "The contamination tell 'execution_order' looks across cells, fitting the configuration's "
    "main effects and testing the position on top: it works with one run per cell but trusts "
    "that additive model. Either firing means the machine changed while the sweep ran."
)


def _replay_checks(runs) -> pd.DataFrame:
    from bmoe.analyze.replay import recorded_vs_replay

    rows = []
    for run in runs:
        metrics = run.metrics if run.has("metrics") else None
        budget = _budget_of(metrics)
        if budget is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            figures = recorded_vs_replay(
                run.trace("route"), budget, metrics.summary if metrics else None
            )
        rows.append({"run": run.run, **figures})
    return pd.DataFrame(rows)


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
        route_sections(report, trace, budget_mib=_budget_of(run), run=run)
    elif kind in ("compute", "compute_layers"):
        compute_sections(report, trace, run=run)
    elif kind == "io":
        io_sections(report, trace, run=run)
    else:
        raise ValueError(f"no report for {kind!r} files")
    return report.html()


def _fidelity_section(report: Report, results: pd.DataFrame, outcome: str) -> None:
    """Speed against fidelity, when the runs measured it (lossy levers)."""
    from bmoe.analyze.fidelity import speed_fidelity
    from bmoe.render.plots.fidelity import speed_against_fidelity_plot
    from bmoe.render.runs import DIGITS

    table = speed_fidelity(results, outcome)
    if table.empty:
        return
    report.heading("Speed against fidelity")
    report.table(table, "each cell's mean and its worst fidelity", DIGITS, view="fidelity")
    report.figure(speed_against_fidelity_plot(table, outcome), "speed against fidelity")


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


def history_report(
    archives: Mapping[str, Any],
    links: Mapping[str, str] | None = None,
    outcome: str = "tok_s_mean",
    threshold_pct: float = 5.0,
    title: str | None = None,
) -> str:
    """The index page for several sweeps (`archives`: label -> archive): each sweep with its
    verdict and a link to its own page (`links`: label -> file name), the outcome per cell
    across the sweeps as a trend plot and a table, and the steps between consecutive sweeps
    with the regressions into the newest one."""
    from bmoe.analyze import history as hist
    from bmoe.render.plots.sweep import trend_lines
    from bmoe.render.runs import DIGITS

    sweeps = {label: archive.cells for label, archive in archives.items()}
    report = Report(title or f"Sweep history: {len(sweeps)} sweeps", ", ".join(sweeps))
    found = hist.history_of(sweeps, outcome, threshold_pct)
    views = found.views()
    lined = found.lined

    report.heading("Regressions")
    report.caveats([f"regression: {s}" for s in found.regressions()["sentence"]],
                   f"Beyond {threshold_pct:g} % into the newest sweep")  # fmt: skip
    report.caveats(found.notes(), "What was not judged")
    report.heading("Sweeps")
    table = views["sweeps"].copy()
    table["verdict"] = [found.verdicts[label].sentence for label in table["sweep"]]
    report.table(table, None, view="sweeps")
    for label in table["sweep"]:
        if links and label in links:
            report.parts.append(
                f'<p><a href="{_esc(links[label])}">{_esc(label)}: the full report</a></p>'
            )
    report.table(
        views["differences between sweeps"], "differences between sweeps", view="differences",
        notes=["'not comparable': the sweeps measured different things (base flags, tracing, "
               "model or engine) and no step between them is judged; 'listed': an engine or "
               "bmoe version, commit, host, CPU or kernel, shown for the reader"],
    )  # fmt: skip
    report.heading("Trends")
    if len(lined):
        caption = f"{outcome} per cell across the sweeps: mean, min-max over repeats"
        report.figure(trend_lines(lined, outcome, breaks=found.not_comparable), caption)
    report.table(views[f"{outcome} per cell and sweep"], f"{outcome} per cell and sweep",
                 DIGITS, view="trend")  # fmt: skip
    report.table(
        views["steps between sweeps"], "steps between sweeps",
        {"change_pct": 1, "ratio": 3, "ratio_low": 3, "ratio_high": 3}, view="steps",
        notes=["ratio: after / before in the better direction (above 1 is better), with its "
               "95 % interval; a regression is worse than the threshold with the interval "
               "below 1, between comparable sweeps whose rankings are settled; 'too few "
               "repeats' below three runs a side and 'not measurable' where the interval is "
               "wider than the ratio give no bounds"],
    )  # fmt: skip
    return report.html()


__all__ = [
    "Report",
    "compute_sections",
    "history_report",
    "io_sections",
    "replay_sections",
    "route_sections",
    "run_report",
    "run_sections",
    "sweep_report",
    "sweep_sections",
    "trace_report",
]
