"""``bmoe history DIR...``: the same cells across archived sweeps, trends and regressions."""

from __future__ import annotations

from pathlib import Path

import typer

from bmoe.cli import app, console, err_console
from bmoe.errors import BmoeError
from bmoe.render.messages import literal, note_line
from bmoe.render.outputs import FORMAT_HELP


@app.command("history")
def history_command(
    folders: list[Path] = typer.Argument(
        ..., help="Sweep folders (bench-data/<date>-<name>), two or more, in any order."
    ),
    outcome: str = typer.Option("tok_s_mean", "--outcome", help="The figure to follow."),
    threshold: str = typer.Option(
        "5%", "--threshold", help="A step worse than this (and its interval) is a regression."
    ),
    fail_on_regression: str | None = typer.Option(
        None,
        "--fail-on-regression",
        metavar="PCT",
        help="Exit 1 when a cell got worse than this into the newest sweep (for CI), e.g. 5%; "
        "only comparable, settled steps count.",
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Draw the outcome per cell across the sweeps (.png/.svg/.pdf)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file that exists."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Line up the same cells (by their axis values) across sweeps ordered by when they
    started: the outcome per cell and sweep with the engine that ran it, the change to the
    newest sweep, every step between consecutive sweeps as a ratio with its 95 % interval,
    and the regressions into the newest sweep.

    Only like is compared with like: sweeps whose base flags (n_predict, the prompt, ...),
    tracing, model (SHA-256) or engine differ are listed as not comparable and no step
    between them is judged; engine version and machine differences are listed. A step is
    judged only when both sweeps' rankings are settled and each side has three or more
    repeats; --fail-on-regression fails only on such steps.

    Example: bmoe history old-sweep/ new-sweep/ --plot trend.png
    Example: bmoe history bench-data/*-tiny-cache-lanes --fail-on-regression 5%
    (in CI: exit 1 on a regression)
    """
    from bmoe.analyze import history as hist
    from bmoe.cli.options import check_format, check_plot
    from bmoe.render.tables import render
    from bmoe.sweep.archive import load_results

    check_format(fmt)
    check_plot(plot, folders, force=force)
    limits = {}
    for name, text in (("--threshold", threshold), ("--fail-on-regression", fail_on_regression)):
        if text is None:
            continue
        try:
            limits[name] = hist.parse_threshold(text)
        except ValueError:
            raise BmoeError(f"{name} {text!r}: give a percentage such as 5%") from None
    gate = limits.get("--fail-on-regression")
    limit = gate if gate is not None else limits["--threshold"]
    if len(folders) < 2:
        raise BmoeError("history needs two or more sweep folders")
    sweeps = {}
    seen: dict[Path, Path] = {}
    for folder in folders:
        try:
            where = folder.resolve()
        except (OSError, RuntimeError):  # a symbolic link loop (RuntimeError before 3.13)
            raise BmoeError(f"{folder}: a symbolic link loop, not a sweep folder") from None
        if where in seen:
            same = "" if str(seen[where]) == str(folder) else f" (as {seen[where]})"
            raise BmoeError(f"{folder}: the same sweep folder given twice{same}")
        seen[where] = folder
        label = folder.name or str(folder)
        if label in sweeps:
            label = str(folder)
        sweeps[label] = load_results(folder)
    found = hist.history_of(sweeps, outcome, limit)
    text = render(found.views(), fmt, console, titles=found.titles())
    if text is not None:
        console.out(text, end="")
    if plot is not None:
        from bmoe.render.plots import save_figure
        from bmoe.render.plots.sweep import trend_lines

        figure = trend_lines(found.lined, outcome, breaks=found.not_comparable)
        err_console.print(literal(f"wrote {save_figure(figure, plot)}"))
    for note in found.notes():
        err_console.print(note_line(note, "NOTE"), highlight=False, soft_wrap=True)
    regressed = found.regressions()
    for row in regressed.itertuples(index=False):
        err_console.print(note_line(row.sentence, "REGRESSION"), highlight=False, soft_wrap=True)
    if gate is not None and len(regressed):
        raise typer.Exit(1)
