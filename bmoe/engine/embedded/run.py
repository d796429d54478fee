"""The embedded engine's generation loop: what ``bmoe run`` executes.

:func:`run_engine` loads the model (mmap, no repacking), sets up streaming when asked (a
one-token warm-up finds the expert tensors in the graph, rebinds them to the arena and drops
their pages from llama.cpp's mapping), prefills the prompt, then decodes ``n_predict`` tokens
one at a time. Around each ``llama_decode`` it measures what the telemetry contract defines and
writes the same files and stdout lines as the native ``bmoe-cli``, through the format layer's
writers.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO

import numpy as np
import pandas as pd

import bmoe
from bmoe.cache import ExpertCache
from bmoe.engine.embedded import ggml, libc, probes
from bmoe.engine.embedded.arena import ExpertArena
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.hook import EvalHook, GraphChanged, TraceRow
from bmoe.engine.embedded.layout import ModelLayout, read_layout
from bmoe.engine.embedded.model import LlamaModel, version
from bmoe.engine.embedded.reader import ExpertReader, ReadJob, ReadRecord
from bmoe.engine.embedded.streamer import DecodeCounters, ExpertStreamer
from bmoe.errors import BmoeError
from bmoe.formats import protocol
from bmoe.formats.decode import IO_COLUMNS, ComputeTraceWriter, IoTraceWriter
from bmoe.formats.metrics import COLUMNS_V2, MetricsWriter
from bmoe.formats.route import COLUMNS as ROUTE_COLUMNS
from bmoe.formats.route import RouteTraceWriter

MIB = 1024 * 1024
IO_TRACE_COLUMNS = (*IO_COLUMNS, "start_ns")


@dataclass
class RunResult:
    """What a run produced, for callers of the Python API."""

    config: EngineConfig
    params: dict[str, Any]  # the metrics preamble
    tokens: list[int]
    text: bytes
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    figures: dict[str, Any]  # the end-of-run lines' figures
    n_prompt: int
    o_direct: bool
    logits: list[np.ndarray] = field(default_factory=list)  # when keep_logits
    cache_stats: dict[str, int] | None = None
    peak_rss_mib: float = 0.0
    expert_resident_bytes: int = 0  # arena pages in RAM at the end (mincore), streaming only
    hook_ns: list[int] = field(default_factory=list)  # profile_hook: ns in the callback per step
    hook_calls: list[int] = field(default_factory=list)  # and its calls per step
    warnings: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(COLUMNS_V2))


def engine_version() -> str:
    """``bmoe-embedded-<bmoe version>+llama-cpp-python-<version>`` (one token, no spaces)."""
    ours = getattr(bmoe, "__version__", None)
    if ours is None:  # bmoe imported as a namespace package (some editable installs)
        try:
            ours = importlib.metadata.version("bmoe")
        except importlib.metadata.PackageNotFoundError:
            ours = "unknown"
    return f"bmoe-embedded-{ours}+llama-cpp-python-{version()}"


def resolve_cache_bytes(cfg: EngineConfig, layout: ModelLayout) -> int:
    """The cache budget in bytes (``--cache-mb auto``: half of MemAvailable, within bounds)."""
    if cfg.cache_mb is not None:
        return int(cfg.cache_mb * MIB)
    avail = probes.memory()["mem_available_mib"] * MIB
    budget = max(cfg.cache_floor_mb * MIB, int(avail // 2))
    if cfg.cache_ceil_mb:
        budget = min(budget, cfg.cache_ceil_mb * MIB)
    return int(min(budget, layout.total_expert_bytes))


def _sampler(cfg: EngineConfig) -> Callable[[np.ndarray], int]:
    if cfg.temp <= 0:
        return lambda logits: int(np.argmax(logits))
    rng = np.random.default_rng(None if cfg.seed == 4294967295 else cfg.seed)

    def sample(logits: np.ndarray) -> int:
        z = logits.astype(np.float64) / cfg.temp
        order = np.argsort(-z, kind="stable")
        if cfg.top_k > 0:
            order = order[: cfg.top_k]
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        if 0 < cfg.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), cfg.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[rng.choice(len(order), p=p)])

    return sample


class _Sinks:
    """The optional output files, opened up front so a bad path fails before the model loads."""

    def __init__(self, cfg: EngineConfig):
        self.files: list[IO[str]] = []
        self.csv = self._open(cfg.csv)
        self.route = self._open(cfg.route_trace)
        self.io = self._open(cfg.io_trace)
        self.compute = self._open(cfg.compute_trace or cfg.compute_trace_layers)
        self.metrics: MetricsWriter | None = None
        self.route_writer: RouteTraceWriter | None = None
        self.io_writer: IoTraceWriter | None = None
        self.compute_writer: ComputeTraceWriter | None = None

    def _open(self, path: str | None) -> IO[str] | None:
        if not path:
            return None
        try:
            fh = open(path, "w", encoding="utf-8", errors="surrogateescape", newline="\n")  # noqa: SIM115
        except OSError as exc:
            raise BmoeError(f"{path}: cannot write ({exc.strerror})") from exc
        self.files.append(fh)
        return fh

    def close(self) -> None:
        for fh in self.files:
            with contextlib.suppress(OSError):
                fh.close()


def _merged(ranges: list[tuple[int, int]], gap: int = libc.PAGE) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, n in sorted(ranges):
        if out and off <= out[-1][0] + out[-1][1] + gap:
            o, m = out[-1]
            out[-1] = (o, max(m, off + n - o))
        else:
            out.append((off, n))
    return out


class _Engine:
    """One loaded model, with streaming set up or not; runs one generation."""

    def __init__(
        self,
        cfg: EngineConfig,
        *,
        fault: Callable[[ReadJob], None] | None = None,
        origin_ns: int,
        profile_hook: bool = False,
    ):
        self.cfg = cfg
        self.layout = read_layout(cfg.model)
        lay = self.layout
        if cfg.moe_stream and not lay.by_layer:
            raise BmoeError(
                f"{cfg.model}: no stacked expert tensors: not a model this engine streams"
            )
        self.n_expert_used = cfg.n_expert_used or lay.n_expert_used
        if cfg.n_expert_used and lay.n_expert and cfg.n_expert_used > lay.n_expert:
            raise BmoeError(
                f"--n-expert-used {cfg.n_expert_used} exceeds the {lay.n_expert} experts"
            )
        trace = "node" if cfg.compute_trace else ("layer" if cfg.compute_trace_layers else None)
        self.hook: EvalHook | None = None
        if cfg.moe_stream or trace:
            ggml.check_layout()
            self.hook = EvalHook(
                route_weights=bool(cfg.route_trace),
                trace=trace,
                first_moe_layer=lay.moe_layers[0] if lay.moe_layers else 0,
                n_moe_layers=len(lay.moe_layers),
                expert_names=frozenset(n.encode() for n in lay.tensors),
                profile=profile_hook,
            )
        self.model = LlamaModel(
            cfg.model,
            n_ctx=cfg.ctx_size,
            n_ubatch=cfg.ubatch,
            threads=cfg.threads,
            n_expert_used=cfg.n_expert_used,
            arch=lay.arch,
            callback=self.hook.callback if self.hook else None,
        )
        self.warnings: list[str] = []
        self.arena: ExpertArena | None = None
        self.reader: ExpertReader | None = None
        self.cache: ExpertCache | None = None
        self.streamer: ExpertStreamer | None = None
        self.budget_bytes = 0
        if cfg.moe_stream:
            self._setup_streaming(fault, origin_ns)
        self.dense_ranges = _merged(lay.dense_ranges)
        base = probes.mapping_base(cfg.model)
        if base is not None and self.arena is not None:
            block = next(iter(self.arena.blocks.values()))
            if base + block.tensor.file_offset != block.original:
                base = None  # not the mapping the tensors point into: do not guess
        self.dense_probe = probes.DenseResidency(base, self.dense_ranges)
        if cfg.dense_weights == "warm":
            self._warm_dense()

    def _setup_streaming(self, fault: Callable[[ReadJob], None] | None, origin_ns: int) -> None:
        cfg, lay, hook, model = self.cfg, self.layout, self.hook, self.model
        assert hook is not None
        hook.discovered = {}
        hook.begin(np.zeros(1, np.int64), np.ones(1, bool), generating=False)
        model.decode([model.bos if model.bos >= 0 else 0], 0)
        hook.end()
        found, hook.discovered = hook.discovered, None
        missing = sorted(set(lay.tensors) - set(found))
        if missing:
            raise BmoeError(
                f"{cfg.model}: the graph never used expert tensor {missing[0]} "
                f"({len(missing)} of {len(lay.tensors)} not found): cannot stream this model"
            )
        self.arena = ExpertArena(lay)
        for name, node in found.items():
            self.arena.bind(name, node)
        self.arena.release_original()
        model.clear_memory()
        self.reader = ExpertReader(
            cfg.model,
            cfg.io_threads,
            o_direct=cfg.o_direct,
            clock_origin_ns=origin_ns,
            after_read=fault,
        )
        if not cfg.load_all:
            self.budget_bytes = resolve_cache_bytes(cfg, lay)
            self.cache = ExpertCache(self.budget_bytes, "lru", n_layer=lay.n_layer)
            cycle = self.cycle_bytes
            if 0 < self.budget_bytes < cycle:
                self.warnings.append(
                    f"--cache-mb {_mb(self.budget_bytes)} is under one token's routed experts "
                    f"(cache_cycle_mb={_mb(cycle)}): expect a hit rate near zero"
                )
        self.streamer = ExpertStreamer(
            lay,
            self.arena,
            self.reader,
            self.cache,
            prefetch=cfg.prefetch,
            load_all=cfg.load_all,
            keep_routings=bool(cfg.route_trace),
        )
        hook.streamer = self.streamer

    @property
    def cycle_bytes(self) -> int:
        """One token's worst-case routed expert bytes at the effective top-k."""
        lay = self.layout
        return sum(lay.expert_bytes(il) for il in lay.moe_layers) * self.n_expert_used

    def _warm_dense(self) -> None:
        """``--dense-weights warm``: fault the dense weights in before the first token."""
        base = self.dense_probe.base
        if base is None:
            return
        for off, n in self.dense_ranges:
            libc.will_need(base + off, n)
            libc.touch(base + off, n)

    def close(self) -> None:
        if self.streamer is not None:
            with contextlib.suppress(Exception):
                self.streamer.finish()
        if self.reader is not None:
            self.reader.close()
        self.model.close()
        if self.arena is not None:
            self.arena.close()


def _params(cfg: EngineConfig, eng: _Engine, o_direct: bool) -> dict[str, Any]:
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
        "chatml": False,
        "moe_stream": stream,
        "cache_mb": _mb(eng.budget_bytes) if stream else 0,
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
        "route_ahead": 0,
        "predict_prefetch": False,
        "predict_log": False,
        "predict_spec_max": 0,
        "prefetch_sync": False,
        "dense_weights": cfg.dense_weights,
        "drop_cold_frac": 0.0,
        "drop_renorm": True,
        "drop_prefill": False,
        "cache_cycle_mb": _mb(cycle) if stream else 0,
        "temp": float(cfg.temp),
        "top_k": cfg.top_k,
        "top_p": float(cfg.top_p),
        "seed": cfg.seed,
        "compute_trace_layers": int(bool(cfg.compute_trace_layers)),
        "spec": "off",
        "spec_draft_max": 0,
        "mtp_p_min": 0.0,
        "ngram_min_match": 0,
    }


def _mb(nbytes: int) -> int | float:
    v = nbytes / MIB
    return int(v) if v.is_integer() else round(v, 3)


def _trace_meta(cfg: EngineConfig, eng: _Engine, o_direct: bool) -> dict[str, Any]:
    return {
        "model": cfg.model,
        "arch": eng.layout.arch,
        "n_layer": eng.layout.n_layer,
        "n_threads": cfg.threads,
        "io_threads": cfg.io_threads if cfg.moe_stream else 0,
        "o_direct": o_direct,
        "overlap": False,
    }


def _route_frame(counters: DecodeCounters, phase: int) -> pd.DataFrame:
    parts = []
    for r in counters.routings:
        n, k = r.ids.shape
        weights = r.weights if r.weights is not None else np.full((n, k), np.nan, np.float32)
        parts.append(
            pd.DataFrame(
                {
                    "turn": np.zeros(n * k, np.int16),
                    "phase": np.full(n * k, phase, np.int8),
                    "step": np.repeat(r.positions.astype(np.int64), k),
                    "layer": np.full(n * k, r.layer, np.int16),
                    "slot": np.tile(np.arange(k, dtype=np.int16), n),
                    "expert": r.ids.ravel().astype(np.int32),
                    "weight": weights.ravel().astype(np.float64),
                    "residency": r.residency.ravel(),
                    "expert_bytes": r.expert_bytes.ravel(),
                    "dropped": np.zeros(n * k, np.int8),
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=list(ROUTE_COLUMNS))
    frame = pd.concat(parts, ignore_index=True)
    # one block per layer in the native order: by layer, then step (prefill), then slot
    return frame.sort_values(["layer", "step", "slot"], kind="stable").reset_index(drop=True)


def _io_frame(records: list[ReadRecord], phase: int, step: int) -> pd.DataFrame:
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
    frame.insert(0, "turn", np.zeros(n, np.int16))
    return frame


def _compute_frame(rows: list[TraceRow], phase: int, step: int) -> pd.DataFrame:
    n = len(rows)
    return pd.DataFrame(
        {
            "turn": np.zeros(n, np.int16),
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


def _emit(out: BinaryIO | None, text: str | bytes) -> None:
    if out is None:
        return
    out.write(text if isinstance(text, bytes) else protocol.to_bytes(text))
    out.flush()


def run_engine(
    cfg: EngineConfig,
    *,
    out: BinaryIO | None = None,
    keep_logits: bool = False,
    fault: Callable[[ReadJob], None] | None = None,
    on_ready: Callable[[], None] | None = None,
    profile_hook: bool = False,
    err: IO[str] | None = None,
) -> RunResult:
    """Run one generation as ``bmoe run`` does; stdout lines go to `out` (None = silent).

    `keep_logits` keeps the logits each generated token was chosen from. `fault` is called by
    a read lane after each expert read (tests use it to corrupt one read). `on_ready` is called
    once the model is loaded and streaming is set up, before the prompt. `profile_hook` times
    the eval callback over the decode steps (:attr:`RunResult.hook_ns`). Load-time warnings
    are written to `err` as they happen (and kept in :attr:`RunResult.warnings`).
    """
    cfg.check()
    origin_ns = time.monotonic_ns()
    sinks = _Sinks(cfg)
    t_load = time.perf_counter()
    eng: _Engine | None = None
    try:
        eng = _Engine(cfg, fault=fault, origin_ns=origin_ns, profile_hook=profile_hook)
        load_s = time.perf_counter() - t_load
        if err is not None:
            for warning in eng.warnings:
                err.write(f"warning: {warning}\n")
            err.flush()
        if on_ready is not None:
            on_ready()
        return _generate(cfg, eng, sinks, out, load_s, keep_logits, profile_hook)
    finally:
        if eng is not None:
            eng.close()
        sinks.close()


def _generate(
    cfg: EngineConfig,
    eng: _Engine,
    sinks: _Sinks,
    out: BinaryIO | None,
    load_s: float,
    keep_logits: bool,
    profile_hook: bool = False,
) -> RunResult:
    model, hook, streamer, cache = eng.model, eng.hook, eng.streamer, eng.cache
    o_direct = bool(eng.reader and eng.reader.o_direct)
    params = _params(cfg, eng, o_direct)
    lay = eng.layout
    if sinks.csv:
        sinks.metrics = MetricsWriter(sinks.csv, params)
    if sinks.route:
        layers = pd.DataFrame(
            {
                "layer": lay.moe_layers,
                "expert_bytes": [lay.expert_bytes(il) for il in lay.moe_layers],
                "dense_bytes": [lay.layer_dense_bytes.get(il, 0) for il in lay.moe_layers],
            }
        )
        meta = {
            "model": cfg.model,
            "arch": lay.arch,
            "n_layer": lay.n_layer,
            "n_expert": lay.n_expert,
            "n_expert_used": eng.n_expert_used,
        }
        sinks.route_writer = RouteTraceWriter(sinks.route, meta, layers)
    if sinks.io:
        sinks.io_writer = IoTraceWriter(sinks.io, _trace_meta(cfg, eng, o_direct), IO_TRACE_COLUMNS)
    if sinks.compute:
        sinks.compute_writer = ComputeTraceWriter(sinks.compute, _trace_meta(cfg, eng, o_direct))

    prompt = cfg.prompt.encode("utf-8", "surrogateescape")
    tokens = model.tokenize(prompt, add_special=True) or [max(model.bos, 0)]
    n_prompt = len(tokens)
    if n_prompt + cfg.n_predict > model.n_ctx:
        raise BmoeError(
            f"prompt ({n_prompt} tokens) + -n {cfg.n_predict} exceeds the context ({model.n_ctx}); "
            "raise -c"
        )
    if not cfg.progress:
        _emit(out, prompt)

    def after_decode(phase: int, step: int, reads_only: bool = False) -> tuple[int, int]:
        """Write this decode's trace rows; returns (read bytes, speculative read bytes)."""
        read = spec = 0
        if eng.reader is not None:
            records = eng.reader.drain()
            for r in records:
                read += r.read_bytes
                if r.spec:
                    spec += r.read_bytes
            if sinks.io_writer and records:
                sinks.io_writer.rows(_io_frame(records, phase, step))
        if reads_only:
            return read, spec
        if sinks.route_writer and streamer is not None:
            sinks.route_writer.rows(_route_frame(streamer.counters, phase))
        if sinks.compute_writer and hook is not None:
            sinks.compute_writer.rows(_compute_frame(hook.trace_rows, phase, step))
        return read, spec

    # ---- prefill
    positions = np.arange(n_prompt, dtype=np.int64)
    outputs = np.zeros(n_prompt, dtype=bool)
    outputs[-1] = True
    if hook is not None:
        hook.begin(positions, outputs, generating=False)
    u0 = probes.usage()
    t0 = time.perf_counter()
    model.decode(tokens, 0)
    prefill_s = time.perf_counter() - t0
    u1 = probes.usage()
    prefill_cpu_s = u1.cpu_s - u0.cpu_s
    if hook is not None:
        hook.end()
    pre = streamer.counters if streamer is not None else DecodeCounters()
    pre_read, pre_spec = after_decode(0, n_prompt - 1)
    spec_read = pre_spec
    logits = model.logits()
    if hook is not None:
        hook.profile_ns = hook.profile_calls = 0
    hook_ns: list[int] = []
    hook_calls: list[int] = []
    t_prev_end = time.perf_counter()

    sample = _sampler(cfg)
    generated: list[int] = []
    kept: list[np.ndarray] = []
    text = bytearray()
    rows: list[dict[str, Any]] = []
    demand_max = layer_demand_max = 0
    steps = cfg.n_predict
    for step in range(1, steps + 1):
        token = sample(logits)
        if keep_logits:
            kept.append(np.array(logits, copy=True))
        generated.append(token)
        piece = model.piece(token)
        text += piece
        pos = n_prompt + step - 1
        u0 = probes.usage()
        t0 = time.perf_counter()
        _decode_one(model, hook, token, pos)
        t1 = time.perf_counter()
        u1 = probes.usage()
        if hook is not None and profile_hook:
            hook_ns.append(hook.profile_ns)
            hook_calls.append(hook.profile_calls)
            hook.profile_ns = hook.profile_calls = 0
        logits = model.logits()
        loop_overhead = t0 - t_prev_end
        c = streamer.counters if streamer is not None else DecodeCounters()
        read, spec = after_decode(1, pos)
        spec_read += spec
        demand_max = max(demand_max, c.demand_bytes)
        layer_demand_max = max(layer_demand_max, c.widest_layer_bytes)
        frac, probe_s = eng.dense_probe.sample()
        mem = probes.memory()
        wall_ms = (t1 - t0) * 1e3
        io_ms = c.io_ns / 1e6
        mgmt_ms = c.mgmt_ns / 1e6 + probe_s * 1e3
        majflt = u1.majflt - u0.majflt
        stats = cache.stats if cache is not None else None
        hit = (
            (100.0 * stats["hits"] / stats["lookups"])
            if stats and stats["lookups"]
            else (0.0 if stats else -1.0)
        )
        row = {
            "step": step,
            "steps": steps,
            "wall_ms": wall_ms,
            "io_ms": io_ms,
            "compute_ms": max(0.0, wall_ms - io_ms - mgmt_ms),
            "read_bytes": read,
            "cache_hit_pct": hit,
            "stall_ms": 0.0,
            "mgmt_ms": mgmt_ms,
            "majflt": majflt,
            "cpu_ms": (u1.cpu_s - u0.cpu_s) * 1e3,
            "dense_resident_frac": frac,
            "turn": 0,
            "majflt_mib": probes.majflt_mib(majflt),
            "cache_budget_mib": eng.budget_bytes / MIB if cfg.moe_stream else 0.0,
            **{k: mem[k] for k in probes.MEMORY_COLUMNS},
            "loop_overhead_ms": loop_overhead * 1e3,
            "mtp_batch": 1,
            "mtp_draft_ms": 0.0,
            "drain_ms": 0.0,
            "adopt_ms": 0.0,
            "ra_issue_ms": 0.0,
            "ra_wd_ms": 0.0,
        }
        rows.append(row)
        if sinks.metrics:
            sinks.metrics.row(row)
        if cfg.progress:
            if read:
                _emit(out, protocol.format_event("LOAD", {"mb": read / MIB, "ms": io_ms}) + "\n")
            _emit(out, protocol.format_event("PROGRESS", _progress(row, piece)) + "\n")
        else:
            _emit(out, piece)
        t_prev_end = time.perf_counter()

    if streamer is not None:
        streamer.finish()
        _r, tail_spec = after_decode(1, n_prompt + len(generated) - 1, reads_only=True)
        spec_read += tail_spec
    tail = time.perf_counter() - t_prev_end
    prefill = {
        "prefill_cpu_s": prefill_cpu_s,
        "prefill_read_mib": pre_read / MIB,
        "prefill_io_s": pre.io_ns / 1e9,
        "prefill_stall_s": 0.0,
        "prefill_mgmt_s": pre.mgmt_ns / 1e9,
    }
    summary = _summary(
        cfg,
        eng,
        rows,
        n_prompt,
        load_s,
        prefill_s,
        prefill,
        demand_max,
        layer_demand_max,
        spec_read,
        tail,
    )
    figures = _figures(cfg, eng, summary)
    if sinks.metrics:
        sinks.metrics.summary(summary)
    lines = protocol.format_run_lines(figures)
    if cfg.progress:
        _emit(out, b"=== answer ===\n" + bytes(text) + b"\n=== perf ===\n")
    else:
        _emit(out, b"\n\n")
    _emit(out, "".join(line + "\n" for line in lines))
    mem = probes.memory()
    return RunResult(
        config=cfg,
        params=params,
        tokens=generated,
        text=bytes(text),
        rows=rows,
        summary=summary,
        figures=figures,
        n_prompt=n_prompt,
        o_direct=o_direct,
        logits=kept,
        cache_stats=cache.stats if cache is not None else None,
        peak_rss_mib=mem.get("peak_rss_mib", 0.0),
        expert_resident_bytes=eng.arena.resident_bytes() if eng.arena is not None else 0,
        hook_ns=hook_ns,
        hook_calls=hook_calls,
        warnings=list(eng.warnings),
    )


def _decode_one(model: LlamaModel, hook: EvalHook | None, token: int, pos: int) -> None:
    """Decode one token; redo it without remembered node decisions if the graph changed."""
    where = np.array([pos], np.int64)
    if hook is None:
        model.decode([token], pos)
        return
    hook.begin(where, np.ones(1, bool))
    model.decode([token], pos)
    try:
        hook.end()
    except GraphChanged:
        model.forget_from(pos)
        hook.forget()
        hook.begin(where, np.ones(1, bool))
        model.decode([token], pos)
        hook.end()


def _progress(row: dict[str, Any], piece: bytes) -> dict[str, Any]:
    return {
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
        "delta_reasoning": "",
        "delta_text": protocol.to_text(piece),
    }


def _summary(
    cfg: EngineConfig,
    eng: _Engine,
    rows: list[dict[str, Any]],
    n_prompt: int,
    load_s: float,
    prefill_s: float,
    prefill: dict[str, float],
    demand_max: int,
    layer_demand_max: int,
    spec_read: int,
    tail_s: float,
) -> dict[str, Any]:
    """The ``# summary`` trailer, keys in the native engine's order (then the prefill split)."""
    n = len(rows)
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
        "experts_routed": 0,
        "experts_dropped": 0,
        "loop_overhead_s/tok": (total("loop_overhead_ms") / 1e3 + tail_s) * per,
        "mtp_drafted": 0,
        "mtp_accepted": 0,
        "mtp_decodes": n,
        "mtp_draft_s/tok": 0.0,
        "drafted_steps": 0,
        "ra_committed": 0,
        "ra_passthrough": 0,
        "ra_agree_pct": 0.0,
        "ra_gemv_ms/tok": 0.0,
        "ra_issue_ms/tok": 0.0,
        "ra_wd_ms/tok": 0.0,
        "drain_s/tok": 0.0,
        "adopt_s/tok": 0.0,
        "evictions": stats["evictions"] if stats else 0,
        "rereads": streamer.rereads if streamer is not None else 0,
        **prefill,
    }


def _figures(cfg: EngineConfig, eng: _Engine, summary: dict[str, Any]) -> dict[str, Any]:
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
    if not cfg.moe_stream:
        fig["mode"] = "plain llama.cpp on mmap, experts not streamed (pass --moe-stream)"
        return fig
    fig["mode"] = "expert streaming"
    if cfg.load_all:
        fig["mode_cache"] = "off (--load-all)"
    elif cfg.cache_mb is None:
        fig["mode_cache"] = "auto"
    else:
        fig["mode_cache"] = "off" if eng.budget_bytes == 0 else f"{_mb(eng.budget_bytes)} MiB"
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
    if cfg.prefetch:
        experts = summary["spec_experts"]
        fig.update(
            {
                "spec_read_MiB": summary["spec_read_MiB"],
                "spec_useful": summary["spec_useful"],
                "spec_experts": experts,
                "spec_useful_pct": 100.0 * summary["spec_useful"] / experts if experts else 0.0,
            }
        )
    return fig
