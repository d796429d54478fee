"""The command-line reference (``docs/cli.md``), generated from the commands' own help.

    python -m bmoe.cli.docs > docs/cli.md

Every command gets its help text (with its examples), its usage line and a table of its
arguments and options; tests/cli/test_docs.py fails when a command or an option is missing
from the committed file, so a new command or option means running the line above again.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from bmoe.cli import cli_command, register

HEADER = """# Command-line reference

Generated from the commands' own help by `python -m bmoe.cli.docs > docs/cli.md`; do not edit
by hand. `bmoe COMMAND --help` prints the same text.
"""


def commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command below ``bmoe`` as (its words, e.g. ("analyze", "route"), the command), in
    alphabetical order; groups are walked, not listed."""
    register()

    def walk(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield path, cmd
            return
        for name in sorted(subs):
            if not subs[name].hidden:
                yield from walk(subs[name], (*path, name))

    yield from walk(cli_command(), ())


def parameter_names(cmd: Any) -> list[str]:
    """How each argument and option of `cmd` is written: ``FILES``, ``--format / -f``, ...;
    ``--help`` left out."""
    names = []
    for param in cmd.params:
        if param.param_type_name == "argument":
            names.append((param.metavar or param.name).upper())
        elif "--help" not in param.opts:
            names.append(" / ".join([*param.opts, *param.secondary_opts]))
    return names


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    value = param.default
    if param.required or value is None or value is False or param.show_default is False:
        return ""
    if isinstance(value, list | tuple):
        if not value:
            return ""
        value = ",".join(str(v) for v in value)
    return f"`{value}`"


def _help_markdown(text: str) -> list[str]:
    """The help text's prose as is, its ``Example:`` lines as one shell block."""
    prose, examples = [], []
    for line in text.strip().splitlines():
        if line.startswith("Example:"):
            examples.append(line.removeprefix("Example:").strip())
        elif examples and line.startswith("("):  # a remark on the example above it
            examples.append("# " + line.strip())
        else:
            prose.append(line)
    out = ["\n".join(prose).strip(), ""]
    if examples:
        out += ["```bash", *examples, "```", ""]
    return out


def command_markdown(path: tuple[str, ...], cmd: Any) -> str:
    """One command's section: heading, help text, usage, then its parameters as a table."""
    name = " ".join(("bmoe", *path))
    usage = [name]
    if any(p.param_type_name == "option" and "--help" not in p.opts for p in cmd.params):
        usage.append("[OPTIONS]")
    for param in cmd.params:
        if param.param_type_name == "argument":
            word = (param.metavar or param.name).upper()
            word += "..." if param.nargs == -1 else ""
            usage.append(word if param.required else f"[{word}]")
    if getattr(cmd, "allow_extra_args", False):  # flags passed through as they are
        usage.append("[ARGS]...")
    lines = [
        f"## {name}",
        "",
        *_help_markdown(cmd.help or ""),
        "Usage: `" + " ".join(usage) + "`",
        "",
    ]
    rows = []
    for param, written in zip(
        [p for p in cmd.params if "--help" not in p.opts], parameter_names(cmd), strict=True
    ):
        help_text = _cell(getattr(param, "help", None) or "")
        if param.required and param.param_type_name == "option":
            help_text += " (required)"
        rows.append(f"| `{written}` | {help_text} | {_default(param)} |")
    if rows:
        lines += ["| argument / option | meaning | default |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(lines)


def reference() -> str:
    """The whole reference as Markdown."""
    parts = [HEADER]
    listed = [path for path, _ in commands()]
    parts.append("\n".join(f"- [bmoe {' '.join(p)}](#bmoe-{'-'.join(p)})" for p in listed) + "\n")
    parts += [command_markdown(path, cmd) for path, cmd in commands()]
    return "\n".join(parts).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
