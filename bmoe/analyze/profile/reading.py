"""Runs as the profile sees them, from what was read of their files.

Reading a run's files (its metrics, the traces, ``record.json``, end-of-run lines and pressure
sidecar beside it) is the formats layer's (:func:`bmoe.formats.runfiles.read_recorded_runs`);
this module turns each run read into one :class:`ProfileRun`, reading nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from bmoe.analyze.profile.runs import ProfileRun

if TYPE_CHECKING:
    from bmoe.formats.runfiles import RecordedRun


def profile_run(recorded: RecordedRun) -> ProfileRun:
    """One run read (its metrics, traces by kind, record, end-of-run figures, pressure and
    streaming line) as a :class:`ProfileRun`."""
    traces = recorded.traces
    return ProfileRun(
        recorded.metrics,
        route=traces.get("route"),
        io=traces.get("io"),
        compute=traces.get("compute"),
        record=recorded.record,
        log=dict(recorded.figures),
        pressure=dict(recorded.pressure),
        streaming_line=dict(recorded.streaming_line),
    )


def profile_runs(recorded: Iterable[RecordedRun]) -> list[ProfileRun]:
    """:func:`profile_run` of each run read, in order."""
    return [profile_run(r) for r in recorded]


__all__ = ["profile_run", "profile_runs"]
