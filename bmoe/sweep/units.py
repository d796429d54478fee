"""A unit of a sweep run next to its target: its runs back to back, each attempted until it
completes (plain), or as the turns of one engine process (session mode,
:mod:`bmoe.sweep.sessions`).

The executors (:mod:`bmoe.sweep.local`, :mod:`bmoe.sweep.farm`) call :func:`run_unit` without
knowing what a unit holds.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from bmoe.errors import BmoeError
from bmoe.sweep.archive import resume_command
from bmoe.sweep.attempt import CellContext
from bmoe.sweep.attempts import run_with_retries
from bmoe.sweep.plan import Unit
from bmoe.sweep.sessions import run_session_unit
from bmoe.sweep.targets import Target


def run_unit(
    unit: Unit, target: Target, ctx: CellContext, emit: Callable[[dict[str, Any]], None]
) -> None:
    """Run the runs of `unit` back to back on `target` (turns of one engine process in
    session mode), archiving each attempt and passing its record to `emit`."""
    try:
        if unit.session:
            run_session_unit(unit, target, ctx, emit)
            return
        for run in unit.runs:
            if ctx.stop.is_set():
                return
            run_with_retries(run, target, ctx, emit)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        ctx.stop.set()  # the other targets end their attempts too
        where = f" writing {exc.filename}" if exc.filename else ""
        raise DiskFull(
            f"{ctx.archive.root}: no space left on the device{where}; the runs stopped "
            f"(free space, then resume with: {resume_command(ctx.archive.root)})"
        ) from None


class DiskFull(BmoeError):
    """The sweep folder's filesystem is full: the sweep stops (completed runs are kept)."""
