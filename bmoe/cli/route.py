"""``bmoe analyze route``: what the router asked for, view by view."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

# The route views use no linear algebra: the thread pool OpenBLAS starts when numpy loads
# would only spend CPU time (about 50 ms of a second's run). Set before numpy is imported;
# a value the user chose is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer

from bmoe.analyze import route
from bmoe.analyze.ids import experts_beyond_declared
from bmoe.cli import analyze_app, console, err_console
from bmoe.cli.options import check_format, check_plot
from bmoe.errors import BmoeError
from bmoe.formats.route import read_route_columns
from bmoe.render.messages import literal, note_line, warning_line
from bmoe.render.outputs import FORMAT_HELP
from bmoe.render.tables import render

PLOT_KINDS = ("auto", "reuse", "reuse-bytes", "heatmap", "heatmap-experts", "workset", "hot",
              "overlap")  # fmt: skip
PLOT_FOR_VIEW = {
    "reuse": "reuse",
    "bytes": "reuse-bytes",
    "matrix": "heatmap",
    "cache": "heatmap",
    "workset": "workset",
    "hot": "hot",
    "overlap": "overlap",
}


def parse_ints(text: str | None, what: str) -> list[int] | None:
    """``0-11``, ``0,5,10`` or a mix (``0-3,8``) -> the integers; None stays None."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise BmoeError(
                f"--{what} {text!r}: expected numbers or ranges like 0-11 or 0,5,10"
            ) from None
    if not out:
        raise BmoeError(f"--{what} {text!r} names nothing")
    return out


def parse_views(text: str) -> list[str]:
    if text == "default":
        return list(route.DEFAULT_VIEWS)
    if text == "all":
        return list(route.VIEWS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in route.VIEWS]
    if unknown or not names:
        raise BmoeError(
            f"unknown view {', '.join(unknown) or repr(text)} "
            f"(choose default, all or some of {', '.join(route.VIEWS)})"
        )
    return names


def choose_plot(kind: str, views: list[str], view_text: str, cells: str) -> str:
    """The plot `--plot` draws: `kind` unless ``auto``; then reuse for the view sets, else
    the first chosen view that has a plot (matrix/cache: the heatmap)."""
    if kind != "auto":
        if kind not in PLOT_KINDS:
            raise BmoeError(f"unknown --plot-kind {kind!r} (choose {', '.join(PLOT_KINDS)})")
        return kind
    if view_text in ("default", "all"):
        return "reuse"
    for name in views:
        if name in PLOT_FOR_VIEW:
            if name == "matrix" and cells == "experts":
                return "heatmap-experts"
            return PLOT_FOR_VIEW[name]
    return "reuse"


def draw(kind: str, selected, budget_mib: float | None):
    from bmoe.render.plots import route as plots

    if kind == "reuse":
        return plots.reuse_distance_plot(route.reuse_distances(selected))
    if kind == "reuse-bytes":
        return plots.reuse_distance_plot(route.reuse_bytes_distances(selected), "bytes", budget_mib)
    if kind in ("heatmap", "heatmap-experts"):
        value = "expert" if kind == "heatmap-experts" else "residency"
        return plots.routing_heatmap(route.routing_grid(selected, value), value)
    if kind == "workset":
        return plots.workset_growth_plot(route.workset_curve(selected), budget_mib)
    if kind == "hot":
        n_expert = selected.meta.get("n_expert")
        return plots.hot_concentration_plot(route.expert_counts(selected), n_expert)
    k, n_expert = selected.n_expert_used, selected.meta.get("n_expert")
    chance = 100.0 * k / n_expert if k and n_expert else None
    return plots.overlap_plot(route.overlap(selected, (1, 2, 4, 8, 16, 32)), chance)


@analyze_app.command("route")
def analyze_route(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="A route trace (CSV or Parquet)."),
    view: str = typer.Option(
        "default",
        "--view",
        "-v",
        help="default (all but matrix), all, or names: "
        + ", ".join(route.VIEWS)
        + " (comma-separated).",
    ),
    phase: str = typer.Option("decode", "--phase", help="decode, prefill or all."),
    turn: int | None = typer.Option(None, "--turn", help="Only this session turn."),
    layers: str | None = typer.Option(None, "--layers", help="Layers, e.g. 0-11 or 0,5,10."),
    steps: str | None = typer.Option(
        None, "--steps", help="Steps (the step column: token positions), e.g. 29-44."
    ),
    max_steps: int | None = typer.Option(
        None, "--max-steps", min=1, help="Only the first N steps (after the other filters)."
    ),
    cells: str = typer.Option(
        "experts", "--cells", help="Matrix cells: experts, weights, mb or hit."
    ),
    top: int = typer.Option(8, "--top", min=1, help="Hot experts listed per layer."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Also draw a figure (.png/.svg/.pdf): the reuse-distance plot for the view sets, "
        "else the chosen view's (matrix/cache: routing heatmap, workset: growth vs budget, "
        "hot: concentration, overlap: by lag, bytes: reuse distance in MiB).",
    ),
    plot_kind: str = typer.Option(
        "auto", "--plot-kind", help="Which figure --plot draws: " + ", ".join(PLOT_KINDS) + "."
    ),
    budget_mib: float | None = typer.Option(
        None, "--budget-mib", help="Cache budget line on the workset and reuse-bytes plots."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file that exists."),
    stream: bool = typer.Option(
        False,
        "--stream",
        help="A trace larger than memory (CSV or Parquet): the views in passes over the file, "
        "each holding whole layers of at most 10 M rows; not the matrix, --max-steps or --plot.",
    ),
) -> None:
    """Views of a routing trace: what the router asked for, layer by layer.

    Example: bmoe analyze route trace.csv --view reuse,overlap --phase decode
    Example: bmoe analyze route trace.csv --view matrix --cells hit --steps 29-44 --layers 0-7
    Example: bmoe analyze route huge.route.parquet --stream --view hot,reuse
    """  # fmt: skip
    check_format(fmt)
    if cells not in route.MATRIX_CELLS:
        raise BmoeError(f"unknown --cells {cells!r} (choose {', '.join(route.MATRIX_CELLS)})")
    names = parse_views(view)
    if stream:
        from bmoe.cli.route_passes import print_in_passes

        if max_steps is not None or plot is not None:
            raise BmoeError("--stream does not go with --max-steps or --plot")
        print_in_passes(
            trace_path, names, phase=phase, turn=turn, layers=parse_ints(layers, "layers"),
            steps=parse_ints(steps, "steps"), top=top, fmt=fmt,
        )  # fmt: skip
        return
    kind = choose_plot(plot_kind, names, view, cells) if plot else None
    check_plot(plot, (trace_path,), force=force)
    with (
        warnings.catch_warnings(record=True) as caught,
        _busy(literal("reading trace")),
    ):
        warnings.simplefilter("always")
        trace = read_route_columns(trace_path)  # numpy columns: no pandas on this path
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False, soft_wrap=True)
    if (beyond := experts_beyond_declared(trace)) is not None:
        err_console.print(warning_line(beyond), highlight=False, soft_wrap=True)
    selected, sequence = route.select_sequence(
        trace,
        phase=phase,
        turn=turn,
        layers=parse_ints(layers, "layers"),
        steps=parse_ints(steps, "steps"),
        max_steps=max_steps,
        consume=True,  # the whole trace is not needed again: hold one frame, not two
    )
    said = route.caveats(trace, selected, phase)
    limit = None if (steps is not None or max_steps is not None) else route.MATRIX_STEPS
    with _busy("computing views"):
        views = route.view_columns(
            selected, names, top=top, cells=cells, matrix_limit=limit, sequence=sequence
        )
    if "cache" in views:
        slots = route.prefetch_slot_columns(selected)
        if len(slots["slot"]):  # right after the cache view
            ordered = {}
            for name, frame in views.items():
                ordered[name] = frame
                if name == "cache":
                    ordered["prefetch_slots"] = slots
            views = ordered
    _print(trace, selected, sequence.n_steps, views, said, fmt, cells, phase, limit)
    if plot is not None and kind is not None:
        from bmoe.render.plots import save_figure

        with _busy(literal(f"drawing {kind}")):
            written = save_figure(draw(kind, selected.to_trace(), budget_mib), plot)
        err_console.print(literal(f"wrote {kind} plot to {written}"), highlight=False)


def _busy(what):
    """A spinner on stderr while `what` runs, where stderr is a terminal (elsewhere rich's
    status shows nothing, and would only start its refresh thread)."""
    return err_console.status(what) if err_console.is_terminal else contextlib.nullcontext()


def _print(trace, selected, n_steps, views, said, fmt, cells, phase, limit) -> None:
    from bmoe.render import route as text

    limited = "matrix" in views and limit is not None and n_steps > limit
    notes = text.view_notes(
        views,
        k=trace.n_expert_used,
        cells=cells,
        matrix_limited=limited,
        total_steps=n_steps,
        prefill="phase" in selected.columns and bool((selected.columns["phase"] == 0).any()),
    )
    if fmt == "table":
        meta = trace.meta
        text.print_header(
            console,
            {
                "model": meta.get("model"),
                "arch": meta.get("arch"),
                "n_layer": meta.get("n_layer"),
                "n_expert": meta.get("n_expert"),
                "n_expert_used": meta.get("n_expert_used"),
                "phase": phase,
                "rows": selected.n_rows,
            },
            said,
        )
        if selected.n_rows:
            text.print_views(console, views, notes, cells)
        return
    for c in said:
        err_console.print(note_line(c), highlight=False, soft_wrap=True)
    frames = {name: v if name == "matrix" else route.as_frame(v) for name, v in views.items()}
    out = text.markdown_views(frames, notes, []) if fmt == "markdown" else render(frames, fmt)
    console.out(out or "", end="")
