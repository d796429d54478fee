"""``bmoe info``: what a telemetry file is and what it says."""

from __future__ import annotations

from pathlib import Path

import typer

from bmoe.cli import app, console
from bmoe.formats.info import describe
from bmoe.render.tables import FORMATS, render


@app.command()
def info(
    files: list[Path] = typer.Argument(..., help="Telemetry files of any format."),
    fmt: str = typer.Option("table", "--format", "-f", help=f"One of {', '.join(FORMATS)}."),
) -> None:
    """One screen per file: format and version, model, key parameters, rows, completeness.

    Example: bmoe info run.csv trace.route.csv
    """
    for path in files:
        views = describe(path)
        text = render(views, fmt, console)
        if text is not None:
            console.out(text, end="")
