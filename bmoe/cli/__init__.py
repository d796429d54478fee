"""The ``bmoe`` command line: parses arguments, calls the library, renders. Nothing else.

Each command group lives in its own module and registers itself on the apps below; this
module assembles them and turns user errors into one line on stderr instead of a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import typer
from rich.console import Console

from bmoe.errors import BmoeError
from bmoe.render.messages import error_line, labelled, warning_line

app = typer.Typer(
    name="bmoe",
    help="Benchmark and analyse mixture-of-experts models that stream experts from flash.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
analyze_app = typer.Typer(
    help="Analyse route, decode and metrics files, and archived sweeps.",
    no_args_is_help=True,
)
app.add_typer(analyze_app, name="analyze")
export_app = typer.Typer(
    help="Export telemetry to other tools' formats (Perfetto / Chrome traces).",
    no_args_is_help=True,
)
app.add_typer(export_app, name="export")

#: Command modules; importing one registers its commands on the apps above.
COMMAND_MODULES = (
    "bmoe.cli.formats",
    "bmoe.cli.runs",
    "bmoe.cli.route",
    "bmoe.cli.sweep",
    "bmoe.cli.decode",
    "bmoe.cli.replay",
    "bmoe.cli.engine",
    "bmoe.cli.report",
)

# Plain strings are never read as markup (they may quote a file); styled lines are built as
# rich Text by bmoe.render.messages.
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)


def register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error and return the Exit to raise."""
    err_console.print(error_line(message), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (``warning: file:line: problem``), never a source dump."""
    err_console.print(warning_line(message), highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bmoe`` script and ``python -m bmoe``."""
    warnings.showwarning = _show_warning
    register()
    try:
        app(args=argv, prog_name="bmoe")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BmoeError as exc:
        err_console.print(error_line(exc), highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:  # a bug, but still one line (BMOE_DEBUG=1 shows the traceback)
        if os.environ.get("BMOE_DEBUG"):
            raise
        err_console.print(
            labelled(
                "internal error:",
                "bold red",
                f"{type(exc).__name__}: {exc} (run with BMOE_DEBUG=1 for the traceback)",
            ),
            highlight=False,
            soft_wrap=True,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
