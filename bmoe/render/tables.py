"""Render analysis results as rich tables, CSV blocks, JSON or markdown.

Every analysis hands over a mapping of view name -> result, where a result is a DataFrame (a
table: rows of records) or a mapping (a group of named figures). The same mapping renders in
every format, so what the terminal shows is exactly what a script or notebook gets.
"""

from __future__ import annotations

import datetime
import io
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from rich.console import Console

from bmoe.render.messages import literal, printable
from bmoe.render.outputs import FORMATS

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

    Result: TypeAlias = pd.DataFrame | Mapping[str, Any]

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
    if isinstance(value, datetime.date | datetime.time):  # pandas' Timestamp among them
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
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


#: What a spreadsheet reads as the start of a formula (or of a DDE call), and a number.
_FORMULA_START = r"[=+\-@\t\r]"
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def formula_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every text cell and column name that a spreadsheet would run as a formula
    (:data:`bmoe.render.outputs.CSV_FORMULAS`) given a leading ``'``; a text cell that is a
    number (``-1.5``) is left as it is. The one rule of every CSV bmoe writes."""
    import pandas as pd

    out = frame
    for name in frame.columns:
        column = frame[name]
        if not (pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column)
                or isinstance(column.dtype, pd.CategoricalDtype)):  # fmt: skip
            continue
        text = column.astype(object) if isinstance(column.dtype, pd.CategoricalDtype) else column
        try:
            strings = text.str  # only the strings among the values answer (NaN elsewhere)
        except AttributeError:  # no string at all
            continue
        risky = strings.match(_FORMULA_START, na=False) & ~strings.fullmatch(_NUMBER, na=False)
        if risky.any():
            if out is frame:
                out = frame.copy()
            fixed = text.astype(object)
            fixed[risky] = "'" + text[risky].astype(str)
            out[name] = fixed
    names = [_safe_name(str(c)) for c in out.columns]
    if names != [str(c) for c in out.columns]:
        out = out.set_axis(names, axis=1)
    return out


def _safe_name(text: str) -> str:
    return (
        "'" + text if re.match(_FORMULA_START, text) and not re.fullmatch(_NUMBER, text) else text
    )


def frame_csv(frame: pd.DataFrame) -> str:
    """One table as CSV text: formula cells neutralised (:func:`formula_safe`), control
    characters spelled out."""
    return printable(formula_safe(frame).to_csv(index=False, lineterminator="\n"))


def render_csv(views: Mapping[str, Result]) -> str:
    """Each view as a CSV block headed by ``# view=<name>`` (see :func:`frame_csv`)."""
    import pandas as pd

    out = io.StringIO()
    for name, result in views.items():
        out.write(f"# view={printable(name)}\n")
        frame = pd.DataFrame([plain(result)]) if isinstance(result, Mapping) else result
        formula_safe(frame).to_csv(out, index=False, lineterminator="\n")
    return printable(out.getvalue())


def render_json(views: Mapping[str, Result]) -> str:
    import json  # here: a table printed to the terminal needs none of it

    return json.dumps(to_jsonable(views), indent=2, allow_nan=False) + "\n"


_MARKDOWN_CELL = str.maketrans(
    {"|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": "<br>", "\r": ""}
)


def markdown_cell(text: str) -> str:
    """`text` as one markdown table cell: a pipe or newline cannot end the cell or the row,
    and HTML in a value (a prompt, a config string) is shown, not rendered."""
    return printable(text).translate(_MARKDOWN_CELL)


def render_markdown(
    views: Mapping[str, Result],
    digits: Mapping[str, int] | None = None,
    titles: Mapping[str, str] | None = None,
) -> str:
    """Each view as a markdown table under its title (`titles`: slug -> title, see
    :mod:`bmoe.analyze.views`; a view without one is headed by its slug)."""
    out = []
    for name, result in views.items():
        frame = _as_frame(result)
        out.append(f"### {markdown_cell(str((titles or {}).get(name, name)))}\n")
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
    views: Mapping[str, Result],
    digits: Mapping[str, int] | None = None,
    titles: Mapping[str, str] | None = None,
) -> list[Table]:
    """Each view as a rich Table titled with its title (`titles`), else its slug."""
    return [
        rich_table(table_cells(result, digits), title=(titles or {}).get(name, name))
        for name, result in views.items()
    ]


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


#: Characters after which a word too long for its column may break (a header such as
#: ``read_mib_per_token``, a path, a cell id); a word is never cut elsewhere unless it has
#: none within reach.
BREAK_AFTER = "_-/.,:;=+|)]"
#: The narrowest a column of words gets before the table is split: a longer word (a path)
#: breaks at BREAK_AFTER rather than widen its column past this.
WORD_WIDTH = 20
#: The most leading columns repeated in each part of a table too wide for the console.
KEY_COLUMNS = 2


def _pieces(word: str) -> list[str]:
    """`word` cut after each of BREAK_AFTER: ``cache_hit_pct`` -> ``cache_``, ``hit_``, ``pct``."""
    return [p for p in re.split(f"(?<=[{re.escape(BREAK_AFTER)}])", word) if p]


def wrap_text(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters: words kept whole where they fit, a longer
    word broken after one of BREAK_AFTER (see :func:`_break`), or cut at `width` when it has none
    there; explicit newlines kept."""
    width = max(width, 1)
    out: list[str] = []
    for paragraph in text.split("\n"):
        if len(paragraph) <= width:  # as it is, blanks and all
            out.append(paragraph)
            continue
        line = ""
        for word in paragraph.split(" "):
            if not word:
                continue
            if line and len(line) + 1 + len(word) <= width:
                line += " " + word
                continue
            if line:
                out.append(line)
                line = ""
            while len(word) > width:
                cut = _break(word, width)
                out.append(word[:cut])
                word = word[cut:]
            line = word
        out.append(line)
    return out


def _break(word: str, width: int) -> int:
    """Where to break `word` for a line of `width`: after the last ``/`` within reach, else
    after the last of the other BREAK_AFTER, if that leaves a third of the line or more;
    else at `width`."""
    for chars in ("/", BREAK_AFTER):
        cut = max((i + 1 for i, c in enumerate(word[:width]) if c in chars), default=0)
        if cut > width // 3:
            return cut
    return width


def _narrowest(text: str, numeric: bool) -> int:
    """The narrowest a cell lets its column be: a number whole; text its longest word, at
    most WORD_WIDTH (a longer word, a path, breaks after one of BREAK_AFTER)."""
    if numeric:
        return len(text)
    return min(max(map(len, text.split()), default=0), WORD_WIDTH)


def _header_narrowest(header: str) -> int:
    return max((len(p) for w in header.split() for p in _pieces(w)), default=1)


@dataclass(frozen=True)
class TablePart:
    """One table as printed: its title, and per column the header, whether it is a number,
    the cells and the width (text, no padding) every line of them is wrapped to."""

    title: Any
    columns: CellColumns
    widths: list[int]


def layout(
    columns: CellColumns, width: int, title: Any = None, keys: int | None = None
) -> list[TablePart]:
    """How a table of display text fits a console `width` columns wide (a terminal, or 80
    in a pipe or file): each column as wide as its widest text, the widest narrowed first,
    never below what keeps numbers and words whole and headers broken only after ``_`` and
    the like. When even that is too wide the table is split into parts by columns, each part
    repeating the first `keys` columns (the row's name) and titled "..., continued"."""
    headers = [shown(h) for h, _n, _c in columns]
    cols = [(h, n, c) for h, (_h, n, c) in zip(headers, columns, strict=True)]
    cells = [max(map(len, c), default=0) for _h, _n, c in cols]
    natural = [max(len(h), w) for (h, _n, _c), w in zip(cols, cells, strict=True)]
    least = [
        min(nat, max(_header_narrowest(h), max((_narrowest(t, n) for t in c), default=0), 1))
        for (h, n, c), nat in zip(cols, natural, strict=True)
    ]

    def room(n: int) -> int:  # text width left for n columns: borders and one blank each side
        return width - (n + 1) - 2 * n

    if not cols or sum(least) <= room(len(cols)):
        groups = [list(range(len(cols)))]
    else:
        keys = _key_columns(cols) if keys is None else keys
        keys = min(keys, len(cols) - 1)
        if sum(least[:keys]) + max(least[keys:]) > room(keys + 1):
            keys = 0  # the row names alone fill the console: parts without them
        groups = _groups(least, keys, room)
        # Headers kept whole where that takes no more parts.
        whole = [max(w, min(len(h), room(keys + 1) - sum(least[:keys])))
                 for w, (h, _n, _c) in zip(least, cols, strict=True)]  # fmt: skip
        whole_groups = _groups(whole, keys, room)
        if len(whole_groups) == len(groups):
            groups = whole_groups
    parts = []
    for n, group in enumerate(groups):
        widths = _fit(
            [natural[i] for i in group], [least[i] for i in group], room(len(group)),
            [cells[i] for i in group],
        )  # fmt: skip
        label = title if n == 0 or title is None else f"{title}, continued"
        parts.append(TablePart(label, [cols[i] for i in group], widths))
    return parts


def _groups(widths: Sequence[int], keys: int, room: Callable[[int], int]) -> list[list[int]]:
    """Columns after the first `keys` in order, as many to a part as fit `room` (of the
    number of columns) at `widths`, each part led by the `keys` columns."""
    groups: list[list[int]] = []
    part = list(range(keys))
    for i in range(keys, len(widths)):
        trial = [*part, i]
        if len(part) > keys and sum(widths[j] for j in trial) > room(len(trial)):
            groups.append(part)
            trial = [*range(keys), i]
        part = trial
    groups.append(part)
    return groups


def _key_columns(columns: CellColumns) -> int:
    """How many leading columns name a row: up to and including the first text column (a
    rank and a cell id; a figure's name), at most KEY_COLUMNS."""
    for i, (_h, numeric, _c) in enumerate(columns[:KEY_COLUMNS]):
        if not numeric:
            return i + 1
    return 1


def _fit(natural: list[int], least: list[int], room: int, cells: list[int]) -> list[int]:
    """Column widths summing to at most `room`: the natural ones; then headers wider than
    their column's cells broken first (a line or two more in the header), then the widest
    columns narrowed (more lines in every row), never below `least` (a single column wider
    than the console is cut to it)."""
    widths = list(natural)
    for floor in ([max(f, c) for f, c in zip(least, cells, strict=True)], least):
        widths = _narrowed(widths, floor, room)
    if sum(widths) > room and len(widths) == 1:
        widths[0] = max(1, room)
    return widths


def _narrowed(widths: list[int], least: list[int], room: int) -> list[int]:
    """`widths` narrowed, the widest first, until they sum to `room` or reach `least`."""
    widths = list(widths)
    excess = sum(widths) - room
    while excess > 0:
        slack = [i for i, w in enumerate(widths) if w > least[i]]
        if not slack:
            break
        top = max(widths[i] for i in slack)
        widest = [i for i in slack if widths[i] == top]
        below = max([widths[i] for i in slack if widths[i] < top] + [0])
        step = max(1, min(top - below, top - max(least[i] for i in widest),
                          -(-excess // len(widest))))  # fmt: skip
        for i in widest:
            if excess <= 0:
                break
            cut = min(step, widths[i] - least[i], excess)
            widths[i] -= cut
            excess -= cut
    return widths


def rich_table(
    columns: CellColumns, title: Any = None, widths: Sequence[int] | None = None
) -> Table:
    """A rich Table of display text (see :func:`table_cells`); with `widths` (a
    :class:`TablePart`'s), each column that wide and its cells wrapped by :func:`wrap_text`."""
    from rich.table import Table  # here: most tables are printed without it (plain_table)

    table = Table(
        title=None if title is None else literal(title), title_justify="left", header_style="bold"
    )
    for i, (header, numeric, cells) in enumerate(columns):
        if widths is not None:
            table.add_column(
                literal("\n".join(wrap_text(shown(header), widths[i]))),
                justify="right" if numeric else "left",
                width=widths[i],
                overflow="fold",
            )
            continue
        # Numbers are never cut: a narrow terminal folds headers and labels instead.
        widest = max(map(len, cells), default=0) if numeric else None
        table.add_column(
            literal(shown(header)),
            justify="right" if numeric else "left",
            overflow="fold",
            min_width=widest,
        )
    for row in zip(*(cells for _h, _n, cells in columns), strict=True):
        if widths is not None:
            row = tuple("\n".join(wrap_text(c, w)) for c, w in zip(row, widths, strict=True))
        table.add_row(*(literal(cell) for cell in row))
    if not columns or not columns[0][2]:
        table.caption = "(none)"
    return table


def plain_table(columns: CellColumns, width: int, title: Any = None) -> str | None:
    """The characters :func:`print_table` prints on a console of `width` columns that emits
    no styles (output to a file or a pipe), written directly: a few microseconds per cell
    instead of rich's measuring and rendering of every cell. The table is laid out by
    :func:`layout` (several parts, one after the other, when it is too wide), each part's
    title on a line of its own. None when the table needs rich itself: no rows (a caption),
    or text that is not plain (control characters, wide or combining characters, edge
    blanks)."""
    n_rows = len(columns[0][2]) if columns else 0
    if not n_rows:
        return None
    texts = [[shown(h), *cells] for h, _n, cells in columns]
    if not all(_plain_text(t) for column in texts for t in column):
        return None
    if title is not None and not _plain_text(str(title)):
        return None
    return "".join(_plain_part(part) for part in layout(columns, width, title))


def _plain_part(part: TablePart) -> str:
    widths = part.widths
    right = [n for _h, n, _c in part.columns]

    def block(cells: Sequence[str], edge: str, header: bool) -> list[str]:
        lines = [wrap_text(c, w) for c, w in zip(cells, widths, strict=True)]
        height = max(map(len, lines))
        parts = []
        for cell, w, r in zip(lines, widths, right, strict=True):
            cell = [t.rjust(w) if r else t.ljust(w) for t in cell]
            pad = [" " * w] * (height - len(cell))
            parts.append(pad + cell if header else cell + pad)
        return [
            f"{edge} " + f" {edge} ".join(line) + f" {edge}" for line in zip(*parts, strict=True)
        ]

    bars = [w + 2 for w in widths]
    out = [] if part.title is None else [str(part.title)]
    out.append("┏" + "┳".join("━" * b for b in bars) + "┓")
    out += block([h for h, _n, _c in part.columns], "┃", True)
    out.append("┡" + "╇".join("━" * b for b in bars) + "┩")
    for row in zip(*(cells for _h, _n, cells in part.columns), strict=True):
        out += block(row, "│", False)
    out.append("└" + "┴".join("─" * b for b in bars) + "┘")
    return "\n".join(out) + "\n"


def _plain_text(text: str) -> bool:
    """`text` takes one terminal cell per character and prints as it is in a table cell:
    printable ASCII and the missing mark, without leading or trailing blanks."""
    if MISSING in text:
        text = text.replace(MISSING, "-")
    return text.isascii() and text.isprintable() and text == text.strip(" ")


def write_plain(console: Console, text: str) -> None:
    """`text`, already the characters rich would print for it (plain, laid out), written
    straight to the console's file where it emits no styles and records nothing: rich's own
    pass over them (lines, segments, the control-character hook) costs ~0.1 ms a KiB."""
    if console.color_system is None and not console.record:
        console.file.write(text)
    else:
        console.out(text, end="", highlight=False)


def print_line(console: Console, text: Any = "", style: str = "") -> None:
    """`text`, literal, on a line of its own: written straight (:func:`write_plain`) where
    the console emits no styles and it is plain text that fits the width, else by rich
    (which wraps a longer line)."""
    line = str(text)
    if console.color_system is None and len(line) <= console.width and _plain_text(line):
        write_plain(console, line + "\n")
    else:
        console.print(literal(text, style), highlight=False)


def print_table(console: Console, columns: CellColumns, title: Any = None) -> None:
    """Print a table of display text laid out by :func:`layout` for the console's width,
    each part's title on a line of its own: written directly where the console emits no
    styles (the same characters rich would print), else by rich."""
    if console.color_system is None:
        text = plain_table(columns, console.width, title)
        if text is not None:
            write_plain(console, text)
            return
    if not columns:
        if title is not None:
            console.print(literal(title, "italic"), highlight=False, soft_wrap=True)
        console.print(rich_table(columns))
        return
    # (a table without rows too: its headers break where a full one's would, never mid-word)
    for part in layout(columns, console.width, title):
        if part.title is not None:
            console.print(literal(part.title, "italic"), highlight=False, soft_wrap=True)
        console.print(rich_table(part.columns, None, part.widths))


def _figure_columns(figures: Mapping[str, Any]) -> list[tuple[str, bool, list]] | None:
    """The ``figure`` and ``value`` columns of a group of figures as (name, numeric, values),
    typed as pandas would type them, without pandas; None when a value is not a plain Python
    scalar (the caller goes through pandas then)."""
    keys, values = list(figures.keys()), list(figures.values())
    out = []
    for name, column in (("figure", keys), ("value", values)):
        kinds: set[type] = set()
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
    titles: Mapping[str, str] | None = None,
) -> str | None:
    """Render `views` (slug -> result) in `fmt`. ``table`` prints to `console` and returns
    None; the text formats return a string. json and csv name each view by its slug; tables
    and markdown show its title from `titles` (slug -> title, :mod:`bmoe.analyze.views`),
    its slug where it has none."""
    if fmt == "csv":
        return render_csv(views)
    if fmt == "json":
        return render_json(views)
    if fmt == "markdown":
        return render_markdown(views, digits, titles)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    console = console or Console(markup=False)
    for name, result in views.items():
        print_table(console, table_cells(result, digits), title=(titles or {}).get(name, name))
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
