"""The streaming step run at each routing node: stage, evict, read, prefetch.

When layer ``il``'s router has chosen (``ffn_moe_topk-<il>`` materialised), the streamer stages
the ids in the shared :class:`bmoe.cache.ExpertCache` (the same accounting replay uses),
returns evicted experts' pages to the OS, reads the missed experts' slices on the read lanes
and waits for them, all before ggml goes on to the expert matmul. With ``--prefetch K`` it then
bets that the next K layers will route what they routed for the previous token and reads
those on idle lanes. With ``--load-all`` it reads every expert of the layer, every time.

With ``--drop-cold-experts F`` the routing step runs at the layer's last routing-weight node
instead (still before the expert matmul) and gets the applied weights: a routing slot whose
expert is not resident, which weighs under ``F / k`` and is not its token's top slot, is
*dropped*, as the native engine decides it: the caller zeroes its weight and the slot is staged
as its token's top expert (never looked up or read for its own; an expert another slot keeps is
still read).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import numpy as np

from bmoe.cache import EXPERT_BITS, ExpertCache
from bmoe.engine.embedded.arena import ExpertArena
from bmoe.engine.embedded.layout import ModelLayout
from bmoe.engine.embedded.reader import Completion, Reader, SliceTable

EXPERT_MASK = (1 << EXPERT_BITS) - 1


@dataclass
class Routing:
    """One routing node as seen: the rows of one cell block of the route trace."""

    layer: int
    positions: np.ndarray  # (n,) context position of each routed token
    ids: np.ndarray  # (n, k) int32
    residency: np.ndarray  # (n, k) int8: 0 miss, 1 hit, 2 hit on a prefetch's first touch
    expert_bytes: np.ndarray  # (n, k) int64: bytes read, on the first row of each miss
    weights: np.ndarray | None = None  # (n, k) float32, when the weight node was captured
    dropped: np.ndarray | None = None  # (n, k) bool, when dropping ran on this routing


@dataclass(slots=True)
class ResidentRoutings:
    """One-token routings that needed no read, in graph order, as the eval filter logged them:
    every key staged (``layer << 16 | id``, a dropped slot repeating its token's top expert),
    where each routing's keys end, and their totals."""

    touches: list[int]
    ends: list[int]
    lookups: int  # distinct keys, a lookup each
    slots: int  # routed slots
    dropped: int  # of which dropped
    demand_bytes: int  # the bytes of each routing's distinct experts, summed
    widest_bytes: int  # and the largest of them


@dataclass
class DecodeCounters:
    """What the streamer did during one llama_decode."""

    io_ns: int = 0  # wall time blocked on reads
    mgmt_ns: int = 0  # staging, eviction and bookkeeping
    demand_bytes: int = 0  # routed expert bytes (distinct per layer), summed over layers
    widest_layer_bytes: int = 0
    routed: int = 0  # routings (slots) of generated tokens
    dropped: int = 0  # of which dropped
    routings: list[Routing] = field(default_factory=list)


class ExpertStreamer:
    """Cache + arena + read lanes, driven once per routing node."""

    def __init__(
        self,
        layout: ModelLayout,
        arena: ExpertArena,
        reader: Reader,
        cache: ExpertCache | None,
        *,
        prefetch: int = 0,
        load_all: bool = False,
        keep_routings: bool = False,
        drop_frac: float = 0.0,
        drop_prefill: bool = False,
    ):
        self.layout = layout
        self.arena = arena
        self.reader = reader
        #: the reader's one-call routing step (the C lanes), else None
        self._load = getattr(reader, "load", None)
        self.cache = cache
        self.prefetch = max(0, int(prefetch))
        self.load_all = load_all
        self.keep_routings = keep_routings
        self.drop_frac = float(drop_frac) if cache is not None and not load_all else 0.0
        self.drop_prefill = drop_prefill
        self.moe_layers = layout.moe_layers
        self._next_layers = {
            il: self.moe_layers[i + 1 : i + 1 + self.prefetch]
            for i, il in enumerate(self.moe_layers)
        }
        self._expert_bytes = {il: layout.expert_bytes(il) for il in self.moe_layers}
        #: the same by layer number (0 for a dense layer), for the eval filter
        self.expert_bytes_by_layer = np.zeros(max(layout.n_layer, 1), dtype=np.int64)
        for il, eb in self._expert_bytes.items():
            self.expert_bytes_by_layer[il] = eb
        self._inflight: dict[tuple[int, int], Completion] = {}
        self._materialized: set[tuple[int, int]] = set()
        self._ever_held: set[tuple[int, int]] = set()
        self._prev_ids: dict[int, list[int]] = {}
        self._spec: set[tuple[int, int]] = set()
        self.counters = DecodeCounters()
        self._generating = True
        #: per (layer, expert), layer-major: 1 while its slices are resident and read (what the
        #: eval filter's fast path trusts); an admitted prefetch is not, until a routing read
        self.n_expert = layout.n_expert
        self.readable = (ctypes.c_ubyte * (max(layout.n_layer, 1) * max(layout.n_expert, 1)))()
        reader.set_slices(
            [
                SliceTable(
                    b.tensor.layer,
                    b.tensor.proj,
                    b.tensor.shard,
                    b.tensor.slice_offset(0),
                    b.tensor.slice_bytes,
                    b.slice_address(0),
                )
                for blocks in arena.by_layer.values()
                for b in blocks
            ]
        )
        # run totals
        self.rereads = 0
        self.spec_experts = 0
        self.spec_useful = 0
        self.loads = 0  # expert loads (misses) read on demand

    # -- per decode -----------------------------------------------------------------------
    def begin_decode(self, generating: bool = True) -> None:
        """A new llama_decode starts; `generating` is False for the prompt (no prefetch: the
        bet is on the previous *generated* step, as replay makes it)."""
        self.counters = DecodeCounters()
        self._generating = generating

    def finish(self) -> None:
        """Wait for every read still in flight (end of run)."""
        for ticket in list(self._inflight.values()):
            ticket.wait()
        self._inflight.clear()

    @property
    def dropping(self) -> bool:
        """Whether this decode's routings may be dropped (they must come with weights)."""
        return self.drop_frac > 0 and (self._generating or self.drop_prefill)

    @property
    def resident_bytes(self) -> int:
        """Bytes of expert data the engine holds (what the cache accounts)."""
        return sum(self._expert_bytes[layer] for layer, _e in self._materialized)

    # -- the routing step -------------------------------------------------------------------
    def route(
        self,
        layer: int,
        ids: np.ndarray,
        positions: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Make every expert `ids` (n_tokens x k) names resident before the matmul runs.

        With `weights` (the applied routing weights, n_tokens x k) and dropping on, returns
        the (n_tokens x k) mask of the routings dropped, whose weight the caller zeroes."""
        return self.route_ids(layer, ids.ravel().tolist(), ids.shape[1], positions, weights)

    def route_ids(
        self,
        layer: int,
        flat: list[int],
        k: int,
        positions: np.ndarray,
        weights: np.ndarray | None = None,
        dropped_slots: int = 0,
    ) -> np.ndarray | None:
        """:meth:`route` over the ids as a flat list, token after token (`k` per token);
        `dropped_slots`: how many of them the caller dropped already (each staged as its
        token's top expert), for the counts."""
        t0 = time.perf_counter_ns()
        io_ns = 0
        eb = self._expert_bytes[layer]
        c = self.counters
        dropped = None
        routed = flat
        if weights is not None and self.dropping:
            dropped, tops = self._drops(layer, flat, k, weights)
            if dropped.any():  # a dropped slot stands for its token's top expert (as native)
                routed = [
                    tops[i // k] if gone else e
                    for i, (e, gone) in enumerate(zip(flat, dropped.ravel().tolist(), strict=True))
                ]
        distinct = list(dict.fromkeys(routed))
        c.demand_bytes += len(distinct) * eb
        c.widest_layer_bytes = max(c.widest_layer_bytes, len(distinct) * eb)
        if self._generating:
            c.routed += len(flat)
            c.dropped += int(dropped.sum()) if dropped is not None else dropped_slots
        flat_all, flat = flat, routed
        if self.load_all:
            misses, hits, pf_hits = list(range(self.layout.n_expert)), [], []
            victims: list[int] = []
        else:
            assert self.cache is not None
            base = layer << EXPERT_BITS
            recency = None
            if len(distinct) != len(flat):  # repeats only refresh recency: last-touch order
                recency = [base | e for e in reversed(dict.fromkeys(reversed(flat)))]
            hit_keys, miss_keys, pf_keys, victims = self.cache.stage_keys(
                layer, [base | e for e in distinct], recency, eb
            )
            hits = [k & EXPERT_MASK for k in hit_keys] if self._inflight else []
            misses = [k & EXPERT_MASK for k in miss_keys]
            pf_hits = [k & EXPERT_MASK for k in pf_keys]
        inflight = self._inflight
        waits = (
            [inflight.pop((layer, e)) for e in hits if (layer, e) in inflight] if inflight else []
        )
        gone = [(v >> EXPERT_BITS, v & EXPERT_MASK) for v in victims]
        if (
            misses
            and not waits
            and self._load is not None
            and not (inflight and any(key in inflight for key in gone))
        ):
            # one call: the reads queued and waited for, then the victims' pages given back
            # (no read of a victim is in flight), as the native engine reads, then evicts; a
            # step of more than one token (the prompt) gives them back first, so that its
            # reads of up to every expert of the layer do not sit in memory beside them
            held = [key for key in gone if key in self._materialized]
            readable = self.readable
            for key in held:
                self._materialized.discard(key)
                readable[key[0] * self.n_expert + key[1]] = 0
            tw = time.perf_counter_ns()
            release_ns = self._load(layer, misses, held, len(flat) > k)
            io_ns += time.perf_counter_ns() - tw - release_ns  # the release is management
        else:
            for key in gone:
                io_ns += self._release(key)
            if misses or waits:
                ticket = self.reader.submit_experts(layer, misses) if misses else None
                tw = time.perf_counter_ns()
                for w in waits:
                    w.wait()
                if ticket is not None:
                    ticket.wait()
                io_ns += time.perf_counter_ns() - tw
        if misses or waits:
            readable, row = self.readable, layer * self.n_expert
            for e in misses:
                key = (layer, e)
                if key in self._ever_held:
                    self.rereads += 1
                self._ever_held.add(key)
                self._materialized.add(key)
                readable[row + e] = 1
            self.loads += len(misses)
        self.spec_useful += len(pf_hits)
        if self.prefetch and not self.load_all:
            self._prev_ids[layer] = list(dict.fromkeys(flat_all[-k:])) if flat_all else []
            if self._generating:
                self._speculate(layer)
        if self.keep_routings:
            ids = np.asarray(flat_all, dtype=np.int32).reshape(-1, k)
            routing = self._routing(layer, ids, positions, misses, pf_hits, eb)
            if dropped is not None:
                routing.dropped = dropped
                routing.residency[dropped] = 0
            c.routings.append(routing)
        c.io_ns += io_ns
        c.mgmt_ns += time.perf_counter_ns() - t0 - io_ns
        return dropped

    @property
    def resident_fast_path(self) -> bool:
        """Whether a routing whose experts are all readable needs nothing but the cache's
        bookkeeping (:meth:`route_resident`): a cache within its budget, nothing read ahead,
        no trace rows, not --load-all."""
        cache = self.cache
        return (
            cache is not None
            and not self.load_all
            and not self.prefetch
            and not self.keep_routings
            and not self._inflight
            and cache.bytes_held <= cache.budget_bytes
        )

    def route_resident(self, routed: ResidentRoutings) -> None:
        """:meth:`route_ids` for one-token routings that needed no read (the eval filter
        logged them and the matmuls have run): the same cache lookups, recency and counts in
        one call to the cache, and nothing to read or release."""
        t0 = time.perf_counter_ns()
        c = self.counters
        cache = self.cache
        assert cache is not None
        before = cache.stats["prefetch_hits"] if self.prefetch else 0
        cache.stage_resident(routed.touches, routed.ends, routed.lookups, self._expert_bytes)
        if self.prefetch:
            self.spec_useful += cache.stats["prefetch_hits"] - before
        c.demand_bytes += routed.demand_bytes
        c.widest_layer_bytes = max(c.widest_layer_bytes, routed.widest_bytes)
        if self._generating:
            c.routed += routed.slots
            c.dropped += routed.dropped
        c.mgmt_ns += time.perf_counter_ns() - t0

    def _drops(
        self, layer: int, flat: list[int], k: int, weights: np.ndarray
    ) -> tuple[np.ndarray, list[int]]:
        """The routings to drop, slot by slot as the native engine decides: a miss under the
        threshold that is not its token's top slot; and each token's top expert (the first of
        equal maxima), which a dropped slot is pointed at."""
        w = np.asarray(weights, dtype=np.float32)
        if len(flat) == k and not np.isnan(w).any():
            return self._drops_one(layer, flat, w.ravel().tolist())
        return self._drops_batch(layer, flat, k, w)

    def _limit(self, k: int) -> np.float32:
        """The weight under which a slot may be dropped: F x (1/k), in float32 as native."""
        return np.float32(np.float32(self.drop_frac) / np.float32(k))

    def _drops_batch(
        self, layer: int, flat: list[int], k: int, w: np.ndarray
    ) -> tuple[np.ndarray, list[int]]:
        """:meth:`_drops` over arrays (any number of tokens)."""
        ids = np.asarray(flat, dtype=np.int64).reshape(-1, k)
        w = w.reshape(ids.shape)
        best = np.argmax(w, axis=1)
        cold = w < self._limit(k)
        cold[np.arange(len(w)), best] = False
        cache = self.cache
        assert cache is not None
        resident = np.array([(layer, int(e)) in cache for e in ids.ravel()]).reshape(ids.shape)
        return cold & ~resident, ids[np.arange(len(w)), best].tolist()

    def _drops_one(
        self, layer: int, flat: list[int], w: list[float]
    ) -> tuple[np.ndarray, list[int]]:
        """:meth:`_drops` for one token's routing (a generated token), in plain Python: on a
        handful of values numpy's cost per call is most of the work. `w` are float32 values,
        compared with the float32 threshold exactly as the array form does."""
        limit = float(self._limit(len(flat)))
        top = w.index(max(w))  # the first of equal maxima, as argmax
        cache = self.cache
        assert cache is not None
        candidate = [
            x < limit and i != top and (layer, e) not in cache
            for i, (x, e) in enumerate(zip(w, flat, strict=True))
        ]
        return np.array(candidate, dtype=bool).reshape(1, -1), [flat[top]]

    def _release(self, key: tuple[int, int]) -> int:
        """Give an evicted expert's pages back; returns the ns spent waiting for its read."""
        waited = 0
        ticket = self._inflight.pop(key, None)
        if ticket is not None:
            t = time.perf_counter_ns()
            ticket.wait()
            waited = time.perf_counter_ns() - t
        if key in self._materialized:
            self._materialized.discard(key)
            self.readable[key[0] * self.n_expert + key[1]] = 0
            self.arena.release(*key)
        return waited

    def _speculate(self, layer: int) -> None:
        for nxt in self._next_layers[layer]:
            bet = self._prev_ids.get(nxt)
            if bet:
                self.speculate(nxt, bet)

    def speculate(self, layer: int, experts: list[int]) -> None:
        """Read `experts` of `layer` ahead of its routing on idle lanes (a bet the cache
        admits as a prefetch: the first touch of a right one is a prefetch hit)."""
        cache = self.cache
        if cache is None or self.load_all:
            return
        before = cache.stats["evictions"]
        admitted = cache.prefetch(layer, experts, self._expert_bytes[layer])
        if cache.stats["evictions"] != before:
            for key in [k for k in self._materialized if k not in cache]:
                self._release(key)
        if not admitted:
            return
        ticket = self.reader.submit_experts(layer, admitted, spec=True)
        for e in admitted:
            key = (layer, e)
            self._inflight[key] = ticket
            self._materialized.add(key)
            self._ever_held.add(key)
        self.spec_experts += len(admitted)

    def _routing(
        self,
        layer: int,
        ids: np.ndarray,
        positions: np.ndarray,
        misses: list[int],
        pf_hits: list[int],
        eb: int,
    ) -> Routing:
        """The trace rows' view of one routing: per slot, miss / hit / prefetch hit (on the
        first slot of an id) and the bytes read (on the first slot of each miss)."""
        if ids.shape[0] != 1:
            return self._routing_batch(layer, ids, positions, misses, pf_hits, eb)
        flat = ids[0].tolist()  # one token: plain Python beats numpy's cost per call
        first: dict[int, int] = {}
        for i, e in enumerate(flat):
            first.setdefault(e, i)
        missed = set(misses)
        residency = [0 if e in missed else 1 for e in flat]
        nbytes = [0] * len(flat)
        for e in misses:
            if e in first:
                nbytes[first[e]] = eb
        for e in pf_hits:
            if e in first:
                residency[first[e]] = 2
        return Routing(
            layer,
            positions,
            ids,
            np.array([residency], dtype=np.int8),
            np.array([nbytes], dtype=np.int64),
        )

    def _routing_batch(
        self,
        layer: int,
        ids: np.ndarray,
        positions: np.ndarray,
        misses: list[int],
        pf_hits: list[int],
        eb: int,
    ) -> Routing:
        n_expert = max(self.layout.n_expert, int(ids.max(initial=0)) + 1)
        status = np.ones(n_expert, dtype=np.int8)
        flat = ids.ravel()
        _uniq, first = np.unique(flat, return_index=True)
        first_of = np.full(n_expert, -1, dtype=np.int64)
        first_of[flat[first]] = first
        residency = status[flat].copy()
        nbytes = np.zeros(flat.shape, dtype=np.int64)
        if misses:
            miss = np.asarray(misses, dtype=np.int64)
            residency[np.isin(flat, miss)] = 0
            nbytes[first_of[miss[first_of[miss] >= 0]]] = eb
        if pf_hits:
            pf = np.asarray(pf_hits, dtype=np.int64)
            residency[first_of[pf[first_of[pf] >= 0]]] = 2
        shape = ids.shape
        return Routing(layer, positions, ids, residency.reshape(shape), nbytes.reshape(shape))
