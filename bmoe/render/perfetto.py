"""Chrome trace-event JSON (what Perfetto and chrome://tracing open) from a decode timeline.

One process per run; inside it a ``decode steps`` track (one slice per step), a ``compute``
track (graph nodes or layer segments) and one track per io lane (each read a slice, with its
``(layer, expert, proj)``, offset and bytes as args). Slices are complete events (``ph: "X"``)
with microsecond timestamps; a track never holds two overlapping slices — if recorded times
overlap on one lane, the overlapping reads move to an extra track beside it.

The slices are serialised column-wise by pandas (``to_json``), so a trace of a million nodes
is written without a Python loop over its rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.timeline import Timeline
from bmoe.errors import BmoeError
from bmoe.render.tables import plain

PID = 1
TID_STEPS = 1
TID_COMPUTE = 2
TID_LANE0 = 10  # lane n is TID_LANE0 + n; overflow tracks go above every lane
PHASES = {0: "prefill", 1: "decode"}


def overlap_levels(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A level per slice such that slices sharing a level never overlap (touching is fine).

    Level by level, keep each slice that starts at or after the end of every earlier
    remaining slice; the rest go one level down (a vectorised greedy: it may use a level more
    than the minimum when overlaps chain). Slices must be sorted by start.
    """
    n = len(start)
    level = np.zeros(n, dtype=np.int64)
    remaining = np.arange(n)
    depth = 0
    while remaining.size:
        s = start[remaining]
        e = end[remaining]
        reach = np.maximum.accumulate(e)
        prev = np.concatenate([[np.iinfo(np.int64).min], reach[:-1]])
        keep = s >= prev
        level[remaining[keep]] = depth
        remaining = remaining[~keep]
        depth += 1
    return level


def _slices(
    frame: pd.DataFrame, names: pd.Series, cat: pd.Series | str, tid: np.ndarray, args: list[str]
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": names.to_numpy(),
            "cat": cat if isinstance(cat, str) else cat.to_numpy(),
            "ph": "X",
            "ts": frame["start_ns"].to_numpy(np.int64) / 1e3,
            "dur": frame["dur_ns"].to_numpy(np.int64) / 1e3,
            "pid": PID,
            "tid": tid,
            "args": frame[args].to_dict("records"),
        }
    )


def _split_overlaps(frame: pd.DataFrame, tid: np.ndarray) -> np.ndarray:
    """Move overlapping slices of each track to sub-tracks; returns the sub-track per row."""
    sub = np.zeros(len(frame), dtype=np.int64)
    start = frame["start_ns"].to_numpy(np.int64)
    end = start + frame["dur_ns"].to_numpy(np.int64)
    for t in np.unique(tid):
        idx = np.flatnonzero(tid == t)
        order = idx[np.argsort(start[idx], kind="stable")]
        sub[order] = overlap_levels(start[order], end[order])
    return sub


def _metadata(tracks: Mapping[int, str], process: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": process}}
    ]
    for tid, label in sorted(tracks.items()):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": label}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": PID,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    return events


def trace_frames(timeline: Timeline) -> tuple[pd.DataFrame, dict[int, str]]:
    """The slice events (one row each) and the track names, before serialisation."""
    frames: list[pd.DataFrame] = []
    labels: dict[int, str] = {}
    steps = timeline.steps
    if len(steps):
        phase = steps["phase"].map(PHASES).fillna("phase").astype(str)
        frame = steps.assign(dur_ns=steps["end_ns"] - steps["start_ns"])
        names = "step " + steps["step"].astype(str) + " (" + phase + ")"
        frames.append(
            _slices(frame, names, "step", np.full(len(frame), TID_STEPS), ["turn", "phase", "step"])
        )
        labels[TID_STEPS] = "decode steps"
    comp = timeline.compute
    if comp is not None and len(comp):
        args = [c for c in comp.columns if c not in ("start_ns", "dur_ns", "name")]
        names = comp["name"].astype(str) if "name" in comp else comp["op"].astype(str)
        frames.append(_slices(comp, names, "compute", np.full(len(comp), TID_COMPUTE), args))
        labels[TID_COMPUTE] = "compute" + ("" if timeline.compute_measured else " (laid out)")
    io = timeline.io
    if io is not None and len(io):
        lanes = io["lane"].to_numpy(np.int64)
        args = [c for c in io.columns if c not in ("start_ns", "dur_ns")]
        names = "L" + io["layer"].astype(str) + " E" + io["expert"].astype(str)
        if "proj" in io:
            names = names + " p" + io["proj"].astype(str)
        cat = np.where(io["spec"].to_numpy() != 0, "io,spec", "io") if "spec" in io else "io"
        frames.append(
            _slices(
                io,
                names,
                pd.Series(cat) if not isinstance(cat, str) else cat,
                TID_LANE0 + lanes,
                args,
            )
        )
        note = "" if timeline.io_measured else " (reconstructed)"
        for lane in np.unique(lanes):
            labels[TID_LANE0 + int(lane)] = f"io lane {lane}{note}"
    if not frames:
        raise BmoeError("nothing to export: the timeline is empty")
    events = pd.concat(frames, ignore_index=True)
    ts_ns = np.rint(events["ts"].to_numpy() * 1e3).astype(np.int64)
    dur_ns = np.rint(events["dur"].to_numpy() * 1e3).astype(np.int64)
    if (dur_ns < 0).any():  # a complete event never ends before it starts
        dur_ns = np.maximum(dur_ns, 0)
        events["dur"] = dur_ns / 1e3
    tid = events["tid"].to_numpy(np.int64)
    sub = _split_overlaps(pd.DataFrame({"start_ns": ts_ns, "dur_ns": dur_ns}), tid)
    if sub.any():
        extra = sub > 0
        pairs, which = np.unique(np.stack([tid[extra], sub[extra]]), axis=1, return_inverse=True)
        top = int(tid.max()) + 1
        for k, (old, level) in enumerate(pairs.T):
            labels[top + k] = f"{labels[int(old)]} (overlap {int(level)})"
        tid = tid.copy()
        tid[extra] = top + which.reshape(-1)
        events["tid"] = tid
    return events, labels


def chrome_trace(timeline: Timeline, meta: Mapping[str, Any] | None = None) -> str:
    """The whole Chrome trace-event JSON document as text."""
    events, labels = trace_frames(timeline)
    meta = dict(meta or {})
    process = "bmoe decode" + (f" — {Path(str(meta['model'])).name}" if meta.get("model") else "")
    head = json.dumps(_metadata(labels, process))
    body = events.to_json(orient="records", double_precision=15)
    other = {
        **{str(k): v for k, v in meta.items()},
        "io_timeline": "measured"
        if timeline.io_measured
        else ("reconstructed" if timeline.io is not None else "absent"),
        "compute_timeline": "measured"
        if timeline.compute_measured
        else ("laid out" if timeline.compute is not None else "absent"),
        "notes": list(timeline.notes),
    }
    # a preamble value of nan/inf would be NaN/Infinity, which no JSON parser takes: null
    other_json = json.dumps(plain(other), default=str, allow_nan=False)
    return (
        '{"traceEvents":'
        + head[:-1]
        + ("," + body[1:] if len(body) > 2 else "]")
        + ',"displayTimeUnit":"ms","otherData":'
        + other_json
        + "}\n"
    )


def write_chrome_trace(
    timeline: Timeline, path: str | Path, meta: Mapping[str, Any] | None = None
) -> Path:
    """Write :func:`chrome_trace` to `path`."""
    path = Path(path)
    try:
        path.write_text(chrome_trace(timeline, meta), encoding="utf-8")
    except OSError as exc:
        raise BmoeError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path
