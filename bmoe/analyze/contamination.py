"""Contamination tells: cells whose numbers measure the device rather than the configuration.

A sweep runs cells one after another on a device that heats up, fills its page cache, gets
its frequency capped and keeps stray processes around. The benchmarking practice names four
tells that a cell's figures were bent by that state instead of by its flags:

* ``compute_vs_topk``: compute s/token *rising* while ``n_expert_used`` falls, among cells
  that differ in nothing else (fewer experts per token is less work, never more);
* ``majflt``: major faults per token an order of magnitude above comparable cells (same
  model, top-k and dense-weight placement): dense weights re-faulting from flash;
* ``entry_state``: a cell that started hotter, with less MemAvailable, or with a lower
  ``scaling_max_freq`` than the others (where a sweep logged its entry state);
* ``execution_order``: throughput that follows the execution position once the
  configuration's own effect is taken out (a linear model of log tok/s on the config's main
  effects plus the position, tested by permuting the positions).

:func:`contamination_flags` takes one row per run/cell attempt (the sweep's
``results.parquet`` has the same column names); :func:`bmoe.sweep.results.runs_table` gives
that table for metrics files, a directory or a sweep folder.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

TELLS = ("compute_vs_topk", "majflt", "entry_state", "execution_order")

#: Columns that describe a cell's configuration (engine flag names with dashes as underscores,
#: the metrics preamble's keys, and where it ran). Cells agreeing on all present ones are
#: comparable.
CONFIG_COLUMNS = (
    "target", "device", "engine", "model", "arch", "prompt", "prompt_file", "n_predict",
    "threads", "ctx_size", "n_ctx", "ubatch", "n_ubatch", "n_expert_used", "chatml", "no_think",
    "temp", "top_k", "top_p", "seed", "mtp", "ngram", "spec", "draft", "spec_draft_max",
    "mtp_p_min", "ngram_min_match", "moe_stream", "cache_mb", "cache_auto", "cache_floor_mb",
    "cache_ceil_mb", "force_cache", "io_threads", "no_odirect", "o_direct", "dense_weights",
    "load_all", "overlap", "io_two_wave", "prefetch", "drop_cold_experts", "drop_cold_frac",
    "drop_no_renorm", "drop_renorm", "drop_in_prefill", "drop_prefill", "route_ahead",
    "predict_log", "predict_prefetch", "predict_spec_max", "prefetch_sync", "row_stream",
    "expert_substitute", "substitute_lambda", "prefill_device", "compute_trace_layers",
)  # fmt: skip

#: Columns that set how much work a token is, for the major-fault peers.
WORK_COLUMNS = ("target", "device", "model", "n_expert_used", "dense_weights")

FLAG_COLUMNS = ["tell", "cells", "evidence"]


def _cell_ids(cells: pd.DataFrame) -> pd.Series:
    if "cell" in cells:
        return cells["cell"].astype(str)
    return pd.Series([str(i) for i in cells.index], index=cells.index)


def _present(cells: pd.DataFrame, names: Iterable[str]) -> list[str]:
    return [c for c in names if c in cells.columns]


def _group_keys(cells: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One hashable key per row: the tuple of `columns` (missing values spelled "—")."""
    if not columns:
        return pd.Series(["all"] * len(cells), index=cells.index)
    frame = cells[list(columns)].astype(object).where(cells[list(columns)].notna(), "—")
    return pd.Series(list(frame.itertuples(index=False, name=None)), index=cells.index)


def _describe(columns: Sequence[str], key: tuple) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(columns, key, strict=True)) or "all cells"


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _numeric(cells: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(cells[col], errors="coerce").astype(float)


# ----------------------------------------------------------------------------- the tells


def compute_vs_topk(
    cells: pd.DataFrame, config_columns: Sequence[str], tolerance: float = 0.10
) -> list[dict[str, Any]]:
    """Pairs of otherwise identical cells where the smaller top-k computes slower."""
    if not {"n_expert_used", "compute_s_per_token"} <= set(cells.columns):
        return []
    others = [c for c in config_columns if c != "n_expert_used"]
    frame = pd.DataFrame(
        {
            "group": _group_keys(cells, others),
            "k": _numeric(cells, "n_expert_used"),
            "compute": _numeric(cells, "compute_s_per_token"),
            "cell": _cell_ids(cells),
        }
    ).dropna(subset=["k", "compute"])
    if frame.empty:
        return []
    levels = (
        frame.groupby(["group", "k"], sort=True)
        .agg(compute=("compute", "mean"), cells=("cell", list))
        .reset_index()
    )
    pairs = levels.merge(levels, on="group", suffixes=("_lo", "_hi"))
    pairs = pairs[
        (pairs["k_lo"] < pairs["k_hi"])
        & (pairs["compute_lo"] > pairs["compute_hi"] * (1.0 + tolerance))
    ]
    flags = []
    for rec in pairs.to_dict("records"):
        rise = 100.0 * (rec["compute_lo"] / rec["compute_hi"] - 1.0)
        evidence = (
            f"n_expert_used {rec['k_lo']:g}: compute {_fmt(rec['compute_lo'])} s/token vs "
            f"n_expert_used {rec['k_hi']:g}: {_fmt(rec['compute_hi'])} s/token (+{rise:.0f} % "
            f"for less work; {_describe(others, rec['group'])})"
        )
        flags.append(
            {"tell": "compute_vs_topk", "cells": rec["cells_lo"] + rec["cells_hi"],
             "evidence": evidence}
        )  # fmt: skip
    return flags


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """For each element, the median of the other elements (NaN where there are none)."""
    m = len(values)
    if m < 2:
        return np.full(m, np.nan)
    grid = np.tile(np.asarray(values, dtype=float), (m, 1))
    np.fill_diagonal(grid, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows that are all NaN
        return np.nanmedian(grid, axis=1)


def majflt_outliers(
    cells: pd.DataFrame,
    work_columns: Sequence[str] = WORK_COLUMNS,
    factor: float = 10.0,
    floor: float = 1.0,
) -> list[dict[str, Any]]:
    """Cells whose major faults per token are >= `factor` x the median of their peers (and at
    least `floor` per token)."""
    if "majflt_per_token" not in cells:
        return []
    work = _present(cells, work_columns)
    frame = pd.DataFrame(
        {
            "group": _group_keys(cells, work),
            "majflt": _numeric(cells, "majflt_per_token"),
            "cell": _cell_ids(cells),
        }
    ).dropna(subset=["majflt"])
    flags = []
    for key, group in frame.groupby("group", sort=False):
        if len(group) < 2:
            continue
        values = group["majflt"].to_numpy()
        peers = _median_of_others(values)
        hit = (values >= floor) & (values >= factor * peers)
        ids = group["cell"].to_numpy()
        for i in np.flatnonzero(hit):
            others = [c for j, c in enumerate(ids) if j != i]
            shown = ", ".join(others[:5]) + (
                f" and {len(others) - 5} more" if len(others) > 5 else ""
            )
            ratio = "" if peers[i] == 0 else f", {values[i] / peers[i]:.0f}x"
            evidence = (
                f"majflt/token {_fmt(values[i])} vs median {_fmt(peers[i])} of {len(others)} "
                f"comparable cell(s) [{shown}] ({_describe(work, key)}{ratio})"
            )
            flags.append({"tell": "majflt", "cells": [ids[i]], "evidence": evidence})
    return flags


def entry_state_outliers(
    cells: pd.DataFrame,
    temp_margin_c: float = 5.0,
    mem_margin_mb: float = 512.0,
    mem_margin_frac: float = 0.15,
    freq_margin_frac: float = 0.01,
) -> list[dict[str, Any]]:
    """Cells that started hotter, shorter of memory, or frequency-capped against the others.

    Hotter: entry CPU temperature above the median of the other cells by more than
    `temp_margin_c`. Short of memory: entry MemAvailable below the others' median by more than
    max(`mem_margin_mb`, `mem_margin_frac` x that median). Capped: a ``scaling_max_freq``
    column (``entry_scaling_max_freq_khz`` or a per-policy variant) below the highest any cell
    entered with by more than `freq_margin_frac`.
    """
    ids = _cell_ids(cells).to_numpy()
    flags = []
    if "entry_cpu_temp_c" in cells:
        temp = _numeric(cells, "entry_cpu_temp_c").to_numpy()
        ok = ~np.isnan(temp)
        if ok.sum() >= 2:
            others = np.full(len(temp), np.nan)
            others[ok] = _median_of_others(temp[ok])
            for i in np.flatnonzero(ok & (temp > others + temp_margin_c)):
                flags.append(
                    {"tell": "entry_state", "cells": [ids[i]],
                     "evidence": f"entered at CPU {temp[i]:.1f} °C vs median {others[i]:.1f} °C "
                                 f"of the other cells (+{temp[i] - others[i]:.1f} °C)"}
                )  # fmt: skip
    if "entry_mem_available_mb" in cells:
        mem = _numeric(cells, "entry_mem_available_mb").to_numpy()
        ok = ~np.isnan(mem)
        if ok.sum() >= 2:
            others = np.full(len(mem), np.nan)
            others[ok] = _median_of_others(mem[ok])
            margin = np.maximum(mem_margin_mb, mem_margin_frac * others)
            for i in np.flatnonzero(ok & (mem < others - margin)):
                flags.append(
                    {"tell": "entry_state", "cells": [ids[i]],
                     "evidence": f"entered with MemAvailable {mem[i]:.0f} MiB vs median "
                                 f"{others[i]:.0f} MiB of the other cells "
                                 f"({mem[i] - others[i]:+.0f} MiB)"}
                )  # fmt: skip
    for col in [c for c in cells.columns if str(c).startswith("entry_scaling_max_freq_khz")]:
        freq = _numeric(cells, col).to_numpy()
        ok = ~np.isnan(freq)
        if ok.sum() < 2:
            continue
        top = float(np.nanmax(freq))
        for i in np.flatnonzero(ok & (freq < top * (1.0 - freq_margin_frac))):
            flags.append(
                {"tell": "entry_state", "cells": [ids[i]],
                 "evidence": f"entered with {col} {freq[i]:.0f} kHz vs {top:.0f} kHz for the "
                             f"uncapped cells ({100 * (freq[i] / top - 1):.0f} %): frequency cap"}
            )  # fmt: skip
    return flags


def position_beyond_config(
    cells: pd.DataFrame,
    config_columns: Sequence[str],
    outcome: str = "tok_s_mean",
    min_cells: int = 5,
    alpha: float = 0.01,
    min_drift_pct: float = 5.0,
    permutations: int = 999,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], str | None]:
    """Throughput that tracks execution order *across cells* once the configuration is
    accounted for (the ``execution_order`` tell).

    Unlike :func:`bmoe.analyze.sweep.within_cell_drift`, which compares each cell's repeats
    with each other and needs repeats, this works with one run per cell, at the price of
    assuming the configuration acts additively (main effects on the log scale).

    Fits log(`outcome`) = main effect of each varying config column + beta x position, and
    tests beta by permuting the positions (`permutations` shuffles, seeded). Flags when the
    two-sided permutation p < `alpha` and the fitted drift over the run's span is at least
    `min_drift_pct`. Returns (flags, why it could not be checked or None).
    """
    if not {"order", outcome} <= set(cells.columns):
        return [], f"needs 'order' and '{outcome}' columns"
    y = _numeric(cells, outcome)
    position = _numeric(cells, "order")
    ok = (y > 0) & position.notna()
    frame = cells[ok]
    n = len(frame)
    if n < min_cells:
        return [], f"{n} cells with an order and {outcome}: needs at least {min_cells}"
    y = np.log(y[ok].to_numpy())
    position = position[ok].to_numpy()
    varying = [c for c in config_columns if c in frame and frame[c].astype(str).nunique() > 1]
    design = [np.ones((n, 1))]
    for col in varying:
        dummies = pd.get_dummies(frame[col].astype(str), drop_first=True, dtype=float)
        design.append(dummies.to_numpy())
    x = np.hstack(design)
    # Residual maker of the config design: M v = v - X (X^+ v)
    pinv = np.linalg.pinv(x)
    resid = np.eye(n) - x @ pinv
    ry = resid @ y
    ro = resid @ position
    denom = float(ro @ ro)
    if denom <= 1e-12 * max(1.0, float(position @ position)):
        return [], "execution order is confounded with the configuration (no repeats to compare)"
    beta = float(ro @ ry) / denom
    rng = np.random.default_rng(seed)
    shuffled = np.argsort(rng.random((permutations, n)), axis=1)
    perm = resid @ position[shuffled].T  # n x permutations
    betas = (perm * ry[:, None]).sum(axis=0) / (perm * perm).sum(axis=0)
    p = (1 + int(np.sum(np.abs(betas) >= abs(beta) - 1e-15))) / (permutations + 1)
    span = float(position.max() - position.min())
    drift_pct = 100.0 * (math.exp(beta * span) - 1.0)
    if p >= alpha or abs(drift_pct) < min_drift_pct:
        return [], None
    ids = _cell_ids(frame).to_numpy()[np.argsort(position, kind="stable")]
    step_pct = 100.0 * (math.exp(beta) - 1.0)
    accounted = ", ".join(varying) if varying else "nothing varied"
    evidence = (
        f"{outcome} changes {step_pct:+.2f} % per execution position, {drift_pct:+.0f} % from "
        f"first to last (positions {position.min():g}..{position.max():g}), after accounting "
        f"for the configuration ({accounted}); permutation p = {p:.3g} over {permutations} "
        f"shuffles"
    )
    return [{"tell": "execution_order", "cells": list(ids), "evidence": evidence}], None


def contamination_flags(
    cells: pd.DataFrame,
    config_columns: Sequence[str] | None = None,
    *,
    compute_tolerance: float = 0.10,
    majflt_factor: float = 10.0,
    order_alpha: float = 0.01,
    seed: int = 0,
) -> pd.DataFrame:
    """Every tell that fires on `cells` (one row per run/cell attempt), as rows of
    ``tell, cells, evidence`` (``cells`` is a list of cell ids).

    Recognised columns (all optional): ``cell``, ``order``, ``n_expert_used``,
    ``tok_s_mean``, ``compute_s_per_token``, ``majflt_per_token``, ``entry_cpu_temp_c``,
    ``entry_mem_available_mb``, ``entry_scaling_max_freq_khz``, plus the configuration
    columns (default: those of :data:`CONFIG_COLUMNS` present) that decide comparability.
    Tells that could not be evaluated are listed in ``result.attrs["not_checked"]``.
    """
    config = list(config_columns) if config_columns is not None else _present(cells, CONFIG_COLUMNS)
    flags: list[dict[str, Any]] = []
    not_checked: list[str] = []
    if {"n_expert_used", "compute_s_per_token"} <= set(cells.columns):
        flags += compute_vs_topk(cells, config, compute_tolerance)
    else:
        not_checked.append("compute_vs_topk: needs n_expert_used and compute_s_per_token")
    if "majflt_per_token" in cells and _numeric(cells, "majflt_per_token").notna().any():
        flags += majflt_outliers(cells, factor=majflt_factor)
    else:
        not_checked.append("majflt: no major-fault counts (older files or unmeasured)")
    entry = [c for c in cells.columns if str(c).startswith("entry_")]
    if entry:
        flags += entry_state_outliers(cells)
    else:
        not_checked.append("entry_state: no entry state logged")
    order_flags, why = position_beyond_config(cells, config, alpha=order_alpha, seed=seed)
    flags += order_flags
    if why:
        not_checked.append(f"execution_order: {why}")
    result = pd.DataFrame(flags, columns=FLAG_COLUMNS)
    result.attrs["not_checked"] = not_checked
    return result


__all__ = [
    "CONFIG_COLUMNS",
    "TELLS",
    "compute_vs_topk",
    "contamination_flags",
    "entry_state_outliers",
    "majflt_outliers",
    "position_beyond_config",
]
