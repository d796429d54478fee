"""A loaded model, with expert streaming set up when asked.

Loading is llama.cpp's (mmap, no repacking). Setting up streaming is this engine's: a one-token
warm-up decode during which the eval callback collects the expert tensors (and the dense weights
the graph reads), then every expert tensor is rebound to the arena, the dense weights are copied
into engine memory (``--dense-weights anon``, the default), the KV cache is cleared, and the
read lanes, the cache and the streamer are created.

Memory is accounted as the native engine accounts it: llama.cpp maps the whole file with
``MAP_POPULATE``, and the experts' pages of that mapping stay mapped (clean file pages the
kernel may reclaim, counted in ``RssFile``) while the arena's pages, the cache, are ``RssAnon``.
Giving the experts' mapped pages back would change only what the process is charged (the page
cache keeps them either way) and would make this engine's RSS a different figure from the
native engine's on the same run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import numpy as np

from bmoe.cache import ExpertCache
from bmoe.engine.embedded import ggml, libc, probes
from bmoe.engine.embedded.arena import ExpertArena
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.creader import make_reader
from bmoe.engine.embedded.dense import DenseCopy
from bmoe.engine.embedded.hook import EvalHook
from bmoe.engine.embedded.layout import ModelLayout, read_layout
from bmoe.engine.embedded.model import LlamaModel, prepare_openmp
from bmoe.engine.embedded.reader import Reader, ReadJob
from bmoe.engine.embedded.routing_forecast import RoutePredictor, read_routers
from bmoe.engine.embedded.streamer import ExpertStreamer
from bmoe.engine.native import native_refusal
from bmoe.errors import BmoeError
from bmoe.units import MIB


def mib(nbytes: int) -> int | float:
    """Bytes as MiB the way the preamble spells them (an integer when whole)."""
    v = nbytes / MIB
    return int(v) if v.is_integer() else round(v, 3)


def resolve_cache_bytes(cfg: EngineConfig, layout: ModelLayout) -> int:
    """The cache budget in bytes (``--cache-mb auto``: half of MemAvailable, within bounds)."""
    if cfg.cache_mb is not None:
        return int(cfg.cache_mb * MIB)
    avail = probes.memory()["mem_available_mib"] * MIB
    budget = max(cfg.cache_floor_mb * MIB, int(avail // 2))
    if cfg.cache_ceil_mb:
        budget = min(budget, cfg.cache_ceil_mb * MIB)
    return int(min(budget, layout.total_expert_bytes))


def use_huge_pages(whole: bool, env: dict[str, str] | None = None) -> bool:
    """Whether the arena asks for transparent huge pages: only with ``BMOE_HUGE_PAGES=1``, and
    only when the budget holds every expert (`whole`: nothing is ever released).

    Huge pages make the expert matmuls miss the TLB less (on the small model, 14 % faster
    decoding once every expert is resident), but the kernel clears a whole 2 MiB page at the
    first read into it: on the same run 3.7 s of system time and a 3.5 s prompt against
    0.6 s and 0.5 s on 4 KiB pages, which only pays back after about a thousand tokens. The
    native engine's arena is on 4 KiB pages too."""
    choice = (os.environ if env is None else env).get("BMOE_HUGE_PAGES", "0").lower()
    return whole and choice in ("1", "yes", "on")


def _merged(ranges: list[tuple[int, int]], gap: int = libc.PAGE) -> list[tuple[int, int]]:
    """Address ranges with gaps under `gap` closed (fewer mincore/madvise calls)."""
    out: list[tuple[int, int]] = []
    for off, n in sorted(ranges):
        if out and off <= out[-1][0] + out[-1][1] + gap:
            o, m = out[-1]
            out[-1] = (o, max(m, off + n - o))
        else:
            out.append((off, n))
    return out


class EmbeddedEngine:
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
        self.omp_wait = prepare_openmp(cfg.moe_stream)  # before llama.cpp is loaded
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
                dense_names=frozenset(n.encode() for n in lay.dense_tensors)
                if cfg.moe_stream and cfg.dense_weights == "anon"
                else frozenset(),
                profile=profile_hook,
                drop_renorm=cfg.drop_renorm,
            )
        self.model = LlamaModel(
            cfg.model,
            n_ctx=cfg.ctx_size,
            n_ubatch=cfg.ubatch,
            threads=cfg.threads,
            n_expert_used=cfg.n_expert_used,
            arch=lay.arch,
            callback=self.hook.context_callback if self.hook else None,
            callback_user=self.hook.context_user if self.hook else None,
        )
        self.predictor: RoutePredictor | None = None
        if (cfg.predict_log or cfg.predict_prefetch or cfg.route_ahead) and self.hook:
            self.predictor = RoutePredictor(
                read_routers(lay),
                lay.moe_layers,
                self.n_expert_used or lay.n_expert_used,
                ahead=cfg.route_ahead,
                n_layer=lay.n_layer,
            )
            self.hook.predictor = self.predictor
            if cfg.predict_prefetch:
                self.hook.predict_spec_max = cfg.predict_spec_max or self.n_expert_used
        self.warnings: list[str] = []
        refusal = native_refusal(lay.arch) if cfg.moe_stream else None
        if refusal is not None:
            self.warnings.append(
                f"the native engine would refuse to stream this model ({refusal}): a "
                f"{lay.arch} model streams on the embedded engine only, and no native run "
                "can be compared with this one"
            )
        self.arena: ExpertArena | None = None
        self.reader: Reader | None = None
        self.cache: ExpertCache | None = None
        self.streamer: ExpertStreamer | None = None
        self.budget_bytes = 0
        self.dense: DenseCopy | None = None
        if cfg.moe_stream:
            self._setup_streaming(fault, origin_ns)
        mapped = self._mapping_bases()
        bases = [b for b in mapped if b is not None]
        known = len(bases) == len(mapped)
        # the dense weights as address ranges of llama.cpp's mappings (one per shard)
        self.dense_ranges = _merged(
            [(bases[sh] + off, n) for sh, off, n in lay.dense_ranges] if known else []
        )
        if self.dense is not None:  # the residency of the engine's copies, as native samples
            self.dense_ranges = _merged(self.dense.ranges)
            known = True
        self.dense_probe = probes.DenseResidency(0 if known else None, self.dense_ranges)
        if cfg.dense_weights == "warm":
            self._warm_dense()

    def _mapping_bases(self) -> list[int | None]:
        """Where llama.cpp mapped each shard (offset 0), None where it cannot be told."""
        bases = [probes.mapping_base(path) for path in self.layout.shards]
        if self.arena is not None:
            for block in self.arena.blocks.values():
                shard = block.tensor.shard
                base = bases[shard]
                if base is not None and base + block.tensor.file_offset != block.original:
                    bases[shard] = None  # not the mapping the tensors point into: no guess
        return bases

    def _setup_streaming(self, fault: Callable[[ReadJob], None] | None, origin_ns: int) -> None:
        cfg, lay, hook, model = self.cfg, self.layout, self.hook, self.model
        assert hook is not None
        hook.discovered = {}
        hook.begin(np.zeros(1, np.int64), np.ones(1, bool), generating=False)
        model.decode([model.bos if model.bos >= 0 else 0], 0)
        hook.end()
        found, hook.discovered = hook.discovered, None
        if cfg.drop_cold_frac > 0:
            if not hook.weight_chain:
                raise BmoeError(
                    f"{cfg.model}: the graph has no ffn_moe_weights node to drop routings at "
                    "(--drop-cold-experts cannot run on this model)"
                )
            hook.final_weights = hook.weight_chain[-1]
        missing = sorted(set(lay.tensors) - set(found))
        if missing:
            raise BmoeError(
                f"{cfg.model}: the graph never used expert tensor {missing[0]} "
                f"({len(missing)} of {len(lay.tensors)} not found): cannot stream this model"
            )
        if not cfg.load_all:
            self.budget_bytes = resolve_cache_bytes(cfg, lay)
        whole = cfg.load_all or self.budget_bytes >= lay.total_expert_bytes
        self.arena = ExpertArena(lay, huge_pages=use_huge_pages(whole))
        for name, node in found.items():
            self.arena.bind(name, node)
        if hook.discovered_dense:
            self.dense = DenseCopy(hook.discovered_dense)
            hook.discovered_dense = {}
        model.clear_memory()
        self.reader = make_reader(
            lay.shards,
            cfg.io_threads,
            o_direct=cfg.o_direct,
            clock_origin_ns=origin_ns,
            after_read=fault,
        )
        if not cfg.load_all:
            self.cache = ExpertCache(
                self.budget_bytes,
                cfg.cache_policy,
                n_layer=lay.n_layer,
                key_space_bytes={il: eb * lay.n_expert for il, eb in lay.expert_sizes().items()},
            )
            cycle = self.cycle_bytes
            if 0 < self.budget_bytes < cycle:
                self.warnings.append(
                    f"--cache-mb {mib(self.budget_bytes)} is under one token's routed experts "
                    f"(cache_cycle_mb={mib(cycle)}): expect a hit rate near zero"
                )
        self.streamer = ExpertStreamer(
            lay,
            self.arena,
            self.reader,
            self.cache,
            prefetch=cfg.prefetch,
            load_all=cfg.load_all,
            keep_routings=bool(cfg.route_trace),
            drop_frac=cfg.drop_cold_frac,
            drop_prefill=cfg.drop_prefill,
        )
        hook.streamer = self.streamer

    @property
    def cycle_bytes(self) -> int:
        """One token's worst-case routed expert bytes at the effective top-k."""
        lay = self.layout
        return sum(lay.expert_bytes(il) for il in lay.moe_layers) * self.n_expert_used

    def _warm_dense(self) -> None:
        """``--dense-weights warm``: fault the dense weights in before the first token."""
        if self.dense_probe.base is None:
            return
        for address, n in self.dense_ranges:
            libc.will_need(address, n)
            libc.touch(address, n)

    def close(self) -> None:
        if self.streamer is not None:
            with contextlib.suppress(Exception):
                self.streamer.finish()
        if self.reader is not None:
            self.reader.close()
        self.model.close()
        if self.arena is not None:
            self.arena.close()
        if self.dense is not None:
            self.dense.close()
