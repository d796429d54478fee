"""Cache-policy replay: the recorded routing through other policies and budgets.

A recorded hit rate cannot say whether a low hit rate is the policy's fault or the working
set's; replaying the same routing through other caches can. The replay runs the batch
semantics of the engine's own :class:`bmoe.cache.ExpertCache` as compiled kernels
(:mod:`bmoe.cache.kernels`, tested equal to staging batch by batch, driven by
:mod:`bmoe.analyze.replay_run` with the whole trace as one chunk; the prefetch replay stages
through the cache itself), with the reference's batch order:

* prefill: one batch per layer holding every prompt token's ids, token-major, slot order,
  layers ascending;
* decode: one batch per (step, layer), steps ascending, layers ascending within a step;
* turns in order (``turn`` N alone with ``turn=N``).

Everything here is pure: a :class:`~bmoe.formats.route.RouteTrace` in, DataFrames out. The
trace may also come as :class:`~bmoe.formats.route.RouteColumns` (numpy columns), and
:func:`replay` can give its curve and validation as columns (``frames=False``): the
command line's table then needs no pandas.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from bmoe.analyze.replay_run import Replays, Tally, as_frame
from bmoe.cache import (
    DEFAULT_POLICY,
    EXPERT_BITS,
    NEVER,
    POLICIES,
    REFERENCE_POLICIES,
    ExpertCache,
)
from bmoe.cache.expert_cache import EXPERT_MASK
from bmoe.errors import BmoeError
from bmoe.formats.route import NUMPY_TYPES, RouteColumns, RouteTrace
from bmoe.units import MIB

if TYPE_CHECKING:
    import pandas as pd

    from bmoe.cache.kernels import Chunk

#: a routing trace, its rows as a DataFrame or as numpy columns
Trace = RouteTrace | RouteColumns

#: the reference's default budgets (MiB)
DEFAULT_BUDGETS_MIB = (250, 500, 750, 1000, 1500, 2000, 3000, 4000, 6000)
#: the budgets of the archived reference curves (MiB)
ARCHIVED_BUDGETS_MIB = (250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000, 6000, 8000)


@dataclass
class ReplayBatches:
    """A trace cut into cache batches, as flat arrays the replay kernels read.

    Per batch: ``layer``, ``turn``, ``step`` (first step), ``decode`` (bool), ``size``
    (bytes of one expert of the layer), ``n_lookups``, ``repeated`` (an id repeats, so the
    last-touch order differs from the first-seen one) and ``part`` (the layer's index among
    the trace's layers: its budget slice under ``layer``/``layerlfu``). Per lookup, batch
    after batch (``bounds`` cut them, one more entry than batches): ``look`` (dense key ids,
    first-seen order) and ``rec`` (the same ids in last-touch order). Per dense key id:
    ``key_code`` (the cache key ``layer << 16 | expert``) and ``key_part``.

    ``lookups``, ``recency`` and ``next_use`` give the same as Python lists of cache keys
    (what :class:`~bmoe.cache.ExpertCache` stages), built on first use.
    """

    layer: np.ndarray
    turn: np.ndarray
    step: np.ndarray
    decode: np.ndarray
    size: np.ndarray
    n_lookups: np.ndarray
    repeated: np.ndarray
    part: np.ndarray
    bounds: np.ndarray
    look: np.ndarray
    rec: np.ndarray
    key_code: np.ndarray
    key_part: np.ndarray
    recorded_hits: np.ndarray | None  # per batch, lookups the run recorded as resident
    n_layer: int
    n_expert: int | None
    k: int | None
    look_row: np.ndarray | None = None  # per lookup, its first row in the trace (on request)
    recorded_with_dropping: bool = False  # the trace says it was recorded with dropping on

    def __len__(self) -> int:
        return len(self.layer)

    @property
    def n_keys(self) -> int:
        return len(self.key_code)

    @property
    def n_parts(self) -> int:
        return int(self.key_part.max(initial=-1)) + 1

    @property
    def n_prefill(self) -> int:
        return int((~self.decode).sum())

    @property
    def n_decode(self) -> int:
        return int(self.decode.sum())

    def size_of_keys(self) -> np.ndarray:
        """Per dense key id, the bytes of one expert of its layer."""
        table = np.zeros(self.n_parts, dtype=np.int64)
        table[self.part] = self.size
        return table[self.key_part]

    def _split(self, values: np.ndarray) -> list[list[int]]:
        flat = values.tolist()
        b = self.bounds.tolist()
        return [flat[b[i] : b[i + 1]] for i in range(len(self))]

    @cached_property
    def lookups(self) -> list[list[int]]:
        """Per batch, its distinct cache keys in first-seen order."""
        return self._split(self.key_code[self.look])

    @cached_property
    def recency(self) -> list[list[int] | None]:
        """Per batch, its keys in last-touch order, None where that is the lookup order."""
        rec = self._split(self.key_code[self.rec])
        return [r if rep else None for r, rep in zip(rec, self.repeated.tolist(), strict=True)]

    @cached_property
    def next_use_flat(self) -> np.ndarray:
        """Per lookup, the index of the next batch looking the same key up (int32; the
        number of batches if none)."""
        from bmoe.cache.kernels import batches

        return batches.next_uses(self.bounds, self.look, self.n_keys)

    @cached_property
    def next_use(self) -> list[list[int]]:
        """Per batch, :attr:`next_use_flat` of its lookups, :data:`~bmoe.cache.NEVER` if none."""
        flat = self.next_use_flat.astype(np.int64)
        flat[flat >= len(self)] = NEVER
        return self._split(flat)


def column_or(rows: pd.DataFrame | Mapping[str, np.ndarray], name: str, default: int) -> np.ndarray:
    """A column of `rows` (a DataFrame or numpy columns) as an integer array in its own dtype
    (no widening copy when it is one); a column it lacks as `default` in the column's type
    in a route trace (:data:`~bmoe.formats.route.NUMPY_TYPES`)."""
    if name in rows:
        values = np.asarray(rows[name])
        if values.dtype.kind not in "iu":
            values = values.astype(np.int64)
        return values
    return np.full(_n_rows(rows), default, dtype=NUMPY_TYPES.get(name, np.int8))


def _n_rows(rows: pd.DataFrame | Mapping[str, np.ndarray]) -> int:
    if isinstance(rows, Mapping):
        return len(next(iter(rows.values()))) if rows else 0
    return len(rows)


def rows_of(trace: Trace) -> pd.DataFrame | dict[str, np.ndarray]:
    """The routing rows of `trace`: its DataFrame, or its numpy columns."""
    return trace.rows if isinstance(trace, RouteTrace) else trace.columns


#: the route-trace columns a replay reads (the rest, weights and byte counts, it never uses)
REPLAY_COLUMNS = ("turn", "phase", "step", "layer", "slot", "expert", "residency", "dropped")


def without_rows(trace: Trace) -> Trace:
    """`trace`'s run facts and layer sizes with no routing rows (an empty frame of its
    columns): what a replay still reads once its batches are cut, so a large trace's rows
    can be freed before the replays run."""
    if isinstance(trace, RouteColumns):
        empty = {name: values[:0].copy() for name, values in trace.columns.items()}
        return dataclasses.replace(trace, columns=empty)
    return dataclasses.replace(trace, rows=trace.rows.iloc[:0].copy())


def turns_of(trace: Trace) -> list[int]:
    rows = rows_of(trace)
    if "turn" not in rows:
        return [0]
    return np.unique(np.asarray(rows["turn"])).tolist()


def preamble_count(meta: dict, name: str) -> int | None:
    """A preamble count as an int, None when absent or not a whole number >= 1."""
    try:
        value = int(meta.get(name))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if value >= 1 else None


def _span(values: np.ndarray) -> tuple[int, int]:
    return (int(values.min()), int(values.max())) if len(values) else (0, 0)


def _batch_order(
    turns: np.ndarray, phase: np.ndarray, step: np.ndarray, layer: np.ndarray, slot: np.ndarray
) -> np.ndarray:
    """The permutation into reference batch order (turn, phase, then step-major in decode
    and layer-major in prefill, slot), or an empty array when the rows already are in it.
    One packed int64 sort key when the value ranges allow, a lexsort otherwise."""
    from bmoe.cache.kernels import batches

    t0, t1 = _span(turns)
    s0, s1 = _span(step)
    l0, l1 = _span(layer)
    o0, o1 = _span(slot)
    span = max(s1 - s0, l1 - l0) + 1
    n_slot = o1 - o0 + 1
    if (t1 - t0 + 1) * 2 * span * span * n_slot < (1 << 62):
        packed, ordered = batches.batch_sort_key(
            turns, phase, step, layer, slot, t0, s0, l0, o0, span, n_slot
        )
        if ordered:
            return np.zeros(0, dtype=np.int64)
        return np.argsort(packed, kind="stable")
    decode = phase != 0
    major = np.where(decode, step, layer)
    minor = np.where(decode, layer, step)
    return np.lexsort((slot, minor, major, decode, turns))


def prepare_batches(
    trace: Trace, turn: int | None = None, *, lookup_rows: bool = False
) -> ReplayBatches:
    """Cut `trace` into cache batches (reference order), optionally one turn only, and with
    `lookup_rows` the row each lookup comes from (``look_row``: positions in the rows of
    that turn).

    Expert ids must be 0..65535 and layers 0..65535 (the cache key packs both into 32 bits);
    anything else, such as the -1 of a routing that was never resolved, is an error naming
    the value."""
    from bmoe.cache.kernels import batches  # numba: imported when a replay is asked for

    rows = rows_of(trace)
    name = trace.path or "trace"
    for label in ("expert", "layer"):
        values = column_or(rows, label, 0)
        lo, hi = _span(values)
        if lo < 0 or hi > EXPERT_MASK:
            bad = lo if lo < 0 else hi
            at = int(np.flatnonzero(values == bad)[0])
            raise BmoeError(
                f"{name}: {label} id {bad} (routing row {at + 1}) is outside 0..{EXPERT_MASK}; "
                "a replay needs real ids"
            )
    turns = column_or(rows, "turn", 0)
    if turn is not None:
        if turn not in set(np.unique(turns).tolist()):
            raise BmoeError(
                f"{name}: no turn {turn} (turns: {', '.join(map(str, turns_of(trace)))})"
            )
        keep = turns == turn
        rows = {c: v[keep] for c, v in rows.items()} if isinstance(rows, dict) else rows[keep]
        turns = turns[keep]
    if not _n_rows(rows):
        raise BmoeError(f"{name}: no routing rows to replay")
    layer = column_or(rows, "layer", 0)
    expert = column_or(rows, "expert", 0)

    sizes = trace.expert_bytes()
    present = np.flatnonzero(np.bincount(layer))  # the layers that occur (ids checked above)
    missing = [int(x) for x in present if int(x) not in sizes]
    if missing:
        raise BmoeError(
            f"{name}: layer {missing[0]} has no expert_bytes in the preamble "
            "(a replay cannot price its misses)"
        )
    for x in present.tolist():
        if not 0 <= sizes[x] < (1 << 53):
            raise BmoeError(
                f"{name}: layer {x} has expert_bytes={sizes[x]} in the preamble, not a size "
                "a replay can count in (0 .. 2^53)"
            )

    phase = column_or(rows, "phase", 1)
    step = column_or(rows, "step", 0)
    order = _batch_order(turns, phase, step, layer, column_or(rows, "slot", 0))

    # dense key ids: the layer's index among the trace's layers x experts + expert, or,
    # when few of those occur (large sparse ids), the keys that occur, numbered
    part_of = np.zeros(int(present.max()) + 1, dtype=np.int64)
    part_of[present] = np.arange(len(present))
    n_e = int(expert.max()) + 1
    n_keys = len(present) * n_e
    if n_keys <= 2 * len(expert) + 65536:
        codes = np.arange(n_keys, dtype=np.int64)
        key_part = codes // n_e
        key_code = (present[key_part].astype(np.int64) << EXPERT_BITS) | (codes % n_e)
        row_id, id_part_of, id_n_e = expert, part_of, n_e
    else:
        packed = part_of[layer] * n_e + expert
        used, row_id = np.unique(packed, return_inverse=True)
        del packed
        key_part = used // n_e
        key_code = (present[key_part].astype(np.int64) << EXPERT_BITS) | (used % n_e)
        n_keys = len(used)
        id_part_of, id_n_e = np.zeros_like(part_of), 1
    resident = np.zeros(0, dtype=bool)
    if "residency" in rows:
        resident = np.asarray(rows["residency"]) > 0
    n_b = batches.count_batches(order, turns, phase, step, layer)
    look_row = np.empty(len(layer) if lookup_rows else 0, dtype=np.int64)
    look, rec, first, bounds, repeated, recorded = batches.cut_batches(
        order, turns, phase, step, layer, row_id, resident, id_part_of, id_n_e, n_b, n_keys,
        look_row,
    )  # fmt: skip
    del order, resident, row_id

    b_layer = layer[first]
    size_table = np.zeros(int(present.max()) + 1, dtype=np.int64)
    for x in present.tolist():
        size_table[x] = sizes[x]
    meta = trace.meta
    return ReplayBatches(
        layer=layer[first],
        turn=turns[first],
        step=step[first],
        decode=phase[first] != 0,
        size=size_table[b_layer],
        n_lookups=np.diff(bounds),
        repeated=repeated,
        part=part_of[b_layer],
        bounds=bounds,
        look=look,
        rec=rec,
        key_code=key_code,
        key_part=key_part,
        recorded_hits=recorded if "residency" in rows else None,
        n_layer=preamble_count(meta, "n_layer") or (int(present.max()) + 1),
        n_expert=preamble_count(meta, "n_expert"),
        k=preamble_count(meta, "n_expert_used"),
        look_row=look_row[: len(look)] if lookup_rows else None,
        recorded_with_dropping=trace.recorded_with_dropping,
    )


def whole_chunk(batches: ReplayBatches, *, future: bool = False) -> Chunk:
    """`batches` as one :class:`~bmoe.cache.kernels.Chunk` (with each lookup's next use when
    `future`: for the policies that read it)."""
    from bmoe.cache.kernels import Chunk

    b = batches
    if not future:
        return Chunk(b.bounds, b.look, b.rec, b.repeated, b.size, b.part, b.decode)
    return Chunk(b.bounds, b.look, b.rec, b.repeated, b.size, b.part, b.decode,
                 next_use=b.next_use_flat, n_total=len(b), total_lookups=len(b.look))  # fmt: skip


def _part_keys(batches: ReplayBatches) -> int:
    """The most key ids of one layer."""
    return int(np.bincount(batches.key_part).max(initial=0)) if batches.n_keys else 0


def _replays(batches: ReplayBatches, cells: list, seed: int, jobs: int = 1) -> Replays:
    b = batches
    return Replays(cells, b.n_keys, b.n_parts, b.n_layer, part_keys=_part_keys(b), seed=seed,
                   jobs=jobs)  # fmt: skip


def simulate(
    batches: ReplayBatches, policy: str, budget_bytes: int, *, seed: int = 0
) -> np.ndarray:
    """Hits per batch of one replay (policy at budget), by the policy's compiled kernels:
    the replay driver fed the whole trace as one chunk."""
    from bmoe.cache import kernels

    check_policies([policy])
    budget = int(budget_bytes)
    if budget < 0:
        raise BmoeError(f"cache budget must be >= 0 bytes, not {budget}")
    if not len(batches):
        return np.zeros(0, dtype=np.int64)
    spec = kernels.kernel_spec(policy)
    setup = kernels.Setup(batches.n_keys, batches.n_parts, seed, _part_keys(batches))
    cache = kernels.Replay(spec, budget, setup, batches.n_layer)
    return cache.feed(whole_chunk(batches, future=spec.live.needs_future))


def summarize(batches: ReplayBatches, hits: np.ndarray) -> dict[str, float]:
    """Cumulative and decode-only hit % and MiB read for one replay's hits per batch."""
    chunk = whole_chunk(batches)
    tally = Tally(1)
    tally.count(chunk)
    tally.add(0, hits, chunk)
    return tally.figures(0)


def check_policies(policies: Iterable[str]) -> list[str]:
    """The policy names, validated (an unknown name is an error naming it)."""
    names = [p.strip() for p in policies if p.strip()]
    for name in names:
        if name not in POLICIES:
            raise BmoeError(f"unknown cache policy {name!r} (choose from {', '.join(POLICIES)})")
    if not names:
        raise BmoeError("no cache policy given")
    return names


def default_jobs() -> int:
    """The replays run at once by default: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def replay_curve(
    trace: Trace | ReplayBatches,
    budgets_mib: Sequence[float] = DEFAULT_BUDGETS_MIB,
    policies: Sequence[str] = REFERENCE_POLICIES,
    *,
    turn: int | None = None,
    seed: int = 0,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    frame: bool = True,
) -> pd.DataFrame | dict[str, list]:
    """The replay curve: one row per (budget, policy) with budget_mib, policy, hit_pct_cum,
    hit_pct_decode, read_mib (the reference's CSV columns); as columns (name -> values)
    without `frame`. `jobs` replays run at once (threads: the kernels release the GIL;
    default the CPUs), with the same figures as one at a time. `progress(done, total)` is
    called after each replay."""
    batches = trace if isinstance(trace, ReplayBatches) else prepare_batches(trace, turn)
    names = check_policies(policies)
    budgets = check_budgets(budgets_mib)
    cells = [(budget, name) for budget in budgets for name in names]
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise BmoeError(f"jobs must be >= 1, not {jobs}")
    tally = Tally(len(cells))
    chunk = whole_chunk(batches, future=any(POLICIES[name].needs_future for name in names))
    tally.count(chunk)
    if len(batches):
        replays = _replays(batches, cells, seed, jobs)
        try:
            replays.feed(chunk, tally, progress)
        finally:
            replays.close()
    columns = tally.curve_columns(cells)
    return as_frame(columns) if frame else columns


def check_budgets(budgets_mib: Iterable[float]) -> list[float]:
    budgets = [float(b) for b in budgets_mib]
    bad = [b for b in budgets if not b >= 0]
    if bad:
        raise BmoeError(f"budget {bad[0]:g} MiB is not a size (budgets are MiB >= 0)")
    if not budgets:
        raise BmoeError("no cache budget given")
    return [int(b) if b.is_integer() else b for b in budgets]


# ----------------------------------------------------------------------------- shape


def model_shape(trace: Trace, batches: ReplayBatches) -> dict[str, object]:
    """What the reference prints above its curve: model, layers, experts, k, MiB per
    expert, the batch count and T, the bytes one token cycle touches (sum over MoE layers
    of expert_bytes x k: the budget below which a cache cannot hold one token's experts)."""
    sizes = trace.expert_bytes()
    k = batches.k or int(batches.n_lookups[batches.decode].max(initial=0))
    model = str(trace.meta.get("model", "")).replace("\\", "/").rsplit("/", 1)[-1]
    per_expert = np.array(list(sizes.values()), dtype=np.float64) / MIB
    return {
        "model": model or None,
        "n_layer": batches.n_layer,
        "moe_layers": len(sizes),
        "n_expert": batches.n_expert,
        "k": k,
        "mib_per_expert": float(per_expert.max()) if len(per_expert) else None,
        "mib_per_expert_min": float(per_expert.min()) if len(per_expert) else None,
        "batches": len(batches),
        "prefill_batches": batches.n_prefill,
        "decode_batches": batches.n_decode,
        "lookups": int(batches.n_lookups.sum()),
        "t_mib": sum(sizes.values()) * k / MIB,
        "recorded_with_dropping": batches.recorded_with_dropping,
        **{f"recorded_{key}": value for key, value in (recorded_hit_rate(batches) or {}).items()},
    }


def decode_pivot(curve: pd.DataFrame, value: str = "hit_pct_decode") -> pd.DataFrame:
    """Budgets as rows, policies as columns (the reference's printed table)."""
    table = curve.pivot(index="budget_mib", columns="policy", values=value)
    table = table[list(dict.fromkeys(curve["policy"]))].reset_index()
    table.columns.name = None
    return table


# ----------------------------------------------------------------------------- validation


def recorded_hit_rate(batches: ReplayBatches) -> dict[str, float] | None:
    """The hit rate the run recorded (the residency column), counted like the replay: one
    lookup per distinct expert per batch."""
    if batches.recorded_hits is None:
        return None
    return summarize(batches, batches.recorded_hits)


def validate(
    batches: ReplayBatches,
    budget_mib: float,
    metrics_summary: dict | None = None,
    *,
    seed: int = 0,
    frame: bool = True,
) -> pd.DataFrame | dict[str, list]:
    """The LRU replay at the run's budget next to what the run recorded: the trace's
    residency column and, when given, the metrics summary's ``cache_hit_pct`` (as columns
    without `frame`)."""
    hits = simulate(batches, DEFAULT_POLICY, round(budget_mib * MIB), seed=seed)
    lru = summarize(batches, hits)
    columns = validation_columns(lru, recorded_hit_rate(batches), budget_mib, metrics_summary)
    return as_frame(columns) if frame else columns


def validation_table(
    lru: Mapping[str, float],
    recorded: Mapping[str, float] | None,
    budget_mib: float,
    metrics_summary: dict | None = None,
) -> pd.DataFrame:
    """:func:`validate`'s table from the LRU replay's and the residency column's hit rates
    (``hit_pct_cum``, ``hit_pct_decode``), however they were counted."""
    return as_frame(validation_columns(lru, recorded, budget_mib, metrics_summary))


def validation_columns(
    lru: Mapping[str, float],
    recorded: Mapping[str, float] | None,
    budget_mib: float,
    metrics_summary: dict | None = None,
) -> dict[str, list]:
    """:func:`validation_table` as columns (name -> values)."""
    rows = [
        {
            "source": f"{DEFAULT_POLICY} replay @ {budget_mib:g} MiB",
            "hit_pct_cum": lru["hit_pct_cum"],
            "hit_pct_decode": lru["hit_pct_decode"],
        }
    ]
    if recorded is not None:
        rows.append(
            {
                "source": "trace residency column",
                "hit_pct_cum": recorded["hit_pct_cum"],
                "hit_pct_decode": recorded["hit_pct_decode"],
            }
        )
    if metrics_summary is not None and metrics_summary.get("cache_hit_pct") is not None:
        rows.append(
            {
                "source": "metrics summary cache_hit_pct",
                "hit_pct_cum": float(metrics_summary["cache_hit_pct"]),
                "hit_pct_decode": float("nan"),
            }
        )
    columns: dict[str, list[Any]] = {name: [row[name] for row in rows] for name in rows[0]}
    columns["minus_replay_cum"] = [cum - lru["hit_pct_cum"] for cum in columns["hit_pct_cum"]]
    return columns


# ----------------------------------------------------------------------------- exact LRU MRC


@dataclass
class StackDistances:
    """Per lookup (replay order): the LRU byte stack distance under the batch semantics
    (``inf`` for a first lookup), whether it is a decode lookup, and its key's bytes.

    A lookup hits an LRU cache of B bytes exactly when ``distance <= B``; see
    :func:`lru_stack_distances`.
    """

    distance: np.ndarray
    decode: np.ndarray
    size: np.ndarray
    expert_set_bytes: int

    def hits_at(self, budget_bytes: float) -> tuple[int, int]:
        hit = self.distance <= budget_bytes
        return int(hit.sum()), int((hit & self.decode).sum())


def lru_stack_distances(batches: ReplayBatches) -> StackDistances:
    """Byte stack distances of every lookup, in one pass (Fenwick tree over touch order).

    With the batch semantics, the resident set of an LRU cache after each batch is the
    longest prefix of the recency stack whose bytes fit the budget, or the batch itself when
    the batch alone is larger (eviction never takes the batch, whose keys top the stack).
    So a lookup hits iff the bytes of the keys touched since its key's last touch, plus its
    own, fit the budget, or its key was in the previous batch. The distance stored is 0 in
    that second case (a hit at every budget), the byte distance otherwise: hit iff
    ``distance <= budget``, for every budget at once.
    """
    from bmoe.cache.kernels import distances

    b = batches
    out = distances.lru_byte_distances(b.bounds, b.look, b.rec, b.repeated, b.size, b.n_keys, True)
    seen = np.zeros(b.n_keys, dtype=bool)
    seen[b.look] = True
    total = int(b.size_of_keys()[seen].sum())
    decode = np.repeat(batches.decode, batches.n_lookups)
    size_per = np.repeat(
        batches.size.astype(np.min_scalar_type(int(batches.size.max()))), batches.n_lookups
    )
    if batches.n_expert:
        layer_bytes = dict(zip(batches.layer.tolist(), batches.size.tolist(), strict=True))
        expert_set = sum(layer_bytes.values()) * batches.n_expert
    else:
        expert_set = total
    return StackDistances(out, decode, size_per, int(max(expert_set, total)))


def lru_reuse_bytes(trace: RouteTrace) -> pd.DataFrame:
    """Every reuse with its classic LRU stack distance in bytes: the bytes of the distinct
    experts (of any layer) looked up between an expert's previous lookup and this one, the
    expert itself not counted. Lookups as in replay (one per distinct expert per batch, in
    first-seen order), but each taken at once rather than batch-wise. Columns layer,
    expert, step (of the lookup's first row), distance_bytes; lookup order."""
    import pandas as pd

    from bmoe.cache.kernels import distances

    columns = ["layer", "expert", "step", "distance_bytes"]
    if not len(trace.rows):
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    b = prepare_batches(trace, lookup_rows=True)
    dist = distances.lru_byte_distances(
        b.bounds, b.look, b.rec, b.repeated, b.size, b.n_keys, False
    )
    reused = np.isfinite(dist)
    codes = b.key_code[b.look[reused]]
    assert b.look_row is not None  # asked for above
    rows = b.look_row[reused]
    return pd.DataFrame(
        {
            "layer": codes >> EXPERT_BITS,
            "expert": codes & EXPERT_MASK,
            "step": trace.rows["step"].to_numpy()[rows].astype(np.int64),
            "distance_bytes": dist[reused].astype(np.int64),
        }
    )


def _at_most(values: np.ndarray, points: np.ndarray, *, owned: bool = False) -> np.ndarray:
    """How many of `values` are <= each of `points`: sorted in place when `owned` (a copy the
    caller made, such as a masked selection), else in one copy; then binary search."""
    ordered = values if owned else values.copy()
    ordered.sort()
    return np.searchsorted(ordered, points, side="right")


def mrc_at(dist: StackDistances, budgets_mib: Sequence[float] | np.ndarray) -> pd.DataFrame:
    """The exact LRU curve evaluated at `budgets_mib` (budget_mib, hit_pct_cum,
    hit_pct_decode, read_mib).

    A lookup hits at budget B iff its distance <= B, so each figure is a count of sorted
    distances at or below B: all lookups, the decode ones, and per expert size the hit
    bytes. One sorted copy at a time, so memory stays near the distances' own."""
    d = dist.distance
    budget_list = list(budgets_mib)
    points = np.asarray(budget_list, dtype=np.float64) * MIB
    hits = _at_most(d, points)
    dec = _at_most(d[dist.decode], points, owned=True)
    hit_bytes = np.zeros(len(points), dtype=np.float64)
    for size in np.unique(dist.size).tolist():
        hit_bytes += float(size) * _at_most(d[dist.size == size], points, owned=True)
    total_bytes = float(dist.size.sum(dtype=np.float64))
    n, n_dec = len(d), int(dist.decode.sum())
    import pandas as pd

    return pd.DataFrame(
        {
            "budget_mib": budget_list,
            "hit_pct_cum": 100.0 * hits / n if n else np.full(len(points), np.nan),
            "hit_pct_decode": 100.0 * dec / n_dec if n_dec else np.full(len(points), np.nan),
            "read_mib": (total_bytes - hit_bytes) / MIB,
        }
    )


def lru_mrc(dist: StackDistances) -> pd.DataFrame:
    """The exact LRU miss-ratio curve as steps: one row per budget where the hit rate
    changes, from 0 to the whole expert set (budget_mib, hit_pct_cum, hit_pct_decode,
    miss_pct_cum, read_mib)."""
    finite = dist.distance[np.isfinite(dist.distance)]
    finite.sort()
    finite = finite[np.r_[True, finite[1:] != finite[:-1]]] if len(finite) else finite
    points = np.concatenate([[0.0], finite, [float(dist.expert_set_bytes)]]) / MIB
    frame = mrc_at(dist, np.unique(points))
    frame.insert(2, "miss_pct_cum", 100.0 - frame["hit_pct_cum"])
    return frame


# ----------------------------------------------------------------------------- prefetch


def _previous_token_keys(
    trace: RouteTrace, turn: int | None
) -> dict[tuple[int, int, int], list[int]]:
    """(turn, step, layer) -> the distinct keys that cell routed, in slot order."""
    import pandas as pd

    rows = trace.rows
    turns = column_or(rows, "turn", 0)
    keep = np.ones(len(rows), dtype=bool) if turn is None else turns == turn
    t = turns[keep]
    step = column_or(rows, "step", 0)[keep]
    layer = column_or(rows, "layer", 0)[keep]
    slot = column_or(rows, "slot", 0)[keep]
    keys = (layer.astype(np.int64) << EXPERT_BITS) | column_or(rows, "expert", 0)[keep]
    order = np.lexsort((slot, layer, step, t))
    t, step, layer, keys = t[order], step[order], layer[order], keys[order]
    cell = pd.MultiIndex.from_arrays([t, step, layer])
    firsts = ~pd.DataFrame({"c": pd.factorize(cell)[0], "k": keys}).duplicated().to_numpy()
    t, step, layer, keys = t[firsts], step[firsts], layer[firsts], keys[firsts]
    new = np.ones(len(keys), dtype=bool)
    new[1:] = (t[1:] != t[:-1]) | (step[1:] != step[:-1]) | (layer[1:] != layer[:-1])
    starts = [*np.flatnonzero(new).tolist(), len(keys)]
    key_list = keys.tolist()
    return {
        (int(t[a]), int(step[a]), int(layer[a])): key_list[a:b]
        for a, b in itertools.pairwise(starts)
    }


def prefetch_replay(
    trace: RouteTrace,
    batches: ReplayBatches,
    policy: str,
    budget_mib: float,
    depth: int,
    *,
    seed: int = 0,
) -> dict[str, object]:
    """Replay the previous-token bet on top of `policy` at `budget_mib`: when a decode
    batch stages layer l of token t, prefetch what layers l+1..l+depth routed at token t-1
    (same turn; the first decode token bets on the last prompt token). Returns the
    prefetched experts and bytes, the share a later routing used while still resident, and
    the demand misses with and without the bet."""
    if depth < 1:
        raise BmoeError(f"prefetch depth must be >= 1, not {depth}")
    check_policies([policy])
    budget = round(budget_mib * MIB)
    base_hits = simulate(batches, policy, budget, seed=seed)
    cells = _previous_token_keys(trace, None)
    layers = sorted(set(batches.layer.tolist()))
    following = {x: layers[i + 1 : i + 1 + depth] for i, x in enumerate(layers)}
    size_of = dict(zip(batches.layer.tolist(), batches.size.tolist(), strict=True))

    cache = ExpertCache(budget, policy, n_layer=batches.n_layer, seed=seed)
    future = cache.needs_future
    uses: dict[int, list[int]] = {}
    if future:
        for i, look in enumerate(batches.lookups):
            for key in look:
                uses.setdefault(key, []).append(i)

    def next_use(keys: list[int], now: int) -> list[int]:
        out = []
        for key in keys:
            later = uses.get(key, ())
            j = bisect_right(later, now)
            out.append(later[j] if j < len(later) else NEVER)
        return out

    b_layer, b_turn, b_step = (a.tolist() for a in (batches.layer, batches.turn, batches.step))
    decode = batches.decode.tolist()
    sizes = batches.size.tolist()
    hits = np.zeros(len(batches), dtype=np.int64)
    for i, look in enumerate(batches.lookups):
        layer = b_layer[i]
        h, _, _, _ = cache.stage_keys(
            layer, look, batches.recency[i], sizes[i], batches.next_use[i] if future else None
        )
        hits[i] = len(h)
        if not decode[i]:
            continue
        for nxt in following[layer]:
            keys = cells.get((b_turn[i], b_step[i] - 1, nxt))
            if keys:
                cache.prefetch_keys(nxt, keys, size_of[nxt], next_use(keys, i) if future else None)
    st = cache.stats
    base = summarize(batches, base_hits)
    with_bet = summarize(batches, hits)
    n = int(batches.n_lookups.sum())
    base_misses = n - int(base_hits.sum())
    misses = n - int(hits.sum())
    return {
        "budget_mib": budget_mib,
        "policy": policy,
        "depth": depth,
        "prefetched": st["prefetched"],
        "prefetched_mib": st["prefetch_bytes"] / MIB,
        "used": st["prefetch_hits"],
        "used_pct": 100.0 * st["prefetch_hits"] / st["prefetched"]
        if st["prefetched"]
        else float("nan"),
        "demand_misses_base": base_misses,
        "demand_misses": misses,
        "demand_miss_change": misses - base_misses,
        "demand_miss_change_pct": 100.0 * (misses - base_misses) / base_misses
        if base_misses
        else float("nan"),
        "hit_pct_decode_base": base["hit_pct_decode"],
        "hit_pct_decode": with_bet["hit_pct_decode"],
        "read_mib_base": base["read_mib"],
        "read_mib": with_bet["read_mib"] + st["prefetch_bytes"] / MIB,
    }


def prefetch_table(
    trace: RouteTrace,
    batches: ReplayBatches,
    budgets_mib: Sequence[float],
    policies: Sequence[str],
    depth: int,
    *,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """:func:`prefetch_replay` for every budget and policy."""
    names = check_policies(policies)
    rows = []
    for b in budgets_mib:
        for p in names:
            rows.append(prefetch_replay(trace, batches, p, b, depth, seed=seed))
            if progress is not None:
                progress(len(rows), len(budgets_mib) * len(names))
    import pandas as pd

    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- post-mortem helpers

#: Budgets :func:`budgets_for` proposes, as fractions of the whole expert set.
BUDGET_FRACTIONS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1)


def _round_mib(value: float) -> float:
    """`value` to two significant digits below 10 MiB, to the whole MiB from there."""
    if value <= 0:
        return 0.0
    digits = max(0, 1 - int(np.floor(np.log10(value))))
    rounded = round(value, digits)
    return float(int(rounded)) if rounded >= 10 else float(rounded)


def budgets_for(trace: Trace, extra: Iterable[float] = ()) -> list[float]:
    """Cache budgets (MiB) that span this model: fractions of the whole expert set (every
    MoE layer's ``n_expert`` experts at their ``expert_bytes``), rounded (whole MiB from 10
    MiB, two significant digits below), plus `extra` (e.g. the budget the run recorded at),
    sorted and distinct."""
    sizes = trace.expert_bytes()
    n_expert = preamble_count(trace.meta, "n_expert")
    expert = trace.column("expert")
    if not n_expert and expert is not None and len(expert):
        n_expert = int(expert.max()) + 1
    total = sum(sizes.values()) * int(n_expert or 0) / MIB
    found = {_round_mib(total * f) for f in BUDGET_FRACTIONS} if total > 0 else set()
    found |= {float(b) for b in extra if b is not None and b == b and b >= 0}
    return sorted(found)


def recorded_vs_replay(
    trace: RouteTrace, budget_mib: float, metrics_summary: dict | None = None
) -> dict[str, float | None]:
    """The run's recorded hit rate next to what its own routing replays to at its budget:
    the trace's residency column (decode and all lookups), the simulated LRU cache
    (:func:`validate`), the exact LRU curve at that budget (:func:`mrc_at`) and, when given,
    the metrics summary's ``cache_hit_pct``."""
    batches = prepare_batches(trace)
    lru_figures = summarize(batches, simulate(batches, DEFAULT_POLICY, round(budget_mib * MIB)))
    table = validation_table(
        lru_figures, recorded_hit_rate(batches), budget_mib, metrics_summary
    ).set_index("source")
    lru = table.iloc[0]
    exact = mrc_at(lru_stack_distances(batches), [budget_mib]).iloc[0]
    recorded = recorded_hit_rate(batches) or {}

    def figure(value) -> float | None:
        return None if value is None or value != value else float(value)

    summary_hit = (metrics_summary or {}).get("cache_hit_pct")
    return {
        "budget_mib": float(budget_mib),
        "recorded_hit_pct_decode": figure(recorded.get("hit_pct_decode")),
        "recorded_hit_pct_cum": figure(recorded.get("hit_pct_cum")),
        "lru_hit_pct_decode": figure(lru["hit_pct_decode"]),
        "lru_hit_pct_cum": figure(lru["hit_pct_cum"]),
        "mrc_hit_pct_decode": figure(exact["hit_pct_decode"]),
        "mrc_hit_pct_cum": figure(exact["hit_pct_cum"]),
        "metrics_cache_hit_pct": figure(summary_hit) if summary_hit is not None else None,
    }


# ----------------------------------------------------------------------------- all at once


def replay(
    trace: Trace,
    budgets_mib: Sequence[float] = DEFAULT_BUDGETS_MIB,
    policies: Sequence[str] = REFERENCE_POLICIES,
    *,
    turn: int | None = None,
    validate_mib: float | None = None,
    metrics_summary: dict | None = None,
    mrc: bool = False,
    prefetch: int | None = None,
    seed: int = 0,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    batches: ReplayBatches | None = None,
    frames: bool = True,
) -> dict[str, pd.DataFrame | dict]:
    """Everything ``bmoe analyze replay`` prints, as one mapping of views.

    ``shape`` (figures), ``curve`` (long: one row per budget x policy), and as asked:
    ``validation`` (the LRU row at `validate_mib` next to the recorded hit rates), ``mrc``
    (the exact LRU curve, every step from 0 to the whole expert set) with ``mrc_budgets``
    (it at the chosen budgets), ``prefetch`` (the previous-token bet at depth `prefetch`,
    per budget x policy). `jobs` curve replays run at once (default the CPUs).

    `batches`, when given, are ``prepare_batches(trace, turn)`` cut already: a caller that
    holds them can let the trace's rows go (:func:`without_rows`) before the replays run,
    unless `prefetch` is asked for (it reads the rows; it takes a :class:`RouteTrace`).
    Without `frames`, ``curve`` and ``validation`` are columns (name -> values), so that
    printing them needs no pandas.
    """
    if batches is None:
        batches = prepare_batches(trace, turn)
    names = check_policies(policies)
    budgets = check_budgets(budgets_mib)
    views: dict[str, pd.DataFrame | dict] = {"shape": model_shape(trace, batches)}
    if validate_mib is not None:
        views["validation"] = validate(
            batches, validate_mib, metrics_summary, seed=seed, frame=frames
        )
    runs = len(budgets) * len(names) * (2 if prefetch is not None else 1)

    def curve_progress(done: int, total: int) -> None:
        if progress is not None:
            progress(done, runs)

    def prefetch_progress(done: int, total: int) -> None:
        if progress is not None:
            progress(total + done, runs)

    views["curve"] = replay_curve(
        batches, budgets, names, seed=seed, jobs=jobs, progress=curve_progress, frame=frames
    )
    if mrc:
        dist = lru_stack_distances(batches)
        views["mrc_budgets"] = mrc_at(dist, budgets)
        views["mrc"] = lru_mrc(dist)
    if prefetch is not None:
        assert isinstance(trace, RouteTrace), "the prefetch replay reads a RouteTrace's rows"
        views["prefetch"] = prefetch_table(
            trace, batches, budgets, names, prefetch, seed=seed, progress=prefetch_progress
        )
    return views


#: Multiples of one token's experts (the token cycle T) :func:`default_budgets` adds.
CYCLE_MULTIPLES = (0.5, 1, 2, 4)


def default_budgets(trace: Trace, extra: Iterable[float] = ()) -> list[float]:
    """The budgets a replay uses when none are given, scaled to the model: the fractions of
    the whole expert set of :func:`budgets_for` and multiples of the token cycle T (one
    token's k experts in every MoE layer, where LRU starts to keep a token's experts), below
    the whole expert set; :data:`DEFAULT_BUDGETS_MIB` when the trace has no expert sizes."""
    spanning = budgets_for(trace)
    if not spanning:
        return sorted({*map(float, DEFAULT_BUDGETS_MIB), *budgets_for(trace, extra)})
    k = trace.n_expert_used
    slot = trace.column("slot")
    if not k and slot is not None and len(slot):
        k = int(slot.max()) + 1
    cycle = sum(trace.expert_bytes().values()) * int(k or 0) / MIB
    cycles = {_round_mib(cycle * m) for m in CYCLE_MULTIPLES if 0 < cycle * m < spanning[-1]}
    return sorted({*spanning, *cycles, *budgets_for(trace, extra)})
