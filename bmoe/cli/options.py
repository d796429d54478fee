"""Checks of option values shared by the commands, made before any work starts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from bmoe.errors import BmoeError


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
