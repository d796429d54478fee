"""Checks of option values shared by the commands, made before any work starts."""

from __future__ import annotations

from collections.abc import Sequence

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
