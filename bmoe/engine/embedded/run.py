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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, TextIO

import numpy as np
import pandas as pd

from bmoe.engine.embedded import fidelity, probes, telemetry
from bmoe.engine.embedded.chat import (
    TextSplit,
    model_template,
    opens_reasoning,
    split_reasoning,
)
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.engine import EmbeddedEngine
from bmoe.engine.embedded.hook import EvalHook, GraphChanged
from bmoe.engine.embedded.model import LlamaModel
from bmoe.engine.embedded.reader import ReadJob
from bmoe.engine.embedded.speculate import NgramDrafter, SpecCounters, timed_draft
from bmoe.engine.embedded.streamer import DecodeCounters, Routing
from bmoe.errors import BmoeError
from bmoe.formats import protocol
from bmoe.formats.metrics import COLUMNS_V2, MetricsWriter
from bmoe.formats.op_traces import IO_COLUMNS, ComputeTraceWriter, IoTraceWriter
from bmoe.formats.route import RouteTraceWriter
from bmoe.units import MIB

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
    columns: list[str] = field(default_factory=lambda: list(COLUMNS_V2))  # of the rows

    @property
    def metrics(self) -> pd.DataFrame:
        """The per-token rows as a DataFrame (the metrics CSV's columns)."""
        return pd.DataFrame(self.rows, columns=self.columns)


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


class Sinks:
    """The optional output files, opened up front so a bad path fails before the model loads."""

    def __init__(self, cfg: EngineConfig):
        self.files: list[TextIO] = []
        self.before_close: list[Callable[[], None]] = []  # what still holds rows for them
        self.csv = self._open(cfg.csv)
        self.route = self._open(cfg.route_trace)
        self.io = self._open(cfg.io_trace)
        self.compute = self._open(cfg.compute_trace or cfg.compute_trace_layers)

    def _open(self, path: str | None) -> TextIO | None:
        if not path:
            return None
        try:
            fh = open(path, "w", encoding="utf-8", errors="surrogateescape", newline="\n")  # noqa: SIM115
        except OSError as exc:
            raise BmoeError(f"{path}: cannot write ({exc.strerror})") from exc
        self.files.append(fh)
        return fh

    def close(self) -> None:
        for flush in self.before_close:
            with contextlib.suppress(Exception):
                flush()
        for fh in self.files:
            with contextlib.suppress(OSError):
                fh.close()


def emit(out: BinaryIO | None, text: str | bytes) -> None:
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
    if cfg.fidelity_ref:  # refused before the model loads, not after the prompt is echoed
        fidelity.check_reference(cfg.fidelity_ref)
    origin_ns = time.monotonic_ns()
    sinks = Sinks(cfg)
    t_load = time.perf_counter()
    eng: EmbeddedEngine | None = None
    try:
        eng = EmbeddedEngine(cfg, fault=fault, origin_ns=origin_ns, profile_hook=profile_hook)
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


class RouteRowBuffer:
    """Route-trace rows held back and written a few thousand at a time: building and
    formatting rows has a fixed cost per call that, paid after every token, is several times
    the token itself on a small model. The file is the same; :meth:`flush` writes what is
    held (at the end of each turn, and when the files close)."""

    rows_per_write = 4096

    def __init__(self, writer: RouteTraceWriter):
        self.writer = writer
        self._decodes: list[tuple[list[Routing], int]] = []
        self._rows = 0
        self._turn = 0

    def add(self, routings: list[Routing], phase: int, turn: int = 0) -> None:
        if turn != self._turn:
            self.flush()
            self._turn = turn
        self._decodes.append((routings, phase))
        self._rows += sum(r.ids.size for r in routings)
        if self._rows >= self.rows_per_write:
            self.flush()

    def flush(self) -> None:
        if self._decodes:
            self.writer.rows(telemetry.route_rows(self._decodes, self._turn))
        self._decodes = []
        self._rows = 0


class Writers:
    """The trace and metrics writers of one engine process (a session appends to them)."""

    def __init__(self, cfg: EngineConfig, eng: EmbeddedEngine, sinks: Sinks, o_direct: bool):
        lay = eng.layout
        self.params = telemetry.params(cfg, eng, o_direct)
        #: the metrics row layout, decided once: its columns and each token's starting row
        self.columns = telemetry.metrics_columns(cfg)
        self.blank_row = telemetry.blank_row(self.columns)
        self.metrics = MetricsWriter(sinks.csv, self.params, self.columns) if sinks.csv else None
        self.route: RouteRowBuffer | None = None
        self.io: IoTraceWriter | None = None
        self.compute: ComputeTraceWriter | None = None
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
                **telemetry.spec_meta(cfg),
            }
            self.route = RouteRowBuffer(RouteTraceWriter(sinks.route, meta, layers))
            sinks.before_close.append(self.route.flush)
        if eng.reader is not None:
            eng.reader.trace = bool(sinks.io)  # per-read records only for the io trace
        if sinks.io:
            self.io = IoTraceWriter(
                sinks.io, telemetry.trace_meta(cfg, eng, o_direct), IO_TRACE_COLUMNS
            )
        if sinks.compute:
            self.compute = ComputeTraceWriter(
                sinks.compute, telemetry.trace_meta(cfg, eng, o_direct)
            )


@dataclass
class Turn:
    """What one generation (a one-shot run, or one turn of a session) produced."""

    tokens: list[int]
    text: bytes
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    n_prompt: int  # tokens prefilled this turn
    n_past: int  # context length after it
    cancelled: bool = False
    reasoning: bytes = b""  # with a chat template: the reasoning span of `text`
    answer: bytes = b""  # and the rest (without one: `text`)
    logits: list[np.ndarray] = field(default_factory=list)
    hook_ns: list[int] = field(default_factory=list)
    hook_calls: list[int] = field(default_factory=list)


def _generate(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    sinks: Sinks,
    out: BinaryIO | None,
    load_s: float,
    keep_logits: bool,
    profile_hook: bool = False,
) -> RunResult:
    """The one-shot run: the prompt, its generation, the end-of-run lines."""
    model, cache = eng.model, eng.cache
    o_direct = bool(eng.reader and eng.reader.o_direct)
    writers = Writers(cfg, eng, sinks, o_direct)
    prompt = cfg.prompt.encode("utf-8", "surrogateescape")
    if model.n_ctx > cfg.n_predict:  # (else the check below says so)
        model.check_fits(prompt, model.n_ctx - cfg.n_predict)
    chat = None
    if cfg.chatml:  # the prompt as the user's message, in the model's template
        message = {"role": "user", "content": cfg.prompt}
        text = model_template(model).render([message], think=cfg.think)
        tokens = model.tokenize(text.encode("utf-8", "surrogateescape"), True, parse_special=True)
        chat = TextSplit(opened=opens_reasoning(text))
    else:
        tokens = model.tokenize(prompt, add_special=True) or [max(model.bos, 0)]
    if len(tokens) + cfg.n_predict > model.n_ctx:
        raise BmoeError(
            f"prompt ({len(tokens)} tokens) + -n {cfg.n_predict} exceeds the context "
            f"({model.n_ctx}); raise -c"
        )
    if not cfg.progress:
        emit(out, prompt)
    turn = run_turn(
        cfg,
        eng,
        writers,
        tokens,
        0,
        cfg.n_predict,
        out,
        load_s=load_s,
        progress=cfg.progress,
        keep_logits=keep_logits,
        profile_hook=profile_hook,
        chat=chat,
    )
    summary = turn.summary
    figures = telemetry.figures(cfg, eng, summary)
    if writers.metrics:
        writers.metrics.summary(summary)
    lines = protocol.format_run_lines(figures)
    if eng.predictor is not None and cfg.predict_log:
        lines += eng.predictor.lines()
    if cfg.progress:
        emit(out, b"=== answer ===\n" + turn.answer + b"\n=== perf ===\n")
    else:
        emit(out, b"\n\n")
    emit(out, "".join(line + "\n" for line in lines))
    mem = probes.memory()
    return RunResult(
        config=cfg,
        params=writers.params,
        tokens=turn.tokens,
        text=turn.text,
        rows=turn.rows,
        summary=summary,
        figures=figures,
        n_prompt=turn.n_prompt,
        o_direct=o_direct,
        logits=turn.logits,
        cache_stats=cache.stats if cache is not None else None,
        peak_rss_mib=mem.get("peak_rss_mib", 0.0),
        expert_resident_bytes=eng.arena.resident_bytes() if eng.arena is not None else 0,
        hook_ns=turn.hook_ns,
        hook_calls=turn.hook_calls,
        warnings=list(eng.warnings),
        columns=writers.columns,
    )


def run_turn(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    writers: Writers,
    tokens: list[int],
    start_pos: int,
    n_predict: int,
    out: BinaryIO | None,
    *,
    load_s: float,
    turn: int = 0,
    progress: bool = False,
    keep_logits: bool = False,
    profile_hook: bool = False,
    cancelled: Callable[[], bool] | None = None,
    chat: TextSplit | None = None,
) -> Turn:
    """Prefill `tokens` at positions `start_pos`.. and generate up to `n_predict` tokens,
    writing the per-token rows and trace rows stamped `turn`; the generated text goes to
    `out` (``BMOE_LOAD``/``BMOE_PROGRESS`` lines with `progress`). `cancelled` is asked
    before each token; a true answer ends the turn there. With `chat` (a rendered chat
    prompt) the progress lines carry the answer and the reasoning apart."""
    ra = eng.predictor
    ra_start = (ra.committed, ra.passthrough, ra.agree_slots) if ra is not None else (0, 0, 0)
    n_prompt = len(tokens)
    pre = _prefill(eng, writers, tokens, start_pos, turn)
    gen = _decode_tokens(
        cfg,
        eng,
        writers,
        pre.logits,
        start_pos + n_prompt,
        n_predict,
        out,
        turn=turn,
        progress=progress,
        keep_logits=keep_logits,
        profile_hook=profile_hook,
        cancelled=cancelled,
        prompt=tokens,
        chat=chat,
    )
    n_past = start_pos + n_prompt + len(gen.tokens)
    spec_read = pre.spec_read + gen.spec_read
    if eng.streamer is not None:
        eng.streamer.finish()
        _r, tail_spec = _trace_rows(eng, writers, turn, 1, n_past - 1, reads_only=True)
        spec_read += tail_spec
    if writers.route:
        writers.route.flush()  # the turn's rows are all in the file when it ends
    tail = time.perf_counter() - gen.t_prev_end
    prefill = {
        "prefill_cpu_s": pre.cpu_s,
        "prefill_read_mib": pre.read / MIB,
        "prefill_io_s": pre.counters.io_ns / 1e9,
        "prefill_stall_s": 0.0,
        "prefill_mgmt_s": pre.counters.mgmt_ns / 1e9,
    }
    summary = telemetry.summary(
        cfg,
        eng,
        gen.rows,
        n_prompt,
        load_s,
        pre.seconds,
        prefill,
        gen.demand_max,
        gen.layer_demand_max,
        spec_read,
        tail,
        gen.experts_routed,
        gen.experts_dropped,
        _route_ahead(eng, ra_start),
        gen.spec,
    )
    summary.update(fidelity.finish(gen.sample))
    reasoning, answer = split_reasoning(bytes(gen.text), chat.opened) if chat else (b"", b"")
    return Turn(
        reasoning=reasoning,
        answer=answer if chat else bytes(gen.text),
        tokens=gen.tokens,
        text=bytes(gen.text),
        rows=gen.rows,
        summary=summary,
        n_prompt=n_prompt,
        n_past=n_past,
        cancelled=gen.stopped,
        logits=gen.logits,
        hook_ns=gen.hook_ns,
        hook_calls=gen.hook_calls,
    )


def _trace_rows(
    eng: EmbeddedEngine,
    writers: Writers,
    turn: int,
    phase: int,
    step: int,
    reads_only: bool = False,
) -> tuple[int, int]:
    """Write one decode's trace rows; returns (read bytes, speculative read bytes)."""
    hook, streamer = eng.hook, eng.streamer
    read = spec = 0
    if eng.reader is not None:
        done = eng.reader.drain()
        read, spec = done.read_bytes, done.spec_bytes
        if writers.io and done.records:
            writers.io.rows(telemetry.io_frame(done.records, phase, step, turn))
    if reads_only:
        return read, spec
    if writers.route and streamer is not None:
        writers.route.add(streamer.counters.routings, phase, turn)
    if writers.compute and hook is not None:
        writers.compute.rows(telemetry.compute_frame(hook.trace_rows, phase, step, turn))
    return read, spec


@dataclass
class _Prefill:
    """What the prefill of a turn measured, and the logits it left for the first token."""

    seconds: float
    cpu_s: float
    read: int  # bytes read
    spec_read: int  # of which speculative
    counters: DecodeCounters
    logits: np.ndarray


def _prefill(
    eng: EmbeddedEngine, writers: Writers, tokens: list[int], start_pos: int, turn: int
) -> _Prefill:
    """Decode the prompt `tokens` in one batch at positions `start_pos`.. (phase 0)."""
    model, hook, streamer = eng.model, eng.hook, eng.streamer
    n_prompt = len(tokens)
    positions = np.arange(start_pos, start_pos + n_prompt, dtype=np.int64)
    outputs = np.zeros(n_prompt, dtype=bool)
    outputs[-1] = True
    if hook is not None:
        hook.begin(positions, outputs, generating=False)
    u0 = probes.usage()
    t0 = time.perf_counter()
    model.decode(tokens, start_pos)
    seconds = time.perf_counter() - t0
    u1 = probes.usage()
    if hook is not None:
        hook.end()
    counters = streamer.counters if streamer is not None else DecodeCounters()
    read, spec = _trace_rows(eng, writers, turn, 0, start_pos + n_prompt - 1)
    logits = model.logits()
    if hook is not None:
        hook.profile_ns = hook.profile_calls = 0
    return _Prefill(seconds, u1.cpu_s - u0.cpu_s, read, spec, counters, logits)


@dataclass
class _Generation:
    """What the token loop of a turn produced and accumulated."""

    t_prev_end: float  # when the last step (or the prefill) ended
    tokens: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    rows: list[dict[str, Any]] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    hook_ns: list[int] = field(default_factory=list)
    hook_calls: list[int] = field(default_factory=list)
    spec_read: int = 0
    demand_max: int = 0
    layer_demand_max: int = 0
    experts_routed: int = 0
    experts_dropped: int = 0
    stopped: bool = False
    sample: Callable[[np.ndarray], int] | None = None  # the sampler (fidelity wraps it)
    spec: SpecCounters = field(default_factory=SpecCounters)

    def add(self, counters: DecodeCounters, spec_read: int) -> None:
        """Accumulate one decode's counters into the turn's totals and maxima."""
        self.spec_read += spec_read
        self.experts_routed += counters.routed
        self.experts_dropped += counters.dropped
        self.demand_max = max(self.demand_max, counters.demand_bytes)
        self.layer_demand_max = max(self.layer_demand_max, counters.widest_layer_bytes)


@dataclass
class _Step:
    """One decode of the token loop: what it verified and what it measured."""

    batch: list[int]  # the token, then its drafts
    wall_ms: float
    overhead_ms: float  # the gap since the previous decode (drafting included)
    draft_ms: float
    u0: probes.Usage
    u1: probes.Usage
    counters: DecodeCounters
    read: int  # bytes read during it


def _decode_tokens(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    writers: Writers,
    logits: np.ndarray,
    first_pos: int,
    steps: int,
    out: BinaryIO | None,
    *,
    turn: int,
    progress: bool,
    keep_logits: bool,
    profile_hook: bool,
    cancelled: Callable[[], bool] | None,
    prompt: list[int] | None = None,
    chat: TextSplit | None = None,
) -> _Generation:
    """Generate up to `steps` tokens from position `first_pos` (phase 1), one decode at a
    time, measuring each into metrics rows and writing its text or progress.

    With ``--ngram`` each decode verifies the drafts the n-gram source proposes after the
    token (read off `prompt` and the tokens confirmed since): ``[token, *drafts]`` in one
    batch, each draft kept while it equals the model's greedy choice at its position. A group
    is one decode: its whole cost is charged to the first of its rows (``mtp_batch``).
    Generation ends at `steps` tokens, at an end-of-generation token or when `cancelled`."""
    model, hook = eng.model, eng.hook
    gen = _Generation(t_prev_end=time.perf_counter())
    sample = gen.sample = fidelity.sampler(cfg, _sampler(cfg))
    drafter = (
        NgramDrafter(prompt or [], cfg.draft, cfg.ngram_min_match, cfg.ngram_max_match)
        if cfg.spec == "ngram"
        else None
    )
    pos = first_pos
    token = sample(logits)
    while len(gen.tokens) < steps:
        if cancelled is not None and cancelled():
            gen.stopped = True
            break
        if model.is_eog(token):
            break
        drafts, draft_ns = timed_draft(drafter, token, steps - len(gen.tokens) - 1)
        batch = [token, *drafts]
        if keep_logits:
            logits = np.array(logits, copy=True)
        u0 = probes.usage()
        t0 = time.perf_counter()
        _decode_batch(model, hook, batch, pos)
        t1 = time.perf_counter()
        u1 = probes.usage()
        if hook is not None and profile_hook:
            gen.hook_ns.append(hook.profile_ns)
            gen.hook_calls.append(hook.profile_calls)
            hook.profile_ns = hook.profile_calls = 0
        # accept: each draft while it is what the model itself would have chosen there
        confirmed, chosen_from = [token], [logits]  # a view until the next decode
        for i, draft in enumerate(drafts):
            row = model.logits(i)
            if int(np.argmax(row)) != draft:
                break
            chosen_from.append(row)
            if model.is_eog(draft):  # decoded, never emitted, as on the plain path
                break
            confirmed.append(draft)
        accepted = len(chosen_from) - 1
        logits = model.logits(accepted if drafts else -1)
        if accepted < len(drafts):
            model.forget_from(pos + 1 + accepted)  # the rejected tail leaves the KV
        counters = eng.streamer.counters if eng.streamer is not None else DecodeCounters()
        read, spec_read = _trace_rows(eng, writers, turn, 1, pos + len(batch) - 1)
        gen.add(counters, spec_read)
        gen.spec.decodes += 1
        gen.spec.drafted += len(drafts)
        gen.spec.accepted += accepted
        gen.spec.drafted_steps += bool(drafts)
        gen.spec.draft_ns += draft_ns
        done = _Step(
            batch,
            (t1 - t0) * 1e3,
            (t0 - gen.t_prev_end) * 1e3,
            draft_ns / 1e6,
            u0,
            u1,
            counters,
            read,
        )
        _emit_group(
            cfg,
            eng,
            writers,
            gen,
            done,
            confirmed,
            chosen_from,
            steps,
            out,
            turn=turn,
            progress=progress,
            keep_logits=keep_logits,
            chat=chat,
        )
        if drafter is not None:
            drafter.confirm(confirmed)
        if len(confirmed) < len(chosen_from):  # an accepted end of generation
            break
        pos += len(confirmed)
        if len(gen.tokens) >= steps:
            break  # a token sampled and never decoded would be one too many for --fidelity-save
        token = sample(logits)
        gen.t_prev_end = time.perf_counter()
    if drafter is not None:  # the KV keeps exactly what was emitted
        model.forget_from(first_pos + len(gen.tokens))
    return gen


def _emit_group(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    writers: Writers,
    gen: _Generation,
    step: _Step,
    confirmed: list[int],
    chosen_from: list[np.ndarray],
    steps: int,
    out: BinaryIO | None,
    *,
    turn: int,
    progress: bool,
    keep_logits: bool,
    chat: TextSplit | None = None,
) -> None:
    """The rows (and text or progress lines) of the tokens one decode confirmed: the first
    carries the decode's whole cost, the others zeros, all of them the group's size."""
    for i, token in enumerate(confirmed):
        if keep_logits:
            gen.logits.append(np.array(chosen_from[i], copy=True))
        gen.tokens.append(token)
        piece = eng.model.piece(token)
        gen.text += piece
        row = _step_row(cfg, eng, writers.blank_row, len(gen.tokens), steps, turn,
                        step if i == 0 else None)  # fmt: skip
        row["mtp_batch"] = len(confirmed)
        if "fidelity_kl" in row:
            row["fidelity_kl"] = fidelity.step_kl(gen.sample, len(gen.tokens))
        gen.rows.append(row)
        if writers.metrics:
            writers.metrics.row(row)
        if progress:
            if row["read_bytes"]:
                load = {"mb": row["read_bytes"] / MIB, "ms": row["io_ms"]}
                emit(out, protocol.format_event("LOAD", load) + "\n")
            reasoning, answer, reset = chat.update(bytes(gen.text)) if chat else (b"", piece, False)
            payload = telemetry.progress(row, answer, reasoning, reset)
            emit(out, protocol.format_event("PROGRESS", payload) + "\n")
        else:
            emit(out, piece)


def _step_row(
    cfg: EngineConfig,
    eng: EmbeddedEngine,
    blank: dict[str, Any],
    step: int,
    steps: int,
    turn: int,
    cost: _Step | None,
) -> dict[str, Any]:
    """One token's metrics row: `blank` (every column of the run, 0) with what this engine
    measures filled in; `cost` is the decode that produced it, None for the later tokens of
    a verified group (whose cost the group's first row carries), and the probes are read
    now. The columns it does not measure (``stall_ms``: reads are not overlapped;
    ``drain_ms``, ``adopt_ms``, ``ra_issue_ms``, ``ra_wd_ms``: no such waits) stay 0."""
    if cost is None:
        frac, probe_s = eng.dense_probe.value, 0.0
        c, wall_ms, overhead_ms, draft_ms, read = DecodeCounters(), 0.0, 0.0, 0.0, 0
        majflt, cpu_ms = 0, 0.0
    else:
        frac, probe_s = eng.dense_probe.sample()
        c, wall_ms, read = cost.counters, cost.wall_ms, cost.read
        overhead_ms, draft_ms = cost.overhead_ms, cost.draft_ms
        majflt, cpu_ms = cost.u1.majflt - cost.u0.majflt, (cost.u1.cpu_s - cost.u0.cpu_s) * 1e3
    mem = probes.memory()
    io_ms = c.io_ns / 1e6
    mgmt_ms = c.mgmt_ns / 1e6 + probe_s * 1e3
    stats = eng.cache.stats if eng.cache is not None else None
    hit = (
        (100.0 * stats["hits"] / stats["lookups"])
        if stats and stats["lookups"]
        else (0.0 if stats else -1.0)
    )
    return {
        **blank,
        "step": step,
        "steps": steps,
        "wall_ms": wall_ms,
        "io_ms": io_ms,
        "compute_ms": max(0.0, wall_ms - io_ms - mgmt_ms),
        "read_bytes": read,
        "cache_hit_pct": hit,
        "mgmt_ms": mgmt_ms,
        "majflt": majflt,
        "cpu_ms": cpu_ms,
        "dense_resident_frac": frac,
        "turn": turn,
        "majflt_mib": probes.majflt_mib(majflt),
        "cache_budget_mib": eng.budget_bytes / MIB if cfg.moe_stream else 0.0,
        **{k: mem[k] for k in probes.MEMORY_COLUMNS},
        "loop_overhead_ms": overhead_ms,
        "mtp_batch": 1,
        "mtp_draft_ms": draft_ms,
    }


def _route_ahead(eng: EmbeddedEngine, start: tuple[int, int, int]) -> tuple[int, int, float]:
    """This turn's --route-ahead ledger: committed, passed through, % of slots agreed."""
    ra = eng.predictor
    if ra is None or not ra.ahead:
        return 0, 0, 0.0
    committed = ra.committed - start[0]
    agree = ra.agree_slots - start[2]
    pct = 100.0 * agree / (committed * ra.k) if committed else 0.0
    return committed, ra.passthrough - start[1], pct


def _decode_batch(model: LlamaModel, hook: EvalHook | None, tokens: list[int], pos: int) -> None:
    """Decode `tokens` at positions `pos`.. (one token, or a token and its drafts with logits
    at every position); a single token is redone without remembered node decisions if the
    graph changed."""
    where = np.arange(pos, pos + len(tokens), dtype=np.int64)
    wide = len(tokens) > 1
    if hook is None:
        model.decode(tokens, pos, logits_all=wide)
        return
    hook.begin(where, np.ones(len(tokens), bool))
    model.decode(tokens, pos, logits_all=wide)
    try:
        hook.end()
    except GraphChanged:
        model.forget_from(pos)
        hook.forget()
        hook.begin(where, np.ones(len(tokens), bool))
        model.decode(tokens, pos, logits_all=wide)
        hook.end()
