"""What a run reports, computed from what it measured: the metrics preamble, the trace
preambles and rows, the ``--progress`` payload, the ``# summary`` trailer and the figures of
the end-of-run lines. Pure functions over the engine's state; writing is the format layer's.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from bmoe._version import __version__
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.engine import EmbeddedEngine, mib
from bmoe.engine.embedded.hook import TraceRow
from bmoe.engine.embedded.model import version
from bmoe.engine.embedded.reader import ReadRecord
from bmoe.engine.embedded.speculate import SpecCounters
from bmoe.engine.embedded.streamer import DecodeCounters, Routing
from bmoe.formats import protocol
from bmoe.formats.metrics_columns import BY_NAME, native_columns
from bmoe.formats.route import COLUMNS as ROUTE_COLUMNS
from bmoe.units import MIB


def engine_version() -> str:
    """``bmoe-embedded-<bmoe version>+llama-cpp-python-<version>`` (one token, no spaces)."""
    return f"bmoe-embedded-{__version__}+llama-cpp-python-{version()}"


def params(cfg: EngineConfig, eng: EmbeddedEngine, o_direct: bool) -> dict[str, Any]:
    """The metrics preamble: the resolved configuration, keys in the native order."""
    lay = eng.layout
    stream = cfg.moe_stream
    cycle = eng.cycle_bytes
    return {
        "engine": engine_version(),
        "model": os.path.basename(cfg.model),
        "arch": lay.arch,
        "n_layer": lay.n_layer,
        "n_expert": lay.n_expert,
        "n_expert_used": eng.n_expert_used,
        "threads": cfg.threads,
        "n_ctx": cfg.ctx_size,
        "n_ubatch": cfg.ubatch,
        "chatml": cfg.chatml,
        "moe_stream": stream,
        "cache_mb": mib(eng.budget_bytes) if stream else 0,
        "cache_auto": stream and cfg.cache_mb is None and not cfg.load_all,
        "cache_floor_mb": cfg.cache_floor_mb,
        "cache_ceil_mb": cfg.cache_ceil_mb,
        "force_cache": cfg.force_cache,
        "load_all": cfg.load_all,
        "io_threads": cfg.io_threads if stream else 0,
        "o_direct": o_direct,
        "overlap": False,
        "io_two_wave": False,
        "prefetch": cfg.prefetch,
        # the native engine's cache is LRU and its preamble names no policy: named otherwise
        **({"cache_policy": cfg.cache_policy} if cfg.cache_policy != "lru" else {}),
        "route_ahead": cfg.route_ahead,
        "predict_prefetch": cfg.predict_prefetch,
        "predict_log": cfg.predict_log,
        "predict_spec_max": cfg.predict_spec_max,
        "prefetch_sync": False,
        "dense_weights": cfg.dense_weights,
        "drop_cold_frac": float(cfg.drop_cold_frac),
        "drop_renorm": cfg.drop_renorm,
        "drop_prefill": cfg.drop_prefill,
        "cache_cycle_mb": mib(cycle) if stream else 0,
        "temp": float(cfg.temp),
        "top_k": cfg.top_k,
        "top_p": float(cfg.top_p),
        "seed": cfg.seed,
        "compute_trace_layers": int(bool(cfg.compute_trace_layers)),
        "spec": cfg.spec,
        "spec_draft_max": cfg.draft if cfg.spec != "off" else 0,
        "mtp_p_min": 0.0,
        "ngram_min_match": cfg.ngram_min_match if cfg.spec == "ngram" else 0,
    }


def metrics_columns(cfg: EngineConfig) -> list[str]:
    """The per-token columns a run writes, in order: the native engine's v2 header (so the
    file reads as the native engine's), then the embedded engine's own columns whose feature
    the run turns on (``fidelity_kl`` under ``--fidelity-ref``)."""
    return native_columns(2) + (["fidelity_kl"] if cfg.fidelity_ref else [])


def blank_row(columns: list[str]) -> dict[str, Any]:
    """A metrics row of `columns`, every value 0 (the contract's "not measured"), typed as
    the column table says: each token's row starts from it."""
    return {name: 0 if BY_NAME[name].is_int else 0.0 for name in columns}


def trace_meta(cfg: EngineConfig, eng: EmbeddedEngine, o_direct: bool) -> dict[str, Any]:
    """The preamble of the io and compute traces."""
    return {
        "model": cfg.model,
        "arch": eng.layout.arch,
        "n_layer": eng.layout.n_layer,
        "n_threads": cfg.threads,
        "io_threads": cfg.io_threads if cfg.moe_stream else 0,
        "o_direct": o_direct,
        "overlap": False,
        **spec_meta(cfg),
    }


def spec_meta(cfg: EngineConfig) -> dict[str, Any]:
    """What the trace preambles say about speculation (nothing without it): under it a
    verify decode routes its drafts' positions, and a rejected one's again later."""
    if cfg.spec == "off":
        return {}
    return {"spec": cfg.spec, "spec_draft_max": cfg.draft}


def route_frame(counters: DecodeCounters, phase: int, turn: int = 0) -> pd.DataFrame:
    """One decode's routings as route-trace rows (layer blocks, native order)."""
    return route_rows([(counters.routings, phase)], turn)


def route_rows(decodes: list[tuple[list[Routing], int]], turn: int = 0) -> pd.DataFrame:
    """Route-trace rows of consecutive decodes (each its routings and phase), each decode's
    rows in the native order (by layer, then step, then slot), decodes in the order given.

    Built from the routings' arrays joined once: this runs between two tokens."""
    routings = [r for decode, _phase in decodes for r in decode]
    if not routings:
        return pd.DataFrame(columns=list(ROUTE_COLUMNS))
    sizes = [r.ids.size for r in routings]
    total = sum(sizes)

    def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False)

    per_decode = [sum(r.ids.size for r in decode) for decode, _phase in decodes]
    decode = np.repeat(np.arange(len(decodes)), per_decode)
    phase = np.repeat(np.array([ph for _d, ph in decodes], np.int8), per_decode)
    step = joined([np.repeat(r.positions, r.ids.shape[1]) for r in routings], np.int64)
    layer = np.repeat(np.array([r.layer for r in routings], np.int16), sizes)
    slot = joined([np.tile(np.arange(r.ids.shape[1]), r.ids.shape[0]) for r in routings], np.int16)
    weight = joined(
        [
            r.weights.ravel() if r.weights is not None else np.full(r.ids.size, np.nan)
            for r in routings
        ],
        np.float64,
    )
    dropped = joined(
        [
            r.dropped.ravel() if r.dropped is not None else np.zeros(r.ids.size, bool)
            for r in routings
        ],
        np.int8,
    )
    order = np.lexsort((slot, step, layer, decode))
    return pd.DataFrame(
        {
            "turn": np.full(total, turn, np.int16),
            "phase": phase[order],
            "step": step[order],
            "layer": layer[order],
            "slot": slot[order],
            "expert": joined([r.ids.ravel() for r in routings], np.int32)[order],
            "weight": weight[order],
            "residency": joined([r.residency.ravel() for r in routings], np.int8)[order],
            "expert_bytes": joined([r.expert_bytes.ravel() for r in routings], np.int64)[order],
            "dropped": dropped[order],
        }
    )


def io_frame(records: list[ReadRecord], phase: int, step: int, turn: int = 0) -> pd.DataFrame:
    """The reads drained after one decode as io-trace rows (``start_ns`` appended)."""
    n = len(records)
    frame = pd.DataFrame.from_records(
        [
            (
                r.layer,
                r.expert,
                r.proj,
                r.lane,
                int(r.spec),
                r.offset,
                r.req_bytes,
                r.read_bytes,
                r.latency_ns,
                r.start_ns,
            )
            for r in records
        ],
        columns=[
            "layer",
            "expert",
            "proj",
            "lane",
            "spec",
            "offset",
            "req_bytes",
            "read_bytes",
            "latency_ns",
            "start_ns",
        ],
    )
    frame.insert(0, "step", np.full(n, step, np.int64))
    frame.insert(0, "phase", np.full(n, phase, np.int8))
    frame.insert(0, "turn", np.full(n, turn, np.int16))
    return frame


def compute_frame(rows: list[TraceRow], phase: int, step: int, turn: int = 0) -> pd.DataFrame:
    """One decode's graph timings as compute-trace rows."""
    n = len(rows)
    return pd.DataFrame(
        {
            "turn": np.full(n, turn, np.int16),
            "phase": np.full(n, phase, np.int8),
            "step": np.full(n, step, np.int64),
            "seq": [r.seq for r in rows],
            "layer": [r.layer for r in rows],
            "op": [r.op for r in rows],
            "name": [r.name for r in rows],
            "wall_ns": [r.wall_ns for r in rows],
            "majflt": [r.majflt for r in rows],
        }
    )


def progress(
    row: dict[str, Any], piece: bytes, reasoning: bytes = b"", reset: bool = False
) -> dict[str, Any]:
    """The ``BMOE_PROGRESS`` payload of one metrics row: `piece` is the answer's new text,
    `reasoning` the reasoning span's (`reset`: both are whole snapshots that replace them)."""
    out = {
        "step": row["step"],
        "steps": row["steps"],
        "wall_ms": row["wall_ms"],
        "io_ms": row["io_ms"],
        "compute_ms": row["compute_ms"],
        "mgmt_ms": row["mgmt_ms"],
        "stall_ms": row["stall_ms"],
        "read_mb": row["read_bytes"] / MIB,
        "cache_hit_pct": row["cache_hit_pct"],
        "majflt": row["majflt"],
        "cpu_ms": row["cpu_ms"],
        "dense_resident_frac": row["dense_resident_frac"],
        "delta_reasoning": protocol.to_text(reasoning),
        "delta_text": protocol.to_text(piece),
    }
    if reset:  # the native key order: "reset" right before the deltas
        out = {**{k: v for k, v in out.items() if not k.startswith("delta_")}, "reset": 1}
        out.update(delta_reasoning=protocol.to_text(reasoning), delta_text=protocol.to_text(piece))
    return out


def summary(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    rows: list[dict[str, Any]],
    n_prompt: int,
    load_s: float,
    prefill_s: float,
    prefill: dict[str, float],
    demand_max: int,
    layer_demand_max: int,
    spec_read: int,
    tail_s: float,
    experts_routed: int = 0,
    experts_dropped: int = 0,
    route_ahead: tuple[int, int, float] = (0, 0, 0.0),
    spec: SpecCounters | None = None,
) -> dict[str, Any]:
    """The ``# summary`` trailer, keys in the native engine's order (then the prefill split)."""
    n = len(rows)
    spec = spec if spec is not None else SpecCounters(decodes=n)
    per = 1.0 / n if n else 0.0

    def total(col: str) -> float:
        return float(sum(r[col] for r in rows))

    gen_s = total("wall_ms") / 1e3
    cache, streamer = eng.cache, eng.streamer
    stats = cache.stats if cache is not None else None
    hit = (
        (100.0 * stats["hits"] / stats["lookups"])
        if stats and stats["lookups"]
        else (0.0 if stats else -1.0)
    )
    return {
        "tokens": n,
        "s/tok": gen_s * per,
        "tok/s": n / gen_s if gen_s > 0 else 0.0,
        "read_MiB": total("read_bytes") / MIB,
        "io_s": total("io_ms") / 1e3,
        "compute_s/tok": total("compute_ms") / 1e3 * per,
        "io_s/tok": total("io_ms") / 1e3 * per,
        "cache_hit_pct": hit,
        "n_prompt": n_prompt,
        "load_s": load_s,
        "prefill_s": prefill_s,
        "prefill_tps": n_prompt / prefill_s if prefill_s > 0 else 0.0,
        "stall_s/tok": 0.0,
        "mgmt_s/tok": total("mgmt_ms") / 1e3 * per,
        "cache_resident_MiB": (cache.bytes_held / MIB)
        if cache is not None
        else (streamer.resident_bytes / MIB if streamer is not None else 0.0),
        "cache_budget_MiB": eng.budget_bytes / MIB,
        "cache_resizes": 0,
        "spec_read_MiB": spec_read / MIB,
        "spec_experts": streamer.spec_experts if streamer is not None else 0,
        "spec_useful": streamer.spec_useful if streamer is not None else 0,
        "majflt/tok": total("majflt") * per,
        "cpu_s/tok": total("cpu_ms") / 1e3 * per,
        "token_demand_MiB": demand_max / MIB,
        "layer_demand_MiB": layer_demand_max / MIB,
        "experts_routed": experts_routed,
        "experts_dropped": experts_dropped,
        "loop_overhead_s/tok": (total("loop_overhead_ms") / 1e3 + tail_s) * per,
        "mtp_drafted": spec.drafted,
        "mtp_accepted": spec.accepted,
        "mtp_decodes": spec.decodes,
        "mtp_draft_s/tok": spec.draft_ns / 1e9 * per,
        "drafted_steps": spec.drafted_steps,
        "ra_committed": route_ahead[0],
        "ra_passthrough": route_ahead[1],
        "ra_agree_pct": route_ahead[2],
        "ra_gemv_ms/tok": 0.0,
        "ra_issue_ms/tok": 0.0,
        "ra_wd_ms/tok": 0.0,
        "drain_s/tok": 0.0,
        "adopt_s/tok": 0.0,
        "evictions": stats["evictions"] if stats else 0,
        "rereads": streamer.rereads if streamer is not None else 0,
        **prefill,
    }


def speculation_figures(source: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of the ``ngram:`` end-of-run lines: acceptance, tokens per verify decode,
    what drafting cost on top of the decodes, and how many steps drafted at all."""
    tokens, decodes = summary["tokens"], summary["mtp_decodes"]
    drafted, accepted = summary["mtp_drafted"], summary["mtp_accepted"]
    s_tok, draft_s_tok = summary["s/tok"], summary["mtp_draft_s/tok"]
    return {
        "spec": source,
        "mtp_accepted": accepted,
        "mtp_drafted": drafted,
        "mtp_accept_pct": 100.0 * accepted / drafted if drafted else 0.0,
        "mtp_tokens_per_decode": tokens / decodes if decodes else 0.0,
        "mtp_decodes": decodes,
        "mtp_tokens": tokens,
        "mtp_draft_s/tok": draft_s_tok,
        "mtp_effective_tok/s": 1.0 / (s_tok + draft_s_tok) if s_tok + draft_s_tok > 0 else 0.0,
        "mtp_reported_tok/s": summary["tok/s"],
        "drafted_steps": summary["drafted_steps"],
        "ngram_steps": decodes,
        "drafted_pct": 100.0 * summary["drafted_steps"] / decodes if decodes else 0.0,
    }


def figures(cfg: EngineConfig, eng: EmbeddedEngine, summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of the end-of-run lines (named like the summary keys where they agree)."""
    n = summary["tokens"] or 1
    s_tok = summary["s/tok"]
    fig: dict[str, Any] = {
        "tokens": summary["tokens"],
        "s/tok": s_tok,
        "tok/s": summary["tok/s"],
        "cpu_pct": 100.0 * summary["cpu_s/tok"] / (s_tok * cfg.threads) if s_tok > 0 else 0.0,
        "cpu_s/tok": summary["cpu_s/tok"],
        "threads": cfg.threads,
        "majflt/tok": summary["majflt/tok"],
        "n_prompt": summary["n_prompt"],
        "prefill_s": summary["prefill_s"],
        "prefill_tps": summary["prefill_tps"],
        "load_s": summary["load_s"],
        "ttft_s": summary["load_s"] + summary["prefill_s"],
        "dense_weights": cfg.dense_weights,
        "overlap": False,
    }
    if cfg.spec != "off":
        fig.update(speculation_figures(cfg.spec, summary))
    if not cfg.moe_stream:
        fig["mode"] = "plain llama.cpp on mmap, experts not streamed (pass --moe-stream)"
        return fig
    fig["mode"] = "expert streaming"
    if cfg.load_all:
        fig["mode_cache"] = "off (--load-all)"
    elif cfg.cache_mb is None:
        fig["mode_cache"] = "auto"
    else:
        fig["mode_cache"] = "off" if eng.budget_bytes == 0 else f"{mib(eng.budget_bytes)} MiB"
    read = summary["read_MiB"]
    io_s = summary["io_s"]
    fig.update(
        {
            "read_MiB": read,
            "read_MiB/tok": read / n,
            "decode_s/tok": s_tok,
            "compute_s/tok": summary["compute_s/tok"],
            "mgmt_s/tok": summary["mgmt_s/tok"],
            "io_s/tok": summary["io_s/tok"],
            "read_MiB/s": read / io_s if io_s > 0 else 0.0,
        }
    )
    if eng.cache is not None:
        fig.update(
            {
                "cache_hit_pct": summary["cache_hit_pct"],
                "cache_resident_MiB": summary["cache_resident_MiB"],
                "evictions": summary["evictions"],
                "rereads": summary["rereads"],
                "rereads/tok": summary["rereads"] / n,
            }
        )
    if cfg.drop_cold_frac:
        routed = summary["experts_routed"]
        fig.update(
            {
                "experts_dropped": summary["experts_dropped"],
                "experts_routed": routed,
                "drop_pct": 100.0 * summary["experts_dropped"] / routed if routed else 0.0,
                "drop_cold_frac": float(cfg.drop_cold_frac),
            }
        )
    if cfg.route_ahead:
        fig.update(
            {
                "route_ahead": cfg.route_ahead,
                "ra_committed": summary["ra_committed"],
                "ra_passthrough": summary["ra_passthrough"],
                "ra_agree_pct": summary["ra_agree_pct"],
            }
        )
    if cfg.prefetch or cfg.predict_prefetch:
        experts = summary["spec_experts"]
        fig.update(
            {
                "spec_read_MiB": summary["spec_read_MiB"],
                "spec_useful": summary["spec_useful"],
                "spec_experts": experts,
                "spec_useful_pct": 100.0 * summary["spec_useful"] / experts if experts else 0.0,
            }
        )
        if cfg.predict_prefetch:
            fig["prefetch_source"] = "stale-gate" + (" + prev-token" if cfg.prefetch else "")
    return fig
