"""Replay of a trace larger than memory: the rows come block by block, each block is cut into
batches as :func:`~bmoe.analyze.replay.prepare_batches` cuts a whole trace, and every cache
(one per policy and budget) is carried from block to block by its kernel's state, so memory
stays that of one block plus the caches' per-key state.

Every policy streams with the whole-trace figures; so does the exact LRU curve (``mrc``): its
stack distances are counted per distinct distance, never held per lookup. ``belady`` needs
each key's next use: its lookups go to the spill store the caller gives (on disk, ~10 bytes a
lookup, with :class:`bmoe.formats.spill.SpillFolder`; in memory without one), the next uses
are found walking them back chunk by chunk, and a second pass replays them.

A batch must not straddle two blocks: the rows of the last batch group of a block (a decode
step, or a turn's whole prefill) wait for the next block. The rows must come in the order
the engine writes them (turns, then a turn's prefill before its decode steps, steps
ascending); a group seen again after a later one is an error, since the whole-trace replay
would have put it earlier.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from bmoe.analyze.replay import (
    ReplayBatches,
    Trace,
    check_budgets,
    check_policies,
    column_or,
    default_jobs,
    preamble_count,
    prepare_batches,
    validation_columns,
)
from bmoe.analyze.replay_run import Replays, Tally, as_frame
from bmoe.cache import DEFAULT_POLICY, EXPERT_BITS, POLICIES
from bmoe.cache.expert_cache import EXPERT_MASK
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteColumns
from bmoe.units import MIB

if TYPE_CHECKING:
    import pandas as pd

    from bmoe.cache.kernels import Chunk

#: a block of rows: a DataFrame, or numpy columns (name -> array)
Rows = dict[str, np.ndarray]


def _columns(block: pd.DataFrame | Mapping[str, np.ndarray]) -> Rows:
    """A block's columns as numpy arrays (no copy)."""
    if isinstance(block, Mapping):
        return dict(block)
    return {str(c): block[c].to_numpy() for c in block.columns}


def _n_rows(rows: Rows) -> int:
    return len(next(iter(rows.values()))) if rows else 0


def _groups(rows: Rows) -> np.ndarray:
    """Per row, its batch group packed in one int64 that grows in replay order: turn, then
    prefill (every step of it one group) before decode, then the decode step."""
    turn = column_or(rows, "turn", 0).astype(np.int64)
    decode = (column_or(rows, "phase", 1) != 0).astype(np.int64)
    step = column_or(rows, "step", 0).astype(np.int64)
    return ((turn + (1 << 15)) << 41) | (decode << 40) | (decode * (step + (1 << 31)))


def _whole_groups(
    blocks: Iterable[pd.DataFrame | Mapping[str, np.ndarray]],
) -> Iterator[tuple[Rows, int, int]]:
    """The rows of `blocks` with their first and last batch group (as :func:`_groups` packs
    them), cut so that no group straddles two: the rows of a block's last group wait for
    the next block."""
    from bmoe.cache.kernels import batches

    carry: Rows | None = None
    for block in blocks:
        rows = _columns(block)
        if carry is not None:
            rows = {c: np.concatenate([carry[c], v]) for c, v in rows.items()}
        n = _n_rows(rows)
        if not n:
            continue
        start, alone, lo, hi = batches.last_group(
            column_or(rows, "turn", 0), column_or(rows, "phase", 1), column_or(rows, "step", 0)
        )
        if alone:  # the last group's rows end the block, none before (rows in order): views
            yield {c: v[:start] for c, v in rows.items()}, lo, hi
            carry = {c: v[start:] for c, v in rows.items()}
            _check_carry(carry)
            continue
        groups = _groups(rows)
        last = groups == groups[-1]
        rest = groups[~last]  # not empty: a row before the last run is of another group
        yield {c: v[~last] for c, v in rows.items()}, int(rest.min()), int(rest.max())
        carry = {c: v[last] for c, v in rows.items()}
        _check_carry(carry)
    if carry is not None:  # one group, not empty
        group = int(_groups(carry)[0])
        yield carry, group, group


#: Rows of one batch past which what holding it takes is checked (a decode step of a large
#: model is some thousand rows; a long prompt's prefill some million).
_CARRY_CHECKED = 1 << 20


def _check_carry(carry: Rows) -> None:
    """Refuse a batch that has outgrown what the process may hold while it waits for its
    end (the blocks it is joined with, their copies and the replay: 16x the rows): a few MB
    can declare hundreds of millions of rows of one step."""
    if _n_rows(carry) <= _CARRY_CHECKED:
        return
    from bmoe.formats.inputs import readable_bytes

    room = readable_bytes()
    held = sum(int(v.nbytes) for v in carry.values())
    if room is not None and 16 * held > room:
        phase = "decode step" if int(column_or(carry, "phase", 1)[0]) else "prefill"
        raise BmoeError(
            f"one batch of the trace ({phase} of turn {int(column_or(carry, 'turn', 0)[0])}) "
            f"holds {_n_rows(carry):,} rows and counting: more than a streamed replay may hold at "
            f"once here ({room >> 20} MiB free); a batch is one step's routings, or a prompt's"
        )


class _Blocks:
    """The blocks of a stream cut into chunks whose key ids are the whole stream's:
    ``expert * n_parts + part`` (`part` the layer's index among the preamble's layers), so
    that ids met later, even beyond the declared experts, only add ids at the end. It
    counts what the shape view reports and checks the order of the rows."""

    def __init__(self, trace: Trace, part_of: np.ndarray, n_declared: int | None) -> None:
        self.trace = trace
        head = trace if isinstance(trace, RouteColumns) else RouteColumns.of(trace)
        self.head = dataclasses.replace(head, columns={})
        self.name = trace.path or "trace"
        self.part_of = part_of
        self.n_parts = int(part_of.max()) + 1
        self.n_declared = n_declared
        self.n_e = n_declared or 1  # experts the key ids have room for
        self.done = -1  # the last batch group cut
        self.warned = False
        self.residency = True  # every block has the residency column
        self.seen_layers: set[int] = set()
        names = ("batches", "prefill", "decode", "k", "recorded", "recorded_decode",
                 "recorded_bytes", "dropped")  # fmt: skip
        self.counts = dict.fromkeys(names, 0)

    @property
    def n_keys(self) -> int:
        return self.n_e * self.n_parts

    def cut(self, rows: Rows, first: int, last: int) -> Chunk | None:
        """The chunk of `rows` (whole batch groups, from group `first` to `last`), None when
        there are none; :attr:`n_keys` grows when an expert id needs more room."""
        from bmoe.cache.kernels import Chunk

        if not _n_rows(rows):
            return None
        if first <= self.done:
            raise BmoeError(
                f"{self.name}: routing rows out of the engine's order (a step or prefill seen "
                "again after a later one); replay the trace whole instead"
            )
        self.done = last
        b = prepare_batches(dataclasses.replace(self.head, columns=rows))
        code = b.key_code
        to_global = (code & EXPERT_MASK) * self.n_parts + self.part_of[code >> EXPERT_BITS]
        # every row is looked up: the highest expert id looked up is the column's
        top = int(np.max(rows["expert"])) if "expert" in rows else 0
        if top >= self.n_e:
            if self.n_declared and not self.warned:
                experts = code[b.look] & EXPERT_MASK
                first = int(experts[experts >= self.n_declared][0])
                warnings.warn(
                    f"{self.name}: expert id {first} is outside 0..{self.n_declared - 1} (the "
                    f"preamble's n_expert={self.n_declared}); it is replayed, but figures "
                    "against n_expert (shares of the expert set, its size) do not hold",
                    stacklevel=3,
                )
                self.warned = True
            self.n_e = max(top + 1, 2 * self.n_e)
        self._count(b, rows)
        ids = to_global.astype(np.int32)
        look = ids[b.look]
        rec = ids[b.rec] if b.repeated.any() else look  # read only where a batch repeats
        return Chunk(
            b.bounds, look, rec, b.repeated, b.size, self.part_of[b.layer].astype(np.int64),
            b.decode,
        )  # fmt: skip

    def _count(self, b: ReplayBatches, rows: Rows) -> None:
        counts = self.counts
        self.seen_layers.update(np.unique(b.layer).tolist())
        n = b.n_lookups
        counts["batches"] += len(b)
        counts["prefill"] += b.n_prefill
        counts["decode"] += b.n_decode
        counts["k"] = max(counts["k"], int(n[b.decode].max(initial=0)))
        counts["dropped"] |= "dropped" in rows and bool(np.any(rows["dropped"] != 0))
        if b.recorded_hits is None:
            self.residency = False
        else:
            counts["recorded"] += int(b.recorded_hits.sum())
            counts["recorded_decode"] += int(b.recorded_hits[b.decode].sum())
            counts["recorded_bytes"] += int((b.recorded_hits * b.size).sum())


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
        from bmoe.cache.kernels import distances

        self.state = distances.distances_state(n_keys, 0)
        self.n_keys = n_keys
        self.key_size = key_size
        self.groups: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = {}
        self.lookups = self.decode_lookups = self.total_bytes = 0

    def grow(self, n_keys: int) -> None:
        from bmoe.cache.kernels import distances, widened

        fresh = distances.distances_state(n_keys, 0)
        self.state = widened(self.state, fresh, ("last", "prevb"), self.n_keys)
        self.n_keys = n_keys

    @property
    def seen_bytes(self) -> int:
        """The bytes of every key looked up so far."""
        return self.state.seen_bytes

    def feed(self, c: Chunk) -> None:
        from bmoe.cache.kernels import distances

        tree = distances.distances_restart(self.state, self.key_size(self.n_keys), len(c.look))
        self.state = self.state._replace(tree=tree)
        dist = distances.lru_byte_distances_continue(
            c.bounds, c.look, c.rec, c.repeated, c.size, True, self.state
        )
        n_lookups = np.diff(c.bounds)
        self.lookups += len(dist)
        self.decode_lookups += int(n_lookups[c.decode].sum())
        self.total_bytes += int((n_lookups * c.size).sum())
        for size in np.unique(c.size).tolist():
            for decode in (False, True):
                pick = (c.size == size) & (c.decode == decode)
                if not pick.any():
                    continue
                d = dist[np.repeat(pick, n_lookups)]
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
        import pandas as pd

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


class SpillStore(Protocol):
    """Where the lookups of the policies that read the future wait: numeric columns by name,
    appended to, read back by slice, reserved and written in place
    (:class:`bmoe.formats.spill.SpillFolder` keeps them on disk, :class:`MemorySpill` in
    memory). ``where`` names it in an error."""

    @property
    def where(self) -> str: ...

    def append(self, name: str, values: np.ndarray) -> None: ...

    def read(self, name: str, dtype: np.dtype, start: int, n: int) -> np.ndarray: ...

    def reserve(self, name: str, dtype: np.dtype, n: int) -> None: ...

    def write(self, name: str, start: int, values: np.ndarray) -> None: ...


class MemorySpill:
    """A :class:`SpillStore` in memory (what a replay uses when it is given no other)."""

    where = "memory"

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}
        self._whole: dict[str, np.ndarray] = {}

    def append(self, name: str, values: np.ndarray) -> None:
        self._whole.pop(name, None)
        self._parts.setdefault(name, []).append(np.array(values, copy=True))

    def _column(self, name: str, dtype: np.dtype) -> np.ndarray:
        if name not in self._whole:
            parts = self._parts.pop(name, [])
            self._whole[name] = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
        return self._whole[name]

    def read(self, name: str, dtype: np.dtype, start: int, n: int) -> np.ndarray:
        return self._column(name, dtype)[start : start + n].astype(dtype, copy=True)

    def reserve(self, name: str, dtype: np.dtype, n: int) -> None:
        self._parts.pop(name, None)
        self._whole[name] = np.zeros(n, dtype=dtype)

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        self._whole[name][start : start + len(values)] = values


class _Spill:
    """The chunks of the policies that read the future (``belady``), put in `store` as they
    come (per lookup its key; per batch its lookups, expert size and phase) and given back
    once the next uses are known: found walking the chunks from the last to the first.
    Memory stays one chunk and a table per key when the store is on disk (~10 bytes a
    lookup there)."""

    COLUMNS: ClassVar[dict[str, type]] = {"look": np.int32, "count": np.int32, "size": np.int64,
                                          "decode": np.bool_, "next": np.int32}  # fmt: skip

    def __init__(self, store: SpillStore) -> None:
        self.store = store
        self.spans: list[tuple[int, int, int, int]] = []  # lookup and batch offset, counts
        self.lookups = self.batches = 0

    def add(self, c: Chunk) -> None:
        parts = {"look": c.look, "count": np.diff(c.bounds), "size": c.size, "decode": c.decode}
        try:
            for name, values in parts.items():
                self.store.append(name, np.asarray(values, dtype=self.COLUMNS[name]))
        except OSError as exc:
            raise BmoeError(
                f"belady's lookups cannot be written to {self.store.where} ({exc.strerror}); "
                "point TMPDIR at a larger disk or leave belady out"
            ) from None
        self.spans.append((self.lookups, self.batches, len(c.look), len(c)))
        self.lookups += len(c.look)
        self.batches += len(c)

    def _read(self, name: str, start: int, n: int) -> np.ndarray:
        return self.store.read(name, np.dtype(self.COLUMNS[name]), start, n)

    def _bounds(self, b0: int, n_b: int) -> np.ndarray:
        bounds = np.zeros(n_b + 1, dtype=np.int64)
        np.cumsum(self._read("count", b0, n_b), out=bounds[1:])
        return bounds

    def chunks(self, n_keys: int) -> Iterator[Chunk]:
        """The chunks in order, each lookup with its next use (numbered over the whole)."""
        from bmoe.cache.kernels import Chunk, batches

        nextb = np.full(n_keys, self.batches, dtype=np.int32)
        self.store.reserve("next", np.dtype(self.COLUMNS["next"]), self.lookups)
        for at, b0, n, n_b in reversed(self.spans):
            look = self._read("look", at, n)
            nu = batches.next_uses_continue(self._bounds(b0, n_b), look, nextb, b0)
            self.store.write("next", at, np.asarray(nu, dtype=self.COLUMNS["next"]))
        none = np.zeros(max((n_b for *_, n_b in self.spans), default=0), dtype=np.int64)
        for at, b0, n, n_b in self.spans:
            look = self._read("look", at, n)
            yield Chunk(
                self._bounds(b0, n_b), look, look, none[:n_b].astype(bool),
                self._read("size", b0, n_b), none[:n_b], self._read("decode", b0, n_b),
                first=b0, next_use=self._read("next", at, n), n_total=self.batches,
                total_lookups=self.lookups,
            )  # fmt: skip


def _shape(
    trace: Trace,
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
    trace: Trace,
    blocks: Iterable[pd.DataFrame | Mapping[str, np.ndarray]],
    budgets_mib: Sequence[float],
    policies: Sequence[str] = (DEFAULT_POLICY,),
    *,
    mrc: bool = False,
    validate_mib: float | None = None,
    metrics_summary: dict | None = None,
    seed: int = 0,
    jobs: int | None = None,
    frames: bool = True,
    spill: SpillStore | None = None,
) -> dict[str, pd.DataFrame | dict]:
    """The replay views of a trace whose preamble is `trace` (its rows are not read) and
    whose rows are `blocks` (DataFrames or numpy columns), in file order (e.g.
    :func:`~bmoe.formats.route.iter_route_rows`, :func:`~bmoe.formats.route.iter_route_columns`):
    ``shape`` (:func:`~bmoe.analyze.replay.model_shape`'s figures), ``curve``
    (:func:`~bmoe.analyze.replay.replay_curve`'s rows, same figures) and, with `mrc`,
    ``mrc_budgets`` and ``mrc`` (:func:`~bmoe.analyze.replay.mrc_at` at the budgets and
    :func:`~bmoe.analyze.replay.lru_mrc`); with `validate_mib`, ``validation``
    (:func:`~bmoe.analyze.replay.validate`'s table). `jobs` replays run at once on each block.
    The policies that read the future (``belady``) keep their lookups in `spill` (a
    :class:`SpillStore`; in memory when None: pass a
    :class:`bmoe.formats.spill.SpillFolder` to keep them on disk) and replay them after the
    pass.

    The per-layer policies (``layer``, ``layerlfu``) split the budget by the preamble's
    ``n_layer`` (else the highest layer with an expert size, plus one). Expert ids at or
    beyond the preamble's ``n_expert`` are replayed and warned about once
    (:class:`UserWarning`). Without `frames`, ``curve`` and ``validation`` are columns
    (name -> values), as :func:`~bmoe.analyze.replay.replay` gives them."""
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
    n_layer = preamble_count(trace.meta, "n_layer") or int(layers.max()) + 1
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise BmoeError(f"jobs must be >= 1, not {jobs}")

    def key_size(n_keys: int) -> np.ndarray:
        return np.tile(part_bytes, n_keys // n_parts)

    cells = [(budget, p) for budget in budgets for p in names]
    if validate_mib is not None:  # one more replay, at the run's budget, off the curve
        cells.append((validate_mib, DEFAULT_POLICY))
    cut = _Blocks(trace, part_of, n_declared)
    needs_future = any(POLICIES[p].needs_future for _, p in cells)
    deferred = _Spill(MemorySpill() if spill is None else spill) if needs_future else None
    replays = Replays(cells, cut.n_keys, n_parts, n_layer, part_keys=cut.n_e, seed=seed,
                      jobs=jobs, deferred=deferred)  # fmt: skip
    distances = _Distances(cut.n_keys, key_size) if mrc else None
    tally = Tally(len(cells))
    try:
        for rows, first, last in _whole_groups(blocks):
            chunk = cut.cut(rows, first, last)
            if chunk is None:
                continue
            if cut.n_keys > replays.setup.n_keys:
                replays.grow(cut.n_keys, cut.n_e)
                if distances is not None:
                    distances.grow(cut.n_keys)
            tally.count(chunk)
            if distances is not None:
                distances.feed(chunk)
            replays.feed(chunk, tally)
        if tally.lookups:
            replays.finish(tally)
    finally:
        replays.close()
    if not tally.lookups:
        raise BmoeError(f"{name}: no routing rows to replay")
    totals = {"lookups": tally.lookups, "decode_lookups": tally.decode_lookups,
              "bytes": tally.bytes}  # fmt: skip
    shape = _shape(trace, cut.counts, totals, max(cut.seen_layers), cut.residency)
    views: dict[str, pd.DataFrame | dict] = {"shape": shape}
    if validate_mib is not None:  # the last cell
        lru = tally.figures(len(cells) - 1)
        recorded: dict[str, Any] | None = None
        if cut.residency:
            recorded = {k: shape[f"recorded_{k}"] for k in ("hit_pct_cum", "hit_pct_decode")}
        table = validation_columns(lru, recorded, validate_mib, metrics_summary)
        views["validation"] = as_frame(table) if frames else table
    curve = tally.curve_columns(cells[: len(budgets) * len(names)])
    views["curve"] = as_frame(curve) if frames else curve
    if distances is not None:
        seen = distances.seen_bytes
        expert_set = sum(sizes[x] for x in cut.seen_layers) * n_declared if n_declared else seen
        views["mrc_budgets"] = distances.at(budgets)
        views["mrc"] = distances.steps(max(expert_set, seen))
    return views
