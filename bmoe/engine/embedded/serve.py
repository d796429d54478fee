"""``bmoe run --session``: one loaded model serving ``generate`` requests read from stdin.

The protocol is the native engine's (telemetry.md, "Session mode"): ``BMOE_READY`` once the
model is loaded, then per request ``BMOE_BEGIN``, the per-token ``BMOE_LOAD``/``BMOE_PROGRESS``
lines and ``BMOE_DONE``; a request that cannot be served is answered ``BMOE_ERROR`` with
``fatal:false`` and the session goes on. The expert cache stays warm across turns; the CSV and
the traces are written once per process, every row stamped with its turn, and each turn ends
with its ``# summary`` trailer, so the file reads back like the native engine's session CSV.

``clear_kv`` (default true) starts a new conversation; ``clear_kv:false`` continues it, as the
native engine does with and without ``--chatml`` (:mod:`bmoe.engine.embedded.chat`: with a
template the conversation is re-rendered and the shared KV prefix kept, without one the prompt
is decoded after the context). ``think`` (default: ``--no-think`` off) is passed to the
template. ``cancel`` ends the turn in flight after its current token and undoes it; ``close``
or the end of stdin ends the session.

With ``--predict-log`` each turn ends, right before its ``BMOE_DONE``, with the ``moe-predict:``
lines and per-layer table of a one-shot run; as in the native engine the scores are the
session's totals so far (every turn's routings are samples of the same accuracy).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from bmoe.engine.embedded.chat import Conversation, TextSplit, model_template
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.engine import EmbeddedEngine
from bmoe.engine.embedded.run import Sinks, Turn, Writers, emit, run_turn
from bmoe.errors import BmoeError
from bmoe.formats import protocol


@dataclass(frozen=True)
class Request:
    """One line of stdin: a request, or why it is not one (`error`)."""

    seq: int  # order of arrival among the generate requests
    data: dict[str, Any]
    error: str | None = None


class _Requests:
    """Reads stdin on a thread so that ``cancel`` reaches a turn while it runs."""

    def __init__(self, stdin: IO[bytes]):
        self.queue: queue.Queue[Request | None] = queue.Queue()
        self._generates = 0
        self._cancel_upto = 0  # generate requests up to this one are cancelled
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stdin,), daemon=True)
        self._thread.start()

    def _read(self, stdin: IO[bytes]) -> None:
        try:
            for lineno, line in enumerate(_lines(stdin), 1):
                if not line.strip():
                    continue
                try:
                    data = protocol.parse_request(line, path="stdin", lineno=lineno)
                except BmoeError as exc:
                    self.queue.put(Request(0, {"id": protocol.request_id_in(line)}, str(exc)))
                    continue
                if data["cmd"] == "cancel":
                    with self._lock:
                        self._cancel_upto = self._generates
                    continue
                with self._lock:
                    if data["cmd"] == "generate":
                        self._generates += 1
                    seq = self._generates
                self.queue.put(Request(seq, data))
                if data["cmd"] == "close":
                    return
        except (OSError, ValueError):
            pass
        finally:
            self.queue.put(None)

    def cancelled(self, seq: int) -> bool:
        """Whether a ``cancel`` arrived after generate request `seq` (and before the next)."""
        with self._lock:
            return self._cancel_upto >= seq


def _lines(stdin: IO[bytes]) -> Iterator[bytes]:
    """The lines of `stdin`, each at most one byte past :data:`protocol.MAX_REQUEST_BYTES`:
    the rest of a longer line is read and dropped, a block at a time (the parser refuses the
    line by its length, naming the request when its head says the id)."""
    limit = protocol.MAX_REQUEST_BYTES + 1
    while True:
        line = stdin.readline(limit)
        if not line:
            return
        if len(line) == limit and not line.endswith(b"\n"):
            rest = line
            while rest and not rest.endswith(b"\n"):
                rest = stdin.readline(1 << 20)
        yield line


def _check_generate(
    data: dict[str, Any], default_n: int, default_think: bool = True
) -> tuple[int, str, int, bool, bool]:
    """(id, prompt, n_predict, clear_kv, think) of a generate request, or BmoeError saying
    why not."""
    rid, prompt = data["id"], data["prompt"]
    if not isinstance(rid, int) or isinstance(rid, bool) or not -(2**31) <= rid < 2**31:
        raise BmoeError('"id" must be an integer from -2147483648 to 2147483647')
    if not isinstance(prompt, str):
        raise BmoeError('"prompt" must be a string')
    try:
        protocol.to_bytes(prompt)
    except UnicodeEncodeError as exc:
        raise BmoeError(
            f'"prompt" holds a lone surrogate ({prompt[exc.start]!r} at character {exc.start}): '
            "not text"
        ) from None
    n = data.get("n_predict", default_n)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 2**31:
        raise BmoeError('"n_predict" must be an integer from 0 to 2147483647')
    clear = data.get("clear_kv", True)
    if not isinstance(clear, bool):
        raise BmoeError('"clear_kv" must be true or false')
    think = data.get("think", default_think)
    if not isinstance(think, bool):
        raise BmoeError('"think" must be true or false')
    return rid, prompt, n, clear, think


def done_payload(rid: int, turn: Turn, load_s: float) -> dict[str, Any]:
    """``BMOE_DONE`` of one turn, from its summary (the keys of telemetry.md, in order)."""
    s = turn.summary
    return {
        "id": rid,
        "cancelled": turn.cancelled,
        "tokens": s["tokens"],
        "tok_s": s["tok/s"],
        "prefill_s": s["prefill_s"],
        "prefill_tps": s["prefill_tps"],
        "load_s": load_s,
        "cache_hit_pct": s["cache_hit_pct"],
        "n_prompt": turn.n_prompt,
        "n_past": turn.n_past,
        "compute_s_tok": s["compute_s/tok"],
        "io_s_tok": s["io_s/tok"],
        "cache_resident_mib": s["cache_resident_MiB"],
        "cache_budget_mib": s["cache_budget_MiB"],
        "read_mib": s["read_MiB"],
        "stall_s_tok": s["stall_s/tok"],
        "mgmt_s_tok": s["mgmt_s/tok"],
        "majflt_tok": s["majflt/tok"],
        "cpu_s_tok": s["cpu_s/tok"],
        "prefill_cpu_s": s["prefill_cpu_s"],
        "prefill_read_mib": s["prefill_read_mib"],
        "prefill_io_s": s["prefill_io_s"],
        "prefill_stall_s": s["prefill_stall_s"],
        "prefill_mgmt_s": s["prefill_mgmt_s"],
        "prefill_dev_tokens": 0,
        "prefill_dev_nodes": 0,
        "prefill_dev_read_mib": 0.0,
        "prefill_dev_stall_s": 0.0,
        "token_demand_mib": s["token_demand_MiB"],
        "mtp_drafted": s["mtp_drafted"],
        "mtp_accepted": s["mtp_accepted"],
        "mtp_decodes": s["mtp_decodes"],
        "mtp_draft_s_tok": s["mtp_draft_s/tok"],
        "drafted_steps": s["drafted_steps"],
        "loop_overhead_s_tok": s["loop_overhead_s/tok"],
        "reasoning": protocol.to_text(turn.reasoning),
        "text": protocol.to_text(turn.answer),
    }


def serve_session(
    cfg: EngineConfig,
    *,
    stdin: IO[bytes],
    out: BinaryIO,
    err: IO[str] | None = None,
) -> None:
    """Load the model once and serve requests from `stdin` until ``close`` or its end."""
    cfg.check()
    if cfg.fidelity_ref:
        from bmoe.engine.embedded.fidelity import check_reference

        check_reference(cfg.fidelity_ref)
    origin_ns = time.monotonic_ns()
    sinks = Sinks(cfg)
    eng: EmbeddedEngine | None = None
    try:
        t_load = time.perf_counter()
        try:
            eng = EmbeddedEngine(cfg, origin_ns=origin_ns)
        except BmoeError as exc:
            _event(out, "ERROR", {"id": -1, "fatal": True, "msg": str(exc)})
            raise
        load_s = time.perf_counter() - t_load
        if err is not None:
            for warning in eng.warnings:
                err.write(f"warning: {warning}\n")
            err.flush()
        writers = Writers(cfg, eng, sinks, bool(eng.reader and eng.reader.o_direct))
        model = eng.model
        _event(
            out,
            "READY",
            {
                "load_s": load_s,
                "arch": eng.layout.arch,
                "n_ctx": model.n_ctx,
                "think_ctl": model_template(model).think_control if cfg.chatml else "template",
                "n_expert_used": eng.n_expert_used if eng.layout.n_expert else 0,
            },
        )
        requests = _Requests(stdin)
        conv = Conversation(model_template(model) if cfg.chatml else None)
        turn_no = 0
        while True:
            request = requests.queue.get()
            if request is None or request.data.get("cmd") == "close":
                break
            rid = request.data.get("id", -1)
            if request.error is not None:
                _event(out, "ERROR", {"id": rid, "fatal": False, "msg": request.error})
                if rid == -1 and err is not None:  # no request to answer: said where it is seen
                    err.write(f"error: {request.error}\n")
                    err.flush()
                continue
            if request.data["cmd"] == "decide":
                _event(out, "BEGIN", {"id": rid})
                _event(out, "ERROR", {"id": rid, "fatal": False, "msg": _NO_DECIDE})
                continue
            try:
                rid, prompt, n_predict, clear, think = _check_generate(
                    request.data, cfg.n_predict, cfg.think
                )
            except BmoeError as exc:
                _event(out, "ERROR", {"id": rid, "fatal": False, "msg": str(exc)})
                continue
            _event(out, "BEGIN", {"id": rid})
            try:
                model.check_fits(protocol.to_bytes(prompt), model.n_ctx - CTX_MARGIN)
            except BmoeError as exc:
                _event(out, "ERROR", {"id": rid, "fatal": False, "msg": str(exc)})
                continue
            plan = conv.plan(model, prompt, clear=clear, think=think)
            if (
                plan.n_tokens + n_predict + CTX_MARGIN > model.n_ctx
                or plan.start + len(plan.tokens) + n_predict > model.n_ctx
            ):
                conv.refuse()
                msg = (
                    f"prompt + n_predict exceeds the session n_ctx ({model.n_ctx}); "
                    "open the session with a larger n_ctx"
                )
                _event(out, "ERROR", {"id": rid, "fatal": False, "msg": msg})
                continue
            seq = request.seq
            predictor = eng.predictor if cfg.predict_log else None
            turn = run_turn(
                cfg,
                eng,
                writers,
                plan.tokens,
                plan.start,
                n_predict,
                out,
                load_s=load_s,
                turn=turn_no,
                progress=True,
                cancelled=functools.partial(requests.cancelled, seq),
                chat=TextSplit(opened=plan.opened) if conv.template is not None else None,
            )
            turn.n_prompt = plan.n_prompt
            if turn.cancelled:  # reported as it stood, then undone
                shared = plan.start if conv.template is not None else 0
                turn.n_past = shared + plan.n_prompt + len(turn.tokens)
                conv.undo(model)
            else:
                turn.n_past = conv.commit(plan, turn.tokens, turn.answer.decode("utf-8", "replace"))
            if writers.metrics:
                writers.metrics.summary(turn.summary)
            for fh in sinks.files:
                fh.flush()
            if predictor is not None:
                emit(out, "".join(line + "\n" for line in predictor.lines()))
            _event(out, "DONE", done_payload(rid, turn, load_s))
            turn_no += 1
    finally:
        if eng is not None:
            eng.close()
        sinks.close()


#: The native engine refuses a prompt that would leave fewer than this many positions free.
CTX_MARGIN = 8

_NO_DECIDE = "decide needs --decide, which the embedded engine does not implement"


def _event(out: BinaryIO, tag: str, data: dict[str, Any]) -> None:
    emit(out, protocol.format_event(tag, data) + "\n")


__all__ = ["done_payload", "serve_session"]
