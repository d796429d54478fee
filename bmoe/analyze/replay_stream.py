"""Replay of a trace larger than memory: the rows come block by block, each block is cut into
batches as :func:`~bmoe.analyze.replay.prepare_batches` cuts a whole trace, and every cache
(one per policy and budget) is carried from block to block by its kernel's state, so memory
stays that of one block plus the caches' per-key state.

Every policy streams with the whole-trace figures; so does the exact LRU curve (``mrc``): its
stack distances are counted per distinct distance, never held per lookup. ``belady`` needs
each key's next use: its lookups go to temporary files on disk (~10 bytes a lookup), the next
uses are found walking them back chunk by chunk, and a second pass replays them.

A batch must not straddle two blocks: the rows of the last batch group of a block (a decode
step, or a turn's whole prefill) wait for the next block. The rows must come in the order
the engine writes them (turns, then a turn's prefill before its decode steps, steps
ascending); a group seen again after a later one is an error, since the whole-trace replay
would have put it earlier.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bmoe.analyze.replay import (
    CURVE_COLUMNS,
    MIB,
    ReplayBatches,
    check_budgets,
    check_policies,
    column_or,
    default_jobs,
    preamble_count,
    prepare_batches,
    validation_table,
)
from bmoe.cache import EXPERT_BITS
from bmoe.cache.expert_cache import EXPERT_MASK
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace


def _groups(rows: pd.DataFrame) -> np.ndarray:
    """Per row, its batch group packed in one int64 that grows in replay order: turn, then
    prefill (every step of it one group) before decode, then the decode step."""
    turn = column_or(rows, "turn", 0).astype(np.int64)
    decode = (column_or(rows, "phase", 1) != 0).astype(np.int64)
    step = column_or(rows, "step", 0).astype(np.int64)
    return ((turn + (1 << 15)) << 41) | (decode << 40) | (decode * (step + (1 << 31)))


class _Chunk:
    """A block's batches with key ids of the whole stream: ``expert * n_parts + part``
    (`part` the layer's index among the preamble's layers), so that ids met later, even
    beyond the declared experts, only add ids at the end."""

    def __init__(self, b: ReplayBatches, part_of: np.ndarray, n_parts: int) -> None:
        code = b.key_code
        to_global = (code & EXPERT_MASK) * n_parts + part_of[code >> EXPERT_BITS]
        self.batches = b
        self.look = to_global[b.look].astype(np.int32)
        self.rec = to_global[b.rec].astype(np.int32)
        self.part = part_of[b.layer].astype(np.int64)
        self.one_part = np.zeros(len(b), dtype=np.int64)
        self.experts = code[b.look] & EXPERT_MASK  # per lookup, in replay order
        self.max_expert = int(self.experts.max(initial=0))


def _grown(state: tuple, fresh: tuple, per_key: Sequence[int], old: int) -> tuple:
    """`state` with its per-key arrays (at `per_key`) widened to those of `fresh`, the new
    ids empty; the other arrays kept. A linked list's node arrays hold a slot per key and
    then one per list (its sentinel, addressed from the end): those stay at the end."""
    out = list(state)
    for i in per_key:
        fresh[i][:old] = state[i][:old]
        extra = len(state[i]) - old
        if extra:
            fresh[i][-extra:] = state[i][old:]
        out[i] = fresh[i]
    return tuple(out)


class _Replay:
    """One policy at one budget, its cache carried from chunk to chunk."""

    #: per kernel: the indices of its state's per-key arrays (widened when new ids appear)
    PER_KEY: ClassVar[dict[str, tuple[int, ...]]] = {
        "lru": (0, 1, 2, 3),
        "lfu": (0, 1, 2, 3, 6),  # and its heaps, part by part
        "lfuda": (0, 1, 2, 3, 4, 5, 6, 7),
        "lfuda_libcachesim": (0, 1, 2, 3, 4, 5, 6, 7),
        "arc": (0, 1, 2, 3, 4),
        "s3fifo": (0, 1, 2, 3, 4, 5, 6),
        "s3fifo_libcachesim": (0, 1, 2, 3, 4, 5, 6, 7, 8),
        "random": (0, 1, 2, 3),
    }

    def __init__(
        self, policy: str, budget: int, n_parts: int, n_layer: int, n_keys: int, seed: int
    ) -> None:
        from bmoe.cache import kernels

        self.policy = policy
        self.budget = budget
        self.n_parts = n_parts
        self.n_keys = n_keys
        self.kind = {
            "layer": "lru", "layerlfu": "lfu", "lfu-incache": "lfu",
            "lfuda-libcachesim": "lfuda_libcachesim", "s3fifo-libcachesim": "s3fifo_libcachesim",
        }.get(policy, policy)  # fmt: skip
        self.capacity = budget // n_layer if policy in ("layer", "layerlfu") else budget
        self.parts = n_parts if policy in ("layer", "layerlfu") else 1
        if policy == "random":
            self.mt = kernels.mt_state(seed)
        self.state = self._fresh(n_keys)

    def _fresh(self, n_keys: int) -> tuple:
        from bmoe.cache import kernels

        if self.kind == "lru":
            return kernels.lru_state(self.parts, n_keys)
        if self.kind == "lfu":
            return kernels.lfu_heap_state(self.parts, n_keys)
        if self.kind == "random":
            return kernels.random_state(n_keys, *self.mt)
        return getattr(kernels, f"{self.kind}_state")(n_keys)

    def grow(self, n_keys: int) -> None:
        fresh = self._fresh(n_keys)
        old = self.state
        self.state = _grown(old, fresh, self.PER_KEY[self.kind], self.n_keys)
        if self.kind == "lfu":  # each part's heap moves to its new slots
            hv, hk, base, count = old[4], old[5], old[7], old[8]
            new_base = fresh[7]
            for j in range(len(base)):
                at, to, n = int(base[j]), int(new_base[j]), int(count[j])
                fresh[4][to : to + n] = hv[at : at + n]
                fresh[5][to : to + n] = hk[at : at + n]
            self.state = (*self.state[:4], fresh[4], fresh[5], self.state[6], new_base,
                          *self.state[8:])  # fmt: skip
        self.n_keys = n_keys

    def _restamp(self, held_keys: int, priority: np.ndarray, c: _Chunk, restamp) -> int:
        """Renumber the touch stamps below the heap priorities for chunk `c`; the shift the
        priorities are packed with: the bits of the keys held and the chunk's lookups."""
        from bmoe.cache import kernels

        shift = kernels.counter_bits(held_keys + len(c.look))
        if int(priority.max(initial=0)) + len(c.look) >= 1 << (62 - shift):
            raise BmoeError(f"{self.policy} priorities outgrew 62 bits; replay fewer rows")
        restamp(self.state, shift)
        return shift

    def feed(self, c: _Chunk) -> np.ndarray:
        """Hits per batch of `c`, the cache left as after it."""
        from bmoe.cache import kernels

        b, st = c.batches, self.state
        part = c.part if self.parts > 1 else c.one_part
        if self.kind == "lru":
            return kernels.lru_continue(
                b.bounds, c.look, c.rec, b.repeated, b.size, part, self.capacity, st
            )
        if self.kind == "lfu":
            shift = self._restamp(int(st[8].sum()), st[0], c, kernels.lfu_heap_restamp)
            return kernels.lfu_heap_continue(
                b.bounds, c.look, c.rec, b.repeated, b.size, part, self.capacity,
                self.policy != "lfu-incache", shift, st,
            )  # fmt: skip
        if self.kind == "lfuda":
            shift = self._restamp(int(st[9][0]), st[1], c, kernels.lfuda_restamp)
            return kernels.lfuda_continue(
                b.bounds, c.look, c.rec, b.repeated, b.size, self.budget, shift, st
            )
        if self.kind == "lfuda_libcachesim":
            shift = self._restamp(int(st[2].sum()), st[0], c, kernels.lfuda_libcachesim_restamp)
            hits, fitted = kernels.lfuda_libcachesim_continue(
                b.bounds, c.look, c.rec, b.repeated, b.size, self.budget, shift, st
            )
            if not fitted:
                raise BmoeError(f"{self.policy}'s priorities outgrew 62 bits; replay fewer rows")
            return hits
        if self.kind == "arc":
            return kernels.arc_continue(
                b.bounds, c.look, c.rec, b.repeated, b.size, self.budget, st
            )
        if self.kind == "s3fifo":
            return kernels.s3fifo_continue(b.bounds, c.look, b.size, self.budget, st)
        if self.kind == "s3fifo_libcachesim":
            return kernels.s3fifo_libcachesim_continue(b.bounds, c.look, b.size, self.budget, st)
        return kernels.randomized_continue(b.bounds, c.look, b.size, self.budget, st)


def _counted(values: np.ndarray, counts: np.ndarray, more: np.ndarray):
    """(distinct values, their counts) of `values` x `counts` and the values `more`."""
    found, times = np.unique(more, return_counts=True)
    merged, at = np.unique(np.concatenate([values, found]), return_inverse=True)
    total = np.zeros(len(merged), dtype=np.int64)
    np.add.at(total, at, np.concatenate([counts, times]))
    return merged, total


class _Distances:
    """The exact LRU curve's stack distances (see
    :func:`~bmoe.analyze.replay.lru_stack_distances`), counted per distinct distance for
    each (expert size, decode) as the chunks come: the tree is renumbered per chunk, the
    counts are bounded by the distinct distances."""

    def __init__(self, n_keys: int, key_size: Callable[[int], np.ndarray]) -> None:
        from bmoe.cache import kernels

        self.state = kernels.distances_state(n_keys, 0)
        self.n_keys = n_keys
        self.key_size = key_size
        self.groups: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = {}
        self.lookups = self.decode_lookups = self.total_bytes = 0

    def grow(self, n_keys: int) -> None:
        from bmoe.cache import kernels

        fresh = kernels.distances_state(n_keys, 0)
        self.state = _grown(self.state, fresh, (1, 2), self.n_keys)
        self.n_keys = n_keys

    @property
    def seen_bytes(self) -> int:
        """The bytes of every key looked up so far."""
        return int(self.state[3][0])

    def feed(self, c: _Chunk) -> None:
        from bmoe.cache import kernels

        b = c.batches
        self.state = kernels.distances_restart(self.state, self.key_size(self.n_keys), len(c.look))
        dist = kernels.lru_byte_distances_continue(
            b.bounds, c.look, c.rec, b.repeated, b.size, True, self.state
        )
        self.lookups += len(dist)
        self.decode_lookups += int(b.n_lookups[b.decode].sum())
        self.total_bytes += int((b.n_lookups * b.size).sum())
        for size in np.unique(b.size).tolist():
            for decode in (False, True):
                pick = (b.size == size) & (b.decode == decode)
                if not pick.any():
                    continue
                d = dist[np.repeat(pick, b.n_lookups)]
                empty = (np.zeros(0), np.zeros(0, dtype=np.int64))
                values, counts = self.groups.get((size, decode), empty)
                self.groups[(size, decode)] = _counted(values, counts, d[np.isfinite(d)])

    def at(self, budgets_mib: Sequence[float] | np.ndarray) -> pd.DataFrame:
        """:func:`~bmoe.analyze.replay.mrc_at` from the counts (the same figures)."""
        budget_list = list(budgets_mib)
        points = np.asarray(budget_list, dtype=np.float64) * MIB
        at_most = {}
        for key, (values, counts) in self.groups.items():
            cum = np.concatenate([[0], np.cumsum(counts)])
            at_most[key] = cum[np.searchsorted(values, points, side="right")]
        none = np.zeros(len(points), dtype=np.int64)
        hits = sum(at_most.values(), none)
        dec = sum((v for (_, d), v in at_most.items() if d), none)
        hit_bytes = np.zeros(len(points), dtype=np.float64)
        for size in sorted({s for s, _ in self.groups}):
            hit_bytes += float(size) * sum((v for (s, _), v in at_most.items() if s == size), none)
        n, n_dec = self.lookups, self.decode_lookups
        return pd.DataFrame(
            {
                "budget_mib": budget_list,
                "hit_pct_cum": 100.0 * hits / n if n else np.full(len(points), np.nan),
                "hit_pct_decode": 100.0 * dec / n_dec if n_dec else np.full(len(points), np.nan),
                "read_mib": (float(self.total_bytes) - hit_bytes) / MIB,
            }
        )

    def steps(self, expert_set_bytes: int) -> pd.DataFrame:
        """:func:`~bmoe.analyze.replay.lru_mrc` from the counts (the same figures)."""
        finite = [values for values, _ in self.groups.values()]
        points = np.concatenate([[0.0], *finite, [float(expert_set_bytes)]]) / MIB
        frame = self.at(np.unique(points))
        frame.insert(2, "miss_pct_cum", 100.0 - frame["hit_pct_cum"])
        return frame


class _Spill:
    """``belady``'s chunks written to disk as they come (per lookup its key; per batch its
    lookups, expert size and phase), then replayed in a second pass once the next uses are
    known: found walking the chunks from the last to the first. Memory stays one chunk and
    a table per key; the disk takes ~10 bytes a lookup."""

    FILES: ClassVar[dict[str, type]] = {"look": np.int32, "count": np.int32, "size": np.int64,
                                        "decode": np.bool_, "next": np.int32}  # fmt: skip

    def __init__(self, budgets: Sequence[int]) -> None:
        import tempfile

        self.budgets = list(budgets)
        self.dir = tempfile.TemporaryDirectory(prefix="bmoe-belady-")
        self.chunks: list[tuple[int, int, int, int]] = []  # lookup and batch offset, counts
        self.lookups = self.batches = 0

    def path(self, name: str) -> str:
        return f"{self.dir.name}/{name}"

    def add(self, c: _Chunk) -> None:
        b = c.batches
        parts = {"look": c.look, "count": b.n_lookups.astype(np.int32), "size": b.size,
                 "decode": b.decode}  # fmt: skip
        try:
            for name, values in parts.items():
                with open(self.path(name), "ab") as fh:
                    fh.write(np.ascontiguousarray(values, dtype=self.FILES[name]).tobytes())
        except OSError as exc:
            raise BmoeError(
                f"belady's lookups cannot be written to {self.dir.name} ({exc.strerror}); "
                "point TMPDIR at a larger disk or leave belady out"
            ) from None
        self.chunks.append((self.lookups, self.batches, len(c.look), len(b)))
        self.lookups += len(c.look)
        self.batches += len(b)

    def _read(self, name: str, start: int, n: int) -> np.ndarray:
        dtype = np.dtype(self.FILES[name])
        return np.fromfile(self.path(name), dtype=dtype, count=n, offset=start * dtype.itemsize)

    def replay(self, n_keys: int) -> list[tuple[int, int, int]]:
        """Per budget: hits, decode hits and hit bytes of ``belady``."""
        from bmoe.cache import kernels

        shift = kernels.counter_bits(self.lookups)
        if 2 * shift > 62:
            raise BmoeError(f"{self.lookups:,} lookups are more than one replay can count")
        nextb = np.full(n_keys, self.batches, dtype=np.int32)
        with open(self.path("next"), "wb") as fh:
            fh.truncate(self.lookups * 4)
        with open(self.path("next"), "r+b") as fh:
            for at, b0, n, n_b in reversed(self.chunks):
                bounds = np.zeros(n_b + 1, dtype=np.int64)
                np.cumsum(self._read("count", b0, n_b), out=bounds[1:])
                nu = kernels.next_uses_continue(bounds, self._read("look", at, n), nextb, b0)
                fh.seek(at * 4)
                fh.write(nu.tobytes())
        states = [kernels.belady_state(n_keys) for _ in self.budgets]
        out = np.zeros((len(self.budgets), 3), dtype=np.int64)
        for at, b0, n, n_b in self.chunks:
            count = self._read("count", b0, n_b).astype(np.int64)
            bounds = np.concatenate([[0], np.cumsum(count)])
            look, nu = self._read("look", at, n), self._read("next", at, n)
            size, decode = self._read("size", b0, n_b), self._read("decode", b0, n_b)
            for i, budget in enumerate(self.budgets):
                h = kernels.belady_continue(
                    bounds, look, size, nu, self.batches, b0, budget, shift, states[i]
                )
                out[i] += (int(h.sum()), int(h[decode].sum()), int((h * size).sum()))
        self.dir.cleanup()
        return [(a, b, c) for a, b, c in out.tolist()]


def _shape(
    trace: RouteTrace,
    counts: dict[str, int],
    totals: dict[str, int],
    top_layer: int,
    residency: bool,
) -> dict[str, object]:
    """:func:`~bmoe.analyze.replay.model_shape` from the counts the blocks added up."""
    sizes = trace.expert_bytes()
    k = preamble_count(trace.meta, "n_expert_used") or counts["k"]
    model = str(trace.meta.get("model", "")).replace("\\", "/").rsplit("/", 1)[-1]
    per_expert = np.array(list(sizes.values()), dtype=np.float64) / MIB
    n, n_dec = totals["lookups"], totals["decode_lookups"]
    recorded = {}
    if residency:
        recorded = {
            "recorded_hit_pct_cum": 100.0 * counts["recorded"] / n if n else float("nan"),
            "recorded_hit_pct_decode": 100.0 * counts["recorded_decode"] / n_dec
            if n_dec
            else float("nan"),
            "recorded_read_mib": (totals["bytes"] - counts["recorded_bytes"]) / MIB,
        }
    return {
        "model": model or None,
        "n_layer": preamble_count(trace.meta, "n_layer") or top_layer + 1,
        "moe_layers": len(sizes),
        "n_expert": preamble_count(trace.meta, "n_expert"),
        "k": k,
        "mib_per_expert": float(per_expert.max()) if len(per_expert) else None,
        "mib_per_expert_min": float(per_expert.min()) if len(per_expert) else None,
        "batches": counts["batches"],
        "prefill_batches": counts["prefill"],
        "decode_batches": counts["decode"],
        "lookups": n,
        "t_mib": sum(sizes.values()) * k / MIB,
        "recorded_with_dropping": bool(counts["dropped"]),
        **recorded,
    }


def stream_replay(
    trace: RouteTrace,
    blocks: Iterable[pd.DataFrame],
    budgets_mib: Sequence[float],
    policies: Sequence[str] = ("lru",),
    *,
    mrc: bool = False,
    validate_mib: float | None = None,
    metrics_summary: dict | None = None,
    seed: int = 0,
    jobs: int | None = None,
) -> dict[str, pd.DataFrame | dict]:
    """The replay views of a trace whose preamble is `trace` (its rows are not read) and
    whose rows are `blocks`, in file order (e.g. :func:`~bmoe.formats.route.iter_route_rows`):
    ``shape`` (:func:`~bmoe.analyze.replay.model_shape`'s figures), ``curve``
    (:func:`~bmoe.analyze.replay.replay_curve`'s rows, same figures) and, with `mrc`,
    ``mrc_budgets`` and ``mrc`` (:func:`~bmoe.analyze.replay.mrc_at` at the budgets and
    :func:`~bmoe.analyze.replay.lru_mrc`); with `validate_mib`, ``validation``
    (:func:`~bmoe.analyze.replay.validate`'s table). `jobs` replays run at once on each block.
    ``belady`` spills its lookups to a temporary directory and replays them after the pass.

    ``layer`` and ``layerlfu`` split the budget by the preamble's ``n_layer`` (else the
    highest layer with an expert size, plus one). Expert ids at or beyond the preamble's
    ``n_expert`` are replayed and warned about once (:class:`UserWarning`)."""
    from bmoe.cache import kernels

    budgets = check_budgets(budgets_mib)
    names = check_policies(policies)
    name = trace.path or "trace"
    sizes = trace.expert_bytes()
    if not sizes:
        raise BmoeError(f"{name}: no expert_bytes in the preamble (a replay cannot price misses)")
    layers = np.array(sorted(sizes), dtype=np.int64)
    n_parts = len(layers)
    part_of = np.full(int(layers.max()) + 1, -1, dtype=np.int64)
    part_of[layers] = np.arange(n_parts)
    part_bytes = np.array([sizes[x] for x in layers.tolist()], dtype=np.int64)
    n_declared = preamble_count(trace.meta, "n_expert")
    n_e = n_declared or 1
    n_layer = preamble_count(trace.meta, "n_layer") or int(layers.max()) + 1
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise BmoeError(f"jobs must be >= 1, not {jobs}")

    def key_size(n_keys: int) -> np.ndarray:
        return np.tile(part_bytes, n_keys // n_parts)

    cells = [(budget, p) for budget in budgets for p in names]
    if validate_mib is not None:  # one more LRU replay, at the run's budget, off the curve
        cells.append((validate_mib, "lru"))
    now = [i for i, (_, p) in enumerate(cells) if p != "belady"]  # the rest in a second pass
    replays = [
        _Replay(cells[i][1], round(cells[i][0] * MIB), n_parts, n_layer, n_e * n_parts, seed)
        for i in now
    ]
    later = [i for i, (_, p) in enumerate(cells) if p == "belady"]
    spill = _Spill([round(cells[i][0] * MIB) for i in later]) if later else None
    distances = _Distances(n_e * n_parts, key_size) if mrc else None
    lookups = decode_lookups = total_bytes = 0
    hits = np.zeros(len(cells), dtype=np.int64)
    decode_hits = np.zeros(len(cells), dtype=np.int64)
    hit_bytes = np.zeros(len(cells), dtype=np.int64)
    seen_layers: set[int] = set()
    counts = dict.fromkeys(("batches", "prefill", "decode", "k", "recorded", "recorded_decode",
                            "recorded_bytes", "dropped"), 0)  # fmt: skip
    residency = True  # every block has the residency column
    done = -1  # the last batch group replayed
    warned = False
    pool = ThreadPoolExecutor(max_workers=min(jobs, len(replays))) if jobs > 1 and replays else None

    def run(rows: pd.DataFrame, groups: np.ndarray) -> None:
        nonlocal lookups, decode_lookups, total_bytes, done, n_e, warned, residency
        if not len(rows):
            return
        if int(groups.min()) <= done:
            raise BmoeError(
                f"{name}: routing rows out of the engine's order (a step or prefill seen again "
                "after a later one); replay the trace whole instead"
            )
        done = int(groups.max())
        b = prepare_batches(RouteTrace(trace.path, trace.version, trace.meta, trace.layers, rows))
        c = _Chunk(b, part_of, n_parts)
        if c.max_expert >= n_e:
            if n_declared and not warned:
                first = int(c.experts[c.experts >= n_declared][0])
                warnings.warn(
                    f"{name}: expert id {first} is outside 0..{n_declared - 1} (the "
                    f"preamble's n_expert={n_declared}); it is replayed, but figures against "
                    "n_expert (shares of the expert set, its size) do not hold",
                    stacklevel=3,
                )
                warned = True
            n_e = max(c.max_expert + 1, 2 * n_e)
            for r in replays:
                r.grow(n_e * n_parts)
            if distances is not None:
                distances.grow(n_e * n_parts)
        seen_layers.update(np.unique(b.layer).tolist())
        n = b.n_lookups
        counts["batches"] += len(b)
        counts["prefill"] += b.n_prefill
        counts["decode"] += b.n_decode
        counts["k"] = max(counts["k"], int(n[b.decode].max(initial=0)))
        counts["dropped"] |= "dropped" in rows and bool((rows["dropped"] != 0).any())
        if b.recorded_hits is None:
            residency = False
        else:
            counts["recorded"] += int(b.recorded_hits.sum())
            counts["recorded_decode"] += int(b.recorded_hits[b.decode].sum())
            counts["recorded_bytes"] += int((b.recorded_hits * b.size).sum())
        lookups += int(n.sum())
        decode_lookups += int(n[b.decode].sum())
        total_bytes += int((n * b.size).sum())
        if distances is not None:
            distances.feed(c)
        if spill is not None:
            spill.add(c)

        def one(i: int) -> tuple[int, int, int]:
            h = replays[i].feed(c)
            out = int(h.sum()), int(h[b.decode].sum()), int((h * b.size).sum())
            if pool is not None:
                kernels.release_heap()
            return out

        found = pool.map(one, range(len(replays))) if pool else map(one, range(len(replays)))
        for i, (h, hd, hb) in zip(now, found, strict=True):
            hits[i] += h
            decode_hits[i] += hd
            hit_bytes[i] += hb

    try:
        carry: pd.DataFrame | None = None
        for block in blocks:
            rows = block if carry is None else pd.concat([carry, block], ignore_index=True)
            if not len(rows):
                continue
            groups = _groups(rows)
            last = groups == groups[-1]
            run(rows[~last], groups[~last])
            carry = rows[last]
        if carry is not None:
            run(carry, _groups(carry))
        if spill is not None and lookups:
            for i, (h, hd, hb) in zip(later, spill.replay(n_e * n_parts), strict=True):
                hits[i], decode_hits[i], hit_bytes[i] = h, hd, hb
    finally:
        if spill is not None:
            spill.dir.cleanup()
        if pool is not None:
            pool.shutdown()
    if not lookups:
        raise BmoeError(f"{name}: no routing rows to replay")
    totals = {"lookups": lookups, "decode_lookups": decode_lookups, "bytes": total_bytes}
    shape = _shape(trace, counts, totals, max(seen_layers), residency)
    hit_pct = 100.0 * hits / lookups
    decode_pct = (
        100.0 * decode_hits / decode_lookups if decode_lookups else np.full(len(hits), np.nan)
    )
    views: dict[str, pd.DataFrame | dict] = {"shape": shape}
    if validate_mib is not None:  # the last cell
        lru = {"hit_pct_cum": hit_pct[-1], "hit_pct_decode": decode_pct[-1]}
        recorded: dict[str, Any] | None = None
        if residency:
            recorded = {k: shape[f"recorded_{k}"] for k in ("hit_pct_cum", "hit_pct_decode")}
        views["validation"] = validation_table(lru, recorded, validate_mib, metrics_summary)
    n = len(budgets) * len(names)
    views["curve"] = pd.DataFrame(
        {
            "budget_mib": [budget for budget, _ in cells[:n]],
            "policy": [p for _, p in cells[:n]],
            "hit_pct_cum": hit_pct[:n],
            "hit_pct_decode": decode_pct[:n],
            "read_mib": (total_bytes - hit_bytes[:n]) / MIB,
        },
        columns=list(CURVE_COLUMNS),
    )
    if distances is not None:
        seen = distances.seen_bytes
        expert_set = sum(sizes[x] for x in seen_layers) * n_declared if n_declared else seen
        views["mrc_budgets"] = distances.at(budgets)
        views["mrc"] = distances.steps(max(expert_set, seen))
    return views
