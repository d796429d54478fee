"""``bmoe info``, ``bmoe validate``, ``bmoe convert``: what a file is, whether it keeps the
contract, and its Parquet form."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import typer
from rich.text import Text

from bmoe.cli import app, console, err_console
from bmoe.cli.options import check_format
from bmoe.errors import BmoeError
from bmoe.render.messages import error_line, literal, printable
from bmoe.render.outputs import FORMAT_HELP, FORMATS

TARGETS = ("parquet", "csv")  # bmoe.formats.convert.TARGETS, named here for the help text

_FORMAT_HELP = FORMAT_HELP


def _error(message: str) -> None:
    err_console.print(error_line(message), highlight=False, soft_wrap=True)


@app.command()
def info(
    files: list[Path] = typer.Argument(..., help="Telemetry files of any format."),
    fmt: str = typer.Option("table", "--format", "-f", help=_FORMAT_HELP),
) -> None:
    """One screen per file: format and version, model, key parameters, rows, completeness.

    Any file of a run: metrics CSV, traces (CSV or Parquet), stdout, .metrics sidecar, .state.

    Example: bmoe info run.csv trace.route.csv run.out
    """
    # a description uses no linear algebra: OpenBLAS's threads would only spend CPU time (set
    # before numpy loads, for a route trace's columns; a value the user chose is kept)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from bmoe.analyze.views import INFO
    from bmoe.formats.info import describe
    from bmoe.render.tables import render

    check_format(fmt)
    failed = False
    for path in files:
        try:
            views = describe(path)
        except BmoeError as exc:
            _error(str(exc))
            failed = True
            continue
        text = render(views, fmt, console, titles=INFO.titles())
        if text is not None:
            console.out(text, end="")
    if failed:
        raise typer.Exit(2)


@app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="Telemetry files of any format."),
    fmt: str = typer.Option(
        "text", "--format", "-f", help=f"text (one finding per line), {FORMAT_HELP[7:]}"
    ),
) -> None:
    """Check files against the telemetry contract and list the findings with line numbers.

    Exit status: 0 every file is clean, 1 findings (errors or warnings), 2 a file is unreadable.

    Example: bmoe validate run.csv trace.route.csv
    """
    import pandas as pd

    from bmoe.formats.errors import FormatWarning
    from bmoe.formats.validate import validate_file
    from bmoe.render.tables import render

    check_format(fmt, ("text", *FORMATS))
    unreadable = False
    records = []
    for path in files:
        try:
            with warnings.catch_warnings():  # the reader's warnings come back as findings
                warnings.simplefilter("ignore", FormatWarning)
                findings = validate_file(path)
        except BmoeError as exc:
            _error(str(exc))
            unreadable = True
            continue
        for f in findings:
            records.append(
                {"file": str(path), "line": f.line, "severity": f.severity, "message": f.message}
            )
        if fmt == "text":
            for f in findings:
                color = "red" if f.severity == "error" else "yellow"
                console.print(
                    Text.assemble(
                        printable(f"{path}{':' + str(f.line) if f.line else ''}: "),
                        (f.severity, color),
                        ": ",
                        printable(f.message),
                    ),
                    highlight=False,
                    soft_wrap=True,
                )
            errors = sum(f.severity == "error" for f in findings)
            summary = (
                f"{errors} error(s), {len(findings) - errors} warning(s)" if findings else "ok"
            )
            console.print(literal(f"{path}: {summary}"), highlight=False, soft_wrap=True)
    if fmt != "text":
        frame = pd.DataFrame.from_records(
            records, columns=["file", "line", "severity", "message"]
        ).astype({"line": "Int64"})
        text = render({"findings": frame}, fmt, console)
        if text is not None:
            console.out(text, end="")
    if unreadable:
        raise typer.Exit(2)
    if records:
        raise typer.Exit(1)


@app.command()
def convert(
    files: list[Path] = typer.Argument(..., help="Metrics CSVs or route/compute/io traces."),
    to: str = typer.Option("parquet", "--to", help=f"Target format: {' or '.join(TARGETS)}."),
    out_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Directory for the outputs (default: beside each file)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite outputs that exist already."),
) -> None:
    """Convert files to Parquet (preamble and summaries kept in the schema metadata) or back.

    Every reader accepts the Parquet file in place of the CSV; --to csv gives the original bytes.
    An output that exists already is left alone unless --force; an input never is overwritten.

    Example: bmoe convert run.csv trace.route.csv --to parquet -o converted/
    """
    from bmoe.formats.convert import convert_file, output_path

    if to not in TARGETS:
        raise BmoeError(f"cannot convert to {to!r} (choose {' or '.join(TARGETS)})")
    failed = False
    written: dict[Path, Path] = {}  # output -> the input converted into it by this command
    for path in files:
        try:
            dest = output_path(path, to, out_dir)
            if dest in written:
                raise BmoeError(f"{path}: would also be written to {dest} (from {written[dest]})")
            dest = convert_file(path, to, out_dir, force=force, inputs=files)
            written[dest] = path
        except BmoeError as exc:
            _error(str(exc))
            failed = True
            continue
        console.print(literal(f"{path} -> {dest}"), highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(2)
