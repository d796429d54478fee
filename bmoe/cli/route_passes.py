"""``bmoe analyze route --stream``: the route views of a trace larger than memory, computed in
passes over the file (:func:`bmoe.analyze.route.route_views_in_passes`), each holding a group
of whole layers."""

from __future__ import annotations

import warnings
from collections.abc import Collection
from pathlib import Path

from bmoe.analyze import route
from bmoe.cli import console, err_console
from bmoe.errors import BmoeError
from bmoe.render.messages import literal, warning_line
from bmoe.render.tables import render

#: Rows one pass holds at most with --stream (~22 bytes a row in memory, plus the views').
PASS_ROWS = 10_000_000


def print_in_passes(
    trace_path: Path,
    names: list[str],
    *,
    phase: str,
    turn: int | None,
    layers: Collection[int] | None,
    steps: Collection[int] | None,
    top: int,
    fmt: str,
    max_rows: int | None = None,
) -> None:
    """Compute the views `names` of the file in passes and print them as the command does."""
    from bmoe.formats.route import iter_route_rows, read_route_preamble
    from bmoe.render import route as text

    if "matrix" in names:
        raise BmoeError("--stream computes every view but matrix (it needs the rows at once)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        preamble = read_route_preamble(trace_path)
        with err_console.status(literal("computing views in passes over the file")):
            views = route.route_views_in_passes(
                lambda: iter_route_rows(trace_path),
                preamble,
                names,
                phase=phase,
                turn=turn,
                layers=layers,
                steps=steps,
                top=top,
                max_rows=PASS_ROWS if max_rows is None else max_rows,
            )
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False, soft_wrap=True)
    sanity = views.get("sanity")
    if sanity is not None and len(sanity) != 1:
        sanity = None
    notes = text.view_notes(
        views,
        k=preamble.n_expert_used,
        total_steps=int(sanity["steps"].iloc[0]) if sanity is not None else None,
        prefill=phase != "decode",
    )
    if fmt == "table":
        meta = preamble.meta
        facts = {
            key: meta.get(key) for key in ("model", "arch", "n_layer", "n_expert", "n_expert_used")
        }
        facts["phase"] = phase
        if sanity is not None:
            facts["rows"] = int(sanity["rows"].iloc[0])
        text.print_header(console, facts, [])
        text.print_views(console, views, notes)
        return
    out = text.markdown_views(views, notes, []) if fmt == "markdown" else render(views, fmt)
    console.out(out or "", end="")
