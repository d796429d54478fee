"""Decode traces: where the time of a token went (compute trace) and how the flash reads behaved
(io trace).

The views reproduce the established ``decode-analyze`` figures on the same file (decode rows if
there are any, else every row; per-token figures divide by the number of decode steps), then add
what that tool cannot: op classes, time by class per layer, and a per-token join with the run's
metrics CSV. Every function is pure: a trace in, a DataFrame or a dict of figures out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.opclass import OP_CLASSES, classify_rows
from bmoe.errors import BmoeError
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.op_traces import ComputeTrace, IoTrace
from bmoe.units import MIB

#: Quantiles of the per-read latency (index rule ``min(n-1, floor(q*n))``).
LATENCY_QUANTILES = (0.5, 0.9, 0.99)
#: How many ops the by-op view lists by default (the reference's default).
DEFAULT_TOP = 12

Views = dict[str, pd.DataFrame | dict[str, Any]]


# ----------------------------------------------------------------------------- shared


def decode_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The decode rows (``phase == 1``) if there are any, else every row."""
    if "phase" in rows and len(rows):
        decode = rows["phase"].to_numpy() == 1
        if decode.any():
            return rows[decode]
    return rows


def _turns(rows: pd.DataFrame) -> np.ndarray:
    return rows["turn"].to_numpy(np.int64) if "turn" in rows else np.zeros(len(rows), np.int64)


_STEP_BIAS = 1 << 31


def step_keys(rows: pd.DataFrame) -> np.ndarray:
    """One int64 per row identifying its (turn, step); see :func:`split_step_keys`."""
    return _turns(rows) * (1 << 32) + (rows["step"].to_numpy(np.int64) + _STEP_BIAS)


def split_step_keys(keys: np.ndarray | Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(turn, step) arrays back from :func:`step_keys` values."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys >> 32, (keys & 0xFFFFFFFF) - _STEP_BIAS


def step_count(rows: pd.DataFrame) -> int:
    """Distinct decode steps: (turn, step) pairs; the reference's count on one-turn files."""
    if not len(rows):
        return 0
    return int(pd.unique(step_keys(rows)).size)


def quantile_index(values: np.ndarray, q: float) -> float:
    """The element at index ``min(n-1, floor(q*n))`` of the sorted values (no interpolation)."""
    n = len(values)
    if not n:
        return float("nan")
    k = min(n - 1, int(np.floor(q * n)))
    return float(np.partition(values, k)[k])


def _need_rows(rows: pd.DataFrame, trace: ComputeTrace | IoTrace, needs: tuple = ()) -> None:
    """Refuse, naming it, a trace without rows or without a column the view `needs` (every
    engine writes them all; a file lacking one is named rather than failing in the view)."""
    where = trace.path or "<input>"
    if not len(rows):
        raise BmoeError(f"{where}: the trace has no rows to analyse")
    missing = [c for c in needs if c not in rows]
    if missing:
        kind = "io" if isinstance(trace, IoTrace) else "compute"
        raise BmoeError(
            f"{where}: the {kind} trace has no {', '.join(missing)} column (its header lacks "
            "it); this analysis needs it"
        )


def _share(part: np.ndarray | pd.Series, total: float) -> np.ndarray:
    part = np.asarray(part, dtype=np.float64)
    return part * 100.0 / total if total > 0 else np.full(len(part), np.nan)


# ----------------------------------------------------------------------------- compute


def compute_summary(trace: ComputeTrace) -> dict[str, Any]:
    """Steps, nodes per step, measured compute ms/token and major faults per token."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace)
    steps = step_count(rows)
    return {
        "steps": steps,
        "nodes_per_step": len(rows) / steps,
        "ms_per_token": float(rows["wall_ns"].sum()) / steps / 1e6,
        "majflt_per_token": float(rows["majflt"].sum()) / steps if "majflt" in rows else None,
        "granularity": "layer" if trace.layer_granular else "node",
        "phase": "decode" if "phase" in rows and bool((rows["phase"] == 1).all()) else "all",
    }


def group_codes(key: pd.Series) -> tuple[np.ndarray, list]:
    """An integer code per row and the label of each code (a categorical's own codes, else
    sorted factorisation): grouping by ``np.bincount`` instead of hashing strings."""
    if isinstance(key.dtype, pd.CategoricalDtype):
        labels = [str(c) for c in key.cat.categories]
        return key.cat.codes.to_numpy(np.int64), labels
    codes, uniques = pd.factorize(key, sort=True)
    return codes.astype(np.int64), list(uniques)


def _grouped_time(rows: pd.DataFrame, key: pd.Series, steps: int) -> pd.DataFrame:
    """ns, nodes and faults per group (groups without rows dropped), per token, with the
    share of the total time; indexed by the group label."""
    codes, labels = group_codes(key)
    n = len(labels)
    wall = np.bincount(codes, weights=rows["wall_ns"].to_numpy(np.float64), minlength=n)
    faults = (
        np.bincount(codes, weights=rows["majflt"].to_numpy(np.float64), minlength=n)
        if "majflt" in rows
        else np.zeros(n)
    )
    nodes = np.bincount(codes, minlength=n)
    present = nodes > 0
    total = float(wall.sum())
    wall, faults, nodes = wall[present], faults[present], nodes[present]
    return pd.DataFrame(
        {
            "ms_per_token": wall / steps / 1e6,
            "share_pct": _share(wall, total),
            "majflt_per_token": faults / steps,
            "nodes_per_token": nodes / steps,
            "_ns": wall,
            "_faults": faults,
        },
        index=pd.Index([lab for lab, p in zip(labels, present, strict=True) if p], name="key"),
    )


def compute_by_op(trace: ComputeTrace, top: int | None = DEFAULT_TOP) -> pd.DataFrame:
    """Time per op (ms/token, share of the measured total, faults/token), largest first;
    the first `top` ops (all when `top` is None or 0)."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, ("op",))
    g = _grouped_time(rows, rows["op"], step_count(rows))
    g = g.sort_values("_ns", ascending=False, kind="stable")
    if top:
        g = g.head(top)
    out = g.reset_index().rename(columns={"key": "op"})
    return out[["op", "ms_per_token", "share_pct", "majflt_per_token", "nodes_per_token"]]


def compute_faults(trace: ComputeTrace) -> pd.DataFrame:
    """Fault attribution: the ops (segments, for a layer-granular file) that took major faults,
    with their faults and time per token and their share of all faults; most faults first."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, ("name",) if trace.layer_granular else ("op",))
    layered = trace.layer_granular
    column = "segment" if layered else "op"
    cols = [column, "majflt_per_token", "ms_per_token", "fault_share_pct"]
    if "majflt" not in rows:
        return pd.DataFrame(columns=cols)
    g = _grouped_time(rows, rows["name" if layered else "op"], step_count(rows))
    g = g[g["_faults"] > 0].sort_values(["_faults", "_ns"], ascending=False, kind="stable")
    g["fault_share_pct"] = _share(g["_faults"], float(rows["majflt"].sum()))
    return g.reset_index().rename(columns={"key": column})[cols]


def compute_by_layer(trace: ComputeTrace) -> pd.DataFrame:
    """Time per layer as the engine parsed it (-1 = no layer: embeddings, output head, masks,
    and the views/unnamed nodes whose name carries no ``-<il>`` suffix)."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, ("layer",))
    g = _grouped_time(rows, rows["layer"], step_count(rows))
    out = g.reset_index().rename(columns={"key": "layer"})
    out["layer"] = out["layer"].astype(np.int16)
    return out[["layer", "ms_per_token", "share_pct", "majflt_per_token"]]


_SEGMENT = re.compile(r"blk\.(\d+)")


def _segment_order(names: pd.Index) -> np.ndarray:
    """Sort keys: ``pre`` first, then ``blk.0..N`` by number, ``post``, then anything else."""
    keys = []
    for name in names:
        m = _SEGMENT.fullmatch(str(name))
        if name == "pre":
            keys.append((0, -1, ""))
        elif m:
            keys.append((1, int(m.group(1)), ""))
        elif name == "post":
            keys.append((2, 0, ""))
        else:
            keys.append((3, 0, str(name)))
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def compute_segments(trace: ComputeTrace) -> pd.DataFrame:
    """Layer-granular files: time per segment, ordered ``pre``, ``blk.0..N``, ``post`` (a
    layer's routing boundary rows share its ``blk.<il>`` name and sum into it)."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, ("name",))
    g = _grouped_time(rows, rows["name"], step_count(rows))
    g = g.iloc[_segment_order(g.index)]
    out = g.reset_index().rename(columns={"key": "segment"})
    return out[["segment", "ms_per_token", "share_pct", "majflt_per_token"]]


def classify_nodes(trace: ComputeTrace) -> pd.DataFrame:
    """The decode rows of a per-node trace with two more columns: ``op_class`` (see
    :mod:`bmoe.analyze.opclass`) and ``layer_resolved``. Compute it once and hand it to the
    by-class views when calling several."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, ("op", "name"))
    if trace.layer_granular:
        raise BmoeError(
            f"{trace.path or '<input>'}: a layer-granular trace has no per-node detail to "
            "classify (record with --compute-trace for op classes)"
        )
    classes, layers = classify_rows(rows, str(trace.meta.get("arch", "")))
    return rows.assign(op_class=classes, layer_resolved=layers)


def compute_by_class(trace: ComputeTrace, nodes: pd.DataFrame | None = None) -> pd.DataFrame:
    """Time by op class (attention, router, expert matmul, dense FFN, norm, other): is it the
    experts? Every class is listed, in that order, zero when absent. `nodes`: the result of
    :func:`classify_nodes`, if already at hand."""
    rows = classify_nodes(trace) if nodes is None else nodes
    g = _grouped_time(rows, rows["op_class"], step_count(rows)).reindex(list(OP_CLASSES))
    g = g.fillna(0.0)
    out = g.reset_index().rename(columns={"key": "op_class"})
    return out[["op_class", "ms_per_token", "share_pct", "majflt_per_token", "nodes_per_token"]]


def _class_matrix(rows: pd.DataFrame, key: pd.Series, scale: float) -> tuple[list, np.ndarray]:
    """Summed wall time per (key group, op class) as a matrix, one row per group label."""
    codes, labels = group_codes(key)
    cls = rows["op_class"].cat.codes.to_numpy(np.int64)
    k = len(OP_CLASSES)
    flat = np.bincount(
        codes * k + cls, weights=rows["wall_ns"].to_numpy(np.float64), minlength=len(labels) * k
    )
    return labels, flat.reshape(len(labels), k) * scale


def compute_class_by_layer(trace: ComputeTrace, nodes: pd.DataFrame | None = None) -> pd.DataFrame:
    """ms/token per (resolved layer, op class): one row per layer, one column per class, plus
    the row total. Views and unnamed nodes are put back into the layer they serve."""
    rows = classify_nodes(trace) if nodes is None else nodes
    steps = step_count(rows)
    labels, matrix = _class_matrix(rows, rows["layer_resolved"], 1.0 / steps / 1e6)
    out = pd.DataFrame(matrix, columns=list(OP_CLASSES))
    out.insert(0, "layer", np.asarray(labels, dtype=np.int16))
    out["total"] = matrix.sum(axis=1)
    return out


def compute_per_token(trace: ComputeTrace) -> pd.DataFrame:
    """Per decode step: measured compute (ms) and major faults, in step order."""
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace)
    codes, labels = group_codes(pd.Series(step_keys(rows)))
    turn, step = split_step_keys(labels)
    n = len(labels)
    wall = np.bincount(codes, weights=rows["wall_ns"].to_numpy(np.float64), minlength=n)
    faults = (
        np.bincount(codes, weights=rows["majflt"].to_numpy(np.float64), minlength=n)
        if "majflt" in rows
        else np.zeros(n)
    )
    return pd.DataFrame(
        {
            "turn": turn,
            "trace_step": step,
            "traced_ms": wall / 1e6,
            "traced_majflt": faults.astype(np.int64),
        }
    )


# ----------------------------------------------------------------------------- io


def _io_decode(trace: IoTrace, needs: tuple = ()) -> pd.DataFrame:
    rows = decode_rows(trace.rows)
    _need_rows(rows, trace, needs)
    return rows


def io_latency(trace: IoTrace) -> dict[str, float]:
    """Per-read latency in microseconds: p50, p90, p99 (index rule) and max."""
    lat = _io_decode(trace)["latency_ns"].to_numpy(np.int64)
    out = {f"p{round(q * 100)}": quantile_index(lat, q) / 1e3 for q in LATENCY_QUANTILES}
    out["max"] = float(lat.max()) / 1e3
    return out


def io_summary(trace: IoTrace) -> dict[str, Any]:
    """Steps, reads, MiB/token, lane-busy bandwidth (read bytes over summed latency) and the
    O_DIRECT alignment waste ((read - requested) / read)."""
    rows = _io_decode(trace)
    steps = step_count(rows)
    read = float(rows["read_bytes"].sum())
    busy_s = float(rows["latency_ns"].sum()) / 1e9
    req = float(rows["req_bytes"].sum()) if "req_bytes" in rows else None
    return {
        "steps": steps,
        "reads": len(rows),
        "reads_per_token": len(rows) / steps,
        "mib_per_token": read / MIB / steps,
        "lane_busy_mib_s": read / MIB / busy_s if busy_s > 0 else None,
        "busy_ms_per_token": busy_s * 1e3 / steps,
        "waste_pct": (read - req) * 100.0 / read if req is not None and read > 0 else None,
        "waste_mib_per_token": (read - req) / MIB / steps if req is not None else None,
        "lanes": int(rows["lane"].nunique()) if "lane" in rows else None,
        "timeline": "measured" if "start_ns" in rows else "none (no start_ns column)",
    }


def size_buckets(read_bytes: np.ndarray) -> np.ndarray:
    """The power of two (in KiB) at or below each read size; reads under 1 KiB go to 1."""
    kib = np.maximum(np.asarray(read_bytes, dtype=np.int64) >> 10, 1)
    return (1 << np.floor(np.log2(kib)).astype(np.int64)).astype(np.int64)


def io_sizes(trace: IoTrace) -> pd.DataFrame:
    """Reads by request size (``read_bytes`` bucketed to a power of two KiB): count, MiB,
    MiB/s over the bucket's own latency, and mean microseconds per read."""
    rows = _io_decode(trace)
    frame = pd.DataFrame(
        {
            "size_kib": size_buckets(rows["read_bytes"].to_numpy()),
            "bytes": rows["read_bytes"].to_numpy(np.float64),
            "ns": rows["latency_ns"].to_numpy(np.float64),
        }
    )
    g = frame.groupby("size_kib").agg(
        reads=("bytes", "size"), bytes=("bytes", "sum"), ns=("ns", "sum")
    )
    out = pd.DataFrame(
        {
            "size_kib": g.index.to_numpy(np.int64),
            "reads": g["reads"].to_numpy(np.int64),
            "mib": g["bytes"].to_numpy() / MIB,
            "mib_s": np.where(g["ns"] > 0, g["bytes"] / MIB / (g["ns"] / 1e9), np.nan),
            "us_per_read": g["ns"].to_numpy() / g["reads"].to_numpy() / 1e3,
        }
    )
    return out


def io_lanes(trace: IoTrace) -> pd.DataFrame:
    """Per lane: MiB/token, busy ms/token (summed latency) and MiB/s while busy. Uneven busy
    time means a lane is starved, not that the drive is full."""
    rows = _io_decode(trace, ("lane",))
    steps = step_count(rows)
    frame = pd.DataFrame(
        {
            "lane": rows["lane"].to_numpy(),
            "bytes": rows["read_bytes"].to_numpy(np.float64),
            "ns": rows["latency_ns"].to_numpy(np.float64),
        }
    )
    g = frame.groupby("lane").agg(reads=("bytes", "size"), bytes=("bytes", "sum"), ns=("ns", "sum"))
    return pd.DataFrame(
        {
            "lane": g.index.to_numpy(),
            "reads_per_token": g["reads"].to_numpy() / steps,
            "mib_per_token": g["bytes"].to_numpy() / MIB / steps,
            "busy_ms_per_token": g["ns"].to_numpy() / 1e6 / steps,
            "mib_s": np.where(g["ns"] > 0, g["bytes"] / MIB / (g["ns"] / 1e9), np.nan),
        }
    )


def io_speculative(trace: IoTrace) -> dict[str, Any]:
    """The speculative (prefetch, ``spec=1``) share of reads and bytes."""
    rows = _io_decode(trace)
    steps = step_count(rows)
    spec = rows["spec"].to_numpy() != 0 if "spec" in rows else np.zeros(len(rows), bool)
    read = rows["read_bytes"].to_numpy(np.float64)
    spec_bytes = float(read[spec].sum())
    return {
        "reads": int(spec.sum()),
        "reads_pct": float(spec.mean() * 100.0),
        "mib_per_token": spec_bytes / MIB / steps,
        "bytes_pct": spec_bytes * 100.0 / float(read.sum()) if read.sum() > 0 else None,
    }


def _group_cummax(values: np.ndarray, group: np.ndarray, new_group: np.ndarray) -> np.ndarray:
    """Running max of `values` restarting at every group (rows sorted by group)."""
    gid = np.cumsum(new_group) - 1
    lo = int(values.min()) if len(values) else 0
    span = int(values.max()) - lo + 1 if len(values) else 1
    if len(values) and (int(gid[-1]) + 1) * span < (1 << 62):
        lifted = gid * span + (values - lo)
        return np.maximum.accumulate(lifted) - gid * span + lo
    frame = pd.DataFrame({"g": group, "v": values})
    return frame.groupby("g", sort=False)["v"].cummax().to_numpy()


def _runs(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts reads by (turn, step, offset), and per read in that order a flag
    saying it starts a new contiguous run: it begins after every byte the step's earlier reads
    (by offset) asked for."""
    key = step_keys(rows)
    offset = rows["offset"].to_numpy(np.int64)
    order = None
    if len(key) and (key[1:] >= key[:-1]).all():  # file order is step order: one int sort
        gid = np.cumsum(np.r_[True, key[1:] != key[:-1]]) - 1
        lo = int(offset.min())
        span = int(offset.max()) - lo + 1
        if (int(gid[-1]) + 1) * span < (1 << 62):
            order = np.argsort(gid * span + (offset - lo), kind="stable")
    if order is None:
        order = np.lexsort((offset, key))
    key, offset = key[order], offset[order]
    end = offset + rows["req_bytes"].to_numpy(np.int64)[order]
    new_group = np.r_[True, key[1:] != key[:-1]] if len(key) else np.zeros(0, bool)
    reach = _group_cummax(end, key, new_group)
    prev_reach = np.r_[np.int64(-1), reach[:-1]]
    return order, new_group | (offset > prev_reach)


def io_adjacency(trace: IoTrace) -> dict[str, Any]:
    """The coalescing ceiling: per step, the reads sorted by offset merge into contiguous runs
    (a read touching or overlapping the bytes before it continues the run); reads/runs is how
    many times fewer requests a perfect coalescer would issue for the same bytes."""
    rows = _io_decode(trace, ("offset", "req_bytes"))
    steps = step_count(rows)
    _order, starts = _runs(rows)
    runs = int(starts.sum())
    return {
        "reads_per_token": len(rows) / steps,
        "runs_per_token": runs / steps,
        "ceiling": len(rows) / runs if runs else None,
    }


def io_adjacency_by_layer(trace: IoTrace) -> pd.DataFrame:
    """The coalescing ceiling per layer (runs that span layers count for the layer that
    starts them): which layers' experts lie scattered on flash."""
    rows = _io_decode(trace, ("offset", "req_bytes"))
    steps = step_count(rows)
    order, starts = _runs(rows)
    layer = rows["layer"].to_numpy()[order] if "layer" in rows else np.full(len(order), -1)
    g = (
        pd.DataFrame({"layer": layer, "run": starts})
        .groupby("layer")
        .agg(reads=("run", "size"), runs=("run", "sum"))
    )
    return pd.DataFrame(
        {
            "layer": g.index.to_numpy(),
            "reads_per_token": g["reads"].to_numpy() / steps,
            "runs_per_token": g["runs"].to_numpy() / steps,
            "ceiling": np.where(g["runs"] > 0, g["reads"] / g["runs"].clip(lower=1), np.nan),
        }
    )


def io_per_token(trace: IoTrace) -> pd.DataFrame:
    """Per decode step: reads, MiB read, and the busiest lane's and all lanes' busy ms."""
    rows = _io_decode(trace)
    frame = pd.DataFrame(
        {
            "turn": _turns(rows),
            "trace_step": rows["step"].to_numpy(np.int64),
            "lane": rows["lane"].to_numpy() if "lane" in rows else 0,
            "bytes": rows["read_bytes"].to_numpy(np.int64),
            "ns": rows["latency_ns"].to_numpy(np.float64),
        }
    )
    per_lane = frame.groupby(["turn", "trace_step", "lane"], sort=True).agg(
        reads=("bytes", "size"), bytes=("bytes", "sum"), ns=("ns", "sum")
    )
    per_step = per_lane.groupby(level=["turn", "trace_step"]).agg(
        reads=("reads", "sum"), bytes=("bytes", "sum"), ns=("ns", "sum"), lane_max=("ns", "max")
    )
    return pd.DataFrame(
        {
            "turn": per_step.index.get_level_values("turn").to_numpy(),
            "trace_step": per_step.index.get_level_values("trace_step").to_numpy(),
            "reads": per_step["reads"].to_numpy(),
            "read_bytes": per_step["bytes"].to_numpy(),
            "busy_ms": per_step["ns"].to_numpy() / 1e6,
            "busiest_lane_ms": per_step["lane_max"].to_numpy() / 1e6,
        }
    )


# ----------------------------------------------------------------------------- metrics join


def prompt_ends(trace_rows: pd.DataFrame, run: MetricsRun | None = None) -> dict[int, int]:
    """Per turn, the trace step of the first decode (the absolute position just past the
    prompt), so that ``metrics step = trace step - prompt end + 1``.

    From the trace's own prefill rows when it has them (their last step + 1); else, for a
    one-turn file, the metrics summary's ``n_prompt``; else the turn's first decode step.
    """
    turns = _turns(trace_rows)
    steps = trace_rows["step"].to_numpy(np.int64)
    phase = trace_rows["phase"].to_numpy() if "phase" in trace_rows else np.ones(len(steps))
    frame = pd.DataFrame({"turn": turns, "step": steps, "phase": phase})
    decode = frame[frame["phase"] == 1]
    prefill = frame[frame["phase"] == 0]
    out = decode.groupby("turn")["step"].min().astype(np.int64).to_dict()
    summary_prompt = None
    if run is not None and len(run.summaries) == 1 and len(out) <= 1:
        summary_prompt = run.summary.get("n_prompt")
    if isinstance(summary_prompt, int) and not len(prefill):
        out = {t: summary_prompt for t in out}
    from_prefill = (prefill.groupby("turn")["step"].max() + 1).astype(np.int64).to_dict()
    out.update({t: v for t, v in from_prefill.items() if t in out})
    return {int(k): int(v) for k, v in out.items()}


def join_metrics(
    per_token: pd.DataFrame, trace_rows: pd.DataFrame, run: MetricsRun
) -> pd.DataFrame:
    """Put a trace's per-step figures next to the metrics CSV's row for the same token.

    `per_token` has ``turn`` and ``trace_step`` columns (see :func:`compute_per_token`,
    :func:`io_per_token`); the metrics rows are matched on (turn, step) with
    ``step = trace_step - prompt_end + 1`` (:func:`prompt_ends`). Steps on either side without
    a partner are kept with the other side missing.
    """
    ends = prompt_ends(trace_rows, run)
    if not ends:
        raise BmoeError("the trace has no decode rows to join with the metrics CSV")
    offset = per_token["turn"].map(ends)
    joined = per_token.assign(step=(per_token["trace_step"] - offset + 1).astype("Int64"))
    metrics = run.rows.copy()
    if "turn" not in metrics:
        metrics["turn"] = 0
    wanted = [
        c
        for c in ("wall_ms", "io_ms", "compute_ms", "stall_ms", "mgmt_ms", "cpu_ms", "majflt",
                  "read_bytes")
        if c in metrics
    ]  # fmt: skip
    metrics = metrics[["turn", "step", *wanted]].astype({"turn": np.int64, "step": "Int64"})
    clash = {c: f"metrics_{c}" for c in wanted if c in joined}
    metrics = metrics.rename(columns=clash)
    out = joined.merge(metrics, on=["turn", "step"], how="outer", sort=True)
    first = ["turn", "step", "trace_step"]
    return out[first + [c for c in out.columns if c not in first]]


def class_column(op_class: str) -> str:
    """``expert matmul`` -> ``expert_matmul_ms``: the per-token column of a class."""
    return op_class.lower().replace(" ", "_") + "_ms"


def compute_per_token_by_class(
    trace: ComputeTrace, nodes: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per decode step: measured ms by op class (per-node traces), one column per class."""
    rows = classify_nodes(trace) if nodes is None else nodes
    labels, matrix = _class_matrix(rows, pd.Series(step_keys(rows)), 1e-6)
    turn, step = split_step_keys(labels)
    out = pd.DataFrame(matrix, columns=[class_column(c) for c in OP_CLASSES])
    out.insert(0, "trace_step", step)
    out.insert(0, "turn", turn)
    return out


def compute_join(
    trace: ComputeTrace, run: MetricsRun, nodes: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per token: measured compute (the trace; by op class for per-node files) next to the
    metrics row's ``compute_ms`` residual, ``io_ms`` and ``wall_ms``."""
    per_token = compute_per_token(trace)
    if not trace.layer_granular:
        by_class = compute_per_token_by_class(trace, nodes)
        per_token = per_token.merge(by_class, on=["turn", "trace_step"])
    out = join_metrics(per_token, trace.rows, run)
    if "wall_ms" in out:
        out["traced_pct_of_wall"] = out["traced_ms"] * 100.0 / out["wall_ms"]
    return out


def io_join(trace: IoTrace, run: MetricsRun) -> pd.DataFrame:
    """Per token: what the io trace read next to the metrics row's read bytes and ``io_ms``."""
    return join_metrics(io_per_token(trace), trace.rows, run)


def join_summary(joined: pd.DataFrame) -> dict[str, Any]:
    """Means over the tokens both sides have, and how many matched."""
    both = joined.dropna(subset=[c for c in ("trace_step", "wall_ms") if c in joined])
    out: dict[str, Any] = {"tokens_matched": len(both), "tokens_unmatched": len(joined) - len(both)}
    for col in ("traced_ms", "wall_ms", "compute_ms", "io_ms", "busy_ms", "busiest_lane_ms"):
        if col in both:
            out[f"{col}_mean"] = float(both[col].astype(float).mean()) if len(both) else None
    return out


# ----------------------------------------------------------------------------- facades


def analyze_compute(
    trace: ComputeTrace,
    top: int | None = DEFAULT_TOP,
    metrics: MetricsRun | None = None,
    class_by_layer: bool = False,
) -> Views:
    """Every compute view: summary, then by_op, faults, by_layer and by_class (per-node
    files; with `class_by_layer`, time by class per layer too) or segments and faults
    (layer-granular files), then the per-token join when `metrics` is given."""
    views: Views = {"summary": compute_summary(trace)}
    nodes = None
    if views["summary"]["granularity"] == "layer":
        views["segments"] = compute_segments(trace)
        views["faults"] = compute_faults(trace)
    else:
        nodes = classify_nodes(trace)
        views["by_op"] = compute_by_op(trace, top)
        views["faults"] = compute_faults(trace)
        views["by_layer"] = compute_by_layer(trace)
        views["by_class"] = compute_by_class(trace, nodes)
        if class_by_layer:
            views["class_by_layer"] = compute_class_by_layer(trace, nodes)
    if metrics is not None:
        joined = compute_join(trace, metrics, nodes)
        views["per_token_summary"] = join_summary(joined)
        views["per_token"] = joined
    return views


def analyze_io(trace: IoTrace, adjacent: bool = False, metrics: MetricsRun | None = None) -> Views:
    """Every io view: summary, latency_us, sizes, lanes, speculative, adjacency (plus the
    per-layer adjacency when `adjacent`), and the per-token join when `metrics` is given."""
    views: Views = {
        "summary": io_summary(trace),
        "latency_us": io_latency(trace),
        "sizes": io_sizes(trace),
        "lanes": io_lanes(trace),
        "speculative": io_speculative(trace),
        "adjacency": io_adjacency(trace),
    }
    if adjacent:
        views["adjacency_by_layer"] = io_adjacency_by_layer(trace)
    if metrics is not None:
        joined = io_join(trace, metrics)
        views["per_token_summary"] = join_summary(joined)
        views["per_token"] = joined
    return views


def io_latency_cdf(trace: IoTrace) -> pd.DataFrame:
    """The empirical distribution of read latency per lane and over all lanes: rows of
    (lane, latency_us, fraction) with fraction = rank / reads, sorted; lane is -1 for all."""
    rows = _io_decode(trace)
    lat = rows["latency_ns"].to_numpy(np.float64) / 1e3
    lane = rows["lane"].to_numpy(np.int64) if "lane" in rows else np.zeros(len(rows), np.int64)
    both = pd.DataFrame(
        {
            "lane": np.concatenate([np.full(len(lat), -1), lane]),
            "latency_us": np.concatenate([lat, lat]),
        }
    ).sort_values(["lane", "latency_us"], kind="stable")
    rank = both.groupby("lane").cumcount().to_numpy() + 1
    count = both.groupby("lane")["latency_us"].transform("size").to_numpy()
    return both.assign(fraction=rank / count).reset_index(drop=True)
