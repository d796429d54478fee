"""Build a device profile from runs already recorded.

Each run contributes what it has. Its metrics CSV (any version: v0 without a preamble, v1, v2)
gives the per-token times: flash wait (``io_ms``; under ``--overlap`` the lanes' busy time and
the ``stall_ms`` compute lost to reads), the ``compute_ms`` residual and the CPU time
(``cpu_ms``), cache management (``mgmt_ms``), major faults and the memory picture. Beside it, a
route trace gives the expert sizes and exactly which experts each decode step missed, an io
trace the latency of every flash request, a compute trace the split of compute into dense and
expert work, and a sweep's ``record.json`` the system state the run was measured in.

Every term records which runs and columns it came from and how settled it is (the spread of
its per-run means and of its means over blocks of tokens); a term no run measured is absent and
named, never a silent zero. Expert sizes come, in order, from a route trace (given, or beside
a run), from sizes the caller read from the model file, or from the preamble (v2's
``cache_cycle_mb``, v1's ``token_demand_MiB`` / ``layer_demand_MiB``); without any, the profile
prices MiB read instead of reads and says so.

A compute-traced run is instrumented: its compute time is refused unless asked, and then the
profile carries the caveat. Route- and io-traced runs are slower than untraced ones too: where
the profile has untraced runs, compute, management and the overlap stall come from those, and
the traced runs give the routing and the flash latencies (the profile's ``tracing`` says which;
where a traced and an untraced run share a configuration, the overhead is measured).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.predict import MIB, batch_flash_ms
from bmoe.analyze.verdict import OFF_CPU_PCT, off_cpu_pct
from bmoe.cache import DEFAULT_POLICY, policy_name
from bmoe.errors import BmoeError
from bmoe.formats.decode import ComputeTrace, IoTrace
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.profile import DEFAULT_COVERAGE, DeviceProfile
from bmoe.formats.route import RouteTrace

#: The native engine's defaults for what a file without a preamble does not say.
DEFAULT_LANES = 4
DEFAULT_THREADS = 4
#: A term whose contributing runs' means differ by more than this (%, max over min) is
#: unsettled: the runs disagree about it.
RUNS_DISAGREE_PCT = 25.0
#: Tokens per block when a run's tokens are cut into blocks for the spread of a term's mean.
BLOCK_TOKENS = 16
_STREAMING_LINE = re.compile(r"expert streaming ON\b(?P<rest>.*)$", re.MULTILINE)


@dataclass
class ProfileRun:
    """One recorded run: its metrics and whichever traces and records were written with it."""

    metrics: MetricsRun
    route: RouteTrace | None = None
    io: IoTrace | None = None
    compute: ComputeTrace | None = None
    record: dict[str, Any] | None = None  # the sweep's record.json of the run
    log: dict[str, Any] = field(default_factory=dict)  # end-of-run figures (.log / .out)
    pressure: dict[str, Any] = field(default_factory=dict)  # the .metrics sidecar
    streaming_line: dict[str, Any] = field(default_factory=dict)  # "expert streaming ON" keys

    @property
    def name(self) -> str:
        return self.metrics.path or "run"

    @property
    def compute_traced(self) -> bool:
        params = self.metrics.params
        return self.compute is not None or bool(params.get("compute_trace_layers"))

    @property
    def traced(self) -> bool:
        """Instrumented: a trace was recorded with it, or its preamble says it was probed."""
        params = self.metrics.params
        probed = any(bool(params.get(k)) for k in ("predict_log", "prefetch_sync"))
        recorded = self.record is not None and any(
            bool((self.record.get("params") or {}).get(k))
            for k in ("route_trace", "io_trace", "compute_trace", "compute_trace_layers")
        )
        return (
            self.compute_traced
            or self.route is not None
            or self.io is not None
            or probed
            or recorded
        )

    @property
    def lanes(self) -> int:
        return run_config(self).io_threads

    @property
    def overlap(self) -> bool:
        return run_config(self).overlap

    def figure(self, key: str) -> Any:
        """A summary figure: the trailer's, else the end-of-run line's, else None."""
        value = self.metrics.summary.get(key)
        return self.log.get(key) if value is None else value


@dataclass
class RunConfig:
    """The configuration a run used, from its preamble; what a file does not say is inferred
    (from its summary, its end-of-run lines, its rows) or the engine's default, and
    ``assumed`` says which and how."""

    cache_mb: float | None
    io_threads: int
    prefetch: int
    overlap: bool
    policy: str
    threads: int
    n_expert_used: int | None
    drop: float | None
    streaming: bool
    assumed: dict[str, str] = field(default_factory=dict)

    def axes(self) -> dict[str, Any]:
        return {
            "cache_mb": self.cache_mb,
            "io_threads": self.io_threads,
            "prefetch": self.prefetch,
            "overlap": int(self.overlap),
            "policy": self.policy,
        }


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def run_config(run: ProfileRun) -> RunConfig:
    """What configuration `run` measured (see :class:`RunConfig`)."""
    params, rows = run.metrics.params, run.metrics.rows
    assumed: dict[str, str] = {}
    line = run.streaming_line
    io_meta = run.io.meta if run.io is not None else {}

    cache = _number(params.get("cache_mb"))
    if cache is None:
        for source, value in (
            ("the rows' cache_budget_mib", rows["cache_budget_mib"].median()
             if "cache_budget_mib" in rows and len(rows) else None),
            ("the summary's cache_budget_MiB", run.figure("cache_budget_MiB")),
            ("the log's expert streaming line", line.get("cache")),
            ("the resident cache (cache_resident_MiB)", run.figure("cache_resident_MiB")),
        ):  # fmt: skip
            cache = _number(value)
            if cache is not None:
                assumed["cache_mb"] = f"from {source}"
                break

    lanes = _number(params.get("io_threads")) or _number(io_meta.get("io_threads"))
    if not lanes:
        lanes = _number(line.get("io_threads"))
        if lanes:
            assumed["io_threads"] = "from the log's expert streaming line"
        else:
            lanes = DEFAULT_LANES
            assumed["io_threads"] = f"not recorded: the engine's default {DEFAULT_LANES}"

    if "prefetch" in params:
        prefetch = int(_number(params.get("prefetch")) or 0)
    else:
        spec = _number(run.figure("spec_read_MiB")) or 0.0
        prefetch = 1 if spec > 0 else 0
        if spec > 0:
            assumed["prefetch"] = (
                f"on ({spec:.1f} MiB speculative in its summary); its depth is not recorded"
            )

    if "overlap" in params:
        overlap = bool(params["overlap"])
    else:
        stalled = "stall_ms" in rows and bool((rows["stall_ms"] > 0).any())
        overlap = stalled or bool(_number(run.figure("stall_s/tok")))
        assumed["overlap"] = "from stall_ms (non-zero under --overlap only)"

    named = params.get("cache_policy")
    policy = policy_name(named) if named else DEFAULT_POLICY

    threads = _number(params.get("threads")) or _number(run.figure("threads"))
    if not threads:
        threads = DEFAULT_THREADS
        assumed["threads"] = f"not recorded: the engine's default {DEFAULT_THREADS}"
    if "threads" not in params and "threads" in run.log:
        assumed["threads"] = "from the end-of-run compute line"

    k = _number(params.get("n_expert_used"))
    if k is None and run.route is not None:
        k = _number(run.route.meta.get("n_expert_used"))
    drop = _number(params.get("drop_cold_frac"))

    streaming = bool(params.get("moe_stream", 1))
    if "moe_stream" not in params and "read_bytes" in rows and len(rows):
        hit = rows["cache_hit_pct"] if "cache_hit_pct" in rows else pd.Series([0.0])
        streaming = bool((rows["read_bytes"] > 0).any()) or bool((hit >= 0).any())
    return RunConfig(
        cache_mb=cache,
        io_threads=int(lanes),
        prefetch=prefetch,
        overlap=overlap,
        policy=policy,
        threads=int(threads),
        n_expert_used=int(k) if k else None,
        drop=drop if drop else None,
        streaming=streaming,
        assumed=assumed,
    )


# ----------------------------------------------------------------------------- reading


def _streaming_line(text: str) -> dict[str, Any]:
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


def _beside(path: Path, run: ProfileRun) -> None:
    """Fill `run` with what was recorded beside its metrics file: the sweep's record.json
    (a run folder), the end-of-run lines (``.log`` / ``.out``) and the pressure sidecar."""
    from bmoe.formats.runlog import read_run_output
    from bmoe.formats.sidecar import pressure_sidecar_for, read_pressure

    record = path.parent / "record.json"
    if record.is_file() and path.name == "run.csv":
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        run.record = data if isinstance(data, dict) else None
    for suffix in (".log", ".out"):
        log = path.with_suffix(suffix)
        if not log.is_file() or log.stat().st_size > 64 * MIB:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                output = read_run_output(log)
            except (BmoeError, OSError):
                continue
        run.log = {**output.figures, **run.log}
        run.pressure = {**output.pressure, **run.pressure}
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        run.streaming_line = run.streaming_line or _streaming_line(text)
    sidecar = pressure_sidecar_for(path)
    if sidecar is not None:
        with contextlib.suppress(BmoeError, OSError):
            run.pressure = {**read_pressure(sidecar), **run.pressure}


def read_runs(paths: Iterable[str | os.PathLike]) -> list[ProfileRun]:
    """Runs from metrics CSVs (their traces, end-of-run lines, pressure sidecar and sweep
    record beside them are found by name) or folders (every metrics CSV inside,
    recursively)."""
    from bmoe.analyze.runfiles import traces_beside
    from bmoe.formats.detect import detect_bytes
    from bmoe.formats.load import load_file, read_head

    paths = list(paths)
    metrics_paths: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            candidates = [path]
        else:
            raise BmoeError(f"{path}: no such file or folder")
        for candidate in candidates:
            if candidate.suffix in (".csv", ".metrics", ".parquet") or candidate == path:
                try:
                    kind = detect_bytes(read_head(candidate, 4096))
                except OSError:
                    continue
                if kind == "metrics":
                    metrics_paths.append(candidate)
    if not metrics_paths:
        raise BmoeError(f"no metrics CSV in {', '.join(map(str, paths))}")
    runs = []
    for path in metrics_paths:
        run = ProfileRun(load_file(path, "metrics"))
        for trace in traces_beside(path):
            kind = detect_bytes(read_head(trace, 4096))
            if kind is not None:
                setattr(run, kind, load_file(trace, kind))
        _beside(path, run)
        runs.append(run)
    return runs


# ----------------------------------------------------------------------------- per token


def decode_misses(route: RouteTrace) -> pd.DataFrame:
    """Per decode (step, layer) of a recorded run: the distinct experts it missed (read on
    demand). ``token`` numbers the decode steps 0, 1, ... in order."""
    rows = route.rows
    dec = rows[rows["phase"] != 0] if "phase" in rows else rows
    if "residency" not in dec:
        raise BmoeError(f"{route.path or 'route trace'}: no residency column (misses unknown)")
    read = dec["residency"] == 0
    if "dropped" in dec:  # a dropped routing was never read
        read &= dec["dropped"] == 0
    turn = dec["turn"] if "turn" in dec else pd.Series(0, index=dec.index)
    frame = pd.DataFrame({"turn": turn, "step": dec["step"], "layer": dec["layer"]})
    keys = frame[read].assign(expert=dec.loc[read, "expert"]).drop_duplicates()
    per = keys.groupby(["turn", "step", "layer"]).size().rename("misses").reset_index()
    tokens = frame[["turn", "step"]].drop_duplicates().sort_values(["turn", "step"])
    tokens["token"] = np.arange(len(tokens))
    return per.merge(tokens, on=["turn", "step"], how="left")


@dataclass
class Tokens:
    """Per decode token of one run, in the profile's units: the times the metrics recorded
    (NaN where a column is absent), reads of ``unit`` bytes (demand ``misses`` and
    ``prefetched``), and the per-batch matrix of demand reads (tokens x read batches)."""

    frame: pd.DataFrame
    batches: np.ndarray  # float64, tokens x layers (one column when the layers are unknown)


def _column(rows: pd.DataFrame, name: str, default: float = np.nan) -> np.ndarray:
    if name not in rows:
        return np.full(len(rows), default)
    return pd.to_numeric(rows[name], errors="coerce").to_numpy(np.float64)


def token_reads(
    run: ProfileRun, unit: float, n_layers: int | None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Per decode token of `run`: demand and speculative reads (in reads of `unit` bytes) and
    the per-batch matrix of demand reads. From the route trace where the run has one (exact
    per layer), else the token's ``read_bytes`` (the speculative share from the io trace or,
    spread evenly, the summary's ``spec_read_MiB``) split evenly over `n_layers` (one batch
    per token when the layers are unknown)."""
    rows = run.metrics.rows.reset_index(drop=True)
    n = len(rows)
    read = _column(rows, "read_bytes", 0.0)
    spec = np.zeros(n)
    if run.io is not None and "spec" in run.io.rows and len(run.io.rows):
        io = run.io.rows
        dec = io[io["phase"] != 0] if "phase" in io else io
        if len(dec):
            steps = np.sort(dec["step"].unique())
            moved = dec[dec["spec"] != 0].groupby("step")["read_bytes"].sum()
            idx = np.searchsorted(steps, moved.index.to_numpy())
            keep = idx < n
            np.add.at(spec, idx[keep], moved.to_numpy(np.float64)[keep])
    else:
        total = _number(run.figure("spec_read_MiB")) or 0.0
        if total > 0 and n:
            spec = np.minimum(np.full(n, total * MIB / n), read)
    demand = np.maximum(read - spec, 0.0)
    if run.route is not None and "residency" in run.route.rows and n_layers:
        per = decode_misses(run.route)
        per = per[per["token"] < n]
        layers = sorted(run.route.expert_bytes()) or sorted(per["layer"].unique())
        col = {layer: i for i, layer in enumerate(layers)}
        matrix = np.zeros((n, max(len(layers), 1)))
        known = per["layer"].isin(col)
        np.add.at(
            matrix,
            (per.loc[known, "token"].to_numpy(np.int64),
             per.loc[known, "layer"].map(col).to_numpy(np.int64)),
            per.loc[known, "misses"].to_numpy(np.float64),
        )  # fmt: skip
    else:
        misses = demand / unit
        if n_layers:
            whole = np.rint(misses)
            base, extra = np.divmod(whole, n_layers)
            matrix = base[:, None] + (np.arange(n_layers)[None, :] < extra[:, None])
        else:
            matrix = misses[:, None]
    prefetched = spec / unit
    if run.io is not None and "spec" in run.io.rows and len(run.io.rows):
        io = run.io.rows
        dec = io[(io["spec"] != 0) & (io["phase"] != 0)] if "phase" in io else io[io["spec"] != 0]
        if len(dec):  # count experts, not bytes, where the trace says which
            steps = np.sort(io.loc[io["phase"] != 0, "step"].unique()) if "phase" in io else (
                np.sort(io["step"].unique()))  # fmt: skip
            per = dec[["step", "layer", "expert"]].drop_duplicates().groupby("step").size()
            idx = np.searchsorted(steps, per.index.to_numpy())
            keep = idx < n
            prefetched = np.zeros(n)
            np.add.at(prefetched, idx[keep], per.to_numpy(np.float64)[keep])
    frame = pd.DataFrame(
        {
            "read_mib": read / MIB,
            "spec_mib": spec / MIB,
            "misses": matrix.sum(axis=1),
            "prefetched": prefetched,
        }
    )
    return frame, matrix


def _token_frame(run: ProfileRun, unit: float, n_layers: int | None) -> Tokens:
    rows = run.metrics.rows.reset_index(drop=True)
    reads, matrix = token_reads(run, unit, n_layers)
    cpu = _column(rows, "cpu_ms")
    if np.nansum(cpu) <= 0:
        cpu[:] = np.nan  # 0 means unmeasured
    majflt = _column(rows, "majflt")
    if "majflt" in rows and np.nansum(majflt) <= 0 and np.nansum(cpu) != np.nansum(cpu):
        majflt[:] = np.nan  # a platform that reports neither
    frame = pd.DataFrame(
        {
            "wall_ms": _column(rows, "wall_ms"),
            "io_ms": _column(rows, "io_ms"),
            "compute_ms": _column(rows, "compute_ms"),
            "mgmt_ms": _column(rows, "mgmt_ms"),
            "stall_ms": _column(rows, "stall_ms", 0.0),
            "cpu_ms": cpu,
            "majflt": majflt,
            **{c: reads[c].to_numpy() for c in reads},
        }
    )
    return Tokens(frame, matrix)


# ----------------------------------------------------------------------------- model section


def _summary_sizes(run: ProfileRun) -> tuple[dict[int, int], str] | None:
    """Expert sizes a run's preamble and summary imply: v2's ``cache_cycle_mb`` (one token's
    worst-case routed bytes) or v1's ``token_demand_MiB`` / ``layer_demand_MiB`` over
    ``n_layer`` x ``n_expert_used`` (every layer taken as MoE, all experts one size)."""
    params = run.metrics.params
    n_layer = _number(params.get("n_layer"))
    k = _number(params.get("n_expert_used"))
    if not n_layer or not k:
        return None
    cycle = _number(params.get("cache_cycle_mb"))
    if cycle:
        per = cycle * MIB / (n_layer * k)
        return {i: round(per) for i in range(int(n_layer))}, "cache_cycle_mb"
    token = _number(run.figure("token_demand_MiB"))
    layer = _number(run.figure("layer_demand_MiB"))
    if token and layer:
        layers = max(1, round(token / layer))
        per = layer * MIB / k
        return {i: round(per) for i in range(layers)}, "token_demand_MiB, layer_demand_MiB"
    return None


def _check_against_runs(trace: RouteTrace, runs: Sequence[ProfileRun]) -> None:
    """Refuse a route trace of another model than the runs' (their preamble's n_layer,
    n_expert, top-k, or the expert sizes their summaries imply), naming both files."""
    meta = trace.meta
    where = trace.path or "the route trace"
    for run in runs:
        params = run.metrics.params
        for key in ("n_layer", "n_expert"):
            mine, theirs = _number(meta.get(key)), _number(params.get(key))
            if mine is not None and theirs is not None and mine != theirs:
                raise BmoeError(
                    f"{where} ({key}={int(mine)}) and {run.name} ({key}={int(theirs)}) are "
                    "runs of different models: a profile describes one model"
                )
        mine_k, theirs_k = _number(meta.get("n_expert_used")), _number(params.get("n_expert_used"))
        if mine_k is not None and theirs_k is not None and mine_k != theirs_k:
            raise BmoeError(
                f"{where} routes top-{int(mine_k)} but {run.name} ran top-{int(theirs_k)} "
                "(--n-expert-used changes the routing): give a trace recorded at the same top-k"
            )
        implied = _summary_sizes(run)
        sizes = trace.expert_bytes()
        if implied and sizes:
            theirs_mean = float(np.mean(list(implied[0].values())))
            mine_mean = float(np.mean(list(sizes.values())))
            # the summaries round to 0.1 MiB: allow that and 2 %
            slack = 0.02 * mine_mean + 0.1 * MIB / max(len(implied[0]), 1)
            if abs(theirs_mean - mine_mean) > slack:
                raise BmoeError(
                    f"{where} has experts of {mine_mean / MIB:.3f} MiB on average but "
                    f"{run.name} implies {theirs_mean / MIB:.3f} MiB ({implied[1]}): runs of "
                    "another model (or quantisation)"
                )


def _model_section(
    runs: Sequence[ProfileRun],
    trace: RouteTrace | None,
    expert_sizes: Mapping[int, int] | None,
    sizes_from: str | None,
) -> dict:
    named = [(r.name, r.route) for r in runs if r.route is not None and r.route.expert_bytes()]
    if trace is not None:
        if not trace.expert_bytes():
            raise BmoeError(f"{trace.path or 'the route trace'}: no expert_bytes in its preamble")
        _check_against_runs(trace, runs)
        named = [(trace.path or "the route trace", trace), *named]
    traces = [t for _n, t in named]
    sizes: dict[int, int] = {}
    source: str | None = None
    meta: dict[str, Any] = {}
    if named:
        first_name, first = named[0]
        sizes = first.expert_bytes()
        for name, other in named[1:]:
            if other.expert_bytes() != sizes:
                raise BmoeError(
                    f"{name} is a run of another model than {first_name} (expert sizes "
                    "differ): a profile describes one model on one device"
                )
        meta = first.meta
        source = f"route trace {first.path or first_name}"
        for run in runs:
            if run.route is not None:
                _check_against_runs(first, [run])
    elif expert_sizes:
        sizes = {int(k): int(v) for k, v in expert_sizes.items()}
        source = sizes_from or "the model file"
    else:
        for run in runs:
            implied = _summary_sizes(run)
            if implied:
                sizes = implied[0]
                source = f"the preamble of {run.name} ({implied[1]})"
                break
    params = next((r.metrics.params for r in runs if r.metrics.params), {})
    slices = 1
    read_per: dict[str, int] = {}
    ios = [r.io for r in runs if r.io is not None and len(r.io.rows)]
    if ios:
        slices = max(int(t.rows["proj"].nunique()) if "proj" in t.rows else 1 for t in ios)
        keys = ["turn", "phase", "step", "layer", "expert", "spec"]
        per = pd.concat(  # bytes one expert read moved, per run, then per layer
            [t.rows.groupby(keys, observed=True)["read_bytes"].sum() for t in ios]
        )
        per = per.groupby(level="layer").median()
        read_per = {str(int(k)): int(v) for k, v in per.items() if int(k) in sizes}
    route_path = traces[0].path if traces else None
    values = [float(v) for v in read_per.values()] or [float(v) for v in sizes.values()]
    unit = float(np.median(values)) if values else float(MIB)
    model_name = meta.get("model") or params.get("model") or ""
    return {
        "name": str(model_name).replace("\\", "/").rsplit("/", 1)[-1] or None,
        "route_trace": str(Path(route_path).resolve()) if route_path else None,
        "arch": meta.get("arch", params.get("arch")),
        "n_layer": meta.get("n_layer", params.get("n_layer")),
        "n_expert": meta.get("n_expert", params.get("n_expert")),
        "n_expert_used": meta.get("n_expert_used", params.get("n_expert_used")),
        "expert_bytes": {str(k): int(v) for k, v in sorted(sizes.items())},
        "read_bytes_per_expert": read_per,
        "slices_per_expert": slices,
        "sizes_from": source,
        "read_unit_bytes": round(unit),
    }


# ----------------------------------------------------------------------------- fits


def flash_table(io_traces: Iterable[tuple[IoTrace, int]]) -> pd.DataFrame:
    """Request latency by (lanes, request size) from io traces (each with the lane count it
    ran with): median, 10th and 90th percentile (ms), throughput at that many lanes, reads.
    Demand reads only (speculative ones queue behind them)."""
    parts = []
    for trace, lanes in io_traces:
        rows = trace.rows
        if not len(rows):
            continue
        rows = rows[rows["spec"] == 0] if "spec" in rows else rows
        parts.append(
            pd.DataFrame(
                {
                    "lanes": lanes,
                    "req_bytes": rows["req_bytes"].to_numpy(np.int64),
                    "read_bytes": rows["read_bytes"].to_numpy(np.int64),
                    "latency_ms": rows["latency_ns"].to_numpy(np.float64) / 1e6,
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=["lanes", "req_bytes", "latency_ms"])
    reads = pd.concat(parts, ignore_index=True)
    grouped = reads.groupby(["lanes", "req_bytes"])
    table = grouped["latency_ms"].agg(
        latency_ms="median",
        latency_ms_p10=lambda s: s.quantile(0.1),
        latency_ms_p90=lambda s: s.quantile(0.9),
        reads="size",
    )
    moved = grouped["read_bytes"].median()
    table["mib_s"] = (
        table.index.get_level_values("lanes") * moved / MIB / (table["latency_ms"] / 1e3)
    )
    out = table.reset_index()
    out["source"] = "io trace"
    return out


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a + b x by least squares, with a, b >= 0 (a constant when x does not vary)."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return 0.0, 0.0
    if np.ptp(x) == 0:
        if x[0] > 0:
            return 0.0, float(np.mean(y) / x[0])
        return float(max(np.mean(y), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(np.mean(y), 0.0)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)


def _fit_two(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a x1 + b x2 by least squares with a, b >= 0 (no intercept); where the two do not
    separate (collinear), all of it on x2."""
    keep = np.isfinite(x1) & np.isfinite(x2) & np.isfinite(y)
    x1, x2, y = x1[keep], x2[keep], y[keep]
    if not len(y) or not np.any(x2 > 0):
        return 0.0, 0.0
    design = np.column_stack([x1, x2])
    if np.linalg.matrix_rank(design) == 2 and np.linalg.cond(design) < 1e6:
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if a >= 0 and b >= 0:
            return float(a), float(b)
        if b > 0 and a < 0:
            return 0.0, float(np.sum(x2 * y) / np.sum(x2 * x2))
    return 0.0, float(max(np.sum(y), 0.0) / np.sum(x2))


# ----------------------------------------------------------------------------- spread


#: A term whose mean is uncertain by more than this (%, standard error from its block means)
#: is unsettled.
TERM_SE_PCT = 10.0


#: Parts a run is cut into for how much its mean drifts (the interval's width).
RUN_PARTS = 4


def _block_ratios(values: np.ndarray, model: np.ndarray, parts: int | None = None) -> np.ndarray:
    """Per block of :data:`BLOCK_TOKENS` consecutive tokens (at least two where there are 4
    tokens or more; or `parts` equal blocks), measured over modelled: sum(values) /
    sum(model)."""
    keep = np.isfinite(values) & np.isfinite(model)
    values, model = values[keep], model[keep]
    n = len(values)
    if not n:
        return np.asarray([])
    k = 1 if n < 4 else (min(parts, n) if parts else max(2, n // BLOCK_TOKENS))
    out = []
    for v, m in zip(np.array_split(values, k), np.array_split(model, k), strict=True):
        if m.sum() > 0:
            out.append(v.sum() / m.sum())
    return np.asarray(out)


def term_spread(
    per_run: Mapping[str, np.ndarray], fitted: Mapping[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """How settled a term is, from its per-token values in each run it came from, as ratios
    to what the term's model says per token (`fitted`: its fit, where the term depends on the
    reads; else its mean): the mean, each run's ratio, the coefficient of variation of the
    ratios over blocks of tokens (within runs) and over runs, the standard error of the
    mean from the blocks, and ``sd_rel``, how much a run's mean of the term moves (between
    runs or between quarters of a run, whichever is larger)."""
    values = {n: np.asarray(v, dtype=np.float64) for n, v in per_run.items()}
    every: np.ndarray = (
        np.concatenate([v[np.isfinite(v)] for v in values.values()]) if values else np.array([])
    )
    mean = float(np.mean(every)) if len(every) else float("nan")
    if fitted is None:
        model = {n: np.full(len(v), mean) for n, v in values.items()}
    else:
        model = {n: np.asarray(fitted[n], dtype=np.float64) for n in values}
    blocks = [_block_ratios(values[n], model[n]) for n in values]
    ratios = np.concatenate(blocks) if blocks else np.asarray([])
    quarters = [_block_ratios(values[n], model[n], RUN_PARTS) for n in values]
    drift = 0.0
    if quarters:  # how far a part of a run strays from its run: pooled over runs
        spreads = [np.std(q / q.mean(), ddof=1) for q in quarters if len(q) > 1 and q.mean() > 0]
        drift = float(np.sqrt(np.mean(np.square(spreads)))) if spreads else 0.0
    run_ratio = {}
    for name in values:
        keep = np.isfinite(values[name]) & np.isfinite(model[name])
        total = float(model[name][keep].sum())
        if total > 0:
            run_ratio[name] = float(values[name][keep].sum()) / total
    centre = float(np.mean(ratios)) if len(ratios) else 1.0
    block_cv = float(np.std(ratios, ddof=1) / centre) if len(ratios) > 1 and centre > 0 else 0.0
    se = block_cv / np.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    run_values = np.asarray(list(run_ratio.values()))
    if len(run_values) > 1 and run_values.mean() > 0:
        run_cv = float(np.std(run_values, ddof=1) / run_values.mean())
        disagree = float(100.0 * (run_values.max() / max(run_values.min(), 1e-12) - 1.0))
    else:
        run_cv, disagree = float("nan"), 0.0
    return {
        "value": mean,
        "p10": float(np.quantile(every, 0.1)) if len(every) else float("nan"),
        "p90": float(np.quantile(every, 0.9)) if len(every) else float("nan"),
        "run_means": {n: float(np.nanmean(v)) for n, v in values.items() if np.isfinite(v).any()},
        "run_ratios": run_ratio,
        "block_cv_pct": 100.0 * block_cv,
        "se_pct": 100.0 * se,
        "run_cv_pct": 100.0 * run_cv if run_cv == run_cv else None,
        "runs_disagree_pct": disagree,
        "drift_cv_pct": 100.0 * drift,
        "sd_rel": max(drift, run_cv) if len(run_values) > 1 else drift,
        "tokens": len(every),
    }


def _provenance(
    runs: Sequence[str], columns: Sequence[str], spread: dict[str, Any], note: str = ""
) -> dict[str, Any]:
    """A term's record: where it came from, its spread, and whether it is settled (with why
    not: the runs disagree about it by more than :data:`RUNS_DISAGREE_PCT` %, or its mean is
    uncertain by more than :data:`TERM_SE_PCT` %)."""
    why = []
    if spread.get("runs_disagree_pct", 0.0) > RUNS_DISAGREE_PCT:
        means = ", ".join(f"{v:.3g}" for v in spread["run_means"].values())
        why.append(f"its runs disagree by {spread['runs_disagree_pct']:.0f} % (run means {means})")
    if spread.get("se_pct", 0.0) > TERM_SE_PCT:
        why.append(
            f"its mean is uncertain by +-{spread['se_pct']:.0f} % (tokens vary by "
            f"{spread['block_cv_pct']:.0f} % from block to block)"
        )
    return {
        "runs": list(runs),
        "columns": list(columns),
        **spread,
        "settled": not why,
        "why": "; ".join(why) or None,
        "note": note or None,
    }


# ----------------------------------------------------------------------------- system state


def run_state(run: ProfileRun, tokens: pd.DataFrame, config: RunConfig) -> dict[str, Any]:
    """The system state a run was measured in: its sweep record's system warnings and entry
    load (where it ran in a sweep), the engine's CPU share (CPU time over wall time), and its
    off-CPU share (the verdict's measure: wall time that was neither CPU time per thread nor
    a measured wait), and whether it was starved of a core."""
    record = run.record or {}
    entry = record.get("entry") if isinstance(record.get("entry"), dict) else {}
    wall = float(np.nansum(tokens["wall_ms"]))
    cpu = float(np.nansum(tokens["cpu_ms"])) if tokens["cpu_ms"].notna().any() else None
    n = max(len(tokens), 1)
    frame = pd.DataFrame(
        {
            "tok_s_mean": [1000.0 * n / wall if wall > 0 else np.nan],
            "cpu_s_per_token": [cpu / n / 1000.0 if cpu else np.nan],
            "threads": [config.threads],
            "stall_ms_per_token": [float(np.nanmean(tokens["stall_ms"])) if config.overlap
                                   else 0.0],
            "io_s_per_token": [float(np.nanmean(tokens["io_ms"])) / 1000.0
                               if tokens["io_ms"].notna().any() else 0.0],
            "mgmt_ms_per_token": [float(np.nanmean(tokens["mgmt_ms"]))
                                  if tokens["mgmt_ms"].notna().any() else 0.0],
        }
    )  # fmt: skip
    off = off_cpu_pct(frame).iloc[0]
    warnings_ = record.get("system_warnings") or []
    share = record.get("engine_cpu_share")
    if share is None and cpu and wall > 0:
        share = cpu / wall
    off_value = None if off != off else float(off)
    return {
        "name": run.name,
        "version": run.metrics.version,
        "tokens": len(tokens),
        "tok_s": 1000.0 * n / wall if wall > 0 else None,
        **config.axes(),
        "threads": config.threads,
        "n_expert_used": config.n_expert_used,
        "dense_weights": run.metrics.params.get("dense_weights"),
        "traced": run.traced,
        "compute_traced": run.compute_traced,
        "assumed": dict(config.assumed),
        "system_warnings": [str(w) for w in warnings_],
        "load_1m": entry.get("load_1m") if entry else None,
        "cpu_share": None if share is None else float(share),
        "off_cpu_pct": off_value,
        "starved": bool(off_value is not None and off_value > OFF_CPU_PCT),
    }


# ----------------------------------------------------------------------------- building


def _refuse_unusable(run: ProfileRun, config: RunConfig) -> None:
    rows = run.metrics.rows
    need = [c for c in ("wall_ms", "compute_ms") if c not in rows]
    if need:
        raise BmoeError(f"{run.name}: no {need[0]} column (a profile needs per-token times)")
    if not len(rows):
        raise BmoeError(f"{run.name}: no token rows")
    if not config.streaming:
        raise BmoeError(
            f"{run.name}: a run without expert streaming (plain mmap) measures no flash reads "
            "or cache: nothing of it applies to a streaming configuration"
        )
    if "io_ms" not in rows and run.io is None:
        raise BmoeError(
            f"{run.name}: no io_ms column and no io trace: the flash wait of its tokens is "
            "unknown (a profile needs it)"
        )


def build_profile(
    runs: Sequence[ProfileRun],
    *,
    allow_traced: bool = False,
    trace: RouteTrace | None = None,
    expert_sizes: Mapping[int, int] | None = None,
    sizes_from: str | None = None,
    coverage: float = DEFAULT_COVERAGE,
) -> DeviceProfile:
    """The device profile these runs measure (see the module docstring). `trace` is a route
    trace of the same model (its expert sizes); `expert_sizes` sizes read from the model
    file (`sizes_from` says which); `coverage` the coverage the prediction intervals of the
    profile are to have."""
    if not runs:
        raise BmoeError("no runs to build a profile from")
    configs = {r.name: run_config(r) for r in runs}
    for run in runs:
        _refuse_unusable(run, configs[run.name])
    ks = {c.n_expert_used for c in configs.values() if c.n_expert_used}
    if len(ks) > 1:
        named = ", ".join(f"{n} (top-{c.n_expert_used})" for n, c in configs.items())
        raise BmoeError(f"the runs ran at different top-k: {named}; one profile per top-k")
    model = _model_section(runs, trace, expert_sizes, sizes_from)
    sized = bool(model["expert_bytes"])
    unit = float(model["read_unit_bytes"])
    n_layers = len(model["expert_bytes"]) or None
    slices = model["slices_per_expert"]
    req = float(np.median(list(model["expert_bytes"].values()))) / slices if sized else unit
    caveats: list[str] = []
    absent: dict[str, str] = {}
    terms: dict[str, dict[str, Any]] = {}
    tokens = {r.name: _token_frame(r, unit, n_layers) for r in runs}
    frames = {name: t.frame for name, t in tokens.items()}
    states = [run_state(r, frames[r.name], configs[r.name]) for r in runs]
    state = {s["name"]: s for s in states}
    if not sized:
        caveats.append(
            "expert sizes unknown (no route trace, model file or preamble said): reads are "
            "priced per MiB and a route trace cannot be predicted with this profile; give "
            "--trace ROUTE_TRACE of this model (or its GGUF) to price reads"
        )
    assumed: dict[tuple[str, str], list[str]] = {}
    for name, config in configs.items():
        for key, how in config.assumed.items():
            if key in ("io_threads", "threads", "prefetch", "cache_mb"):
                assumed.setdefault((key, how), []).append(Path(name).name)
    for (key, how), names in assumed.items():
        caveats.append(f"{key} {how} ({', '.join(names)})")

    # which runs measure which terms: compute and management from untraced runs if any
    compute_traced = [r for r in runs if r.compute_traced]
    untraced = [r for r in runs if not r.traced]
    eligible = [r for r in runs if not r.compute_traced]
    if not eligible:
        if not allow_traced:
            raise BmoeError(
                "every run was compute-traced (per-node timing synchronises each graph node): "
                "their compute time is not a benchmark figure; add an untraced run, or allow "
                "traced runs (--allow-traced) and the profile will say so"
            )
        eligible = list(runs)
        caveats.append(
            "compute time from compute-traced runs: instrumented, expect predictions too slow"
        )
    timing = untraced or eligible
    tracing = _tracing_section(runs, untraced, timing, frames, configs)
    unsettled: list[str] = []
    if tracing["how"] == "not removed":
        unsettled.append(
            "compute and management come from traced runs only (tracing slows them): "
            "untraced configurations will be predicted slow; add one untraced run"
        )
    elif tracing["how"] != "no traced runs":
        caveats.append(f"tracing: {tracing['how']}")
    del compute_traced

    # management: a fixed part per token and a part per read admitted
    mgmt_runs = [r for r in timing if frames[r.name]["mgmt_ms"].notna().any()]
    if not mgmt_runs:
        mgmt_runs = [r for r in runs if frames[r.name]["mgmt_ms"].notna().any()]
    if mgmt_runs:
        admits = np.concatenate(
            [(frames[r.name]["misses"] + frames[r.name]["prefetched"]).to_numpy()
             for r in mgmt_runs]
        )  # fmt: skip
        mgmt_ms = np.concatenate([frames[r.name]["mgmt_ms"].to_numpy() for r in mgmt_runs])
        base, per_admit = _fit_line(admits.astype(float), mgmt_ms)
        terms["mgmt"] = _provenance(
            [r.name for r in mgmt_runs],
            ["mgmt_ms", "read_bytes" if not any(r.route for r in mgmt_runs) else "route trace"],
            term_spread(
                {r.name: frames[r.name]["mgmt_ms"].to_numpy() for r in mgmt_runs},
                {
                    r.name: base
                    + per_admit
                    * (frames[r.name]["misses"] + frames[r.name]["prefetched"]).to_numpy()
                    for r in mgmt_runs
                },
            ),
            note=f"{base:.3g} ms per token + {per_admit:.3g} ms per read admitted",
        )
    else:
        base, per_admit = 0.0, 0.0
        absent["mgmt"] = (
            "no run recorded mgmt_ms (v0 files of 8 columns): their compute_ms residual "
            "includes cache management"
        )
    mgmt = {"token_ms": base, "per_admit_ms": per_admit}

    def mgmt_of(name: str) -> np.ndarray:
        """Management per token: measured, else the fit (folded into compute there)."""
        frame = frames[name]
        measured = frame["mgmt_ms"].to_numpy()
        fitted = base + per_admit * (frame["misses"] + frame["prefetched"]).to_numpy()
        return np.where(np.isfinite(measured), measured, fitted)

    # memory pressure: major faults against the share of available memory asked for
    memory, fault_ms = _memory_section(runs, frames, configs, terms, absent)

    # compute: the residual, less what the fault and missing-mgmt terms explain; from CPU
    # time where the engine was starved of a core
    per_run_compute: dict[str, np.ndarray] = {}
    starved_notes = []
    calibration = _cpu_calibration(
        [r for r in timing if not state[r.name]["starved"]], frames, configs
    )
    starved_runs = [r for r in timing if state[r.name]["starved"]]
    uncalibrated = calibration is None and bool(starved_runs)
    if uncalibrated:  # CPU time one to one, less what grows with the reads (the lanes' CPU)
        calibration = _cpu_io_share(starved_runs, frames, configs)
        if calibration is not None:
            unsettled.append(
                "every run was starved of a core: compute is their CPU time per thread, "
                "uncalibrated (no unstarved run to weigh it against; threads that spin while "
                "they wait count as CPU time)"
            )
    for run in timing:
        frame = frames[run.name]
        compute = frame["compute_ms"].to_numpy().copy()
        if frame["mgmt_ms"].isna().all() and mgmt_runs:
            compute = compute - mgmt_of(run.name) * 1.0
        if fault_ms and frame["majflt"].notna().any():
            compute = compute - fault_ms * np.nan_to_num(frame["majflt"].to_numpy())
        if state[run.name]["starved"]:
            cpu = frame["cpu_ms"].to_numpy()
            if np.isfinite(cpu).any() and calibration is not None:
                scale, per_mib = calibration
                threads = configs[run.name].threads
                from_cpu = scale * (cpu / threads - per_mib * frame["read_mib"].to_numpy())
                compute = np.where(np.isfinite(from_cpu), np.maximum(from_cpu, 0.0), compute)
                starved_notes.append(
                    f"{run.name}: the engine was starved of a core "
                    f"({state[run.name]['off_cpu_pct']:.0f} % off-CPU): compute from its CPU "
                    "time"
                )
            else:
                unsettled.append(
                    f"{run.name} was starved of a core ({state[run.name]['off_cpu_pct']:.0f} % "
                    "off-CPU) and its compute cannot be taken from CPU time: it recorded none"
                )
        per_run_compute[run.name] = np.maximum(compute, 0.0)
    spread = term_spread(per_run_compute)
    columns = ["compute_ms"]
    if any(state[r.name]["starved"] for r in timing) and calibration is not None:
        columns.append("cpu_ms/threads")
    if fault_ms:
        columns.append("majflt")
    terms["compute"] = _provenance(
        [r.name for r in timing], columns, spread, note="; ".join(starved_notes)
    )
    all_compute = np.concatenate(list(per_run_compute.values()))
    compute_section = {
        "token_ms": float(np.mean(all_compute)),  # tok/s is tokens over summed time
        "token_ms_p10": float(np.quantile(all_compute, 0.1)),
        "token_ms_p90": float(np.quantile(all_compute, 0.9)),
        "expert_share": _expert_share([r.compute for r in runs if r.compute is not None]),
        "source": " and ".join(columns),
        "threads": int(np.median([configs[r.name].threads for r in timing])),
    }
    if compute_section["expert_share"] is None:
        absent["expert_share"] = "no compute trace among the runs (the dense/expert split)"
    if any(r.route is not None for r in runs) and not untraced:
        caveats.append("route-traced runs: their cache management includes the trace bookkeeping")

    # flash: io traces, else the serial runs' io_ms, else the overlap runs' lane time
    serial = [r for r in runs if not configs[r.name].overlap]
    overlapped = [r for r in runs if configs[r.name].overlap]
    table = flash_table((r.io, configs[r.name].io_threads) for r in serial if r.io is not None)
    if len(table):
        table["batch_overhead_ms"] = 0.0
        for lanes in sorted(table["lanes"].unique()):
            table.loc[table["lanes"] == lanes, "batch_overhead_ms"] = _batch_overhead(
                table,
                [r for r in serial if configs[r.name].io_threads == lanes],
                tokens,
                int(lanes),
                slices,
                req,
            )
        flash_runs = [r for r in serial if r.io is not None]
        flash_cols = ["io trace latency_ns", "io_ms"]
        traced_lanes = set(table["lanes"])
        rest = [r for r in serial if configs[r.name].io_threads not in traced_lanes]
        more = _flash_from_metrics(rest, tokens, configs, slices, req)
        if len(more):  # lane counts only untraced runs measured: from their io_ms
            table = pd.concat([table, more], ignore_index=True)
            flash_runs += [r for r in rest if frames[r.name]["io_ms"].notna().any()]
            flash_cols.append("read_bytes")
    else:
        table = _flash_from_metrics(serial, tokens, configs, slices, req)
        flash_runs = [r for r in serial if frames[r.name]["io_ms"].notna().any()]
        flash_cols = ["io_ms", "read_bytes"]
    lane_counts = set(table["lanes"]) if len(table) else set()
    extra = _flash_from_overlap(
        [r for r in overlapped if configs[r.name].io_threads not in lane_counts],
        tokens,
        configs,
        slices,
        req,
    )
    if len(extra):
        table = pd.concat([table, extra], ignore_index=True) if len(table) else extra
        flash_runs += [r for r in overlapped if configs[r.name].io_threads not in lane_counts]
        flash_cols.append("io_ms (lane busy time under --overlap)")
    if not len(table):
        raise BmoeError(
            "no flash measurement among the runs: no io trace and no token that read experts "
            "with an io_ms column"
        )
    lanes_seen = sorted(int(x) for x in table["lanes"].unique())
    flash_io = {r.name: frames[r.name]["io_ms"].to_numpy() for r in flash_runs}
    flash_fit = {
        r.name: _flash_fitted(table, tokens[r.name], configs[r.name], slices, req)
        for r in flash_runs
    }
    note = (
        f"measured at {lanes_seen[0]} lanes only (one point of the lane curve: other lane "
        "counts are scaled per lane, throughput held past it)"
        if len(lanes_seen) == 1
        else f"lane curve from {', '.join(map(str, lanes_seen))} lanes"
    )
    terms["flash"] = _provenance(
        [r.name for r in flash_runs], flash_cols, term_spread(flash_io, flash_fit), note=note
    )

    # the stall the overlap leaves, per token and per read missed
    overlap_section: dict[str, Any] = {}
    stall_runs = [r for r in timing if configs[r.name].overlap] or overlapped
    if stall_runs:
        misses = np.concatenate([frames[r.name]["misses"].to_numpy() for r in stall_runs])
        stall = np.concatenate([frames[r.name]["stall_ms"].to_numpy() for r in stall_runs])
        a, b = _fit_line(misses.astype(float), stall)
        overlap_section = {
            "stall_ms": a,
            "stall_ms_per_miss": b,
            "lanes": sorted({configs[r.name].io_threads for r in stall_runs}),
        }
        terms["stall"] = _provenance(
            [r.name for r in stall_runs],
            ["stall_ms", "read_bytes" if not any(r.route for r in stall_runs) else "route trace"],
            term_spread(
                {r.name: frames[r.name]["stall_ms"].to_numpy() for r in stall_runs},
                {r.name: a + b * frames[r.name]["misses"].to_numpy() for r in stall_runs},
            ),
            note=f"{a:.3g} ms per token + {b:.3g} ms per read missed",
        )
    else:
        absent["stall"] = "no run used --overlap: overlap configurations cannot be predicted"

    prefill = _prefill_section(runs)
    if not prefill:
        absent["prefill"] = "no run's summary has its prefill time"
    for term, record in terms.items():
        if not record["settled"]:
            unsettled.append(f"{term}: {record['why']}")
    if len(runs) == 1 and len(frames[runs[0].name]) < 2 * BLOCK_TOKENS:
        unsettled.append(
            f"one run of {len(frames[runs[0].name])} tokens: too few to tell a term's spread"
        )
    warned = [s for s in states if s["system_warnings"]]
    for s in warned:
        caveats.append(f"{s['name']}: system warnings: {'; '.join(s['system_warnings'])}")
    modes = {configs[r.name].overlap for r in runs}
    mode = "mixed" if len(modes) > 1 else ("overlap" if modes.pop() else "serial")
    profile = DeviceProfile(
        mode=mode,
        model=model,
        flash=table,
        compute=compute_section,  # type: ignore[arg-type]
        mgmt=mgmt,
        prefill=prefill,
        overlap=overlap_section,
        sources=[r.name for r in runs],
        caveats=caveats,
        memory=memory,
        terms=terms,
        absent=absent,
        runs=states,
        tracing=tracing,
        coverage=coverage,
        unsettled=unsettled,
    )
    from bmoe.formats.profile import profile_from_dict

    return profile_from_dict(json.loads(json.dumps(profile.to_dict())))  # validated


def _tracing_section(runs, untraced, timing, frames, configs) -> dict[str, Any]:
    """How the profile deals with traced runs, and the overhead where it can be measured (a
    traced and an untraced run of one configuration)."""
    traced = [r for r in runs if r.traced]
    if not traced:
        return {"how": "no traced runs"}
    out: dict[str, Any] = {
        "traced_runs": [r.name for r in traced],
        "timing_runs": [r.name for r in timing],
    }
    if untraced:
        out["how"] = (
            "compute, management and stall from the untraced runs; routing and flash "
            "latency from the traced ones"
        )
    else:
        out["how"] = "not removed"
    overhead: dict[str, list[float]] = {}
    for t in traced:
        key = configs[t.name].axes()
        twins = [u for u in untraced if configs[u.name].axes() == key]
        if twins:
            for col in ("compute_ms", "mgmt_ms"):
                a = float(np.nanmean(frames[t.name][col]))
                b = float(np.nanmean(np.concatenate([frames[u.name][col] for u in twins])))
                if np.isfinite(a) and np.isfinite(b):
                    overhead.setdefault(col, []).append(a - b)
    if overhead:
        out["overhead_ms"] = {k: float(np.mean(v)) for k, v in overhead.items()}
    return out


def _cpu_calibration(runs, frames, configs) -> tuple[float, float] | None:
    """How CPU time relates to compute on unstarved tokens: ``compute = scale x (cpu / threads
    - per_mib x read_mib)`` (the I/O lanes' CPU grows with what they read). None without
    unstarved tokens that recorded CPU time."""
    xs, mibs, ys = [], [], []
    for run in runs:
        frame = frames[run.name]
        cpu = frame["cpu_ms"].to_numpy() / configs[run.name].threads
        keep = np.isfinite(cpu) & np.isfinite(frame["compute_ms"].to_numpy())
        if keep.sum() < 4:
            continue
        xs.append(cpu[keep])
        mibs.append(frame["read_mib"].to_numpy()[keep])
        ys.append(frame["compute_ms"].to_numpy()[keep])
    if not xs:
        return None
    cpu, mib, compute = np.concatenate(xs), np.concatenate(mibs), np.concatenate(ys)
    # cpu/threads = compute / scale + per_mib x mib
    inv_scale, per_mib = _fit_two(compute, mib, cpu)
    if inv_scale <= 0:
        inv_scale, per_mib = (float(np.sum(cpu)) / max(float(np.sum(compute)), 1e-12)), 0.0
    if inv_scale <= 0:
        return None
    return 1.0 / inv_scale, per_mib


def _cpu_io_share(runs, frames, configs) -> tuple[float, float] | None:
    """Without an unstarved run: CPU time per thread taken one to one for compute, less the
    part that grows with the MiB read (the lanes' CPU: the slope of CPU time per thread on
    MiB read over the runs' tokens). None without CPU time."""
    xs, ys = [], []
    for run in runs:
        frame = frames[run.name]
        cpu = frame["cpu_ms"].to_numpy() / configs[run.name].threads
        keep = np.isfinite(cpu)
        xs.append(frame["read_mib"].to_numpy()[keep])
        ys.append(cpu[keep])
    if not xs or not sum(len(x) for x in xs):
        return None
    _base, per_mib = _fit_line(np.concatenate(xs), np.concatenate(ys))
    return 1.0, per_mib


def _memory_section(runs, frames, configs, terms, absent) -> tuple[dict[str, Any], float]:
    """Major faults per token against how much of the available memory a run asked for
    (its cache budget plus what else it kept resident), and the time one fault costs (the
    within-run slope of compute on faults). Empty (and named absent) without majflt."""
    faulting = [r for r in runs if frames[r.name]["majflt"].notna().any()]
    if not faulting:
        absent["memory"] = "no run recorded majflt (major faults): memory pressure not priced"
        return {}, 0.0
    xs, ys = [], []
    for run in faulting:
        frame = frames[run.name]
        faults = frame["majflt"].to_numpy()
        compute = frame["compute_ms"].to_numpy()
        keep = np.isfinite(faults) & np.isfinite(compute)
        if keep.sum() >= 4 and np.ptp(faults[keep]) > 0:
            xs.append(faults[keep] - faults[keep].mean())
            ys.append(compute[keep] - compute[keep].mean())
    fault_ms = 0.0
    how = "no run's faults varied: the cost of a fault is not measured"
    if xs:
        x, y = np.concatenate(xs), np.concatenate(ys)
        slope = float(np.sum(x * y) / np.sum(x * x)) if np.sum(x * x) > 0 else 0.0
        fault_ms = max(slope, 0.0)
        how = "within-run slope of compute_ms on majflt"
    points = []
    for run in faulting:
        frame = frames[run.name]
        rows = run.metrics.rows
        cache = configs[run.name].cache_mb or 0.0
        rss = float(rows["rss_mib"].median()) if "rss_mib" in rows else None
        avail = float(rows["mem_available_mib"].median()) if "mem_available_mib" in rows else None
        if (rss is None or avail is None) and run.pressure.get("peak_rss_kb"):
            rss = float(run.pressure["peak_rss_kb"]) / 1024.0
            before = run.pressure.get("mem_avail_before_kb")
            avail = (float(before) / 1024.0 - rss) if before else None
        if rss is None or avail is None or rss <= 0:
            continue
        anon = float(rows["rss_anon_mib"].median()) if "rss_anon_mib" in rows else rss
        resident_other = max(rss - min(cache, anon), 0.0)
        available = avail + rss
        points.append(
            {
                "run": run.name,
                "cache_mb": cache,
                "resident_other_mib": resident_other,
                "asked_mib": cache + resident_other,
                "available_mib": available,
                "faults_per_token": float(np.nanmean(frame["majflt"])),
            }
        )
    if not points:
        absent["memory"] = (
            "the runs recorded majflt but not their memory (rss_mib, mem_available_mib or a "
            "pressure sidecar): faults cannot be related to what a configuration asks (the "
            "runs' own faults stay in compute)"
        )
        return {}, 0.0
    resident = float(np.median([p["resident_other_mib"] for p in points]))
    available = float(np.median([p["available_mib"] for p in points]))
    memory = {
        "ms_per_fault": fault_ms,
        "points": points,
        "resident_mib": resident,
        "available_mib": available,
    }
    terms["memory"] = _provenance(
        [p["run"] for p in points],
        ["majflt", "compute_ms", "cache_budget_mib", "rss_mib", "mem_available_mib"],
        term_spread({r.name: frames[r.name]["majflt"].to_numpy() for r in faulting}),
        note=f"{fault_ms:.3g} ms per major fault ({how}); faults per token against the "
        "share of available memory a configuration asks for",
    )
    # faults differ between configurations by design: their spread is not a fault of the term
    terms["memory"].update(settled=True, why=None)
    return memory, fault_ms


def _prefill_section(runs: Sequence[ProfileRun]) -> dict[str, float]:
    prefill: dict[str, float] = {}
    rates = [
        r.figure("n_prompt") / r.figure("prefill_s")
        for r in runs
        if r.figure("prefill_s") and r.figure("n_prompt")
    ]
    if rates:
        prefill["tok_s"] = float(np.median(rates))
        prefill["prefill_s"] = float(
            np.median([r.figure("prefill_s") for r in runs if r.figure("prefill_s")])
        )
    loads = [r.figure("load_s") for r in runs if r.figure("load_s")]
    if loads:
        prefill["load_s"] = float(np.median(loads))
    return prefill


def with_probe(profile: DeviceProfile, flash: pd.DataFrame, where: str) -> DeviceProfile:
    """`profile` with its flash latencies replaced by a probe's (`where` it was measured);
    the per-batch overhead the runs measured (the engine's, not the device's) is kept, per
    lane count as the prediction interpolates it."""
    from bmoe.analyze.predict import request_latency_ms
    from bmoe.formats.profile import profile_from_dict

    table = flash.copy()
    req = float(table["req_bytes"].median())
    table["batch_overhead_ms"] = [
        request_latency_ms(profile.flash, req, int(lanes))[1] for lanes in table["lanes"]
    ]
    table["source"] = "probe"
    data = profile.to_dict()
    data["flash"] = table.to_dict(orient="records")
    data["caveats"] = [*profile.caveats, f"flash latency measured by probe on {where}"]
    if "flash" in data.get("terms", {}):
        data["terms"]["flash"]["note"] = f"probe on {where}"
    return profile_from_dict(data)


def _expert_share(traces: Sequence[ComputeTrace]) -> float | None:
    """Share of decode compute spent in expert matmuls (MUL_MAT_ID), from compute traces."""
    total = expert = 0.0
    for trace in traces:
        rows = trace.rows
        if not len(rows) or "op" not in rows:
            continue
        dec = rows[rows["phase"] != 0] if "phase" in rows else rows
        total += float(dec["wall_ns"].sum())
        expert += float(dec.loc[dec["op"].astype(str) == "MUL_MAT_ID", "wall_ns"].sum())
    return expert / total if total else None


def _waves(batches: np.ndarray, slices: int, lanes: int) -> np.ndarray:
    """Per token, the read waves of its batches at `lanes` lanes."""
    return np.ceil(batches * slices / max(lanes, 1)).sum(axis=1)


def _batch_overhead(table, runs, tokens, lanes, slices, req) -> float:
    """Per read batch, the flash wait the metrics recorded beyond the requests' latency."""
    if not runs:
        return 0.0
    flash = table.assign(batch_overhead_ms=0.0)[table["lanes"] == lanes]
    spent = predicted = batches = 0.0
    for run in runs:
        t = tokens[run.name]
        io = t.frame["io_ms"].to_numpy()
        if not np.isfinite(io).any():
            continue
        requests = t.batches * slices
        reading = requests > 0
        keep = np.isfinite(io)
        spent += float(io[keep].sum())
        per = batch_flash_ms(flash, requests[keep].ravel(), req, lanes)
        predicted += float(per.sum())
        batches += float(reading[keep].sum())
    return max(0.0, (spent - predicted) / batches) if batches else 0.0


def _flash_from_metrics(runs, tokens, configs, slices, req) -> pd.DataFrame:
    """Without io traces, from serial runs: per lane count, ``io_ms`` per token fitted as
    ``batch_overhead x batches + latency x waves`` (a wave: one request on each busy lane)."""
    out = []
    for lanes in sorted({configs[r.name].io_threads for r in runs}):
        io, batches, waves, ratios = [], [], [], []
        for run in (r for r in runs if configs[r.name].io_threads == lanes):
            t = tokens[run.name]
            w = _waves(t.batches, slices, lanes)
            b = (t.batches > 0).sum(axis=1).astype(float)
            y = t.frame["io_ms"].to_numpy()
            keep = np.isfinite(y) & (w > 0)
            io.append(y[keep])
            batches.append(b[keep])
            waves.append(w[keep])
            ratios.append(y[keep] / w[keep])
        if not io or not sum(len(x) for x in io):
            continue
        y, b, w = np.concatenate(io), np.concatenate(batches), np.concatenate(waves)
        overhead, latency = _fit_two(b, w, y)
        per_wave = np.concatenate(ratios)
        median = float(np.median(per_wave))
        scale = latency / median if median > 0 else 1.0
        out.append(
            {
                "lanes": lanes,
                "req_bytes": int(req),
                "latency_ms": latency,
                "latency_ms_p10": float(np.quantile(per_wave, 0.1)) * scale,
                "latency_ms_p90": float(np.quantile(per_wave, 0.9)) * scale,
                "batch_overhead_ms": overhead,
                "mib_s": lanes * req / MIB / (latency / 1e3) if latency > 0 else None,
                "reads": int(np.sum(w) * lanes),
                "source": "io_ms",
            }
        )
    if not out:
        return pd.DataFrame(columns=["lanes", "req_bytes", "latency_ms"])
    return pd.DataFrame(out)


def _flash_from_overlap(runs, tokens, configs, slices, req) -> pd.DataFrame:
    """From ``--overlap`` runs (``io_ms`` is the lanes' busy time there): per lane count, the
    busy time per request, a request's latency while the lanes read side by side."""
    out = []
    for lanes in sorted({configs[r.name].io_threads for r in runs}):
        busy, requests = [], []
        for run in (r for r in runs if configs[r.name].io_threads == lanes):
            frame = tokens[run.name].frame
            y = frame["io_ms"].to_numpy()
            n = ((frame["misses"] + frame["prefetched"]) * slices).to_numpy()
            keep = np.isfinite(y) & (n > 0)
            busy.append(y[keep])
            requests.append(n[keep])
        if not busy or not sum(len(x) for x in busy):
            continue
        y, n = np.concatenate(busy), np.concatenate(requests)
        latency = float(y.sum() / n.sum())
        per = y / n
        out.append(
            {
                "lanes": lanes,
                "req_bytes": int(req),
                "latency_ms": latency,
                "latency_ms_p10": float(np.quantile(per, 0.1)),
                "latency_ms_p90": float(np.quantile(per, 0.9)),
                "batch_overhead_ms": 0.0,
                "mib_s": lanes * req / MIB / (latency / 1e3) if latency > 0 else None,
                "reads": int(n.sum()),
                "source": "io_ms under --overlap (lane busy time)",
            }
        )
    if not out:
        return pd.DataFrame(columns=["lanes", "req_bytes", "latency_ms"])
    return pd.DataFrame(out)


def _flash_fitted(table, tokens: Tokens, config: RunConfig, slices: int, req: float):
    """Per token, the ``io_ms`` the flash table says: the batches' wait in serial, the lanes'
    busy time (latency per request) under overlap."""
    lanes = config.io_threads
    if config.overlap:
        latency, _ = _lane_latency(table, req, lanes)
        frame = tokens.frame
        return latency * ((frame["misses"] + frame["prefetched"]) * slices).to_numpy()
    requests = tokens.batches * slices
    per = batch_flash_ms(table, requests.ravel(), req, lanes).reshape(requests.shape)
    return per.sum(axis=1)


def _lane_latency(table, req: float, lanes: int) -> tuple[float, float]:
    from bmoe.analyze.predict import request_latency_ms

    return request_latency_ms(table, req, lanes)


# ----------------------------------------------------------------------------- against files


def _short_labels(names: Sequence[str]) -> list[str]:
    """File stems, with the parent folder added where two stems are the same."""
    stems = [Path(n).stem for n in names]
    out = []
    for name, stem in zip(names, stems, strict=True):
        if stems.count(stem) > 1:
            stem = f"{Path(name).parent.name}/{stem}"
        out.append(stem)
    return out


def measured_files(
    runs: Sequence[ProfileRun], profile: DeviceProfile, trace: RouteTrace | None = None
) -> pd.DataFrame:
    """One row per loose metrics file: its configuration (from its preamble; what a file does
    not say is inferred as :func:`run_config` explains, in ``assumed``), what it measured
    (tok/s over its tokens, steady-state tok/s, MiB/token, hit %), ``comparable`` (None, or
    why no prediction of it can be compared: no expert streaming, another top-k or model),
    ``measurement`` (the verdict's reasons its figure is not firm: mostly off-CPU, traced)
    and ``notes`` (partial runs, CPU temperature)."""
    from bmoe.analyze.metrics import run_summary
    from bmoe.analyze.verdict import cell_stability

    labels = _short_labels([r.name for r in runs])
    rows = []
    attempts = []
    k_profile = _number(profile.model.get("n_expert_used"))
    k_trace = _number(trace.meta.get("n_expert_used")) if trace is not None else None
    for label, run in zip(labels, runs, strict=True):
        config = run_config(run)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = run_summary(run.metrics)
        frame = _token_frame(run, profile.read_unit_bytes, None).frame
        params = run.metrics.params
        why = None
        if not config.streaming:
            why = "no expert streaming (plain mmap): nothing the profile prices"
        elif config.n_expert_used and k_trace and config.n_expert_used != k_trace:
            why = (
                f"top-{config.n_expert_used}, the trace top-{int(k_trace)} "
                "(--n-expert-used changes the routing)"
            )
        elif config.n_expert_used and k_profile and config.n_expert_used != k_profile:
            why = f"top-{config.n_expert_used}, the profile's runs top-{int(k_profile)}"
        else:
            for key in ("n_layer", "n_expert"):
                mine = _number(params.get(key))
                theirs = _number(profile.model.get(key))
                if mine is not None and theirs is not None and mine != theirs:
                    why = f"another model ({key} {int(mine)}, the profile's {int(theirs)})"
                    break
            file_knows = _number(params.get("n_layer")) is not None
            profile_knows = _number(profile.model.get("n_layer")) is not None
            if why is None and file_knows != profile_knows:
                why = (
                    f"a run of {params.get('model') or 'a named model'}; the profile's runs "
                    "do not record their model: cannot tell it is the same"
                    if file_knows
                    else "its file does not record its model (v0): cannot tell it is the "
                    f"profile's ({profile.model.get('name') or 'named'})"
                )
        dense = params.get("dense_weights")
        profile_dense = {
            str(r["dense_weights"]) for r in profile.runs if r.get("dense_weights") is not None
        }
        if why is None and dense is not None and profile_dense and dense not in profile_dense:
            why = (
                f"dense weights {dense}, the profile's runs {', '.join(sorted(profile_dense))}: "
                "not a configuration the profile prices"
            )
        notes = [f"{k} {v}" for k, v in config.assumed.items()]
        if run.metrics.partial:
            notes.append(f"partial: {len(run.metrics.rows)} of {run.metrics.steps} tokens")
        temp = run.pressure.get("cpu_temp_max_mC")
        if temp:
            notes.append(f"CPU up to {float(temp) / 1000:.1f} °C")
        tokens = len(frame)
        wall = float(frame["wall_ms"].sum())
        state = run_state(run, frame, config)
        rows.append(
            {
                "cell": label,
                "file": run.name,
                **config.axes(),
                "version": run.metrics.version,
                "tokens": tokens,
                "tok_s": 1000.0 * tokens / wall if wall > 0 else float("nan"),
                "steady_tok_s": summary.get("steady_tok_s_mean"),
                "mib_per_token": float(frame["read_mib"].mean()) if tokens else float("nan"),
                "hit_pct": _number(run.figure("cache_hit_pct")),
                "off_cpu_pct": state["off_cpu_pct"],
                "comparable": why,
                "notes": "; ".join(notes) or None,
            }
        )
        attempts.append(
            {
                "cell": label,
                "tok_s_mean": rows[-1]["tok_s"],
                "cpu_s_per_token": float(np.nanmean(frame["cpu_ms"])) / 1000.0
                if frame["cpu_ms"].notna().any()
                else np.nan,
                "threads": config.threads,
                "stall_ms_per_token": float(np.nanmean(frame["stall_ms"]))
                if config.overlap
                else 0.0,
                "io_s_per_token": float(np.nanmean(frame["io_ms"])) / 1000.0
                if frame["io_ms"].notna().any()
                else 0.0,
                "mgmt_ms_per_token": float(np.nanmean(frame["mgmt_ms"]))
                if frame["mgmt_ms"].notna().any()
                else 0.0,
                "route_trace": run.traced,
            }
        )
    table = pd.DataFrame(rows)
    attempts_frame = pd.DataFrame(attempts)
    ranked = pd.DataFrame(
        {
            "rank": np.arange(1, len(table) + 1),
            "cell": table["cell"],
            "n": 1,
            "mean": table["tok_s"],
            "sd": np.nan,
            "cv_pct": np.nan,
        }
    )
    stability = cell_stability(ranked, attempts_frame).set_index("cell")["unstable"]
    sources = {str(Path(s).resolve()) for s in profile.sources}
    judged: list[str | None] = []
    for cell, file in zip(table["cell"], table["file"], strict=True):
        parts = [p for p in str(stability.get(cell) or "").split(", ") if p and p != "single run"]
        if str(Path(file).resolve()) in sources:
            parts.insert(0, "a profile run (in sample)")
        judged.append(", ".join(parts) or None)
    table["measurement"] = judged
    return table


def against_files(
    trace: RouteTrace | None,
    profile: DeviceProfile,
    runs: Sequence[ProfileRun],
    *,
    seed: int = 0,
    drop: float | None = None,
) -> dict[str, Any]:
    """Loose metrics files (the shape of an archived phone matrix) each predicted with its
    own configuration and compared with what it measured (see
    :func:`bmoe.analyze.predict.compare_cells`). With `trace`, each file's reads are the
    replay of that routing through its configuration; without, they are the reads the file
    itself recorded (``reads`` says which: the time model is then what is checked, given
    the reads a replay would have given)."""
    from bmoe.analyze.predict import (
        PREDICTED_FIGURES,
        compare_cells,
        measured_reads,
        predict,
        predict_cell,
    )

    files = measured_files(runs, profile, trace)
    if not profile.overlap:
        need = files["comparable"].isna() & (files["overlap"] == 1)
        files.loc[need, "comparable"] = (
            "an --overlap run: the profile has no overlap term (none of its runs used --overlap)"
        )
    by_name = {r.name: r for r in runs}
    predicted = {f: np.full(len(files), np.nan) for f in PREDICTED_FIGURES}
    comparable = files["comparable"].isna().to_numpy()
    if trace is not None and comparable.any():
        grid = files.loc[comparable, ["cache_mb", "io_threads", "prefetch", "overlap", "policy"]]
        missing = grid["cache_mb"].isna()
        if missing.any():
            names = ", ".join(files.loc[comparable].loc[missing, "cell"])
            raise BmoeError(f"no cache budget recorded for {names}: cannot replay it")
        out = predict(trace, profile, grid.reset_index(drop=True), seed=seed, drop=drop)
        for f in PREDICTED_FIGURES:
            predicted[f][comparable] = out[f].to_numpy()
        reads = "replay"
    else:
        for i in np.flatnonzero(comparable):
            row = files.iloc[i]
            run = by_name[row["file"]]
            tokens, _ = token_reads(run, profile.read_unit_bytes, None)
            cell, read_bytes = measured_reads(profile, tokens, float(row["hit_pct"] or np.nan))
            figures = predict_cell(
                profile,
                cell,
                int(row["io_threads"]),
                read_bytes,
                overlap=bool(row["overlap"]),
                cache_mb=None if pd.isna(row["cache_mb"]) else float(row["cache_mb"]),
            )
            for f in PREDICTED_FIGURES:
                predicted[f][i] = figures[f]
        reads = "measured"
    cells = files.copy()
    for f in PREDICTED_FIGURES:
        cells[f"{f}_predicted"] = predicted[f]
    cells["reads"] = [reads if ok else None for ok in comparable]
    out = compare_cells(cells, profile)
    out["summary"]["reads"] = reads
    return out


__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_LANES",
    "DEFAULT_THREADS",
    "ProfileRun",
    "RunConfig",
    "against_files",
    "build_profile",
    "decode_misses",
    "flash_table",
    "measured_files",
    "read_runs",
    "run_config",
    "run_state",
    "term_spread",
    "token_reads",
    "with_probe",
]
