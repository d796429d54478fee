"""The offline HTML report: one self-contained page for a run, a trace or a sweep.

Everything is inline (styles, tables, plots as base64 PNG); the page loads nothing from
anywhere, so it opens in any browser offline and travels as one attachment. Its tables are
the analyses' DataFrames, shown with the precision the terminal uses; a rounded number keeps
its full value in the cell's tooltip (``title``).

:class:`Report` builds the page: headings, text, caveats, tables, the routing matrix and
plots, and the document around them (contents, styles). It runs no analysis: the pages in
:mod:`bmoe.render.pages` fill it with the views :mod:`bmoe.analyze.pages` computes.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.render.messages import printable
from bmoe.render.tables import MISSING, cell_text, plain

#: Rows a table shows before it says how many more there are.
MAX_ROWS = 400
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

    def link(self, href: str, text: str) -> None:
        """A paragraph that links to `href` (another page beside this one)."""
        self.parts.append(f'<p><a href="{_esc(href)}">{_esc(text)}</a></p>')

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


__all__ = ["Report", "collapsed"]
