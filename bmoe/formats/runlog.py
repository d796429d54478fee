"""What a run printed: the ``BMOE_*`` stream, the end-of-run lines, and any device figures.

One reader for both shapes of a run's stdout: a ``--progress`` / ``--session`` stream (events,
then possibly the banners and end-of-run lines) and a plain log (loader chatter, the answer,
the end-of-run lines, and on the phone farm the sampler's ``key=value`` lines appended).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from bmoe.formats import protocol
from bmoe.formats.csvtable import BOM, PathLike, read_bytes
from bmoe.formats.errors import FormatError
from bmoe.formats.sidecar import parse_pressure

E = TypeVar("E", bound=protocol.Event)

#: Compact dtypes of the per-token progress table.
PROGRESS_DTYPES = {
    "turn": np.int16, "step": np.int32, "steps": np.int32, "majflt": np.int64,
    "reset": np.int8,
}  # fmt: skip


@dataclass
class RunOutput:
    """A run's stdout: events in order, end-of-run figures, appended device figures."""

    path: str | None
    events: list[protocol.Event]
    figures: dict[str, Any]  # from the end-of-run lines (see protocol.parse_run_lines)
    pressure: dict[str, Any] = field(default_factory=dict)  # key=value lines after them
    answer: bytes | None = None  # the text under ``=== answer ===``, when printed
    failure: str | None = None  # the engine's last ``error: ...`` line (a run that did not start)
    warnings: list[str] = field(default_factory=list)

    @property
    def is_stream(self) -> bool:
        """The output carries ``BMOE_*`` events (``--progress`` or ``--session``)."""
        return bool(self.events)

    def of(self, kind: type[E]) -> list[E]:
        """The events of one type, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def generations(self) -> list[protocol.Done]:
        return self.of(protocol.Done)

    @property
    def errors(self) -> list[protocol.Error]:
        return self.of(protocol.Error)

    def tag_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.tag] = counts.get(event.tag, 0) + 1
        return counts

    def progress(self) -> pd.DataFrame:
        """One row per ``BMOE_PROGRESS``: its keys, ``turn`` (0-based request index in a
        session, 0 for a one-shot run) and the preceding ``BMOE_LOAD``'s ``load_mb`` /
        ``load_ms`` (NaN when that token read nothing).

        Text deltas are shown with undecodable bytes as U+FFFD; the exact bytes stay on the
        events (``Progress.delta_text_bytes``)."""
        records: list[dict[str, Any]] = []
        turn = -1
        load: protocol.Event | None = None
        for event in self.events:
            if isinstance(event, protocol.Begin):
                turn += 1
            elif isinstance(event, protocol.Load):
                load = event
            elif isinstance(event, protocol.Progress):
                rec = {"turn": max(turn, 0), **event.data}
                for key in ("delta_text", "delta_reasoning"):
                    if isinstance(rec.get(key), str):
                        rec[key] = protocol.printable(rec[key])
                rec["load_mb"] = load.get("mb", np.nan) if load is not None else np.nan
                rec["load_ms"] = load.get("ms", np.nan) if load is not None else np.nan
                records.append(rec)
                load = None
        frame = pd.DataFrame.from_records(records)
        for col, dtype in PROGRESS_DTYPES.items():
            if col in frame and not frame[col].isna().any():
                frame[col] = frame[col].astype(dtype)
        return frame


def _answer(data: bytes) -> bytes | None:
    start = data.find(b"=== answer ===\n")
    if start < 0:
        return None
    body = data[start + len(b"=== answer ===\n") :]
    end = body.find(b"\n=== perf ===")
    return body if end < 0 else body[:end]


def read_run_output(source: PathLike | bytes) -> RunOutput:
    """Read a run's stdout (progress/session stream or plain log)."""
    data, path = read_bytes(source)
    if data.startswith(BOM):
        data = data[len(BOM) :]
    if not data.strip():
        raise FormatError(path, None, "file is empty")
    if b"\x00" in data[:4096]:
        raise FormatError(path, None, "binary data, not a run's output")
    notes: list[str] = []
    events = list(protocol.iter_events(data.splitlines(keepends=True), path=path, notes=notes))
    text = protocol.to_text(data)
    figures = protocol.parse_run_lines(text)
    lines = text.splitlines()
    last = max(
        (i for i, ln in enumerate(lines) if ln.strip().startswith(protocol.RUN_PREFIXES)),
        default=-1,
    )
    pressure = parse_pressure("\n".join(lines[last + 1 :])) if last >= 0 else {}
    failures = [ln.strip() for ln in lines if ln.startswith("error: ")]
    failure = protocol.printable(failures[-1][len("error: ") :]) if failures else None
    return RunOutput(path, events, figures, pressure, _answer(data), failure, notes)


_STREAMING_LINE = re.compile(r"expert streaming ON\b(?P<rest>.*)$", re.MULTILINE)


def streaming_line(text: str) -> dict[str, Any]:
    """``io_threads`` and ``cache`` (MiB) from the engine's ``expert streaming ON`` log line."""
    match = _STREAMING_LINE.search(text)
    if match is None:
        return {}
    rest = match["rest"]
    out: dict[str, Any] = {}
    lanes = re.search(r"io_threads=(\d+)", rest)
    if lanes:
        out["io_threads"] = int(lanes[1])
    cache = re.search(r"cache=(\d+(?:\.\d+)?)\s*MiB", rest)
    if cache:
        out["cache"] = float(cache[1])
    return out
