"""Render analysis results as rich tables, CSV blocks, JSON or markdown.

Every analysis hands over a mapping of view name -> result, where a result is a DataFrame (a
table: rows of records) or a mapping (a group of named figures). The same mapping renders in
every format, so what the terminal shows is exactly what a script or notebook gets.
"""

from __future__ import annotations

import functools
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from bmoe.render.messages import literal, printable
from bmoe.render.outputs import FORMATS

if TYPE_CHECKING:
    import pandas as pd

    Result = pd.DataFrame | Mapping[str, Any]

MISSING = "—"
#: Longest cell a terminal table shows; longer text (a runaway preamble value) is cut with a
#: count, so that drawing a table stays linear in what it shows (csv/json keep every byte).
CELL_CHARS = 400


def plain(value: Any) -> Any:
    """A JSON-safe Python value (numpy scalars unwrapped, NaN/NA -> None)."""
    if value is None:
        return None
    # pandas and numpy are imported only by what made pandas or numpy values: a table of plain
    # figures (``bmoe info``) renders without either.
    pd = sys.modules.get("pandas")
    if pd is not None and (value is pd.NA or value is pd.NaT):
        return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of `frame` as JSON-safe dicts."""
    cols = [str(c) for c in frame.columns]
    return [
        {c: plain(v) for c, v in zip(cols, row, strict=True)}
        for row in frame.itertuples(index=False, name=None)
    ]


def to_jsonable(views: Mapping[str, Result]) -> dict[str, Any]:
    return {
        name: plain(res) if isinstance(res, Mapping) else records(res)
        for name, res in views.items()
    }


def cell_text(value: Any, digits: int | None = None) -> str:
    value = plain(value)
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if digits is not None:
            return f"{value:.{digits}f}"
        if value.is_integer():
            return f"{value:.0f}"
        if abs(value) < 1:
            return f"{value:.3g}"  # 0.229, 0.0047: three significant digits
        return f"{value:.3f}".rstrip("0").rstrip(".")  # 57509.4, 362.141, 9.7
    return str(value)


def shown(text: str, limit: int = CELL_CHARS) -> str:
    """`text` cut to `limit` characters for a terminal, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _as_frame(result: Result) -> pd.DataFrame:
    import pandas as pd

    if not isinstance(result, Mapping):
        return result
    return pd.DataFrame({"figure": list(result.keys()), "value": list(result.values())})


def render_csv(views: Mapping[str, Result]) -> str:
    """Each view as a CSV block headed by ``# view=<name>``."""
    import pandas as pd

    out = io.StringIO()
    for name, result in views.items():
        out.write(f"# view={printable(name)}\n")
        frame = pd.DataFrame([plain(result)]) if isinstance(result, Mapping) else result
        frame.to_csv(out, index=False, lineterminator="\n")
    return printable(out.getvalue())


def render_json(views: Mapping[str, Result]) -> str:
    return json.dumps(to_jsonable(views), indent=2, allow_nan=False) + "\n"


_MARKDOWN_CELL = str.maketrans(
    {"|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": "<br>", "\r": ""}
)


def markdown_cell(text: str) -> str:
    """`text` as one markdown table cell: a pipe or newline cannot end the cell or the row,
    and HTML in a value (a prompt, a config string) is shown, not rendered."""
    return printable(text).translate(_MARKDOWN_CELL)


def render_markdown(views: Mapping[str, Result], digits: Mapping[str, int] | None = None) -> str:
    out = []
    for name, result in views.items():
        frame = _as_frame(result)
        out.append(f"### {markdown_cell(str(name))}\n")
        cols = [str(c) for c in frame.columns]
        out.append("| " + " | ".join(markdown_cell(c) for c in cols) + " |")
        out.append("|" + "|".join("---:" if _numeric(frame[c]) else "---" for c in frame) + "|")
        for row in frame.itertuples(index=False, name=None):
            cells = [
                markdown_cell(cell_text(v, (digits or {}).get(c)))
                for c, v in zip(cols, row, strict=True)
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def _numeric(series: pd.Series) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def rich_tables(
    views: Mapping[str, Result], digits: Mapping[str, int] | None = None
) -> list[Table]:
    """Each view as a rich Table titled with its name."""
    return [rich_table(table_cells(result, digits), title=name) for name, result in views.items()]


#: (header, numeric, cell texts) per column; numeric columns are right-justified.
CellColumns = list[tuple[str, bool, list[str]]]


def table_cells(result: Result, digits: Mapping[str, int] | None = None) -> CellColumns:
    """The display text of a result's columns: each cell as :func:`cell_text` writes it with
    its column's precision (from `digits`), cut by :func:`shown`."""
    columns = _figure_columns(result) if isinstance(result, Mapping) else None
    if columns is None:
        frame = _as_frame(result)
        columns = [(col, _numeric(frame[col]), list(frame[col])) for col in frame.columns]
    return value_cells(columns, digits)


def value_cells(
    columns: Sequence[tuple[Any, bool, Sequence[Any]]], digits: Mapping[str, int] | None = None
) -> CellColumns:
    """(name, numeric, values) columns as display text: :func:`cell_text` with the column's
    precision from `digits`, cut by :func:`shown`."""
    out = []
    for col, numeric, values in columns:
        name = str(col)
        places = (digits or {}).get(name)
        out.append((name, numeric, [shown(cell_text(v, places)) for v in values]))
    return out


def rich_table(columns: CellColumns, title: Any = None) -> Table:
    """A rich Table of display text (see :func:`table_cells`)."""
    table = Table(
        title=None if title is None else literal(title), title_justify="left", header_style="bold"
    )
    for header, numeric, cells in columns:
        # Numbers are never cut: a narrow terminal folds headers and labels instead.
        widest = max(map(len, cells), default=0) if numeric else None
        table.add_column(
            literal(shown(header)),
            justify="right" if numeric else "left",
            overflow="fold",
            min_width=widest,
        )
    for row in zip(*(cells for _h, _n, cells in columns), strict=True):
        table.add_row(*(literal(cell) for cell in row))
    if not columns or not columns[0][2]:
        table.caption = "(none)"
    return table


def plain_table(columns: CellColumns, width: int, title: Any = None) -> str | None:
    """The characters rich prints for :func:`rich_table` on a console of `width` columns
    that emits no styles (output to a file or a pipe), written directly: a few microseconds
    per cell instead of rich's measuring and rendering of every cell. The layout is rich's
    (its column widths, folded headers, wrapped text, lines cut at the console's edge); only
    the cells too wide for their column are wrapped by rich's own text wrapping. None when
    the table needs rich itself: no rows (a caption), a title wider than the table, or text
    that is not plain (control characters, wide or combining characters, edge blanks)."""
    headers = [shown(h) for h, _n, _c in columns]
    n_rows = len(columns[0][2]) if columns else 0
    if not n_rows:
        return None
    texts = [[h, *cells] for h, (_h, _n, cells) in zip(headers, columns, strict=True)]
    if not all(_plain_text(t) for column in texts for t in column):
        return None
    if title is not None and not _plain_text(str(title)):
        return None
    right = [n for _h, n, _c in columns]
    fixed = [max(map(len, cells)) if n else None for _h, n, cells in columns]
    room = width - len(columns) - 1
    if room < 3:
        return None
    widths = _column_widths(texts, fixed, room)
    total = sum(widths) + len(columns) + 1
    if title is not None and len(str(title)) > total:
        return None
    inner = [w - 2 for w in widths]
    if min(inner) < 1:
        return None

    def cell_lines(text: str, w: int, justify_right: bool) -> list[str]:
        if len(text) <= w:
            return [text.rjust(w) if justify_right else text.ljust(w)]
        return _wrapped(text, w, justify_right)

    def row_lines(cells: Sequence[str], edge: str) -> list[str]:
        parts = [cell_lines(c, w, r) for c, w, r in zip(cells, inner, right, strict=True)]
        height = max(map(len, parts))
        if height > 1:  # short cells get blank lines: below in rows, above in the header
            header = edge == "┃"
            parts = [
                ([" " * w] * (height - len(p)) + p)
                if header
                else (p + [" " * w] * (height - len(p)))
                for p, w in zip(parts, inner, strict=True)
            ]
        return [
            f"{edge} " + f" {edge} ".join(line) + f" {edge}" for line in zip(*parts, strict=True)
        ]

    out = [] if title is None else [str(title).ljust(total)]
    out.append("┏" + "┳".join("━" * w for w in widths) + "┓")
    out += row_lines(headers, "┃")
    out.append("┡" + "╇".join("━" * w for w in widths) + "┩")
    for row in zip(*(cells for _h, _n, cells in columns), strict=True):
        out += row_lines(row, "│")
    out.append("└" + "┴".join("─" * w for w in widths) + "┘")
    if total > width:  # rich cuts every line at the console's edge
        out = [line[:width] for line in out]
    return "\n".join(out) + "\n"


def _column_widths(
    texts: Sequence[Sequence[str]], fixed: Sequence[int | None], room: int
) -> list[int]:
    """Rich's column widths (padding included) for columns of plain text: each column its
    widest text; when the sum exceeds `room`, the widest columns narrowed in turn
    (Table._collapse_widths), then all evenly (ratio_reduce), and each column measured again
    at its width, never below its `fixed` minimum (the widest number: numbers are not cut)."""
    from rich._ratio import ratio_reduce

    def measured(column: Sequence[str], most: int, floor: int | None) -> int:
        if most < 3:  # no room for a character inside the padding
            widest = max(most, 0)
        else:
            widest = min(max(map(len, column)), most - 2) + 2
        return widest if floor is None else max(widest, floor + 2)

    widths = [measured(t, room, f) or 1 for t, f in zip(texts, fixed, strict=True)]
    if sum(widths) > room:
        widths = Table._collapse_widths(widths, [True] * len(widths), room)
        if sum(widths) > room:
            widths = ratio_reduce(sum(widths) - room, [1] * len(widths), widths, widths)
        widths = [measured(t, w, f) for t, w, f in zip(texts, widths, fixed, strict=True)]
    return widths


def _wrapped(text: str, width: int, justify_right: bool) -> list[str]:
    """`text` wrapped by rich into lines of `width` (words kept whole where they fit, longer
    ones folded), each justified to `width`."""
    from rich.text import Text

    lines = Text(text).wrap(
        _measuring_console(), width, justify="right" if justify_right else "left", overflow="fold"
    )
    return [line.plain.ljust(width)[:width] for line in lines]


@functools.cache
def _measuring_console() -> Console:
    """A console for rich's text wrapping (it measures characters; nothing is printed)."""
    return Console(width=80, color_system=None, markup=False, file=io.StringIO())


def _plain_text(text: str) -> bool:
    """`text` takes one terminal cell per character and prints as it is in a table cell:
    printable ASCII and the missing mark, without leading or trailing blanks."""
    if MISSING in text:
        text = text.replace(MISSING, "-")
    return text.isascii() and text.isprintable() and text == text.strip(" ")


def print_table(console: Console, columns: CellColumns, title: Any = None) -> None:
    """Print a table of display text: written directly where the console emits no styles
    and the table fits (the same characters rich would print), else by rich."""
    if console.color_system is None:
        text = plain_table(columns, console.width, title)
        if text is not None:
            console.out(text, end="", highlight=False)
            return
    console.print(rich_table(columns, title))


def _figure_columns(figures: Mapping[str, Any]) -> list[tuple[str, bool, list]] | None:
    """The ``figure`` and ``value`` columns of a group of figures as (name, numeric, values),
    typed as pandas would type them, without pandas; None when a value is not a plain Python
    scalar (the caller goes through pandas then)."""
    keys, values = list(figures.keys()), list(figures.values())
    out = []
    for name, column in (("figure", keys), ("value", values)):
        kinds = set()
        for v in column:
            if v is None or isinstance(v, bool | str):
                kinds.add(type(v))
            elif type(v) is int and -(1 << 63) <= v < (1 << 63):
                kinds.add(int)
            elif type(v) is float:
                kinds.add(float)
            else:
                return None
        # (an empty column is float64 to pandas: numeric too)
        numeric = kinds <= {int, float, type(None)} and kinds != {type(None)}
        if numeric and kinds != {int}:  # pandas makes it float64 (None -> NaN)
            column = [None if v is None else float(v) for v in column]
        out.append((name, numeric, column))
    return out


def render(
    views: Mapping[str, Result],
    fmt: str = "table",
    console: Console | None = None,
    digits: Mapping[str, int] | None = None,
) -> str | None:
    """Render `views` in `fmt`. ``table`` prints to `console` and returns None; the text
    formats return a string."""
    if fmt == "csv":
        return render_csv(views)
    if fmt == "json":
        return render_json(views)
    if fmt == "markdown":
        return render_markdown(views, digits)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    console = console or Console(markup=False)
    for name, result in views.items():
        print_table(console, table_cells(result, digits), title=name)
    return None


def transposed(
    frame: pd.DataFrame, label: str, digits: Mapping[str, int] | None = None
) -> pd.DataFrame:
    """`frame` turned on its side for narrow terminals: one row per column of `frame` (named
    in ``figure``), one column per row (headed by its `label` value), cells as display text
    with each figure's own precision."""
    import pandas as pd

    digits = digits or {}
    out = {"figure": [str(c) for c in frame.columns if c != label]}
    for _, row in frame.iterrows():
        out[str(row[label])] = [cell_text(row[c], digits.get(str(c))) for c in out["figure"]]
    return pd.DataFrame(out)
