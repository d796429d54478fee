"""Predictions of a grid of configurations, of a recorded run, and of a sweep's duration.

The grid of configurations to predict: its axes, parsed from ``--grid`` and expanded.

Predict every configuration of a grid from a recorded routing (the replay's reads), or a
recorded run from the reads it made itself.

How long a planned sweep's runs will take, from a profile.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from bmoe.analyze import replay
from bmoe.analyze.device.checks import check_model
from bmoe.analyze.device.lanes import batch_flash_ms, stall_per_miss
from bmoe.analyze.device.reads import CellReads, cell_reads, last_token_keys
from bmoe.analyze.device.timing import predict_cell
from bmoe.cache import DEFAULT_POLICY
from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace
from bmoe.units import MIB

GRID_AXES = ("cache_mb", "io_threads", "prefetch", "overlap")


def parse_grid(text: str | Iterable[str]) -> dict[str, list[float]]:
    """``cache_mb=64,128,io_threads=1,4`` (or the axes apart: ``;``, spaces, several
    strings) -> {"cache_mb": [64, 128], "io_threads": [1, 4]}. Unknown axes are errors."""
    parts = [text] if isinstance(text, str) else list(text)
    tokens = [t for p in parts for t in p.replace(";", ",").replace(" ", ",").split(",") if t]
    grid: dict[str, list[float]] = {}
    axis = None
    for token in tokens:
        if "=" in token:
            axis, _, token = token.partition("=")
            axis = axis.strip().replace("-", "_")
            if axis not in GRID_AXES:
                raise BmoeError(f"--grid: unknown axis {axis!r} (axes: {', '.join(GRID_AXES)})")
            grid.setdefault(axis, [])
            if not token:
                continue
        if axis is None:
            raise BmoeError(f"--grid: {token!r} comes before any axis=")
        try:
            value = float(token)
        except ValueError:
            raise BmoeError(f"--grid: {axis}={token!r} is not a number") from None
        if value < 0 or (axis != "cache_mb" and not value.is_integer()):
            raise BmoeError(f"--grid: {axis}={token} is not a valid value")
        grid[axis].append(value)
    for axis, values in grid.items():
        if not values:
            raise BmoeError(f"--grid: {axis}= names no value")
    if "cache_mb" not in grid:
        raise BmoeError("--grid needs cache_mb=...")
    return grid


def grid_cells(grid: Mapping[str, Sequence[float]], defaults: Mapping[str, float]) -> pd.DataFrame:
    """Every combination of the grid's values (axes it lacks take `defaults`)."""
    axes = {a: list(grid.get(a, [defaults[a]])) for a in GRID_AXES}
    rows = list(itertools.product(*axes.values()))
    cells = pd.DataFrame(rows, columns=list(axes))
    cells["io_threads"] = cells["io_threads"].astype(int)
    cells["prefetch"] = cells["prefetch"].astype(int)
    return cells


PREDICT_COLUMNS = (
    "cache_mb",
    "io_threads",
    "prefetch",
    "policy",
    "overlap",
    "tok_s",
    "tok_s_low",
    "tok_s_high",
    "steady_tok_s",
    "steady_tok_s_low",
    "steady_tok_s_high",
    "warmup_tokens",
    "mib_per_token",
    "hit_pct",
    "hit_pct_decode",
    "token_ms",
    "compute_ms",
    "flash_ms",
    "mgmt_ms",
    "compute_pct",
    "flash_pct",
    "mgmt_pct",
    "misses_per_token",
    "prefetched_per_token",
    "faults_per_token",
    "interval_pct",
    "spread_pct",
    "unpriced",
    "unpriced_levers",
    "lever_effect_pct",
    "lever_factor",
    "memory_note",
)


def grid_defaults(profile: DeviceProfile) -> dict[str, float]:
    return {
        "cache_mb": 0,
        "io_threads": _default_lanes(profile),
        "prefetch": 0,
        "overlap": 1 if profile.mode == "overlap" else 0,
    }


def _default_lanes(profile: DeviceProfile) -> int:
    return int(profile.flash["lanes"].max())


def _cells_frame(profile: DeviceProfile, grid) -> pd.DataFrame:
    defaults = grid_defaults(profile)
    if isinstance(grid, pd.DataFrame):
        cells = grid.copy()
        for axis, default in defaults.items():
            if axis not in cells:
                cells[axis] = default
            cells[axis] = pd.to_numeric(cells[axis], errors="coerce").fillna(default)
        for axis in ("io_threads", "prefetch", "overlap"):
            cells[axis] = cells[axis].astype(int)
        return cells
    return grid_cells(grid, defaults)


def predict(
    trace: RouteTrace,
    profile: DeviceProfile,
    grid: Mapping[str, Sequence[float]] | pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
    drop: float | None = None,
) -> pd.DataFrame:
    """Predict every configuration of `grid` (axes cache_mb, io_threads, prefetch, overlap;
    a mapping of value lists or a DataFrame of cells, which may also name each cell's
    ``policy``) for the routing `trace` recorded: one row per cell with tok/s (and its
    interval), MiB/token, hit %, and the stall attribution."""
    check_model(trace, profile)
    cells = _cells_frame(profile, grid)
    policies = cells["policy"].astype(str) if "policy" in cells else pd.Series(
        policy, index=cells.index
    )  # fmt: skip
    replay.check_policies(sorted(set(policies)))
    batches = replay.prepare_batches(trace)
    if not batches.n_decode:
        raise BmoeError(f"{trace.path or 'trace'}: no decode steps to predict")
    read_bytes = profile.read_bytes_per_expert()
    if "preamble" in str(profile.model.get("sizes_from") or ""):
        # sizes the preamble implies are one mean over every layer; the trace has each one's
        read_bytes = {**read_bytes, **trace.expert_bytes()}
    bets = last_token_keys(trace) if (cells["prefetch"] > 0).any() else None
    rows = []
    for cell, cell_policy in zip(cells.itertuples(index=False), policies, strict=True):
        reads = cell_reads(
            trace,
            batches,
            cell_policy,
            float(cell.cache_mb),
            int(cell.prefetch),
            seed=seed,
            bets=bets,
            drop=drop,
        )
        rows.append(
            {
                "cache_mb": cell.cache_mb,
                "io_threads": int(cell.io_threads),
                "prefetch": int(cell.prefetch),
                "policy": cell_policy,
                **predict_cell(
                    profile,
                    reads,
                    int(cell.io_threads),
                    read_bytes,
                    overlap=bool(cell.overlap),
                    cache_mb=float(cell.cache_mb),
                    levers={
                        "prefetch": int(cell.prefetch),
                        "policy": cell_policy,
                        "drop": drop or 0.0,
                        **({"threads": int(cell.threads)} if "threads" in cells else {}),
                    },
                ),
            }
        )
    frame = pd.DataFrame(rows, columns=list(PREDICT_COLUMNS))
    for column in ("policy", "unpriced", "unpriced_levers", "memory_note"):  # None stays None
        frame[column] = pd.Series([r[column] for r in rows], index=frame.index, dtype=object)
    return frame


def measured_reads(
    profile: DeviceProfile, tokens: pd.DataFrame, hit_pct: float = float("nan")
) -> tuple[CellReads, dict[int, int]]:
    """The reads a recorded run made, as a replay would give them, in the profile's units:
    per decode token its demand ``read_mib`` and speculative ``spec_mib`` (columns of
    `tokens`), split evenly over the profile's MoE layers (one batch a token when the
    profile does not know them). With the bytes one read moves per batch index."""
    unit = profile.read_unit_bytes
    layers = sorted(profile.expert_bytes())
    n = len(tokens)
    demand = (
        np.maximum(
            tokens["read_mib"].to_numpy(np.float64) - tokens["spec_mib"].to_numpy(np.float64), 0.0
        )
        * MIB
        / unit
    )
    spec = tokens["spec_mib"].to_numpy(np.float64) * MIB / unit
    if layers:
        k = len(layers)
        whole = np.rint(demand)
        base, extra = np.divmod(whole, k)
        matrix = base[:, None] + (np.arange(k)[None, :] < extra[:, None])
        spec_matrix = np.zeros_like(matrix, dtype=np.float64)
        spec_matrix[:, 0] = spec
    else:
        k = 1
        matrix = demand[:, None]
        spec_matrix = spec[:, None]
    step = np.repeat(np.arange(n), k)
    layer = np.tile(np.arange(k), n)
    reads = CellReads(
        step=step.astype(np.int64),
        layer=layer.astype(np.int64),
        misses=matrix.ravel(),
        prefetched=spec_matrix.ravel(),
        n_tokens=n,
        hit_pct=hit_pct,
        hit_pct_decode=float("nan"),
    )
    return reads, {i: round(unit) for i in range(k)}


def sweep_duration(
    trace: RouteTrace | None,
    profile: DeviceProfile,
    runs: pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
) -> pd.DataFrame:
    """Predicted duration of each planned run (columns cache_mb, io_threads, prefetch,
    n_predict): model load + prefill + n_predict tokens at the predicted rate. Without a
    trace every routed expert is priced as a miss (an upper bound, ``bound=True``)."""
    frame = runs.copy()
    defaults = grid_defaults(profile)
    for axis, default in defaults.items():
        values = frame[axis] if axis in frame else pd.Series(default, index=frame.index)
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(default)
    for axis in ("io_threads", "prefetch", "overlap"):
        frame[axis] = frame[axis].astype(int)
    if "n_predict" not in frame:
        frame["n_predict"] = 128
    cells = frame[list(GRID_AXES)].drop_duplicates(ignore_index=True)
    if trace is not None:
        columns = [*GRID_AXES, "tok_s", "tok_s_low", "tok_s_high"]
        rates = predict(trace, profile, cells, policy=policy)[columns]
        bound = False
    else:
        rates = cells.assign(tok_s=[_all_miss_rate(profile, int(n)) for n in cells["io_threads"]])
        bound = True
    frame = frame.merge(rates, on=list(GRID_AXES), how="left")
    fixed = float(profile.prefill.get("load_s", 0.0)) + float(profile.prefill.get("prefill_s", 0.0))
    frame["predicted_s"] = fixed + pd.to_numeric(frame["n_predict"]) / frame["tok_s"]
    frame["bound"] = bound
    return frame


def _all_miss_rate(profile: DeviceProfile, lanes: int) -> float:
    """tok/s when every routed expert of every MoE layer is read (no cache, no prefetch)."""
    k = int(profile.model.get("n_expert_used") or 1)
    layers = sorted(profile.expert_bytes())
    slices = int(profile.model["slices_per_expert"])
    req = float(np.median(list(profile.expert_bytes().values()))) / slices
    if profile.mode == "overlap":
        per = stall_per_miss(profile, lanes)
        flash = float(profile.overlap.get("stall_ms", 0.0)) + len(layers) * k * per
    else:
        flash = float(
            batch_flash_ms(profile.flash, np.full(len(layers), k * slices), req, lanes).sum()
        )
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * k * len(layers)
    return 1000.0 / (profile.compute["token_ms"] + flash + mgmt)


__all__ = [
    "GRID_AXES",
    "PREDICT_COLUMNS",
    "grid_cells",
    "grid_defaults",
    "measured_reads",
    "parse_grid",
    "predict",
    "sweep_duration",
]
