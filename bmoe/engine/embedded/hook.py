"""The eval callback (``llama_context_params.cb_eval``): routing capture, expert discovery, timing.

ggml asks the callback about every graph node before computing it (``ask=True``); a node the
callback wants is computed (with everything before it), then handed back (``ask=False``). The
engine wants:

- ``ffn_moe_topk-<il>``: the routed expert ids, materialised; the streamer makes them resident
  before the callback returns, i.e. before the expert matmul runs;
- ``ffn_moe_weights*-<il>`` (route trace only): the routing weights, the last of the chain
  (after normalisation/scaling) being the applied one;
- every node (``--compute-trace``) or the first node of each layer (``--compute-trace-layers``)
  to time the graph.

During the warm-up decode the hook also collects the expert tensors: the first source of each
``MUL_MAT_ID`` node whose name is one of the file's expert tensors.

With dropping on (``--drop-cold-experts``) the streamer needs the routing weights, so the
routing step moves from ``ffn_moe_topk-<il>`` to the layer's last weights node (found during
the warm-up: e.g. ``ffn_moe_weights_norm``), which ggml computes before the expert matmuls;
the hook then zeroes the dropped routings' weights in that tensor, in place, before anything
consumes it (and rescales the kept ones to the full sum unless ``--drop-no-renorm``).

Errors raised inside the callback cannot cross the C boundary; the hook stops the graph and
re-raises them from :meth:`EvalHook.end`.
"""

from __future__ import annotations

import ctypes
import resource
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bmoe.engine.embedded import evalfilter, ggml
from bmoe.engine.embedded.routing_forecast import RoutePredictor
from bmoe.engine.embedded.streamer import ExpertStreamer, ResidentRoutings, Routing

_TOPK = b"ffn_moe_topk-"
_WEIGHTS = b"ffn_moe_weights"
_LOGITS = b"ffn_moe_logits-"
_NO_TOTALS = (ctypes.c_int64 * evalfilter.N_TOTALS)()


class GraphChanged(RuntimeError):
    """A decode that used remembered node decisions routed fewer layers than the model has:
    the graph was rebuilt differently, so that decode must be redone without them."""


@dataclass(slots=True)
class TraceRow:
    """One compute-trace row (without turn/phase/step)."""

    seq: int
    layer: int
    op: str
    name: str
    wall_ns: int
    majflt: int


def _majflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


class EvalHook:
    """The callback object; :attr:`callback` is what goes into the context parameters."""

    def __init__(
        self,
        *,
        streamer: ExpertStreamer | None = None,
        route_weights: bool = False,
        trace: str | None = None,  # None, "node" or "layer"
        first_moe_layer: int = 0,
        n_moe_layers: int = 0,
        expert_names: frozenset[bytes] = frozenset(),
        dense_names: frozenset[bytes] = frozenset(),
        profile: bool = False,
        drop_renorm: bool = True,
    ):
        from llama_cpp import ggml_backend_sched_eval_callback

        self.streamer = streamer
        self.route_weights = route_weights
        self.trace = trace
        self.first_moe_layer = first_moe_layer
        self.n_moe_layers = n_moe_layers
        # Single-token decodes reuse one graph (same nodes at the same addresses), so the
        # answer to "ask" is remembered per node address for them; :meth:`end` checks that
        # every MoE layer was routed and raises GraphChanged if not.
        self._decisions: dict[int, bool] = {}
        self._routing_nodes: dict[int, tuple[int, Any, int]] = {}  # node -> layer, int32[k], k
        self._remember = False
        self._mode: tuple[bool, bool] | None = None
        self._routed = 0
        self.expert_names = expert_names
        self.discovered: dict[str, int] | None = None
        #: during discovery with `dense_names`: every dense weight the graph reads, by name
        self.dense_names = dense_names
        self.discovered_dense: dict[str, int] = {}
        #: the weights chain of the first MoE layer, in graph order (seen during discovery)
        self.weight_chain: list[bytes] = []
        #: the name (without ``-<il>``) of the weights node the routing waits for when dropping
        self.final_weights: bytes | None = None
        self.drop_renorm = drop_renorm
        self._dropping = False
        self._chain_learned = False  # a decode has asked for the weights (see :meth:`begin`)
        self._pending: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}  # ids, positions, node
        #: ``--predict-log``: sees each router's input and each routing of a generated token
        self.predictor: RoutePredictor | None = None
        #: ``--predict-prefetch``: read this many of the stale gate's pick ahead (0 = off)
        self.predict_spec_max = 0
        self.error: BaseException | None = None
        #: with `profile`, the time spent inside the callback and its number of calls
        self.profile_ns = 0
        self.profile_calls = 0
        self.callback = ggml_backend_sched_eval_callback(
            self._timed_callback if profile else self._callback
        )
        # What the context gets: the C filter in front of `callback` when it compiled (not
        # when profiling the Python side), else `callback` itself.
        self.context_callback: Any = self.callback
        self.context_user: int | None = None
        self._filter: evalfilter.FilterState | None = None
        self._prefixes: list[bytes] | None = None
        self._fast = False  # this decode's all-resident routings are logged by the C filter
        self._log: Any = None  # their log (int32 entries: layer, k, dropped slots, ids)
        self._touches: Any = None  # the logged resident routings' keys, and where each ends
        self._ends: Any = None
        lib = None if profile else evalfilter.load()
        if lib is not None:
            state = evalfilter.FilterState()
            state.python = ctypes.cast(self.callback, ctypes.c_void_p).value
            state.name_offset = ggml.NAME_OFFSET
            state.data_offset = ggml.DATA_OFFSET
            state.ne_offset = ggml.NE_OFFSET
            state.nb_offset = ggml.NB_OFFSET
            state.pass_through = 1
            self._filter = state
            self._filter_lib = lib  # keep the library loaded
            self.context_callback = ctypes.cast(
                lib.bmoe_eval_filter, ggml_backend_sched_eval_callback
            )
            self.context_user = ctypes.addressof(state)
        self.trace_rows: list[TraceRow] = []
        self._routings: dict[int, Routing] = {}
        self._positions = np.zeros(0, dtype=np.int64)
        self._outputs = np.zeros(0, dtype=bool)
        self._ub_start = 0
        self._ub_n = 0
        self._seg_layer = -1
        self._seq = 0
        self._last_ns = 0
        self._last_flt = 0

    @property
    def active(self) -> bool:
        """Whether the callback asks for anything at all."""
        return bool(self.streamer or self.trace or self.discovered is not None)

    # -- decode bracket ---------------------------------------------------------------------
    def begin(self, positions: np.ndarray, outputs: np.ndarray, generating: bool = True) -> None:
        """Called right before llama_decode with the batch's positions and output mask
        (`generating`: a generated token rather than the prompt)."""
        self.error = None
        self._positions = positions
        self._outputs = outputs
        self._ub_start = 0
        self._ub_n = 0
        self._routings = {}
        self.trace_rows = []
        self._seg_layer = -1
        self._seq = 0
        self._routed = 0
        self._pending = {}
        if self.streamer is not None:
            self.streamer.begin_decode(generating)
        # The native engine learns which node ends each layer's weight chain at the first
        # decode that asks for the weights (the prompt when tracing, or with dropping in the
        # prompt; else the first generated token) and drops only from the decode after it.
        armed = bool(self.streamer is not None and self.streamer.dropping and self.final_weights)
        self._dropping = armed and self._chain_learned
        if self.streamer is not None and (armed or self.route_weights):
            self._chain_learned = True
        if self.predictor is not None:  # a verify decode is scored on its last token
            self.predictor.active = generating
        self._remember = (
            len(positions) == 1
            and not self.trace
            and self.discovered is None
            and self.streamer is not None
        )
        # the remembered answers depend on which nodes this decode wants
        mode = (self._dropping, self.predictor is not None)
        if self._remember and mode != self._mode:
            self.forget()
            self._mode = mode
        self._fast = False
        if self._filter is not None:
            prefixes = self._wanted_prefixes() if self._remember else None
            self._filter.pass_through = int(prefixes is None)
            if prefixes is not None and prefixes != self._prefixes:
                self._filter.set_prefixes(prefixes)
                self._prefixes = prefixes
            streamer = self.streamer
            self._fast = bool(
                prefixes is not None
                and streamer is not None
                and self.predictor is None
                and not self.route_weights
                and streamer.resident_fast_path
            )
            f = self._filter
            if self._fast:
                assert streamer is not None
                if self._log is None:
                    self._wire_fast_path(streamer)
                f.drop = int(self._dropping)
                if self._dropping and self.final_weights:
                    f.weights_prefix = self.final_weights + b"-"
                    f.drop_frac = streamer.drop_frac
                    f.renorm = int(self.drop_renorm)
            f.pending = None
            f.routed_layer = -1
            f.log_len = 0
            f.totals = _NO_TOTALS
            f.fast = int(self._fast)
        if self.trace:
            self._last_ns = time.perf_counter_ns()
            self._last_flt = _majflt()

    def _wanted_prefixes(self) -> list[bytes] | None:
        """The node names a single-token decode asks for (what :meth:`_ask` answers True
        to), as prefixes for the C filter; None when names alone cannot say."""
        wanted = [_TOPK]
        if self._dropping and self.final_weights:
            wanted.append(self.final_weights + b"-")
        if self.predictor is not None:
            wanted.append(_LOGITS)
        if self.route_weights:
            if not self.weight_chain:
                return None
            wanted += [base + b"-" for base in self.weight_chain if base + b"-" not in wanted]
        return wanted if len(wanted) <= evalfilter.MAX_PREFIXES else None

    def _wire_fast_path(self, streamer: ExpertStreamer) -> None:
        """Give the C filter the streamer's readable flags and a log for one decode."""
        f = self._filter
        assert f is not None
        capacity = max(self.n_moe_layers, 1) * 2
        self._log = (ctypes.c_int32 * (capacity * evalfilter.ENTRY))()
        f.resident = ctypes.addressof(streamer.readable)
        f.n_expert = streamer.n_expert
        f.n_layer = len(streamer.readable) // max(streamer.n_expert, 1)
        f.log = ctypes.addressof(self._log)
        f.log_cap = capacity
        self._touches = (ctypes.c_int32 * (capacity * evalfilter.MAX_K))()
        self._ends = (ctypes.c_int32 * capacity)()
        f.touches = ctypes.addressof(self._touches)
        f.ends = ctypes.addressof(self._ends)
        f.expert_bytes = streamer.expert_bytes_by_layer.ctypes.data
        f.totals = _NO_TOTALS

    def _drain(self) -> None:
        """Hand the routings the C filter logged to the cache, in graph order (before any
        routing in Python, and at the end of the decode)."""
        f = self._filter
        assert f is not None and self.streamer is not None
        n, f.log_len = f.log_len, 0
        streamer = self.streamer
        entry = evalfilter.ENTRY
        last = None
        if n and self._log[(n - 1) * entry] & evalfilter.READS_FLAG:
            # a routing that reads, its drop applied: the log's last entry
            last = self._log[(n - 1) * entry : n * entry]
        resident = n - (last is not None)
        if resident:
            touches, lookups, slots, dropped, demand, widest = f.totals
            f.totals = _NO_TOTALS
            streamer.route_resident(
                ResidentRoutings(
                    self._touches[:touches], self._ends[:resident], lookups, slots, dropped,
                    demand, widest,
                )
            )  # fmt: skip
        if last is not None:
            k = last[1]
            streamer.route_ids(
                last[0] & ~evalfilter.READS_FLAG,
                last[3 : 3 + k],
                k,
                self._positions,
                dropped_slots=(last[2] & 0xFFFFFFFF).bit_count(),
            )
        self._routed += n

    def end(self) -> None:
        """Called right after llama_decode: closes the trace and re-raises a callback error."""
        if self._fast and self.error is None:
            try:
                self._drain()
            except Exception as exc:  # a bookkeeping error, raised as the callback's would be
                self.error = exc
        if self.trace == "layer" and self.error is None:
            self._segment("post", -1)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self._remember and self._routed != self.n_moe_layers:
            self.forget()
            raise GraphChanged(f"{self._routed} of {self.n_moe_layers} MoE layers routed")

    def forget(self) -> None:
        """Drop the remembered node decisions (the next decode asks about every node)."""
        self._decisions.clear()
        self._routing_nodes.clear()
        self._prefixes = None  # the C filter's list is written again at the next begin

    # -- the callback -----------------------------------------------------------------------
    def _timed_callback(self, t: int, ask: bool, user: int) -> bool:
        t0 = time.perf_counter_ns()
        try:
            return self._callback(t, ask, user)
        finally:
            self.profile_ns += time.perf_counter_ns() - t0
            self.profile_calls += 1

    def _callback(self, t: int, ask: bool, _user: int) -> bool:
        try:
            if self._fast and self._filter is not None and self._filter.log_len:
                self._drain()  # the routings logged so far come first
            if not t:  # the filter's call to drain a routing that reads (done above)
                return True
            if ask:
                if self._remember:
                    known = self._decisions.get(t)
                    if known is None:
                        known = self._decisions[t] = self._ask(t)
                    return known
                return self._ask(t)
            if self._remember:  # fast path: a routing node of the remembered graph
                node = self._routing_nodes.get(t)
                if node is not None:
                    layer, row, k = node
                    data = ctypes.c_void_p.from_address(t + ggml.DATA_OFFSET).value
                    self._routed += 1
                    streamer = self.streamer
                    assert streamer is not None  # only a streamed run remembers routing nodes
                    streamer.route_ids(layer, row.from_address(data)[:], k, self._positions)
                    if streamer.keep_routings:  # the weights node that follows fills it in
                        self._routings[layer] = streamer.counters.routings[-1]
                    return True
            return self._computed(t)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            return False

    def _ask(self, t: int) -> bool:
        name = ctypes.string_at(t + ggml.NAME_OFFSET)
        if self.discovered is not None:
            self._discover(t)
            self._chain(name)
        if self.trace == "node":
            return True
        if name.startswith(_TOPK):
            return self.streamer is not None
        if self.predictor is not None and name.startswith(_LOGITS):
            return True
        if name.startswith(_WEIGHTS):
            if self._dropping and name.rpartition(b"-")[0] == self.final_weights:
                return True
            if self.route_weights:
                return b"_sum" not in name and not name.endswith(b")")
        if self.trace == "layer":
            il = ggml.layer_of(name.decode("utf-8", "replace"))
            return il >= 0 and il != self._seg_layer
        return False

    def _computed(self, t: int) -> bool:
        if not self.trace:  # the streaming fast path: a routing node or a weights node
            name = ctypes.string_at(t + ggml.NAME_OFFSET)
            if name.startswith(_TOPK):
                self._route(t, int(name[len(_TOPK) :]))
            elif name.startswith(_WEIGHTS):
                self._on_weights(t, name)
            elif name.startswith(_LOGITS):
                self._gate_input(t, int(name[len(_LOGITS) :]))
            return True
        now = time.perf_counter_ns()
        name = ctypes.string_at(t + ggml.NAME_OFFSET)
        text = name.decode("utf-8", "replace")
        if self.trace == "node":
            flt = _majflt()
            self.trace_rows.append(
                TraceRow(
                    self._seq,
                    ggml.layer_of(text),
                    ggml.op_desc(t),
                    text,
                    now - self._last_ns,
                    flt - self._last_flt,
                )
            )
            self._seq += 1
            self._last_flt = flt
        elif self.trace == "layer":
            il = ggml.layer_of(text)
            if name.startswith(_TOPK):
                if self.streamer is not None:
                    self._segment(f"blk.{il}", il, now)
            elif il >= 0 and il != self._seg_layer:
                if self._seg_layer < 0:
                    self._segment("pre", -1, now)
                elif il < self._seg_layer:  # the next ubatch's first layer
                    self._segment("post", -1, now)
                else:
                    self._segment(f"blk.{self._seg_layer}", self._seg_layer, now)
                self._seg_layer = il
        if name.startswith(_TOPK):
            self._route(t, ggml.layer_of(text))
        elif name.startswith(_WEIGHTS):
            self._on_weights(t, name)
        elif name.startswith(_LOGITS):
            self._gate_input(t, ggml.layer_of(text))
        if self.trace:
            self._last_ns = time.perf_counter_ns()
        return True

    def _segment(self, name: str, layer: int, now: int | None = None) -> None:
        now = time.perf_counter_ns() if now is None else now
        flt = _majflt()
        self.trace_rows.append(
            TraceRow(self._seq, layer, "LAYER", name, now - self._last_ns, flt - self._last_flt)
        )
        self._seq += 1
        self._last_flt = flt

    def _discover(self, t: int) -> None:
        node = ggml.tensor(t)
        if self.dense_names:  # the weights (leaves) this node reads
            for src in node.src:
                if src:
                    leaf = ggml.tensor(src)
                    if leaf.op == 0 and leaf.name in self.dense_names:  # GGML_OP_NONE
                        self.discovered_dense[leaf.name.decode()] = src
        if ggml.op_name(node.op) != "MUL_MAT_ID" or not node.src[0]:
            return
        src = node.src[0]
        name = ggml.name_of(src)
        if name in self.expert_names:
            assert self.discovered is not None
            self.discovered[name.decode()] = src

    def _chain(self, name: bytes) -> None:
        """Remember the first MoE layer's weights nodes in graph order (discovery)."""
        if not name.startswith(_WEIGHTS) or b"_sum" in name or name.endswith(b")"):
            return
        base, _, il = name.rpartition(b"-")
        if il.isdigit() and int(il) == self.first_moe_layer and base not in self.weight_chain:
            self.weight_chain.append(base)

    def _route(self, t: int, layer: int) -> None:
        if self.streamer is None or layer < 0:
            return
        ids = ggml.read_rows(t, np.int32)
        n = ids.shape[0]
        if layer == self.first_moe_layer:  # a new ubatch starts at the first MoE layer
            self._ub_start += self._ub_n
            self._ub_n = n
        if n == 0:
            return
        if self.predictor is not None:
            if n == 1:
                chosen = self.predictor.take_commitment(layer, ids[0])
                if chosen is not None:  # --route-ahead: the committed selection replaces it
                    ids = chosen.astype(np.int32).reshape(1, -1)
                    data = ctypes.c_void_p.from_address(t + ggml.DATA_OFFSET).value
                    assert data is not None  # a computed node has its data
                    ctypes.memmove(data, ids.ctypes.data, ids.nbytes)
            self.predictor.routed(layer, ids[-1])  # the batch's last token
        if self._dropping:  # routed once the weights are known
            self._pending[layer] = (ids, self._positions_for(n), t)
            return
        self._routed += 1
        self.streamer.route(layer, ids, self._positions_for(n))
        if self._remember and n == 1 and self.predictor is None:  # the fast path routes alone
            self._routing_nodes[t] = (layer, ctypes.c_int32 * ids.shape[1], ids.shape[1])
        if self.streamer.keep_routings and self.streamer.counters.routings:
            self._routings[layer] = self.streamer.counters.routings[-1]

    def _positions_for(self, n: int) -> np.ndarray:
        if n == len(self._positions):
            return self._positions
        lo, hi = self._ub_start, self._ub_start + self._ub_n
        pos = self._positions[lo:hi]
        if len(pos) == n:
            return pos
        out = pos[self._outputs[lo:hi]]
        if len(out) == n:
            return out
        return self._positions[-n:] if len(self._positions) >= n else np.full(n, -1, np.int64)

    def _gate_input(self, t: int, layer: int) -> None:
        """The router's input (second source of ``ffn_moe_logits``), for the predictor."""
        predictor = self.predictor
        if predictor is None or not predictor.active or layer < 0:
            return
        src = ggml.tensor(t).src[1]
        if not src:
            return
        x = ggml.as_array(src, np.float32)
        predictor.gate_input(layer, np.array(x[-1] if x.ndim > 1 else x))  # the last token
        if self.predict_spec_max and self.streamer is not None:
            nxt = predictor.next_layer(layer)
            pick = predictor.stale(nxt) if nxt is not None else None
            if nxt is not None and pick is not None:
                self.streamer.speculate(nxt, pick[: self.predict_spec_max].tolist())
        if predictor.ahead and self.streamer is not None:  # read the commitment early
            target = predictor.ahead_target(layer)
            chosen = predictor.commitment(target) if target is not None else None
            if target is not None and chosen is not None:
                self.streamer.speculate(target, chosen.tolist())

    def _on_weights(self, t: int, name: bytes) -> None:
        layer = ggml.layer_of(name.decode("utf-8", "replace"))
        if self._dropping and name.rpartition(b"-")[0] == self.final_weights:
            self._route_weighted(t, layer)
        else:
            self._weights(t, layer)

    def _route_weighted(self, t: int, layer: int) -> None:
        """The routing step with dropping: route with the applied weights, then zero the
        dropped routings' weights in the tensor before the expert matmuls consume it."""
        pending = self._pending.pop(layer, None)
        if pending is None or self.streamer is None:
            return
        ids, positions, topk = pending
        view = ggml.as_array(t, np.float32)
        if view.size != ids.size:
            raise RuntimeError(
                f"layer {layer}: {view.size} routing weights for {ids.size} routed experts"
            )
        weights = np.array(view, dtype=np.float32).reshape(ids.shape)
        self._routed += 1
        dropped = self.streamer.route(layer, ids, positions, weights)
        if self.streamer.keep_routings and self.streamer.counters.routings:
            routing = self.streamer.counters.routings[-1]
            routing.weights = weights  # the router's weights: the trace records the choice
            self._routings[layer] = routing
        if dropped is None or not dropped.any():
            return
        # A dropped slot is pointed at its token's top expert, as the native engine does: the
        # expert matmul then multiplies resident weights by zero instead of faulting in the
        # released pages of an expert nobody read (a minor fault a page, hundreds a slot).
        node = ggml.tensor(topk)
        data, stride, item = int(node.data), int(node.nb[1]), int(node.nb[0])
        tops = ids[np.arange(len(ids)), np.argmax(weights, axis=1)]
        for j, slot in zip(*np.nonzero(dropped), strict=True):
            ctypes.c_int32.from_address(data + int(j) * stride + int(slot) * item).value = int(
                tops[j]
            )
        applied = np.where(dropped, np.float32(0), weights)
        if self.drop_renorm:  # sums in slot order, in float32, as the native engine adds them
            kept = np.add.accumulate(applied, axis=1)[:, -1:]
            total = np.add.accumulate(weights, axis=1)[:, -1:]
            scale = np.where(dropped.any(axis=1, keepdims=True) & (kept > 0), total / kept, 1)
            applied = np.where(dropped, applied, applied * scale.astype(np.float32))
        view[...] = applied.astype(np.float32).reshape(view.shape)

    def _weights(self, t: int, layer: int) -> None:
        routing = self._routings.get(layer)
        if routing is None:
            return
        w = ggml.as_array(t, np.float32)
        if w.size == routing.ids.size:
            routing.weights = np.array(w, dtype=np.float32).reshape(routing.ids.shape)
