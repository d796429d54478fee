"""Build a device profile from runs already recorded.

Each run contributes what it has: its metrics CSV (per-token compute, flash and management
times; required), its route trace (the expert sizes and exactly which experts each decode step
missed), its io trace (the latency of every flash request, by size and lane count) and its
compute trace (the split of compute into dense and expert work). A compute-traced run is
instrumented, its compute time is not a benchmark figure: it is refused for compute unless
asked, and then the profile carries the caveat.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bmoe.analyze.predict import MIB, batch_flash_ms
from bmoe.errors import BmoeError
from bmoe.formats.decode import ComputeTrace, IoTrace
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace


@dataclass
class ProfileRun:
    """One recorded run: its metrics and whichever traces were written with it."""

    metrics: MetricsRun
    route: RouteTrace | None = None
    io: IoTrace | None = None
    compute: ComputeTrace | None = None

    @property
    def name(self) -> str:
        return self.metrics.path or "run"

    @property
    def compute_traced(self) -> bool:
        params = self.metrics.params
        return self.compute is not None or bool(params.get("compute_trace_layers"))

    @property
    def lanes(self) -> int:
        for source in (self.metrics.params, self.io.meta if self.io else {}):
            value = source.get("io_threads")
            if value:
                return int(value)
        return 1

    @property
    def overlap(self) -> bool:
        if "overlap" in self.metrics.params:
            return bool(self.metrics.params["overlap"])
        rows = self.metrics.rows
        return "stall_ms" in rows and bool((rows["stall_ms"] > 0).any())


# ----------------------------------------------------------------------------- reading


def read_runs(paths: Iterable[str | os.PathLike]) -> list[ProfileRun]:
    """Runs from metrics CSVs (their traces beside them are found by name) or folders (every
    metrics CSV inside, recursively)."""
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


def _token_frame(run: ProfileRun, sizes: dict[int, int], read_per_expert: float) -> pd.DataFrame:
    """Per decode token of `run`: metrics times, demand misses, prefetched experts, and
    the per-layer misses (a list) that set the flash waves."""
    rows = run.metrics.rows.reset_index(drop=True)
    n = len(rows)
    frame = pd.DataFrame(
        {
            "wall_ms": rows["wall_ms"].astype(float),
            "io_ms": rows["io_ms"].astype(float) if "io_ms" in rows else np.nan,
            "compute_ms": rows["compute_ms"].astype(float),
            "mgmt_ms": rows["mgmt_ms"].astype(float) if "mgmt_ms" in rows else 0.0,
            "stall_ms": rows["stall_ms"].astype(float) if "stall_ms" in rows else 0.0,
        }
    )
    layers: list[list[int]] = [[] for _ in range(n)]
    if run.route is not None and "residency" in run.route.rows:
        per = decode_misses(run.route)
        per = per[per["token"] < n]
        for token, group in per.groupby("token"):
            layers[int(token)] = group["misses"].astype(int).tolist()
        frame["misses"] = [sum(x) for x in layers]
    else:  # even split of the bytes read over the MoE layers
        read = rows["read_bytes"].to_numpy(np.float64) if "read_bytes" in rows else np.zeros(n)
        misses = np.rint(read / read_per_expert).astype(int)
        frame["misses"] = misses
        n_layers = len(sizes)
        for i, m in enumerate(misses.tolist()):
            base, extra = divmod(m, n_layers)
            layers[i] = [
                base + (1 if j < extra else 0) for j in range(n_layers) if base or j < extra
            ]
    frame["layer_misses"] = layers
    prefetched = np.zeros(n)
    if run.io is not None and "spec" in run.io.rows and len(run.io.rows):
        io = run.io.rows
        spec = io[(io["spec"] != 0) & (io["phase"] != 0)]
        if len(spec):
            steps = np.sort(io.loc[io["phase"] != 0, "step"].unique())
            per = spec[["step", "layer", "expert"]].drop_duplicates().groupby("step").size()
            idx = np.searchsorted(steps, per.index.to_numpy())
            keep = idx < n
            np.add.at(prefetched, idx[keep], per.to_numpy()[keep])
    frame["prefetched"] = prefetched
    return frame


# ----------------------------------------------------------------------------- sections


def _model_section(runs: Sequence[ProfileRun]) -> dict:
    sized = [r for r in runs if r.route is not None and r.route.expert_bytes()]
    traces = [r.route for r in sized if r.route is not None]
    if not sized:
        raise BmoeError(
            "no route trace among the runs: a profile needs one for the model's expert sizes "
            "(record a run with --route-trace)"
        )
    sizes = traces[0].expert_bytes()
    for other, trace in zip(sized[1:], traces[1:], strict=True):
        if trace.expert_bytes() != sizes:
            raise BmoeError(
                f"{other.name} is a run of another model than {sized[0].name} (expert sizes "
                "differ): a profile describes one model on one device"
            )
    meta = traces[0].meta
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
    route_path = traces[0].path
    return {
        "name": str(meta.get("model", "")).replace("\\", "/").rsplit("/", 1)[-1] or None,
        "route_trace": str(Path(route_path).resolve()) if route_path else None,
        "arch": meta.get("arch"),
        "n_layer": meta.get("n_layer"),
        "n_expert": meta.get("n_expert"),
        "n_expert_used": meta.get("n_expert_used"),
        "expert_bytes": {str(k): int(v) for k, v in sorted(sizes.items())},
        "read_bytes_per_expert": read_per,
        "slices_per_expert": slices,
    }


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
    return table.reset_index()


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """y = a + b x by least squares, with a, b >= 0 (a constant when x does not vary)."""
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


def build_profile(runs: Sequence[ProfileRun], *, allow_traced: bool = False) -> DeviceProfile:
    """The device profile these runs measure (see the module docstring)."""
    if not runs:
        raise BmoeError("no runs to build a profile from")
    for run in runs:
        need = [c for c in ("wall_ms", "compute_ms") if c not in run.metrics.rows]
        if need:
            raise BmoeError(f"{run.name}: no {need[0]} column (a profile needs per-token times)")
        if not len(run.metrics.rows):
            raise BmoeError(f"{run.name}: no token rows")
    modes = {run.overlap for run in runs}
    if len(modes) > 1:
        raise BmoeError("the runs mix serial and --overlap: build one profile per mode")
    overlap = modes.pop()
    model = _model_section(runs)
    sizes = {int(k): v for k, v in model["expert_bytes"].items()}
    read_per = float(
        np.median(list(model["read_bytes_per_expert"].values()) or list(sizes.values()))
    )
    slices = model["slices_per_expert"]
    req = float(np.median(list(sizes.values()))) / slices
    caveats: list[str] = []
    tokens = {run.name: _token_frame(run, sizes, read_per) for run in runs}

    # compute: from runs whose compute time is not instrumented
    clean = [r for r in runs if not r.compute_traced]
    if not clean:
        if not allow_traced:
            raise BmoeError(
                "every run was compute-traced (per-node timing synchronises each graph node): "
                "their compute time is not a benchmark figure; add an untraced run, or allow "
                "traced runs (--allow-traced) and the profile will say so"
            )
        clean = list(runs)
        caveats.append(
            "compute time from compute-traced runs: instrumented, expect predictions too slow"
        )
    compute = np.concatenate([tokens[r.name]["compute_ms"].to_numpy() for r in clean])
    expert_share = _expert_share([r.compute for r in runs if r.compute is not None])
    if any(r.route is not None for r in runs):
        caveats.append("route-traced runs: their cache management includes the trace bookkeeping")

    # flash
    table = flash_table((r.io, r.lanes) for r in runs if r.io is not None)
    if overlap:
        misses = np.concatenate([t["misses"].to_numpy() for t in tokens.values()])
        stall = np.concatenate([t["stall_ms"].to_numpy() for t in tokens.values()])
        total = float(misses.sum())
        overlap_section = {"stall_ms_per_miss": float(stall.sum()) / total if total else 0.0}
    else:
        overlap_section = {}
    if not len(table):
        table = _flash_from_metrics(runs, tokens, slices, req)
    table = table.copy()
    table["batch_overhead_ms"] = 0.0
    if not overlap:
        for lanes in sorted(table["lanes"].unique()):
            table.loc[table["lanes"] == lanes, "batch_overhead_ms"] = _batch_overhead(
                table, [r for r in runs if r.lanes == lanes], tokens, lanes, slices, req
            )

    # management: a fixed part per token and a part per expert admitted
    admits = np.concatenate([(t["misses"] + t["prefetched"]).to_numpy() for t in tokens.values()])
    mgmt = np.concatenate([t["mgmt_ms"].to_numpy() for t in tokens.values()])
    base, per_admit = _fit_line(admits.astype(float), mgmt)

    prefill = {}
    rates = [
        r.metrics.summary["n_prompt"] / r.metrics.summary["prefill_s"]
        for r in runs
        if r.metrics.summary.get("prefill_s") and r.metrics.summary.get("n_prompt")
    ]
    if rates:
        prefill["tok_s"] = float(np.median(rates))
        prefill["prefill_s"] = float(
            np.median(
                [r.metrics.summary["prefill_s"] for r in runs if r.metrics.summary.get("prefill_s")]
            )
        )
    loads = [r.metrics.summary["load_s"] for r in runs if r.metrics.summary.get("load_s")]
    if loads:
        prefill["load_s"] = float(np.median(loads))
    profile = DeviceProfile(
        mode="overlap" if overlap else "serial",
        model=model,
        flash=table,
        compute={
            "token_ms": float(np.mean(compute)),  # tok/s is tokens over summed time
            "token_ms_p10": float(np.quantile(compute, 0.1)),
            "token_ms_p90": float(np.quantile(compute, 0.9)),
            "expert_share": expert_share,  # type: ignore[dict-item]
        },
        mgmt={"token_ms": base, "per_admit_ms": per_admit},
        prefill=prefill,
        overlap=overlap_section,
        sources=[r.name for r in runs],
        caveats=caveats,
    )
    from bmoe.formats.profile import profile_from_dict

    return profile_from_dict(profile.to_dict())  # validated, as a file would be


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
    data = profile.to_dict()
    data["flash"] = table.to_dict(orient="records")
    data["caveats"] = [*profile.caveats, f"flash latency measured by probe on {where}"]
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


def _waves(layer_misses: list[list[int]], slices: int) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) * slices for x in layer_misses]


def _batch_overhead(table, runs, tokens, lanes, slices, req) -> float:
    """Per read batch, the flash wait the metrics recorded beyond the requests' latency."""
    if not runs:
        return 0.0
    flash = table.assign(batch_overhead_ms=0.0)[table["lanes"] == lanes]
    spent = predicted = batches = 0.0
    for run in runs:
        frame = tokens[run.name]
        if frame["io_ms"].isna().all():
            continue
        for io_ms, layer_misses in zip(frame["io_ms"], frame["layer_misses"], strict=True):
            requests = np.asarray(layer_misses, dtype=np.float64) * slices
            requests = requests[requests > 0]
            if not len(requests):
                continue
            spent += io_ms
            predicted += float(batch_flash_ms(flash, requests, req, lanes).sum())
            batches += len(requests)
    return max(0.0, (spent - predicted) / batches) if batches else 0.0


def _flash_from_metrics(runs, tokens, slices, req) -> pd.DataFrame:
    """Without io traces: one request latency per lane count, from io_ms over the waves."""
    out = []
    for lanes in sorted({r.lanes for r in runs}):
        per_token = []
        for run in (r for r in runs if r.lanes == lanes):
            frame = tokens[run.name]
            for io_ms, layer_misses in zip(frame["io_ms"], frame["layer_misses"], strict=True):
                waves = float(np.ceil(np.asarray(layer_misses) * slices / lanes).sum())
                if waves > 0 and io_ms == io_ms:
                    per_token.append(io_ms / waves)
        if not per_token:
            continue
        values = np.asarray(per_token)
        out.append(
            {
                "lanes": lanes,
                "req_bytes": int(req),
                "latency_ms": float(np.median(values)),
                "latency_ms_p10": float(np.quantile(values, 0.1)),
                "latency_ms_p90": float(np.quantile(values, 0.9)),
                "mib_s": lanes * req / MIB / (float(np.median(values)) / 1e3)
                if np.median(values) > 0
                else None,
                "reads": int(sum(np.sum(x) for t in tokens.values() for x in t["layer_misses"])),
            }
        )
    if not out:
        raise BmoeError(
            "no flash measurement among the runs: no io trace and no token that read experts "
            "with an io_ms column"
        )
    return pd.DataFrame(out)


__all__ = [
    "ProfileRun",
    "build_profile",
    "decode_misses",
    "flash_table",
    "read_runs",
    "with_probe",
]
