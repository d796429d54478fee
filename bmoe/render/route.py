"""The route views as text: tables with their notes, the wide step x layer matrix split into
bands that fit the terminal, and the caveats said before anything else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from rich.console import Console
from rich.text import Text

from bmoe.analyze.route_cells import IntsWithGaps
from bmoe.analyze.views import ROUTE
from bmoe.render.messages import literal, note_line, printable
from bmoe.render.tables import (
    MISSING,
    CellColumns,
    cell_text,
    print_line,
    print_table,
    render,
    shown,
    table_cells,
    value_cells,
)

if TYPE_CHECKING:
    import pandas as pd

    #: A view as a DataFrame or as columns of numpy arrays (:data:`bmoe.analyze.route.View`).
    AnyView: TypeAlias = pd.DataFrame | Mapping[str, np.ndarray]

#: Display precision per column (the DataFrames keep full precision).
DIGITS = {
    "coverage_pct": 1,
    "lag_1": 1,
    "lag_2": 1,
    "lag_4": 1,
    "lag_8": 1,
    "union_mib": 1,
    "miss_pct": 1,
    "hit_pct": 1,
    "prefetch_pct": 1,
    "entropy_bits": 2,
    "top1_pct": 1,
    "read_mib": 1,
    "expert_mib": 2,
    "dense_mib": 1,
    "mib_per_step": 2,
    "weight_sum_min": 3,
    "weight_sum_max": 3,
    "share_pct": 1,
    "of_slot_pct": 1,
}

#: slug -> title of every route view (the catalogue's).
TITLES = ROUTE.titles()

LETTER_STYLES = {"H": "green", "M": "red", "P": "blue"}


def _column(view: AnyView, name: str) -> Any:
    """One column of a view (a DataFrame's or a numpy view's) as an array."""
    values = view[name]
    return values if isinstance(values, np.ndarray | IntsWithGaps) else values.to_numpy()


def _first(view: AnyView) -> dict[str, Any]:
    """The first row of a view as name -> plain value (None where missing)."""
    out = {}
    for name in view:
        value = _column(view, str(name))[0]
        out[str(name)] = None if value is None else _item(value)
    return out


def _item(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def _n_rows(view: AnyView) -> int:
    names = list(view)
    return len(_column(view, str(names[0]))) if names else 0


def view_notes(
    views: Mapping[str, AnyView],
    *,
    k: int | None = None,
    cells: str = "experts",
    matrix_limited: bool = False,
    total_steps: int | None = None,
    prefill: bool = False,
) -> dict[str, list[str]]:
    """The sentences that go under each view: what a figure means, the totals the table's
    ALL row holds, what is absent."""
    notes: dict[str, list[str]] = {}
    if "sanity" in views and _n_rows(views["sanity"]):
        s = _first(views["sanity"])
        lines = [
            f"{s['cells']} cells (step, layer) over {s['steps']} steps x {s['layers']} MoE layers"
        ]
        if s["steps_per_layer_min"] != s["steps_per_layer_max"]:
            lines.append(
                f"steps per layer are uneven ({s['steps_per_layer_min']}..."
                f"{s['steps_per_layer_max']}): expected in prefill, where the last layer "
                "routes only the final prompt token"
            )
        if _known(s["weight_sum_min"]):
            lines.append("weight sum per cell about 1.0 means the gating normalises")
        notes["sanity"] = lines
    if "reuse" in views:
        notes["reuse"] = [
            "never_2nd = experts this layer routed exactly once (pure cache pollution under LRU)."
        ]
    if "workset" in views and _n_rows(views["workset"]):
        ws = views["workset"]
        marks = [c for c in map(str, ws) if c.startswith("s") and c[1:].isdigit()]
        union = _column(ws, "union_mib")[_column(ws, "layer") == "ALL"]
        if marks and len(union) and _known(float(union[0])):
            notes["workset"] = [
                f"At step {marks[-1][1:]} the union of routed experts is {union[0]:.1f} MiB "
                "of expert weights across all layers: a working set that fits the cache is a "
                "cache that stops missing."
            ]
    if "cache" in views and _n_rows(views["cache"]):
        notes["cache"] = []
        if "prefetch_slots" not in views:
            notes["cache"].append(
                "no prefetch hits recorded (--prefetch off, or every guess missed)."
            )
        if prefill:
            notes["cache"].append(
                "in prefill every routing that faced a cold cache counts as a miss, but the "
                "expert is read once per batch: miss_pct over-counts reads (the bytes view "
                "measures them)."
            )
    if "entropy" in views and k:
        notes["entropy"] = [f"max entropy = {np.log2(k):.2f} bits at k={k}"]
    if "bytes" in views and _n_rows(views["bytes"]):
        by = views["bytes"]
        at = int(np.flatnonzero(_column(by, "layer") == "ALL")[0])
        total = {c: _column(by, c)[at] for c in ("read_mib", "mib_per_step", "dense_mib")}
        steps = f" over {total_steps} steps" if total_steps else ""
        notes["bytes"] = [
            f"total {total['read_mib']:.1f} MiB{steps} ({total['mib_per_step']:.2f} MiB/step "
            "average)",
            f"dense total {total['dense_mib']:.1f} MiB - static: mmap-resident, never streamed, "
            "so this is what a cold layer costs to page in, not a per-step measurement.",
        ]
    if "matrix" in views:
        legend = {
            "experts": "'*' = also routed at this layer on the previous row",
            "weights": "routing weights in slot order",
            "mb": "MiB read by the cell",
            "hit": "H = hit, M = miss, P = prefetch hit, in slot order",
        }[cells]
        lines = [f"cells: {cells} ({legend})"]
        if matrix_limited:
            lines.append(
                f"showing the first {_n_rows(views['matrix'])} steps; use --steps to pick a window"
            )
        notes["matrix"] = lines
    return notes


def print_header(console: Console, facts: Mapping[str, Any], caveats: Sequence[str]) -> None:
    """Model facts on two lines, then every caveat, loudly."""
    parts: list[Any] = []
    for k, v in facts.items():
        if v is not None:
            parts += ["   " if parts else "", (k, "bold"), " ", shown(printable(v))]
    console.print(Text.assemble(*parts), highlight=False)
    for text in caveats:
        console.print(note_line(text), highlight=False)


def print_views(
    console: Console,
    views: Mapping[str, AnyView],
    notes: Mapping[str, Sequence[str]],
    cells: str = "experts",
) -> None:
    """Each view under its title, then its notes. Views may be DataFrames or numpy columns
    (the matrix: a DataFrame)."""
    for name, frame in views.items():
        print_line(console)
        if name == "matrix":
            print_matrix(console, frame, cells)
        else:
            print_line(console, f"=== {TITLES.get(name, name)} ===", "bold")
            if name == "sanity" and _n_rows(frame) == 1:
                print_table(console, table_cells(_figures(frame), DIGITS))
            else:
                print_table(console, view_cells(frame))
        for text in notes.get(name, ()):
            print_line(console, text, "dim")


def markdown_views(
    views: Mapping[str, pd.DataFrame], notes: Mapping[str, Sequence[str]], caveats: Sequence[str]
) -> str:
    out = [f"> **NOTE** {c}\n" for c in caveats]
    for name, frame in views.items():
        out.append(render({name: frame}, "markdown", digits=DIGITS) or "")
        out.extend(f"_{t}_\n" for t in notes.get(name, ()))
    return "\n".join(out)


def view_cells(view: AnyView) -> CellColumns:
    """A view's display text, column by column, with the precision of DIGITS."""
    if not isinstance(view, Mapping):
        return table_cells(view, DIGITS)
    columns = []
    for name, values in view.items():
        # numeric as pandas reads the dtype: integers (with gaps or not) and floats, not bools
        numeric = values.dtype.kind in "iuf"
        columns.append((name, numeric, values.tolist()))
    return value_cells(columns, DIGITS)


def _figures(view: AnyView) -> dict[str, str]:
    """A one-row view as figure -> display text (its precision from DIGITS)."""
    return {name: cell_text(value, DIGITS.get(name)) for name, value in _first(view).items()}


def _styled(text: Any, cells: str) -> Text:
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return Text(MISSING, style="dim")
    text = str(text)
    if cells == "hit":
        out = Text()
        for ch in text:
            out.append(ch, style=LETTER_STYLES.get(ch, ""))
        return out
    if cells == "experts":
        out = Text()
        for i, token in enumerate(text.split(" ")):
            if i:
                out.append(" ")
            out.append(token, style="cyan" if token.startswith("*") else "")
        return out
    return Text(text)


def _bands(names: list[str], widths: list[int], room: int) -> list[list[str]]:
    """The fewest bands of consecutive columns, evenly sized, each fitting `room`."""
    for n in range(1, len(names) + 1):
        per = -(-len(names) // n)
        starts = range(0, len(names), per)
        if all(sum(widths[i : i + per]) <= room for i in starts):
            return [names[i : i + per] for i in starts]
    return [[name] for name in names]


def print_matrix(console: Console, frame: pd.DataFrame, cells: str = "experts") -> None:
    """The step x layer matrix in bands of layers that fit the console width."""
    from rich import box  # here: the other views print without rich's tables
    from rich.table import Table

    layer_cols = [c for c in frame.columns if str(c).startswith("L")]
    index_cols = [c for c in frame.columns if c not in layer_cols]
    if not len(frame):
        console.print(Text("matrix: nothing to show", style="dim"))
        return
    widths = {
        c: max(len(c), int(frame[c].map(lambda v: len(str(v)) if v is not None else 1).max()))
        for c in layer_cols
    }
    index_width = sum(max(len(str(c)), len(str(frame[c].max()))) + 3 for c in index_cols)
    room = max(console.width - index_width - 2, 20)
    bands = _bands(layer_cols, [widths[c] + 3 for c in layer_cols], room)
    for band in bands:
        title = f"=== {TITLES['matrix']} - cells: {cells}"
        if len(bands) > 1:
            title += f" ({band[0]}..{band[-1]})"
        console.print(Text(f"{title} ===", style="bold"), highlight=False)
        table = Table(box=box.SIMPLE_HEAD, header_style="bold")
        for c in index_cols:
            table.add_column(str(c), justify="right", no_wrap=True)
        for c in band:
            table.add_column(c, no_wrap=True, min_width=widths[c])
        for rec in frame[index_cols + band].itertuples(index=False, name=None):
            idx = [literal(v) for v in rec[: len(index_cols)]]
            table.add_row(*idx, *(_styled(v, cells) for v in rec[len(index_cols) :]))
        console.print(table)
