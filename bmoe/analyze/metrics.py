"""Per-run summary of a metrics CSV: throughput, latency, cache, pressure, warm-up, speculation.

The reference figures (see ``reference-semantics.md``) come first and are computed exactly as
the established summary does: per-token rate = 1000 / ``wall_ms`` over rows with ``wall_ms > 0``;
mean tok/s = tokens / total decode seconds; min and max are single-token extremes; median, p5
and p95 interpolate linearly between sorted neighbours; MiB/token = summary ``read_MiB`` /
tokens; TTFT = ``load_s`` + ``prefill_s``; stall and mgmt ms/token are column means.

Two deliberate additions:

* **Speculated runs** (``mtp_batch`` > 1 somewhere): a verify decode charges its whole cost to
  the group's first row and zeros to the others. Those zeros are not free tokens, so every
  per-token figure spreads the group's cost evenly over its ``mtp_batch`` tokens (the first
  row's ``wall_ms / mtp_batch``). Without speculation this is the identity and the reference
  figures are unchanged.
* **A steady-state window** (:func:`steady_state`) separates the warm-up head, where the
  expert cache is still filling, from the rest of the run.

Figures a file cannot give are ``None`` (shown as "—"), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.fidelity import fidelity_figures
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.metrics_columns import with_role
from bmoe.units import MIB

KB_PER_GB = 1024.0 * 1024.0  # the sidecar counts kB; "gb" figures are GiB (kB / 1024^2)

#: The stable leading names of :func:`run_summary` (what the sweep and reports rely on).
STABLE_FIELDS = (
    "file", "tokens", "partial", "tok_s_mean", "tok_s_min", "tok_s_max", "tok_s_median",
    "tok_s_p5", "tok_s_p95", "prefill_tps", "ttft_s", "cache_hit_pct", "read_mib_per_token",
    "stall_ms_per_token", "mgmt_ms_per_token", "peak_rss_gb", "mem_floor_gb",
    "cpu_temp_start_c", "cpu_temp_max_c", "batt_temp_max_c",
)  # fmt: skip

#: Per-row columns that carry a cost the engine charges to a speculation group's first row.
COST_COLUMNS = with_role("cost")

#: Memory-picture columns (v1 onwards); 0 throughout means the platform could not report them.
MEMORY_COLUMNS = with_role("budget", "memory")

#: Per-row readings taken at the token, carried to each token as they are (not spread).
READINGS = with_role("gauge", "budget", "memory")


# ----------------------------------------------------------------------------- small helpers


def _num(value: Any) -> float | None:
    """A finite float, or None (missing, NaN, not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _first(summaries: list[dict[str, Any]], key: str) -> float | None:
    for summary in summaries:
        if key in summary:
            return _num(summary[key])
    return None


def _last(summaries: list[dict[str, Any]], key: str) -> float | None:
    for summary in reversed(summaries):
        if key in summary:
            return _num(summary[key])
    return None


def _total(summaries: list[dict[str, Any]], key: str) -> float | None:
    """Sum of `key` over every turn's summary (None if no summary has it)."""
    values = [v for v in (_num(s[key]) for s in summaries if key in s) if v is not None]
    return float(sum(values)) if values else None


def _column_mean(rows: pd.DataFrame, col: str) -> float | None:
    if col not in rows or not len(rows):
        return None
    return float(rows[col].mean())


def _measured(rows: pd.DataFrame, col: str) -> bool:
    """The column exists and is not all zeros (the engine writes 0 for "cannot report")."""
    return col in rows and len(rows) > 0 and bool((rows[col] != 0).any())


def is_speculated(run: MetricsRun) -> bool:
    """True when some decode confirmed more than one token (``mtp_batch`` > 1)."""
    rows = run.rows
    return "mtp_batch" in rows and len(rows) > 0 and bool((rows["mtp_batch"] > 1).any())


# ----------------------------------------------------------------------------- per token


def per_token(run: MetricsRun) -> pd.DataFrame:
    """One row per generated token with its cost, speculation groups spread evenly.

    Columns: ``step``, ``turn``, ``decode`` (index of the decode that produced the token),
    ``batch`` (tokens that decode confirmed), every cost column the file has (per token),
    ``read_mib``, and the readings (:data:`READINGS`) as recorded. Under speculation a group
    starts at a row with ``wall_ms > 0`` and its cost is divided by the first row's
    ``mtp_batch``; otherwise each row is its own decode.
    """
    rows = run.rows
    n = len(rows)
    out: dict[str, np.ndarray] = {
        "step": rows["step"].to_numpy() if "step" in rows else np.arange(1, n + 1),
        "turn": rows["turn"].to_numpy() if "turn" in rows else np.zeros(n, dtype=np.int16),
    }
    costs = [c for c in COST_COLUMNS if c in rows]
    if is_speculated(run):
        wall = rows["wall_ms"].to_numpy()
        decode = np.maximum(np.cumsum(wall > 0) - 1, 0)  # rows before the first decode join it
        starts = np.flatnonzero(np.r_[True, decode[1:] != decode[:-1]])
        first_batch = rows["mtp_batch"].to_numpy()[starts]
        size = np.diff(np.r_[starts, n])
        batch = np.where(first_batch > 0, first_batch, size)[decode]
        out["decode"] = decode
        out["batch"] = batch.astype(np.int32)
        for col in costs:
            group_sum = np.add.reduceat(rows[col].to_numpy(dtype=float), starts)
            out[col] = group_sum[decode] / batch
    else:
        out["decode"] = np.arange(n)
        out["batch"] = np.ones(n, dtype=np.int32)
        for col in costs:
            out[col] = rows[col].to_numpy(dtype=float)
    if "read_bytes" in out:
        out["read_mib"] = out["read_bytes"] / MIB
    for col in READINGS:
        if col in rows:
            out[col] = rows[col].to_numpy()
    return pd.DataFrame(out)


def token_rates(tokens: pd.DataFrame) -> np.ndarray:
    """Per-token decode rate (tok/s) of the tokens with a positive cost."""
    wall = tokens["wall_ms"].to_numpy(dtype=float)
    wall = wall[wall > 0]
    return 1000.0 / wall


def rate_figures(tokens: pd.DataFrame) -> dict[str, float | None]:
    """Mean (tokens / seconds), min, max, median, p5 and p95 tok/s of `tokens`."""
    names = ("tok_s_mean", "tok_s_min", "tok_s_max", "tok_s_median", "tok_s_p5", "tok_s_p95")
    total_ms = float(tokens["wall_ms"].sum()) if len(tokens) else 0.0
    rates = token_rates(tokens) if len(tokens) else np.array([])
    if total_ms <= 0 or not len(rates):
        return dict.fromkeys(names)
    p5, median, p95 = np.percentile(rates, [5, 50, 95], method="linear")
    return {
        "tok_s_mean": len(tokens) / (total_ms / 1000.0),
        "tok_s_min": float(rates.min()),
        "tok_s_max": float(rates.max()),
        "tok_s_median": float(median),
        "tok_s_p5": float(p5),
        "tok_s_p95": float(p95),
    }


# ----------------------------------------------------------------------------- steady state

#: The steady-state rule's defaults (documented in :func:`steady_state`).
STEADY_WINDOW = 8
STEADY_TOLERANCE = 1.25
STEADY_MIN_TOKENS = 32


@dataclass(frozen=True)
class SteadyState:
    """Where the warm-up head ends. ``warmup_tokens`` is None when the run is too short."""

    warmup_tokens: int | None
    tokens: int
    basis: str  # "read_mib" (flash MiB per token) or "wall_ms" (runs that read nothing)
    level: float | None  # the steady level of the basis (median of the second half)
    reason: str

    @property
    def steady_tokens(self) -> int:
        return 0 if self.warmup_tokens is None else self.tokens - self.warmup_tokens

    def mask(self) -> np.ndarray:
        """Boolean mask over tokens: True in the steady window."""
        out = np.zeros(self.tokens, dtype=bool)
        if self.warmup_tokens is not None:
            out[self.warmup_tokens :] = True
        return out


def steady_state(
    tokens: pd.DataFrame,
    window: int = STEADY_WINDOW,
    tolerance: float = STEADY_TOLERANCE,
    min_tokens: int = STEADY_MIN_TOKENS,
) -> SteadyState:
    """Split the warm-up head (cache filling) from the steady state.

    The rule, on flash MiB read per token (``wall_ms`` when the run reads nothing, i.e. no
    streaming): the steady *level* is the median of the run's second half; warm-up ends at the
    first token that is itself at most ``tolerance`` x level **and** whose next ``window``
    tokens have a median at most ``tolerance`` x level. A cold cache misses on most routings,
    so the head reads far above the level; the windowed median keeps one cheap token inside
    the head (or one burst of new experts after it) from moving the boundary.

    Runs shorter than ``min_tokens`` have no steady state to speak of (``warmup_tokens`` is
    None): a short probe is a warm-up measurement, not a shorter steady-state one.
    """
    n = len(tokens)
    basis = "wall_ms"
    if "read_mib" in tokens and bool((tokens["read_mib"] > 0).any()):
        basis = "read_mib"
    if n < min_tokens:
        return SteadyState(
            None, n, basis, None, f"{n} tokens: too short for a steady state (< {min_tokens})"
        )
    values = tokens[basis].to_numpy(dtype=float)
    level = float(np.median(values[n // 2 :]))
    limit = tolerance * level
    ahead = pd.Series(values[::-1]).rolling(window, min_periods=1).median().to_numpy()[::-1]
    ok = (values <= limit) & (ahead <= limit)
    if not ok.any():
        return SteadyState(None, n, basis, level, f"{basis} never settles to the steady level")
    start = int(np.argmax(ok))
    unit = "MiB" if basis == "read_mib" else "ms"
    reason = (
        f"warm-up ends at token {start + 1}: first token with {basis} <= {tolerance:g} x "
        f"{level:.1f} {unit} (second-half median), itself and over the next {window}"
    )
    return SteadyState(start, n, basis, level, reason)


# ----------------------------------------------------------------------------- summary parts


def pressure_figures(pressure: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The device pressure table from a ``.metrics`` sidecar (GiB, degrees Celsius)."""
    p = pressure or {}

    def scaled(key: str, divisor: float) -> float | None:
        value = _num(p.get(key))
        return None if value is None else value / divisor

    return {
        "peak_rss_gb": scaled("peak_rss_kb", KB_PER_GB),
        "mem_floor_gb": scaled("mem_avail_floor_kb", KB_PER_GB),
        "cpu_temp_start_c": scaled("cpu_temp_before_mC", 1000.0),
        "cpu_temp_max_c": scaled("cpu_temp_max_mC", 1000.0),
        "batt_temp_max_c": scaled("batt_temp_max_dC", 10.0),
        "mem_avail_before_gb": scaled("mem_avail_before_kb", KB_PER_GB),
        "mem_avail_after_gb": scaled("mem_avail_after_kb", KB_PER_GB),
        "batt_temp_start_c": scaled("batt_temp_before_dC", 10.0),
    }


def speculation_figures(run: MetricsRun, tok_s: float | None) -> dict[str, Any]:
    """Reported vs effective rate, and what speculation bought and cost.

    The effective rate ``1 / (1/tok_s + loop_overhead_s_tok)`` adds back the time between
    decodes (sampling, drafting, rendering) that ``wall_ms`` and therefore tok/s exclude.
    """
    s = run.summaries
    tokens = run.tokens
    overhead = _total(s, "loop_overhead_s/tok")
    if overhead is not None and len(s) > 1:
        weights = [_num(x.get("tokens")) or 0 for x in s if "loop_overhead_s/tok" in x]
        values = [_num(x["loop_overhead_s/tok"]) or 0 for x in s if "loop_overhead_s/tok" in x]
        overhead = sum(w * v for w, v in zip(weights, values, strict=True)) / max(sum(weights), 1)
    elif overhead is None and _measured(run.rows, "loop_overhead_ms") and tokens:
        overhead = float(run.rows["loop_overhead_ms"].sum()) / 1000.0 / tokens
    effective = None
    if tok_s and overhead is not None:
        effective = 1.0 / (1.0 / tok_s + overhead)
    spec = run.params.get("spec")
    if spec is None and run.params.get("mtp") is True:
        spec = "mtp"
    decodes = _total(s, "mtp_decodes")
    if decodes is None and "mtp_batch" in run.rows:
        decodes = float((run.rows["wall_ms"] > 0).sum()) if is_speculated(run) else float(tokens)
    drafted = _total(s, "mtp_drafted")
    accepted = _total(s, "mtp_accepted")
    drafted_steps = _total(s, "drafted_steps")
    draft_ms = None
    if "mtp_draft_s/tok" in (s[-1] if s else {}):
        draft_ms = (_last(s, "mtp_draft_s/tok") or 0.0) * 1000.0
    elif _measured(run.rows, "mtp_draft_ms") and tokens:
        draft_ms = float(run.rows["mtp_draft_ms"].sum()) / tokens
    return {
        "tok_s_effective": effective,
        "loop_overhead_ms_per_token": None if overhead is None else overhead * 1000.0,
        "spec": spec,
        "decodes": None if decodes is None else int(decodes),
        "tokens_per_decode": tokens / decodes if decodes else None,
        "draft_acceptance_pct": 100.0 * accepted / drafted
        if drafted and accepted is not None
        else None,
        "drafted_steps_pct": 100.0 * drafted_steps / decodes
        if drafted_steps is not None and decodes and spec not in (None, "off")
        else None,
        "draft_ms_per_token": draft_ms,
    }


def cache_figures(run: MetricsRun) -> dict[str, Any]:
    """Cache, prefetch and dropping figures from the summary trailer(s)."""
    s = run.summaries
    routed = _total(s, "experts_routed")
    dropped = _total(s, "experts_dropped")
    spec_experts = _total(s, "spec_experts")
    spec_useful = _total(s, "spec_useful")
    prefetch = run.params.get("prefetch")
    return {
        "cache_mb": _num(run.params.get("cache_mb")),
        "cache_budget_mib": _last(s, "cache_budget_MiB"),
        "cache_resident_mib": _last(s, "cache_resident_MiB"),
        "token_demand_mib": _last(s, "token_demand_MiB"),
        "layer_demand_mib": _last(s, "layer_demand_MiB"),
        "evictions": _total(s, "evictions"),
        "rereads": _total(s, "rereads"),
        "prefetch": prefetch,
        "prefetch_read_mib": _total(s, "spec_read_MiB"),
        "prefetched_experts": None if spec_experts is None else int(spec_experts),
        "prefetch_useful_pct": 100.0 * spec_useful / spec_experts
        if spec_experts and spec_useful is not None
        else None,
        "drop_cold_frac": _num(run.params.get("drop_cold_frac")),
        "experts_routed": None if routed is None else int(routed),
        "experts_dropped": None if dropped is None else int(dropped),
        "drop_pct": 100.0 * dropped / routed if routed and dropped is not None else None,
    }


def _row_memory(rows: pd.DataFrame) -> dict[str, float | None]:
    def extreme(col: str, how: str) -> float | None:
        if not _measured(rows, col):
            return None
        value = rows[col].max() if how == "max" else rows[col].min()
        return float(value) / 1024.0

    return {
        "rows_rss_max_gb": extreme("rss_mib", "max"),
        "rows_swap_max_gb": extreme("swap_mib", "max"),
        "rows_mem_available_min_gb": extreme("mem_available_mib", "min"),
    }


def _cache_hit(run: MetricsRun) -> float | None:
    value = _last(run.summaries, "cache_hit_pct")
    if value is None and "cache_hit_pct" in run.rows and len(run.rows):
        value = float(run.rows["cache_hit_pct"].iloc[-1])
    return None if value is None or value < 0 else value  # -1: no cache


def run_summary(run: MetricsRun, pressure: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The stable per-run record (names in :data:`STABLE_FIELDS` first, then more).

    `pressure` is the run's ``.metrics`` sidecar as read by
    :func:`bmoe.formats.sidecar.read_pressure` (None: the pressure figures are None).
    """
    s = run.summaries
    tokens_frame = per_token(run)
    rows = run.rows
    n = run.tokens
    rates = rate_figures(tokens_frame)
    read_mib = _total(s, "read_MiB")
    if read_mib is None and "read_bytes" in rows:
        read_mib = float(rows["read_bytes"].sum()) / MIB
    load_s = _first(s, "load_s")
    prefill_s = _first(s, "prefill_s")
    ttft = load_s + prefill_s if load_s is not None and prefill_s is not None else None
    record: dict[str, Any] = {
        "file": run.path,
        "tokens": n,
        "partial": run.partial,
        **rates,
        "prefill_tps": _first(s, "prefill_tps"),
        "ttft_s": ttft,
        "cache_hit_pct": _cache_hit(run),
        "read_mib_per_token": read_mib / n if read_mib is not None and n else None,
        "stall_ms_per_token": _column_mean(rows, "stall_ms"),
        "mgmt_ms_per_token": _column_mean(rows, "mgmt_ms"),
    }
    pressure_part = pressure_figures(pressure)
    for key in STABLE_FIELDS[STABLE_FIELDS.index("peak_rss_gb") :]:
        record[key] = pressure_part.pop(key)
    steady = steady_state(tokens_frame)
    mask = steady.mask()
    steady_rates = rate_figures(tokens_frame[mask]) if steady.steady_tokens else {}
    warm_rates = rate_figures(tokens_frame[~mask]) if steady.warmup_tokens else {}
    steady_read = (
        float(tokens_frame.loc[mask, "read_mib"].mean())
        if steady.steady_tokens and "read_mib" in tokens_frame
        else None
    )
    params = run.params
    record.update(
        {
            "version": run.version,
            "engine": run.engine,
            "model": params.get("model"),
            "n_expert_used": params.get("n_expert_used"),
            "threads": params.get("threads"),
            "steps": run.steps,
            "has_summary": bool(s),
            "turns": len(s) if s else None,
            "n_prompt": _first(s, "n_prompt"),
            "load_s": load_s,
            "prefill_s": prefill_s,
            "read_mib": read_mib,
            "tok_s_reported": _last(s, "tok/s") if len(s) == 1 else None,
            "compute_s_per_token": _per_token_figure(run, "compute_s/tok", "compute_ms", 1e-3),
            "io_s_per_token": _per_token_figure(run, "io_s/tok", "io_ms", 1e-3),
            "cpu_s_per_token": _per_token_figure(run, "cpu_s/tok", "cpu_ms", 1e-3, True),
            "majflt_per_token": _majflt_per_token(run),
            **speculation_figures(run, rates["tok_s_mean"]),
            "warmup_tokens": steady.warmup_tokens,
            "steady_tokens": steady.steady_tokens if steady.warmup_tokens is not None else None,
            "steady_basis": steady.basis,
            "warmup_tok_s_mean": warm_rates.get("tok_s_mean"),
            "steady_tok_s_mean": steady_rates.get("tok_s_mean"),
            "steady_tok_s_median": steady_rates.get("tok_s_median"),
            "steady_read_mib_per_token": steady_read,
            **cache_figures(run),
            **fidelity_figures(s),
            **pressure_part,
            **_row_memory(rows),
        }
    )
    return record


def _per_token_figure(
    run: MetricsRun, key: str, column: str, column_scale: float, measured: bool = False
) -> float | None:
    """A per-token figure: the summary's `key` (token-weighted over turns), else the mean of
    `column` x `column_scale`. With `measured`, all zeros means "cannot report" -> None."""
    s = [x for x in run.summaries if key in x]
    if s and len(s) == len(run.summaries):
        values = [_num(x[key]) or 0.0 for x in s]
        if measured and not any(values):
            return None
        weights = [_num(x.get("tokens")) or 0.0 for x in s]
        if sum(weights) > 0:
            return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
    if measured and not _measured(run.rows, column):
        return None
    mean = _column_mean(run.rows, column)
    return None if mean is None else mean * column_scale


def _majflt_per_token(run: MetricsRun) -> float | None:
    """Major faults per token. The engine writes 0 for both ``majflt`` and ``cpu_ms`` where the
    platform cannot count them, so a zero count is a measurement only when ``cpu_ms`` is."""
    value = _per_token_figure(run, "majflt/tok", "majflt", 1.0)
    if value == 0.0 and _per_token_figure(run, "cpu_s/tok", "cpu_ms", 1e-3, True) is None:
        return None
    return value


def summarize_runs(
    runs: Iterable[MetricsRun], pressures: Iterable[Mapping[str, Any] | None] | None = None
) -> pd.DataFrame:
    """:func:`run_summary` of each run as one DataFrame row (stable names as columns)."""
    runs = list(runs)
    pressures = list(pressures) if pressures is not None else [None] * len(runs)
    records = [run_summary(r, p) for r, p in zip(runs, pressures, strict=True)]
    return pd.DataFrame.from_records(records)


# ----------------------------------------------------------------------------- tables

#: Columns of the three benchmark-page tables (markdown) and the terminal tables.
THROUGHPUT_COLUMNS = (
    "run", "tokens", "partial", "tok_s_mean", "tok_s_median", "tok_s_p5", "tok_s_p95", "tok_s_min",
    "tok_s_max", "steady_tok_s_mean", "warmup_tokens", "tok_s_effective", "prefill_tps",
    "ttft_s", "stall_ms_per_token", "mgmt_ms_per_token",
)  # fmt: skip
PRESSURE_COLUMNS = (
    "run", "peak_rss_gb", "mem_floor_gb", "cpu_temp_start_c", "cpu_temp_max_c",
    "batt_temp_max_c", "rows_rss_max_gb", "rows_swap_max_gb", "rows_mem_available_min_gb",
    "majflt_per_token",
)  # fmt: skip
CACHE_COLUMNS = (
    "run", "cache_mb", "cache_hit_pct", "read_mib_per_token", "steady_read_mib_per_token",
    "token_demand_mib", "prefetch", "prefetch_read_mib", "prefetch_useful_pct", "drop_pct",
)  # fmt: skip
SPECULATION_COLUMNS = (
    "run", "spec", "tok_s_mean", "tok_s_effective", "loop_overhead_ms_per_token",
    "draft_ms_per_token", "decodes", "tokens_per_decode", "draft_acceptance_pct",
    "drafted_steps_pct",
)  # fmt: skip


def run_label(path: str | None, all_paths: Iterable[str | None]) -> str:
    """A short name for a run: the file name, or as many of its last folders as it takes to
    tell it from the other runs (``cell-a/r1/run.csv``, ``cell-b/r1/run.csv``)."""
    if path is None:
        return "<input>"
    parts = Path(path).parts
    others = [Path(q).parts for q in all_paths if q is not None and q != path]
    for k in range(1, len(parts) + 1):
        if not any(q[-k:] == parts[-k:] for q in others):
            return "/".join(parts[-k:])
    return str(path)


def summary_tables(summaries: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The throughput, pressure and cache tables (and speculation, when any run speculated),
    one row per run, from :func:`summarize_runs` output. Empty tables are left out."""
    frame = summaries.copy()
    paths = list(frame["file"])
    frame.insert(0, "run", [run_label(p, paths) for p in paths])
    views = {
        "throughput": frame[list(THROUGHPUT_COLUMNS)],
        "pressure": frame[list(PRESSURE_COLUMNS)],
        "cache": frame[list(CACHE_COLUMNS)],
    }
    if frame["spec"].isin(["mtp", "ngram"]).any() or frame["tokens_per_decode"].gt(1).any():
        views["speculation"] = frame[list(SPECULATION_COLUMNS)]
    # Drop tables that say nothing (every figure unknown for every run).
    return {
        name: view
        for name, view in views.items()
        if view.drop(columns="run").notna().to_numpy().any()
    }


__all__ = [
    "STABLE_FIELDS",
    "SteadyState",
    "is_speculated",
    "per_token",
    "pressure_figures",
    "rate_figures",
    "run_summary",
    "speculation_figures",
    "steady_state",
    "summarize_runs",
    "summary_tables",
    "token_rates",
]
