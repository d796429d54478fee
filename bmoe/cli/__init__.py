"""The ``bmoe`` command line: parses arguments, calls the library, renders. Nothing else.

Each command group lives in its own module and registers itself on the apps below; this
module assembles them and turns user errors into one line on stderr instead of a traceback.

A command line imports only what it needs, so ``bmoe --help`` and ``bmoe info FILE`` start
without pandas, pyarrow, numpy or matplotlib. Two rules keep it so:

- Every module in ``COMMAND_MODULES`` is imported by every command line, unless it is named
  in ``LAZY_COMMANDS``. At its top such a module imports only the standard library, typer,
  rich and light bmoe modules (``bmoe.cli``, ``bmoe.errors``, ``bmoe.render.outputs``);
  the library, pandas and the renderers are imported inside the command functions.
- A module whose commands all live under a group (``bmoe analyze ...``, ``bmoe export ...``)
  may instead be named in ``LAZY_COMMANDS`` (command path -> module): it is imported only when
  the command line names one of its commands, or names the group alone (the group's help lists
  every command), and may then import what its commands need at its top.
- A command line that names a command of ``LAZY_COMMANDS`` imports that module alone: none of
  the others is imported nor built into the click command (~25 ms of a route command's start).
  The command runs, and its help and errors read, as with every module registered.

A new command: its module in ``COMMAND_MODULES`` and, if it lives under a group, its path in
``LAZY_COMMANDS``. ``tests/cli/test_startup.py`` checks the first rule; ``register()`` with
no command line imports every module (for tools that list all commands).
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import typer
from rich.console import Console

from bmoe.errors import BmoeError
from bmoe.render.messages import error_line, guarded, labelled, warning_line

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


def _print_version(value: bool) -> None:
    if value:
        from bmoe._version import __version__

        console.print(f"bmoe {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    pass


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
    "bmoe.cli.op_traces",
    "bmoe.cli.replay",
    "bmoe.cli.engine",
    "bmoe.cli.report",
    "bmoe.cli.history",
    "bmoe.cli.predict",
    "bmoe.cli.tune",
)

#: Commands whose module is imported only when the command line names them (or their group):
#: command path -> module. See the module docstring.
LAZY_COMMANDS = {
    "analyze metrics": "bmoe.cli.runs",
    "analyze stall": "bmoe.cli.runs",
    "analyze compare": "bmoe.cli.runs",
    "analyze contamination": "bmoe.cli.runs",
    "analyze route": "bmoe.cli.route",
    "analyze replay": "bmoe.cli.replay",
    "analyze drop": "bmoe.cli.replay",
    "analyze decode": "bmoe.cli.op_traces",
    "export trace": "bmoe.cli.op_traces",
}

# Plain strings are never read as markup (they may quote a file); styled lines are built as
# rich Text by bmoe.render.messages.
# Whatever they print has its control characters shown escaped (bmoe.render.messages).
console = guarded(Console(markup=False))
err_console = guarded(Console(stderr=True, markup=False))


def modules_for(argv: Sequence[str] | None) -> list[str]:
    """The command modules a command line needs: every module when `argv` is None; only the
    lazy module of the command it names, when it names one of LAZY_COMMANDS; else the modules
    not in LAZY_COMMANDS, plus every lazy module of the group it names without a known command
    (``bmoe analyze --help``)."""
    if argv is None:
        return list(COMMAND_MODULES)
    words = [w for w in argv if not w.startswith("-")][:2]  # the root takes no option values
    path = " ".join(words)
    if path in LAZY_COMMANDS:
        return [LAZY_COMMANDS[path]]
    lazy = set(LAZY_COMMANDS.values())
    needed = [name for name in COMMAND_MODULES if name not in lazy]
    if words:
        prefix = words[0] + " "
        needed += [m for p, m in LAZY_COMMANDS.items() if p.startswith(prefix)]
    return [name for name in COMMAND_MODULES if name in needed]  # help lists in this order


def register(argv: Sequence[str] | None = None) -> None:
    """Import the command modules `argv` needs (all of them when it is None), which
    registers their commands on the apps above."""
    for name in modules_for(argv):
        importlib.import_module(name)


def reflowed(text: str | None) -> str | None:
    """Help text with the line breaks of the source code joined, so that the terminal wraps
    each paragraph at its own width. A line stays a line of its own when it is an example
    (``Example: ...``), a remark in parentheses right after one, an item (``- ...``) or
    indented; a paragraph that starts with ``\\b`` is kept as written."""
    if not text:
        return text
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines: list[str] = []
        example = False
        for line in paragraph.splitlines():
            stripped = line.strip()
            alone = (
                stripped.startswith(("Example:", "- "))
                or (example and stripped.startswith("("))
                or line.startswith((" ", "\t"))
            )
            if lines and not alone:
                lines[-1] += " " + stripped
            else:
                lines.append(line.rstrip())
            example = stripped.startswith("Example:") or (example and stripped.startswith("("))
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def cli_command() -> Any:
    """The click command of :data:`app` (typer's own click; with the commands registered so
    far), every help text :func:`reflowed`."""
    command = typer.main.get_command(app)

    def walk(cmd: Any) -> None:
        cmd.help = reflowed(cmd.help)
        if cmd.help and not cmd.short_help:  # a group's listing: the first sentence
            first = cmd.help.split("\n\n", 1)[0].split("\n", 1)[0]
            cmd.short_help = re.split(r"(?<=\.) (?=[A-Z])", first, maxsplit=1)[0]
        for param in cmd.params:
            if getattr(param, "help", None):  # options (arguments have no help here)
                param.help = reflowed(param.help)
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(command)
    return command


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
    args = sys.argv[1:] if argv is None else list(argv)
    register(args)
    try:
        cli_command()(args=args, prog_name="bmoe")
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


def run() -> None:
    """The ``bmoe`` script and ``python -m bmoe``: :func:`main`, then the exit, without the
    interpreter's teardown once the exit handlers have run and the output is flushed. The
    teardown frees every module and array one by one (~25 ms of CPU after a route command on
    a million rows), and in a process that loaded pyarrow, its C++ thread pools, destroyed
    there, abort the process now and then (``terminate called without an active
    exception``, exit 134, after the command's work is done). A command that leaves threads
    of its own running exits normally: the normal exit waits for them.

    The command's modules load with the cyclic garbage collector off (they make tens of
    thousands of objects and no garbage, so its collections there only walk them: ~5 ms of
    a short command), then those objects are frozen out of its sight and it runs again."""
    gc.disable()
    register(sys.argv[1:])  # what main() registers: imported here, found there
    gc.freeze()
    gc.enable()
    code = main()
    import threading

    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    import atexit
    import contextlib

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
