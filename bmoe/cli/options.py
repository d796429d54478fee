"""Options shared by the commands: the declaration of a flag more than one command takes
(one home, so their names, defaults and help agree), and the checks of option values, made
before any work starts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from bmoe.errors import BmoeError

#: ``--output`` / ``-o`` of the commands that make a sweep folder (``sweep``, ``tune``).
OutputRoot = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", help="Output root (default: the config's output, else bench-data/)."
    ),
]
#: ``--plain`` of the commands that show a sweep's live display (``sweep``, ``tune``).
PlainProgress = Annotated[
    bool,
    typer.Option(
        "--plain",
        help="Plain log lines instead of the live display (automatic when stdout is not a "
        "terminal).",
    ),
]


def check_choice(option: str, value: str, allowed: Sequence[str]) -> None:
    """Fail with one line naming `option` when `value` is not one of `allowed`."""
    if value not in allowed:
        raise BmoeError(f"unknown {option} {value!r} (choose from {', '.join(allowed)})")


def check_format(fmt: str, allowed: Sequence[str] | None = None) -> None:
    """The ``--format`` check of every command that renders tables (`allowed` defaults to
    the table formats, :data:`bmoe.render.outputs.FORMATS`)."""
    if allowed is None:
        from bmoe.render.outputs import FORMATS

        allowed = FORMATS
    check_choice("--format", fmt, allowed)


def check_plot(
    plot: Path | None,
    inputs: Iterable[Path | None] = (),
    *,
    force: bool = False,
    also: Sequence[Path] = (),
) -> None:
    """The ``--plot FILE`` check: a plot suffix, never one of `inputs`, and not an existing
    file unless `force`; `also` names the files written beside `plot` (checked the same)."""
    if plot is None:
        return
    from bmoe.formats.outputs import check_output
    from bmoe.render.plots import SUFFIXES

    sources = [p for p in inputs if p is not None]
    check_output(plot, sources, force=force)  # first: an input is named as such
    if plot.suffix.lower() not in SUFFIXES:
        raise BmoeError(f"{plot}: plot files must end in {', '.join(SUFFIXES)}")
    for dest in also:
        check_output(dest, sources, force=force)
