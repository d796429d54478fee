"""Where cells run: this host, a device over ``adb``, a host over ``ssh``.

A :class:`Target` knows how to run a fixed shell script with arguments on its machine, start
the engine under the pressure sampler, move files, and stop what it started. Values from the
configuration never reach a shell unquoted: locally every command is an argv list (values are
positional parameters of a fixed script); over adb and ssh, each value is quoted with
:func:`shlex.quote`, and the engine's command line travels as a pushed script file.

The interface is small on purpose: a distributed executor places the same cell code next to
a target on another host and only needs :func:`open_target` there.

Each kind of target lives in its own module (:mod:`~bmoe.sweep.targets.local`,
:mod:`~bmoe.sweep.targets.adb`, :mod:`~bmoe.sweep.targets.ssh`) with its configuration keys
and checks, its defaults and its transport; :data:`KINDS` below is the one place they are
registered. A new kind is one new module and one line here (plus its fields in
:class:`~bmoe.sweep.targets.base.TargetSpec` when it has keys of its own).
"""

from __future__ import annotations

from pathlib import Path

from bmoe.sweep.targets import adb, local, ssh
from bmoe.sweep.targets.base import Target, TargetError, TargetKind, TargetSpec

#: Every kind of target, by the name ``[[targets]] kind`` gives.
KINDS: dict[str, TargetKind] = {kind.name: kind for kind in (local.KIND, adb.KIND, ssh.KIND)}

__all__ = ["KINDS", "Target", "TargetError", "TargetKind", "TargetSpec", "open_target"]


def open_target(spec: TargetSpec, state_dir: Path) -> Target:
    """The transport for `spec`; `state_dir` is a host-side folder for its bookkeeping."""
    return KINDS[spec.kind].transport(spec, state_dir)
