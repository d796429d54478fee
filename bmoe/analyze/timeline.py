"""Decode traces laid out in time: each flash read and each compute node (or layer segment) as
a slice with a start and a duration, ready for a lane timeline or a Perfetto trace.

An io trace written by the embedded engine carries ``start_ns`` (monotonic, since the run
began): its reads are placed where they happened. The native engine's io traces only have
latencies; then each lane's reads are laid end to end within their step, in the order the file
lists them, and the timeline says it is reconstructed. Compute traces have node order and
``wall_ns``: nodes are laid end to end within a step. When the reads have real start times,
each compute step starts at its first read (never before the previous step ended); otherwise
both tracks share reconstructed step origins: a step lasts as long as the longer of its
compute and its busiest lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bmoe.analyze.op_traces import decode_rows, step_keys
from bmoe.analyze.opclass import classify_rows
from bmoe.errors import BmoeError
from bmoe.formats.op_traces import ComputeTrace, IoTrace

IO_ARGS = ("layer", "expert", "proj", "spec", "offset", "req_bytes", "read_bytes")
COMPUTE_ARGS = ("seq", "layer", "op", "name", "majflt")


@dataclass
class Timeline:
    """Slices in time (ns since the first slice or the run's start).

    ``io``: one row per read — turn, phase, step, lane, start_ns, dur_ns and the read's tags.
    ``compute``: one row per node or segment — turn, phase, step, start_ns, dur_ns, op, name,
    layer, majflt. ``steps``: one row per step — turn, phase, step, start_ns, end_ns (the
    step's compute when there is a compute trace, else its reads).
    """

    io: pd.DataFrame | None
    compute: pd.DataFrame | None
    steps: pd.DataFrame
    io_measured: bool
    compute_measured: bool
    notes: list[str] = field(default_factory=list)

    @property
    def reconstructed(self) -> bool:
        """True when any track's times were laid out rather than recorded."""
        return (self.io is not None and not self.io_measured) or (
            self.compute is not None and not self.compute_measured
        )


_STEP_KEYS = ["turn", "phase", "step"]


def _keyed(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with turn/phase/step columns (defaults for files that lack turn or phase)."""
    out = rows.copy()
    if "turn" not in out:
        out["turn"] = 0
    if "phase" not in out:
        out["phase"] = 1
    return out


def _select(rows: pd.DataFrame, decode_only: bool, steps: tuple[int, int] | None) -> pd.DataFrame:
    rows = decode_rows(rows) if decode_only else rows
    if steps is not None:
        lo, hi = steps
        s = rows["step"].to_numpy()
        rows = rows[(s >= lo) & (s <= hi)]
    return _keyed(rows)


def _step_index(*frames: pd.DataFrame | None) -> pd.DataFrame:
    """Every (turn, phase, step) present in any frame, in time order."""
    keys = [f[_STEP_KEYS] for f in frames if f is not None and len(f)]
    if not keys:
        return pd.DataFrame({k: pd.Series([], dtype=np.int64) for k in _STEP_KEYS})
    allkeys = pd.concat(keys, ignore_index=True).drop_duplicates()
    allkeys = allkeys.astype(np.int64)
    # Within a turn a prefill precedes its decodes; steps are absolute positions.
    return allkeys.sort_values(["turn", "step", "phase"], kind="stable").reset_index(drop=True)


def _step_pos(frame: pd.DataFrame, index: pd.DataFrame) -> np.ndarray:
    """Each row's position in the step index."""
    pos = pd.MultiIndex.from_frame(index).get_indexer(
        pd.MultiIndex.from_frame(frame[_STEP_KEYS].astype(np.int64))
    )
    return pos.astype(np.int64)


def _no_negative(
    rows: pd.DataFrame | None, column: str, what: str, notes: list[str]
) -> pd.DataFrame | None:
    """`rows` with a negative duration in `column` (a clock that stepped back, a damaged
    file) drawn as 0 long, and a note saying how many; a slice never ends before it starts."""
    if rows is None or column not in rows:
        return rows
    values = rows[column].to_numpy()
    negative = values < 0
    if not negative.any():
        return rows
    notes.append(f"{int(negative.sum())} {what} with a negative {column} drawn 0 long")
    rows = rows.copy()
    rows[column] = np.where(negative, 0, values).astype(values.dtype)
    return rows


def _lay_io(io: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    """Offsets of reconstructed reads within their step (each lane end to end, file order),
    and each step's extent (the busiest lane's total)."""
    lat = io["latency_ns"].to_numpy(np.int64)
    keys = [io[k] for k in _STEP_KEYS] + [io["lane"]]
    within = pd.Series(lat, index=io.index).groupby(keys, sort=False).cumsum().to_numpy() - lat
    extent = (
        pd.DataFrame({**{k: io[k].to_numpy(np.int64) for k in _STEP_KEYS}, "end": within + lat})
        .groupby(_STEP_KEYS)["end"]
        .max()
    )
    return within, extent


def _lay_compute(comp: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    """Offsets of nodes within their step (end to end, in ``seq`` order) and step extents."""
    wall = comp["wall_ns"].to_numpy(np.int64)
    keys = [comp[k] for k in _STEP_KEYS]
    within = pd.Series(wall, index=comp.index).groupby(keys, sort=False).cumsum().to_numpy() - wall
    extent = (
        pd.DataFrame({**{k: comp[k].to_numpy(np.int64) for k in _STEP_KEYS}, "end": within + wall})
        .groupby(_STEP_KEYS)["end"]
        .max()
    )
    return within, extent


def _extent_on(index: pd.DataFrame, extent: pd.Series | None) -> np.ndarray:
    if extent is None:
        return np.zeros(len(index), np.int64)
    mi = pd.MultiIndex.from_frame(index)
    return extent.reindex(mi).fillna(0).to_numpy(np.int64)


def build_timeline(
    compute: ComputeTrace | None = None,
    io: IoTrace | None = None,
    *,
    decode_only: bool = False,
    steps: tuple[int, int] | None = None,
) -> Timeline:
    """Lay a compute trace, an io trace, or both (of the same run) out in time.

    `decode_only` keeps the decode rows (if any); `steps` keeps trace steps lo..hi inclusive.
    """
    if compute is None and io is None:
        raise BmoeError("a timeline needs a compute trace, an io trace, or both")
    for trace, kind, needs in ((io, "io", ("lane",)), (compute, "compute", ("name", "op"))):
        if trace is not None and not any(c in trace.rows for c in needs):
            raise BmoeError(
                f"{trace.path or '<input>'}: the {kind} trace has no {' or '.join(needs)} "
                "column (its header lacks it); a timeline needs it"
            )
    notes: list[str] = []
    io_rows = _select(io.rows, decode_only, steps) if io is not None else None
    comp_rows = None
    if compute is not None:
        comp_rows = _select(compute.rows, decode_only, steps)
        if "seq" in comp_rows:
            comp_rows = comp_rows.sort_values(["turn", "step", "phase", "seq"], kind="stable")
    if (io_rows is None or not len(io_rows)) and (comp_rows is None or not len(comp_rows)):
        raise BmoeError("no trace rows in the selected steps")
    io_rows = _no_negative(io_rows, "latency_ns", "reads", notes)
    comp_rows = _no_negative(comp_rows, "wall_ns", "compute nodes", notes)
    index = _step_index(io_rows, comp_rows)
    if io_rows is not None and comp_rows is not None and len(io_rows) and len(comp_rows):
        shared = np.intersect1d(step_keys(io_rows), step_keys(comp_rows))
        if not len(shared):
            notes.append(
                "the compute and io traces share no step: they look like different runs, "
                "laid side by side"
            )

    io_measured = io_rows is not None and "start_ns" in io_rows
    comp_measured = comp_rows is not None and "start_ns" in comp_rows

    io_within = io_extent = comp_within = comp_extent = None
    if io_rows is not None and not io_measured:
        io_within, io_extent = _lay_io(io_rows)
        notes.append(
            "io timeline reconstructed: the trace has no start_ns, so each lane's reads are "
            "laid end to end within their step"
        )
    if comp_rows is not None and not comp_measured:
        comp_within, comp_extent = _lay_compute(comp_rows)

    # Step origins.
    lengths = np.maximum(_extent_on(index, io_extent), _extent_on(index, comp_extent))
    laid_origin = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    origin = laid_origin
    if io_measured and io_rows is not None and comp_within is not None:
        never = np.iinfo(np.int64).max
        first_read = np.full(len(index), never, dtype=np.int64)
        np.minimum.at(first_read, _step_pos(io_rows, index), io_rows["start_ns"].to_numpy(np.int64))
        has = first_read != never
        anchor = np.where(has, first_read, np.iinfo(np.int64).min // 4)
        anchor[0] = first_read[0] if has[0] else (first_read[has].min() if has.any() else 0)
        # origin_k = max(anchor_k, origin_(k-1) + length_(k-1)), solved with a running max.
        comp_len = _extent_on(index, comp_extent)
        before = np.concatenate([[0], np.cumsum(comp_len)[:-1]]).astype(np.int64)
        origin = before + np.maximum.accumulate(anchor - before)
        notes.append(
            "compute timeline reconstructed from node order and wall_ns; each step starts at "
            "its first read's start_ns (approximate alignment)"
        )
    elif comp_within is not None:
        notes.append("compute timeline reconstructed from node order and wall_ns")

    io_out = comp_out = None
    if io_rows is not None:
        start = (
            io_rows["start_ns"].to_numpy(np.int64)
            if io_measured
            else origin[_step_pos(io_rows, index)] + io_within
        )
        io_out = pd.DataFrame(
            {
                **{k: io_rows[k].to_numpy() for k in _STEP_KEYS},
                "lane": io_rows["lane"].to_numpy() if "lane" in io_rows else 0,
                "start_ns": start,
                "dur_ns": io_rows["latency_ns"].to_numpy(np.int64),
                **{a: io_rows[a].to_numpy() for a in IO_ARGS if a in io_rows},
            }
        )
    if comp_rows is not None:
        start = (
            comp_rows["start_ns"].to_numpy(np.int64)
            if comp_measured
            else origin[_step_pos(comp_rows, index)] + comp_within
        )
        comp_out = pd.DataFrame(
            {
                **{k: comp_rows[k].to_numpy() for k in _STEP_KEYS},
                "start_ns": start,
                "dur_ns": comp_rows["wall_ns"].to_numpy(np.int64),
                **{
                    a: (
                        comp_rows[a].astype(str) if a in ("op", "name") else comp_rows[a]
                    ).to_numpy()
                    for a in COMPUTE_ARGS
                    if a in comp_rows
                },
            }
        )
        assert compute is not None  # comp_rows come from it
        if not compute.layer_granular and {"op", "name"} <= set(comp_rows.columns):
            classes, layers = classify_rows(comp_rows, str(compute.meta.get("arch", "")))
            comp_out["op_class"] = classes.to_numpy()
            comp_out["layer_resolved"] = layers.to_numpy()

    # A step spans its compute when there is a compute trace (the decode itself); reads are
    # stamped with the decode they were drained after and may run past it.
    # Laid out on shared origins, a step is its whole slot (the longer of compute and reads).
    source = comp_out if comp_out is not None and len(comp_out) else io_out
    if source is None or (not io_measured and not comp_measured):
        source = index.assign(start_ns=origin, dur_ns=lengths)
    spans = [source[[*_STEP_KEYS, "start_ns"]].assign(end_ns=source["start_ns"] + source["dur_ns"])]
    step_frame = (
        pd.concat(spans, ignore_index=True)
        .groupby(_STEP_KEYS, as_index=False)
        .agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
        .sort_values("start_ns", kind="stable")
        .reset_index(drop=True)
    )
    return Timeline(io_out, comp_out, step_frame, bool(io_measured), bool(comp_measured), notes)


def layer_segments(compute: pd.DataFrame) -> pd.DataFrame:
    """Coarsen per-node compute slices into layer segments: consecutive nodes of one step
    that serve the same layer become one slice (``blk.<il>``, or ``no layer``), carrying the
    node count, the summed major faults and the time by op class."""
    if not len(compute):
        return compute
    layer = (
        compute["layer_resolved"] if "layer_resolved" in compute else compute["layer"]
    ).to_numpy(np.int64)
    step = compute["step"].to_numpy(np.int64)
    turn = compute["turn"].to_numpy(np.int64)
    new = np.r_[True, (layer[1:] != layer[:-1]) | (step[1:] != step[:-1]) | (turn[1:] != turn[:-1])]
    run = np.cumsum(new) - 1
    frame = compute.assign(_run=run, _end=compute["start_ns"] + compute["dur_ns"], _layer=layer)
    g = frame.groupby("_run", sort=True)
    out = g.agg(
        turn=("turn", "first"),
        phase=("phase", "first"),
        step=("step", "first"),
        start_ns=("start_ns", "min"),
        end_ns=("_end", "max"),
        layer=("_layer", "first"),
        nodes=("dur_ns", "size"),
        **({"majflt": ("majflt", "sum")} if "majflt" in frame else {}),
    ).reset_index(drop=True)
    out["dur_ns"] = out.pop("end_ns") - out["start_ns"]
    out["name"] = np.where(out["layer"] >= 0, "blk." + out["layer"].astype(str), "no layer")
    if "op_class" in frame:
        by_class = (
            frame.pivot_table(
                index="_run", columns="op_class", values="dur_ns", aggfunc="sum", fill_value=0
            )
            / 1e3
        )
        for col in by_class.columns:
            out[f"us_{col}".replace(" ", "_")] = by_class[col].to_numpy()
    return out
