"""The step and cell machinery the route views share: rows as numpy columns, the selection
of a phase, turn, steps and layers (:func:`select`), and the *step sequence* every view reads
(:class:`StepSequence`: per layer its cells ordered by step, the rows sorted once). The views
themselves are in :mod:`bmoe.analyze.route`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import numpy as np

from bmoe.analyze import route_order, route_weights
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteColumns, RouteTrace

if TYPE_CHECKING:
    import pandas as pd

PHASES = {"prefill": 0, "decode": 1}
ALL = "ALL"

Trace: TypeAlias = "RouteTrace | RouteColumns | pd.DataFrame"
#: Rows as name -> numpy array (all of one length).
Columns: TypeAlias = dict[str, np.ndarray]


@dataclass(frozen=True)
class IntsWithGaps:
    """Integers some of which are unknown (the reuse distance of a layer whose experts never
    came back): the values and which of them are missing. A view's column like a numpy
    array as far as the views and their rendering use one (its dtype, its length, indexing,
    ``tolist`` with None for a gap), without numpy's masked arrays, whose import alone
    costs a short command about 12 ms."""

    values: np.ndarray
    missing: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: Any) -> Any:
        """One entry (None where missing), or the entries `key` picks as IntsWithGaps."""
        if isinstance(key, int | np.integer):
            return None if self.missing[key] else self.values[key]
        return IntsWithGaps(self.values[key], self.missing[key])

    def tolist(self) -> list[int | None]:
        return [None if gap else v for v, gap in zip(self.values.tolist(), self.missing.tolist(),
                                                      strict=True)]  # fmt: skip

    @staticmethod
    def concatenate(parts: Sequence[np.ndarray | IntsWithGaps]) -> IntsWithGaps:
        """Parts one after the other (a plain array's entries are all known)."""
        values = np.concatenate([p.values if isinstance(p, IntsWithGaps) else p for p in parts])
        missing = [p.missing if isinstance(p, IntsWithGaps) else np.zeros(len(p), dtype=bool)
                   for p in parts]  # fmt: skip
        return IntsWithGaps(values, np.concatenate(missing))


#: A view as name -> numpy array, one entry per row of the view; an :class:`IntsWithGaps`
#: holds integers with gaps (``Int64`` in the DataFrame), an object array mixes numbers and
#: text.
View: TypeAlias = dict[str, Any]


def as_frame(view: View) -> pd.DataFrame:
    """A view as a DataFrame (integers with gaps become ``Int64`` with missing values)."""
    import pandas as pd

    data: dict[str, Any] = {}
    for name, values in view.items():
        if isinstance(values, IntsWithGaps):
            data[name] = pd.arrays.IntegerArray(
                np.asarray(values.values, dtype=np.int64), values.missing.copy()
            )
        elif name == "layer" and values.dtype == object:  # numbers and ALL: stays mixed
            data[name] = pd.Series(values, dtype=object)
        else:
            data[name] = values
    return pd.DataFrame(data, copy=False)


def columns_of(rows: pd.DataFrame | Columns) -> Columns:
    """Rows as columns (a frame's arrays, not copied)."""
    if isinstance(rows, dict):
        return rows
    return {str(c): rows[c].to_numpy() for c in rows.columns}


def trace_columns(trace: Trace) -> Columns:
    if isinstance(trace, RouteColumns):
        return trace.columns
    return columns_of(trace.rows if isinstance(trace, RouteTrace) else trace)


def _n_rows(cols: Columns) -> int:
    return len(next(iter(cols.values()))) if cols else 0


# ----------------------------------------------------------------------------- selection


@overload
def select(
    trace: RouteTrace,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    max_steps: int | None = None,
    *,
    consume: bool = False,
) -> RouteTrace: ...


@overload
def select(
    trace: RouteColumns,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    max_steps: int | None = None,
    *,
    consume: bool = False,
) -> RouteColumns: ...


def select(
    trace: RouteTrace | RouteColumns,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    max_steps: int | None = None,
    *,
    consume: bool = False,
) -> RouteTrace | RouteColumns:
    """The trace restricted to one phase (``decode``, ``prefill`` or ``all``), one turn,
    some layers, some steps (the ``step`` column's values) and at most the first
    `max_steps` steps; rows come back in step-sequence order (layer, turn, step, slot).

    ``consume=True`` moves the rows out of `trace` column by column as the selection is
    built (`trace` keeps its columns, with no rows, when the selection is not empty): the
    peak is one frame instead of two, for callers done with the whole trace. The selection
    has the trace's form: a RouteTrace gives a RouteTrace, RouteColumns give RouteColumns."""
    return _select(trace, phase, turn, layers, steps, max_steps, consume)[0]


def select_sequence(
    trace: RouteColumns,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    max_steps: int | None = None,
    *,
    consume: bool = False,
) -> tuple[RouteColumns, StepSequence]:
    """:func:`select`, and the step sequence of the selection's rows made from the order the
    selection worked out: the views take it (``view_columns(..., sequence=)``) instead of
    working out the order of the selected rows again. Its step codes are the whole trace's
    (the same order and the same cells as the selection's own)."""
    selected, ordered = _select(trace, phase, turn, layers, steps, max_steps, consume)
    return selected, _sequence(ordered, selected.columns)


def _select(
    trace: RouteTrace | RouteColumns,
    phase: str,
    turn: int | None,
    layers: Collection[int] | None,
    steps: Collection[int] | None,
    max_steps: int | None,
    consume: bool,
) -> tuple[Any, Ordered | None]:
    frame = trace.rows if isinstance(trace, RouteTrace) else None
    cols = trace.columns if isinstance(trace, RouteColumns) else columns_of(trace.rows)
    if consume and frame is not None:
        cols = dict(cols)  # its own dict, emptied as the selection is built
    keep = kept_rows(cols, phase, turn, layers, steps)
    if max_steps is not None and keep.any():
        within = np.flatnonzero(keep)
        code = _step_codes(_key_columns(cols, within))
        keep[within[~np.isin(code, np.unique(code)[:max_steps])]] = False
        del within, code
    if consume and keep.any():  # the trace keeps its columns, with no rows
        if isinstance(trace, RouteTrace):
            trace.rows = trace.rows.iloc[:0].copy()  # not a view holding every row
            del frame
        else:
            # arrays of their own: an empty view would keep its base (every row) alive
            trace.columns = {c: np.empty(0, dtype=a.dtype) for c, a in cols.items()}
    # the selected rows' phase is the one chosen: no need to gather it
    known = {"phase": PHASES[phase]} if phase in PHASES and "phase" in cols else None
    ordered = _sorted_rows(cols, keep, consume=consume, known=known)
    rows = ordered[0] if ordered is not None else {c: a[:0] for c, a in cols.items()}
    if isinstance(trace, RouteColumns):
        return dataclasses.replace(trace, columns=rows), ordered
    import pandas as pd

    return dataclasses.replace(trace, rows=pd.DataFrame(rows, copy=False)), ordered


def kept_rows(
    rows: Columns,
    phase: str,
    turn: int | None,
    layers: Collection[int] | None,
    steps: Collection[int] | None,
) -> np.ndarray:
    """The rows of one phase (or all), one turn, some layers and some steps, as a mask."""
    keep = np.ones(_n_rows(rows), dtype=bool)
    if phase != "all":
        if phase not in PHASES:
            raise BmoeError(f"unknown phase {phase!r} (choose decode, prefill or all)")
        if "phase" in rows:
            keep &= rows["phase"] == PHASES[phase]
    if turn is not None and "turn" in rows:
        keep &= rows["turn"] == turn
    if layers is not None:
        keep &= np.isin(rows["layer"], np.fromiter(layers, dtype=np.int64))
    if steps is not None:
        keep &= np.isin(rows["step"], np.fromiter(steps, dtype=np.int64))
    return keep


_KEY_COLUMNS = ("turn", "phase", "step", "layer", "slot")


def _key_columns(rows: Columns, within: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The columns that order rows (those present), restricted to the positions `within`."""
    cols = {c: rows[c] for c in _KEY_COLUMNS if c in rows}
    return cols if within is None else {c: a[within] for c, a in cols.items()}


def _step_codes(cols: Mapping[str, Any]) -> np.ndarray:
    """One integer per row, increasing with (turn, step, phase): the step axis (int32 when
    it fits, to keep million-row traces small). `cols`: a frame or its key columns."""
    step = np.asarray(cols["step"])
    turn = np.asarray(cols["turn"]) if "turn" in cols else None
    lo, hi = int(step.min()), int(step.max())
    span = hi - lo + 1
    turns = int(turn.max()) + 1 if turn is not None else 1
    small = turns * span * 2 < 2**31 and (turn is None or int(turn.min()) >= 0)
    kind: type[np.signedinteger] = np.int32 if small else np.int64
    code: np.ndarray = step.astype(kind)
    code -= lo
    if turn is not None and (turns > 1 or int(turn.min()) != 0):  # (all turn 0: no change)
        code += turn.astype(kind) * span
    code *= 2
    if "phase" in cols:
        np.add(code, np.asarray(cols["phase"]), out=code, casting="unsafe")
    return code


def count_steps(trace: Trace) -> int:
    """Distinct steps (token positions, per turn and phase) in the trace's rows."""
    rows = trace_columns(trace)
    return _count_distinct(_step_codes(_key_columns(rows))) if _n_rows(rows) else 0


def _count_distinct(values: np.ndarray) -> int:
    """len(np.unique(values)), without sorting when the values span a small range."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 4 * len(values) + 1024:
        return len(np.unique(values))
    seen = np.zeros(hi - lo + 1, dtype=bool)
    seen[values - values.dtype.type(lo)] = True
    return int(np.count_nonzero(seen))


def caveats(
    trace: RouteTrace | RouteColumns,
    selected: RouteTrace | RouteColumns | None = None,
    phase: str | None = None,
) -> list[str]:
    """What a reader must know before trusting the figures of `selected` (default: `trace`):
    dropping was on, the preamble lacks sizes, or the selection left nothing."""
    selected = trace if selected is None else selected
    rows = trace_columns(selected)
    n = _n_rows(rows)
    notes: list[str] = []
    if not n:
        all_rows = trace_columns(trace)
        if not _n_rows(all_rows):
            return ["the trace has no routing rows"]
        steps, layer = all_rows["step"], all_rows["layer"]
        if phase and phase != "all" and "phase" in all_rows:
            in_phase = all_rows["phase"] == PHASES.get(phase, -1)
            if not in_phase.any():
                have = ", ".join(
                    f"{int(np.count_nonzero(all_rows['phase'] == code))} {name}"
                    for name, code in PHASES.items()
                )
                return [f"no {phase} rows in this trace ({have} rows); try --phase all"]
            steps, layer = steps[in_phase], layer[in_phase]
        layers = np.unique(layer)
        return [
            f"the selection (turn, layers, steps) leaves no rows; the {phase or 'trace'} rows "
            f"span steps {steps.min()}-{steps.max()} and layers {_ranges(list(map(int, layers)))}"
        ]
    if "dropped" in rows:
        dropped = int(np.count_nonzero(rows["dropped"]))
        if dropped:
            notes.append(
                f"cache-aware dropping was ON: {dropped} of {n} routings "
                f"({100 * dropped / n:.1f}%) were discarded and never read. The figures "
                "describe what the ROUTER asked for; a drop replay shows what it cost."
            )
    layers, _ = _small_unique(rows["layer"])
    sizes = trace.expert_bytes()
    missing = [int(x) for x in layers if int(x) not in sizes]
    if missing:
        notes.append(
            f"the preamble has no expert_bytes for layer{'s' if len(missing) > 1 else ''} "
            f"{_ranges(missing)}: working-set bytes and expert MiB are unknown there"
        )
    if phase and phase != "all" and "phase" not in trace_columns(trace):
        notes.append("the trace has no phase column: every row is analysed as one phase")
    if "weight" in rows and not np.isfinite(rows["weight"]).any():
        notes.append("no routing weights were recorded (all nan): entropy is unknown")
    if "residency" not in rows:
        notes.append("the trace has no residency column: cache outcomes are unknown")
    return notes


def _ranges(values: Sequence[int]) -> str:
    """``0-3,7`` for [0, 1, 2, 3, 7]."""
    out: list[str] = []
    start: int | None = None
    prev: int | None = None
    for v in [*sorted(values), None]:
        if start is not None and prev is not None and (v is None or v != prev + 1):
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if v is not None and start is None:
            start = v
        prev = v
    return ",".join(out)


# ----------------------------------------------------------------------------- the sequence


@dataclass
class StepSequence:
    """Rows in step-sequence order with the cell structure precomputed once."""

    rows: Columns
    layer: np.ndarray  # per row
    layer_idx: np.ndarray  # per row: index into `layers`
    layers: np.ndarray  # distinct layers, ascending
    expert: np.ndarray  # per row
    n_expert: int  # expert ids are < n_expert
    gcell: np.ndarray  # per row: global cell id (cells are contiguous)
    cell_start: np.ndarray  # per cell: first row
    cell_layer_idx: np.ndarray  # per cell
    cell_index: np.ndarray  # per cell: index in its layer's sequence
    cell_step_code: np.ndarray  # per cell: position on the step axis
    cells_per_layer: np.ndarray  # per layer
    n_steps: int  # distinct steps over all layers
    _by_key: tuple[np.ndarray, np.ndarray] | None = None
    _weights: tuple[np.ndarray, ...] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_rows(self) -> int:
        return len(self.expert)

    def layer_blocks(self) -> list[tuple[int, int]]:
        """(first row, end row) of each layer's rows, in layer order."""
        if not self.n_rows:
            return []
        # each layer starts at its first cell (every layer has one): no pass over the rows
        first_cell = np.concatenate([[0], np.cumsum(self.cells_per_layer)[:-1]])
        bounds = np.r_[self.cell_start[first_cell], self.n_rows]
        return list(itertools.pairwise(bounds.tolist()))

    @property
    def cell(self) -> np.ndarray:
        """Per row: the index of its cell in its layer's sequence (made when asked for)."""
        return self.cell_index[self.gcell]

    def key_type(self) -> type[np.signedinteger]:
        """The integer type of :meth:`key`."""
        return np.int16 if self.n_layers * self.n_expert < 32768 else np.int32

    def key(self) -> np.ndarray:
        """(layer, expert) as one small integer per row."""
        kind = self.key_type()
        return (
            self.layer_idx.astype(kind) * kind(self.n_expert) + self.expert.astype(kind)
        ).astype(kind, copy=False)

    def cell_weights(self) -> tuple[np.ndarray, ...]:
        """Per cell, from the ``weight`` column (made once, for sanity and entropy): whether
        every weight is known, the sum of the known weights, the sum of w*log2(w) over the
        positive ones, and the largest known weight (-inf for none)."""
        if self._weights is None:
            weight = self.rows["weight"]
            n_cells = len(self.cell_start)
            complete = np.empty(n_cells, dtype=bool)
            total, acc, top = np.empty(n_cells), np.empty(n_cells), np.empty(n_cells)
            sizes = np.diff(self.cell_start)
            short = self.n_rows - int(self.cell_start[-1]) <= route_weights.MAX_CELL and (
                not len(sizes) or int(sizes.max()) <= route_weights.MAX_CELL
            )
            # cells are contiguous; blocks of 64 Ki rows: the float64 weights (then their
            # logarithms) of each block in one small scratch array, reused, rather than
            # megabytes of fresh pages
            scratch = np.empty(0)
            for a, b, lo, hi in cell_blocks(self, 1 << 16):
                if len(scratch) < hi - lo:
                    scratch = np.empty(hi - lo)
                w = scratch[: hi - lo]
                w[:] = weight[lo:hi]
                starts = self.cell_start[a:b] - lo
                outputs = complete[a:b], total[a:b], acc[a:b], top[a:b]
                if short and route_weights.cell_weights.takes(weight[lo:hi], w, starts, *outputs):
                    with np.errstate(divide="ignore", invalid="ignore"):
                        logs = np.log2(w, out=w)  # numpy's logarithms: the same digits
                    route_weights.cell_weights(weight[lo:hi], logs, starts, *outputs)
                    continue
                known = ~np.isnan(w)
                if known.all():  # the usual trace: the masks change nothing
                    complete[a:b] = True
                    wk = known_w = w
                else:
                    complete[a:b] = np.logical_and.reduceat(known, starts)
                    wk, known_w = np.where(known, w, 0.0), np.where(known, w, -np.inf)
                total[a:b] = np.add.reduceat(wk, starts)
                pos = wk > 0
                if pos.all():
                    wlogw = wk * np.log2(wk)
                else:  # 0 where a weight is not positive (log2(1) is 0): no masked copies
                    wlogw = np.where(pos, wk, 0.0) * np.log2(np.where(pos, wk, 1.0))
                acc[a:b] = np.add.reduceat(wlogw, starts)
                top[a:b] = np.maximum.reduceat(known_w, starts)
            self._weights = (complete, total, acc, top)
        return self._weights

    def by_key(self) -> tuple[np.ndarray, np.ndarray]:
        """Row order sorted by (layer, expert), stable (so cell order within); and the keys."""
        if self._by_key is None:
            n = self.n_rows
            order: np.ndarray = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
            n_keys = self.n_layers * self.n_expert
            ordered = np.empty(n, dtype=self.key_type())
            args = (self.layer_idx, self.expert, self.n_expert, n_keys, order, ordered)
            if n and route_order.key_order.takes(*args):  # by counting, the keys made there
                route_order.key_order(*args)
                self._by_key = (order, ordered)
                return self._by_key
            key = self.key()
            # rows are layer-major: sorting by expert inside each layer's rows sorts by key,
            # with one small sort (and its scratch) per layer
            for a, b in self.layer_blocks():
                order[a:b] = np.argsort(self.expert[a:b], kind="stable")
                order[a:b] += a
            self._by_key = (order, take_rows(key, order))
        return self._by_key


def order_rows(
    rows: Columns, keep: np.ndarray | None = None, consume: bool = False
) -> StepSequence:
    """Sort rows layer-major: (layer, turn, step, phase, slot), file order breaking ties.
    `keep`: only the rows where this mask holds. The order is worked out on the whole
    frame's columns in place (a stable sort commutes with the selection), then each column is
    copied once: the selection and the sort are one gather. `consume` takes each column out
    of `rows` once copied."""
    return _sequence(_sorted_rows(rows, keep, consume), rows)


def _sequence(ordered: Ordered | None, rows: Columns) -> StepSequence:
    """The step sequence of rows :func:`_sorted_rows` put in order (`rows`: the columns, for
    the empty sequence's when it kept none)."""
    if ordered is None:
        rows = {c: a[:0] for c, a in rows.items()}
        empty = np.zeros(0, dtype=np.int64)
        return StepSequence(
            rows, rows["layer"], empty, empty, rows["expert"], 0, empty,
            empty, empty, empty, empty, empty, 0,
        )  # fmt: skip
    rows, layers, layer_idx, step_code = ordered
    n = len(step_code)
    layer = rows["layer"]
    if layers is None or layer_idx is None:  # the selection's layers, not the whole frame's
        layers, layer_idx = _small_unique(layer, wide=True)
    gcell = np.empty(n, dtype=np.int32)
    starts = np.empty(n, dtype=np.intp)
    if route_order.cells.takes(layer_idx, step_code, gcell, starts):  # one pass
        cell_start = starts[: route_order.cells(layer_idx, step_code, gcell, starts)].copy()
    else:
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = (layer_idx[1:] != layer_idx[:-1]) | (step_code[1:] != step_code[:-1])
        cell_start = np.flatnonzero(new)
        np.cumsum(new, dtype=np.int32, out=gcell)
        gcell -= 1
        del new
    del starts
    cell_layer_idx = layer_idx[cell_start]
    cells_per_layer = np.bincount(cell_layer_idx, minlength=len(layers))
    layer_first_cell = np.concatenate([[0], np.cumsum(cells_per_layer)[:-1]])
    cell_index = (np.arange(len(cell_start)) - layer_first_cell[cell_layer_idx]).astype(np.int32)
    cell_step_code = step_code[cell_start]
    del step_code
    expert = rows["expert"]
    n_expert = int(expert.max()) + 1 if n else 0
    if n and int(expert.min()) < 0:
        raise BmoeError(f"trace: negative expert id {expert.min()}")
    return StepSequence(
        rows=rows,
        layer=layer,
        layer_idx=layer_idx.astype(np.int32, copy=False),
        layers=layers,
        expert=expert,
        n_expert=n_expert,
        gcell=gcell,
        cell_start=cell_start,
        cell_layer_idx=cell_layer_idx.astype(np.int32),
        cell_index=cell_index,
        cell_step_code=cell_step_code,
        cells_per_layer=cells_per_layer,
        n_steps=_count_distinct(cell_step_code),
    )


#: rows in step-sequence order, their distinct layers and each row's index among them (None
#: when the selection's are still to be worked out) and each row's step code
Ordered: TypeAlias = "tuple[Columns, np.ndarray | None, np.ndarray | None, np.ndarray]"


def _sorted_rows(
    rows: Columns,
    keep: np.ndarray | None = None,
    consume: bool = False,
    known: Mapping[str, int] | None = None,
) -> Ordered | None:
    """The gather of :func:`order_rows`: the rows in layer-major order, with the distinct layers,
    each row's layer index (None when `keep` selected rows: they are the selection's to
    work out) and its step code; None when no row is kept. `known`: columns whose every
    kept row holds this value (made, not gathered)."""
    if keep is not None and keep.all():
        keep = None
    n_all = _n_rows(rows)
    n = n_all if keep is None else int(np.count_nonzero(keep))
    if n == 0:
        return None
    cols = _key_columns(rows)
    layers, layer_idx = _small_unique(cols["layer"])
    step_code = _step_codes(cols)
    for name in ("turn", "phase", "step"):  # in step_code now
        cols.pop(name, None)
    span = int(step_code.max()) + 1
    if "slot" in cols:
        slot = cols["slot"]
        slot_lo = min(0, int(slot.min()))
        nslot = int(slot.max()) - slot_lo + 1
    else:
        slot, slot_lo, nslot = np.zeros(n_all, dtype=np.int8), 0, 1
    order = take = None
    size = len(layers) * span * nslot
    ordered = _layer_major(layer_idx, step_code, slot, keep, size)
    if ordered is not None:
        state, found = ordered
        if state == route_order.STEP_MAJOR:
            take = found
        elif state == route_order.UNSORTED:
            wide = np.int32 if size < 2**31 else np.int64
            key = _sort_key((layers.size, span), (layer_idx, step_code), slot, slot_lo, nslot, wide)
            order = np.argsort(key, kind="stable")
    elif size < 2**62:
        kind: type[np.signedinteger] = np.int32 if size < 2**31 else np.int64
        # built in place, one array at a time: these run over every row of large traces
        layer_major = (layers.size, span), (layer_idx, step_code)
        if n_all > 1 and not _ascending(_sort_key(*layer_major, slot, slot_lo, nslot, kind)):
            step_major = (span, layers.size), (step_code, layer_idx)
            if _ascending(_sort_key(*step_major, slot, slot_lo, nslot, kind)):
                order = np.argsort(layer_idx, kind="stable")  # as engines write: radix by layer
            else:
                order = np.argsort(
                    _sort_key(*layer_major, slot, slot_lo, nslot, kind), kind="stable"
                )
    else:  # astronomically sparse step axis: sort by columns instead
        order = np.lexsort((slot, step_code, layer_idx))
    del cols, slot
    if take is not None:
        pass
    elif keep is None:
        take = order
    elif order is None:
        take = np.flatnonzero(keep)
    else:
        take = order[keep[order]]
    del order
    if take is not None:
        if len(take) < 2**31:
            take = take.astype(np.int32, copy=False)
        step_code = take_rows(step_code, take)
        if keep is None:
            layer_idx = take_rows(layer_idx, take)
        rows = _take(rows, take, consume, known)
        del take
    else:
        rows = dict(rows)
    if keep is not None:
        return rows, None, None, step_code
    return rows, layers, layer_idx, step_code


def _layer_major(
    layer_idx: np.ndarray,
    step_code: np.ndarray,
    slot: np.ndarray,
    keep: np.ndarray | None,
    size: int,
) -> tuple[int, np.ndarray] | None:
    """:func:`bmoe.analyze.route_order.layer_major` where its compiled code takes the rows;
    None where the numpy path must decide."""
    every = np.zeros(0, dtype=bool) if keep is None else keep
    n = len(layer_idx)
    if not 1 < n < 2**31 or size >= 2**62:
        return None
    take = np.empty(n, dtype=np.int32)
    if not route_order.layer_major.takes(layer_idx, step_code, slot, every, take):
        return None
    state, written = route_order.layer_major(layer_idx, step_code, slot, every, take)
    return int(state), take[:written]


def _ascending(values: np.ndarray) -> bool:
    return bool((values[1:] >= values[:-1]).all())


def _sort_key(
    sizes: tuple[int, int],
    parts: tuple[np.ndarray, np.ndarray],
    slot: np.ndarray,
    slot_lo: int,
    nslot: int,
    kind: type[np.signedinteger],
) -> np.ndarray:
    """(major, minor, slot) as one integer per row: major * sizes[1] + minor, then slot."""
    key: np.ndarray = parts[0].astype(kind)
    key *= sizes[1]
    np.add(key, parts[1], out=key, casting="unsafe")
    if nslot > 1:
        key *= nslot
        np.add(key, slot, out=key, casting="unsafe")
        if slot_lo:
            key -= slot_lo
    return key


def _take(
    rows: Columns,
    order: np.ndarray,
    consume: bool = False,
    known: Mapping[str, int] | None = None,
) -> Columns:
    """Rows in `order`, column by column; `consume` deletes each column from `rows` once
    copied, so the two together never hold much more than one set of rows. `known`: columns
    whose rows in `order` all hold one value, made instead of gathered."""
    out = {}
    for c in list(rows):
        if known is not None and c in known:
            out[c] = np.full(len(order), known[c], dtype=rows[c].dtype)
        else:
            out[c] = _gathered(rows[c], order)
        if consume:
            del rows[c]
    return out


def _gathered(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values[order]``; a small-integer column of one value (one turn, no row dropped) is
    made without the gather, zeros left to the system's zero pages."""
    if values.dtype.kind == "i" and values.itemsize <= 2 and len(values):
        lo = values.min()
        if lo == values.max():
            if lo == 0:
                return np.zeros(len(order), dtype=values.dtype)
            return np.full(len(order), lo, dtype=values.dtype)
    return take_rows(values, order)


def take_rows(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values[order]``, by the compiled gather where it takes the types (int32 `order`)."""
    out = np.empty(len(order), dtype=values.dtype)
    if route_order.gather.takes(values, order, out):
        route_order.gather(values, order, out)
        return out
    return values[order]


def _small_unique(values: np.ndarray, wide: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for small non-sparse integers, in O(n); the
    inverse int16 where it fits, unless `wide` (for a caller that wants int32)."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 1_000_000:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse
    narrow = hi - lo < 32767 and not wide  # fewer than 32768 distinct values
    inverse = np.empty(len(values), dtype=np.int16 if narrow else np.int32)
    if route_order.small_unique.takes(values, inverse):  # the same, in two passes
        return route_order.small_unique(values, inverse), inverse
    shifted = values.astype(np.int32)
    shifted -= np.int32(lo)
    present = np.bincount(shifted) > 0
    lut = (np.cumsum(present) - 1).astype(np.int16 if present.sum() < 32768 else np.int32)
    return (np.flatnonzero(present) + lo).astype(values.dtype), lut[shifted]


Facts: TypeAlias = RouteTrace | RouteColumns  # a trace's preamble: meta and sizes


def sequence_of(trace: Trace) -> tuple[StepSequence, Facts | None]:
    facts = trace if isinstance(trace, RouteTrace | RouteColumns) else None
    return order_rows(trace_columns(trace)), facts


def layer_view(seq: StepSequence, **columns: Any) -> View:
    return {"layer": seq.layers.astype(np.int64), **columns}


def with_all_row(view: View, all_row: Mapping[str, Any]) -> View:
    """Append the pooled row; `layer` becomes text so ``ALL`` fits."""
    out = {"layer": np.array([*view["layer"].tolist(), ALL], dtype=object)}
    for name, values in view.items():
        if name != "layer":
            out[name] = np.append(values, all_row[name])
    return out


def one_row(row: Mapping[str, Any]) -> View:
    """A one-row view of plain values (None makes an object column, as pandas would)."""
    return {k: np.array([v], dtype=object if v is None else None) for k, v in row.items()}


def cell_blocks(seq: StepSequence, block: int = 1 << 20) -> Iterable[tuple[int, int, int, int]]:
    """Consecutive blocks of whole cells of about `block` rows: (first cell, end cell, first
    row, end row). Per-cell work block by block keeps its scratch memory bounded."""
    n_cells, n_rows = len(seq.cell_start), seq.n_rows
    found = np.searchsorted(seq.cell_start, np.arange(0, n_rows, block))  # ascending
    bounds = found[np.r_[True, found[1:] != found[:-1]]] if len(found) else found
    for a, b in itertools.pairwise([*bounds.tolist(), n_cells]):
        if a < b:
            lo = int(seq.cell_start[a])
            yield a, b, lo, int(seq.cell_start[b]) if b < n_cells else n_rows
