"""What the router asked for: the views of a routing trace, as DataFrames.

A routing trace is conceptually a matrix: rows are steps, columns are MoE layers, and a cell
holds the ``n_expert_used`` experts one layer routed for one token. Per layer, the *step
sequence* is that layer's cells ordered by step. Every view here reads that sequence:

- ``sanity``   row and cell counts, cells of the wrong size, weight sums;
- ``hot``      distinct experts per layer and the share carried by the top N;
- ``reuse``    distance (in cells of the sequence) between routings of one expert;
- ``overlap``  share of a cell's experts also routed ``lag`` cells earlier;
- ``workset``  cumulative distinct experts after m steps, and the bytes of that union;
- ``cache``    share of routings that missed, hit, or hit a prefetched expert;
- ``entropy``  entropy of the normalised routing weights, and the top-1 share;
- ``bytes``    flash bytes read per layer, one-expert and dense sizes;
- ``matrix``   the step x layer matrix itself, as text cells.

Figures match the established route analysis exactly (see the reference semantics): quantiles
take the element at ``min(n-1, floor(q*n))`` of the sorted values, ties among equally hot
experts go to the one routed first. Everything is vectorised; nothing loops over rows.

Each view is computed once, as columns of numpy arrays (:func:`view_columns`, no pandas: what
the command line prints); :func:`route_views` and the per-view functions give them as
DataFrames (:func:`as_frame`). The trace may be a :class:`RouteTrace` (rows in a DataFrame), a
:class:`RouteColumns` (rows as numpy columns) or a bare frame of rows.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, overload

import numpy as np

from bmoe.errors import BmoeError
from bmoe.formats.route import RouteColumns, RouteTrace

if TYPE_CHECKING:
    import pandas as pd

MIB = 1048576
PHASES = {"prefill": 0, "decode": 1}
VIEWS = ("sanity", "hot", "reuse", "overlap", "workset", "cache", "entropy", "bytes", "matrix")
DEFAULT_VIEWS = VIEWS[:-1]
MATRIX_CELLS = ("experts", "weights", "mb", "hit")
WORKSET_MARKS = (1, 2, 5, 10, 25, 50, 100, 200, 500, 1000)
OVERLAP_LAGS = (1, 2, 4, 8)
REUSE_QUANTILES = (0.5, 0.9)
RESIDENCY_LETTERS = {0: "M", 1: "H", 2: "P"}
MATRIX_STEPS = 20  # steps the matrix shows when no window was chosen
ALL = "ALL"

Trace: TypeAlias = "RouteTrace | RouteColumns | pd.DataFrame"
#: Rows as name -> numpy array (all of one length).
Columns: TypeAlias = dict[str, np.ndarray]
#: A view as name -> numpy array, one entry per row of the view; a masked integer array holds
#: integers with gaps (``Int64`` in the DataFrame), an object array mixes numbers and text.
View: TypeAlias = dict[str, np.ndarray]


def as_frame(view: View) -> pd.DataFrame:
    """A view as a DataFrame (masked integers become ``Int64`` with missing values)."""
    import pandas as pd

    data: dict[str, Any] = {}
    for name, values in view.items():
        if isinstance(values, np.ma.MaskedArray):
            data[name] = pd.arrays.IntegerArray(
                np.asarray(values.data, dtype=np.int64), np.ma.getmaskarray(values).copy()
            )
        elif name == "layer" and values.dtype == object:  # numbers and ALL: stays mixed
            data[name] = pd.Series(values, dtype=object)
        else:
            data[name] = values
    return pd.DataFrame(data, copy=False)


def _columns(rows: pd.DataFrame | Columns) -> Columns:
    """Rows as columns (a frame's arrays, not copied)."""
    if isinstance(rows, dict):
        return rows
    return {str(c): rows[c].to_numpy() for c in rows.columns}


def _trace_columns(trace: Trace) -> Columns:
    if isinstance(trace, RouteColumns):
        return trace.columns
    return _columns(trace.rows if isinstance(trace, RouteTrace) else trace)


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
    frame = trace.rows if isinstance(trace, RouteTrace) else None
    cols = trace.columns if isinstance(trace, RouteColumns) else _columns(trace.rows)
    if consume and frame is not None:
        cols = dict(cols)  # its own dict, emptied as the selection is built
    keep = _kept(cols, phase, turn, layers, steps)
    if max_steps is not None and keep.any():
        within = np.flatnonzero(keep)
        code = _step_codes(_key_columns(cols, within))
        keep[within[~np.isin(code, np.unique(code)[:max_steps])]] = False
        del within, code
    if consume and keep.any():  # the trace keeps its columns, with no rows
        if isinstance(trace, RouteTrace):
            trace.rows = trace.rows.iloc[:0]
            del frame
        else:
            trace.columns = {c: a[:0] for c, a in cols.items()}
    ordered = _sorted_rows(cols, keep, consume=consume)
    rows = ordered[0] if ordered is not None else {c: a[:0] for c, a in cols.items()}
    if isinstance(trace, RouteColumns):
        return dataclasses.replace(trace, columns=rows)
    import pandas as pd

    return dataclasses.replace(trace, rows=pd.DataFrame(rows, copy=False))


def _kept(
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
    if turn is not None:
        code += turn.astype(kind) * span
    code *= 2
    if "phase" in cols:
        code += np.asarray(cols["phase"]).astype(kind)
    return code


def count_steps(trace: Trace) -> int:
    """Distinct steps (token positions, per turn and phase) in the trace's rows."""
    rows = _trace_columns(trace)
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
    rows = _trace_columns(selected)
    n = _n_rows(rows)
    notes: list[str] = []
    if not n:
        all_rows = _trace_columns(trace)
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
    if phase and phase != "all" and "phase" not in _trace_columns(trace):
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
class _Sequence:
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

    def key(self) -> np.ndarray:
        """(layer, expert) as one small integer per row."""
        kind: type[np.signedinteger] = (
            np.int16 if self.n_layers * self.n_expert < 32768 else np.int32
        )
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
            for a, b, lo, hi in _cell_blocks(self):  # cells are contiguous
                w = weight[lo:hi].astype(np.float64)
                starts = self.cell_start[a:b] - lo
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
                else:
                    wlogw = np.zeros_like(wk)
                    wlogw[pos] = wk[pos] * np.log2(wk[pos])
                acc[a:b] = np.add.reduceat(wlogw, starts)
                top[a:b] = np.maximum.reduceat(known_w, starts)
            self._weights = (complete, total, acc, top)
        return self._weights

    def by_key(self) -> tuple[np.ndarray, np.ndarray]:
        """Row order sorted by (layer, expert), stable (so cell order within); and the keys."""
        if self._by_key is None:
            key = self.key()
            n = len(key)
            order: np.ndarray = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
            # rows are layer-major: sorting by expert inside each layer's rows sorts by key,
            # with one small sort (and its scratch) per layer
            for a, b in self.layer_blocks():
                order[a:b] = np.argsort(self.expert[a:b], kind="stable")
                order[a:b] += a
            self._by_key = (order, key[order])
        return self._by_key


def _order(rows: Columns, keep: np.ndarray | None = None, consume: bool = False) -> _Sequence:
    """Sort rows layer-major: (layer, turn, step, phase, slot), file order breaking ties.
    `keep`: only the rows where this mask holds. The order is worked out on the whole
    frame's columns in place (a stable sort commutes with the selection), then each column is
    copied once: the selection and the sort are one gather. `consume` takes each column out
    of `rows` once copied."""
    ordered = _sorted_rows(rows, keep, consume)
    if ordered is None:
        rows = {c: a[:0] for c, a in rows.items()}
        empty = np.zeros(0, dtype=np.int64)
        return _Sequence(
            rows, rows["layer"], empty, empty, rows["expert"], 0, empty,
            empty, empty, empty, empty, empty, 0,
        )  # fmt: skip
    rows, layers, layer_idx, step_code = ordered
    n = len(step_code)
    layer = rows["layer"]
    if layers is None or layer_idx is None:  # the selection's layers, not the whole frame's
        layers, layer_idx = _small_unique(layer)
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = (layer_idx[1:] != layer_idx[:-1]) | (step_code[1:] != step_code[:-1])
    cell_start = np.flatnonzero(new)
    gcell = (np.cumsum(new, dtype=np.int32) - 1).astype(np.int32)
    del new
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
    return _Sequence(
        rows=rows,
        layer=layer,
        layer_idx=layer_idx.astype(np.int32),
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


def _sorted_rows(
    rows: Columns, keep: np.ndarray | None = None, consume: bool = False
) -> tuple[Columns, np.ndarray | None, np.ndarray | None, np.ndarray] | None:
    """The gather of :func:`_order`: the rows in layer-major order, with the distinct layers,
    each row's layer index (None when `keep` selected rows: they are the selection's to
    work out) and its step code; None when no row is kept."""
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
    order = None
    size = len(layers) * span * nslot
    if size < 2**62:
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
    if keep is None:
        take = order
    elif order is None:
        take = np.flatnonzero(keep)
    else:
        take = order[keep[order]]
    del order
    if take is not None:
        if len(take) < 2**31:
            take = take.astype(np.int32)
        step_code = step_code[take]
        if keep is None:
            layer_idx = layer_idx[take]
        rows = _take(rows, take, consume)
        del take
    else:
        rows = dict(rows)
    if keep is not None:
        return rows, None, None, step_code
    return rows, layers, layer_idx, step_code


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


def _take(rows: Columns, order: np.ndarray, consume: bool = False) -> Columns:
    """Rows in `order`, column by column; `consume` deletes each column from `rows` once
    copied, so the two together never hold much more than one set of rows."""
    out = {}
    for c in list(rows):
        out[c] = rows[c][order]
        if consume:
            del rows[c]
    return out


def _small_unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for small non-sparse integers, in O(n)."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 1_000_000:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse
    shifted = values.astype(np.int32)
    shifted -= np.int32(lo)
    present = np.bincount(shifted) > 0
    lut = (np.cumsum(present) - 1).astype(np.int16 if present.sum() < 32768 else np.int32)
    return (np.flatnonzero(present) + lo).astype(values.dtype), lut[shifted]


Facts: TypeAlias = RouteTrace | RouteColumns  # a trace's preamble: meta and sizes


def _sequence(trace: Trace) -> tuple[_Sequence, Facts | None]:
    facts = trace if isinstance(trace, RouteTrace | RouteColumns) else None
    return _order(_trace_columns(trace)), facts


def _layer_view(seq: _Sequence, **columns: Any) -> View:
    return {"layer": seq.layers.astype(np.int64), **columns}


def _with_all_row(view: View, all_row: Mapping[str, Any]) -> View:
    """Append the pooled row; `layer` becomes text so ``ALL`` fits."""
    out = {"layer": np.array([*view["layer"].tolist(), ALL], dtype=object)}
    for name, values in view.items():
        if name != "layer":
            out[name] = np.append(values, all_row[name])
    return out


def _one_row(row: Mapping[str, Any]) -> View:
    """A one-row view of plain values (None makes an object column, as pandas would)."""
    return {k: np.array([v], dtype=object if v is None else None) for k, v in row.items()}


# ----------------------------------------------------------------------------- sanity


def sanity(trace: Trace) -> pd.DataFrame:
    """One row: rows, cells over steps x layers, cells whose size is not ``n_expert_used``,
    steps per layer (uneven in prefill: the last layer routes only the final prompt token),
    and the min/max per-cell weight sum over cells whose weights are all known."""
    seq, meta_trace = _sequence(trace)
    return as_frame(_sanity(seq, meta_trace))


def _sanity(seq: _Sequence, trace: Facts | None) -> View:
    k = trace.n_expert_used if trace is not None else None
    n_cells = len(seq.cell_start)
    sizes = np.diff(np.append(seq.cell_start, seq.n_rows))
    wmin = wmax = np.nan
    weighed = 0
    if "weight" in seq.rows and n_cells:
        complete, sums, _, _ = seq.cell_weights()
        weighed = int(complete.sum())
        if weighed:
            wmin, wmax = float(sums[complete].min()), float(sums[complete].max())
    per_layer = seq.cells_per_layer
    row = {
        "rows": seq.n_rows,
        "cells": n_cells,
        "steps": seq.n_steps,
        "layers": seq.n_layers,
        "k": k,
        "cells_not_k": int((sizes != k).sum()) if k is not None else None,
        "steps_per_layer_min": int(per_layer.min()) if n_cells else 0,
        "steps_per_layer_max": int(per_layer.max()) if n_cells else 0,
        "cells_weighed": weighed,
        "weight_sum_min": wmin,
        "weight_sum_max": wmax,
    }
    return _one_row(row)


# ----------------------------------------------------------------------------- hot


def expert_counts(trace: Trace) -> pd.DataFrame:
    """Per (layer, expert): activations, the share of the layer's activations, and the rank
    (hottest first; ties to the expert routed first). Long form, for plots and notebooks."""
    seq, _ = _sequence(trace)
    return as_frame(_expert_counts(seq))


def _expert_counts(seq: _Sequence) -> View:
    if not seq.n_rows:
        none = np.zeros(0, dtype=np.int64)
        return {c: none for c in ("layer", "expert", "activations", "rank")} | {
            "share_pct": np.zeros(0)
        }
    layer_idx, expert, c, share, rank = _ranked(seq)
    return {
        "layer": seq.layers[layer_idx].astype(np.int64),
        "expert": expert,
        "activations": c,
        "share_pct": share,
        "rank": rank,
    }


def _ranked(seq: _Sequence) -> tuple[np.ndarray, ...]:
    """Per (layer, expert), hottest first within each layer (layers in order): the layer
    index, the expert, its activations, their share of the layer's (%) and the rank."""
    order, key = seq.by_key()
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.append(start, len(key)))
    first_row = order[start]  # row position in step-sequence order: (cell, slot)
    ukey = key[start].astype(np.int64)
    layer_idx = ukey // seq.n_expert
    # rank within layer: by count descending, then first routed
    rank_order = np.lexsort((first_row, -counts, layer_idx))
    layer_sorted = layer_idx[rank_order]
    group_start = np.flatnonzero(np.r_[True, layer_sorted[1:] != layer_sorted[:-1]])
    rank = np.arange(len(rank_order)) - np.repeat(
        group_start, np.diff(np.append(group_start, len(rank_order)))
    )
    totals = np.bincount(layer_idx, weights=counts, minlength=seq.n_layers)
    c = counts[rank_order]
    return (
        layer_sorted,
        (ukey[rank_order] % seq.n_expert).astype(np.int64),
        c.astype(np.int64),
        100.0 * c / totals[layer_sorted],
        rank.astype(np.int64),
    )


def hot(trace: Trace, top: int = 8) -> pd.DataFrame:
    """Per layer: distinct experts routed, the share of activations carried by the top
    `top` experts (``coverage_pct``) and those experts as ``expert:count`` text."""
    seq, _ = _sequence(trace)
    return as_frame(_hot(seq, top))


def _hot(seq: _Sequence, top: int) -> View:
    if not seq.n_rows:
        none = np.zeros(0, dtype=np.int64)
        return {"layer": none, "unique": none, "coverage_pct": np.zeros(0),
                "top": np.zeros(0, dtype=object)}  # fmt: skip
    layer_idx, expert, count, _share, rank = _ranked(seq)
    unique = np.bincount(layer_idx, minlength=seq.n_layers)
    first = np.concatenate([[0], np.cumsum(unique)[:-1]])  # each layer's hottest
    shown = np.minimum(unique, top)
    # the top experts' activations over the layer's, from the integer counts: exact to the
    # last bit (a sum of rounded shares is not)
    head = np.bincount(layer_idx[rank < top], weights=count[rank < top], minlength=seq.n_layers)
    total = 100.0 * head / np.bincount(layer_idx, weights=count, minlength=seq.n_layers)
    labels = [f"{e}:{n}" for e, n in zip(expert.tolist(), count.tolist(), strict=True)]
    listing = np.array(
        [" ".join(labels[a : a + n]) for a, n in zip(first.tolist(), shown.tolist(), strict=True)],
        dtype=object,
    )
    return {
        "layer": seq.layers.astype(np.int64),
        "unique": unique.astype(np.int64),
        "coverage_pct": total,
        "top": listing,
    }


# ----------------------------------------------------------------------------- reuse


def reuse_distances(trace: Trace) -> pd.DataFrame:
    """Every reuse, long form: layer, expert, the step of the reuse and its distance in
    cells of the layer's step sequence (not in step numbers)."""
    seq, _ = _sequence(trace)
    same, dist = _reuse_pairs(seq)
    order, key = seq.by_key()
    k = key[1:][same]
    n = max(seq.n_expert, 1)
    layer_idx, expert, rows = k // n, k % n, order[1:][same]
    return as_frame(
        {
            "layer": seq.layers[layer_idx].astype(np.int64),
            "expert": expert.astype(np.int64),
            "step": seq.rows["step"][rows].astype(np.int64),
            "distance": dist.astype(np.int64),
        }
    )


def _reuse_pairs(seq: _Sequence) -> tuple[np.ndarray, np.ndarray]:
    """The reuses, in by-key order: a mask over positions 1.. of ``seq.by_key()`` (the
    routing there repeats the key before it), and each reuse's distance in cells."""
    order, key = seq.by_key()
    if len(key) < 2:
        return np.zeros(max(len(key) - 1, 0), dtype=bool), np.zeros(0, dtype=np.int32)
    same = key[1:] == key[:-1]
    cell = seq.cell_index[seq.gcell[order]]
    dist = np.diff(cell)[same]
    return same, dist


def _quantile_index(n: np.ndarray, q: float) -> np.ndarray:
    """The reference quantile: element ``min(n-1, floor(q*n))`` of the sorted values."""
    return np.minimum(n - 1, np.floor(q * n).astype(np.int64))


def reuse(trace: Trace) -> pd.DataFrame:
    """Per layer: the number of reuses, p50/p90/max reuse distance (in cells of the step
    sequence) and ``never_2nd``, the experts routed exactly once (cache pollution)."""
    seq, _ = _sequence(trace)
    return as_frame(_reuse(seq))


def _reuse(seq: _Sequence) -> View:
    """Layer by layer (the by-key order keeps each layer's rows together), so the scratch
    arrays are one layer's."""
    n_layers = seq.n_layers
    order, key = seq.by_key()
    n_reuse = np.zeros(n_layers, dtype=np.int64)
    quantiles = {q: np.full(n_layers, -1, dtype=np.int64) for q in REUSE_QUANTILES}
    longest = np.full(n_layers, -1, dtype=np.int64)
    never = np.zeros(n_layers, dtype=np.int64)
    for a, b in seq.layer_blocks():
        i = int(seq.layer_idx[a])
        k = key[a:b]
        same = k[1:] == k[:-1]
        dist = np.diff(seq.cell_index[seq.gcell[order[a:b]]])[same]
        starts = np.flatnonzero(np.r_[True, ~same])
        never[i] = int((np.diff(np.append(starts, b - a)) == 1).sum())
        n_reuse[i] = len(dist)
        if len(dist):
            cum = np.cumsum(np.bincount(dist))
            for q in REUSE_QUANTILES:
                quantiles[q][i] = int((cum > _quantile_index(np.array(len(dist)), q)).argmax())
            longest[i] = len(cum) - 1
    figures: dict[str, Any] = {"n_reuse": n_reuse}
    for q in REUSE_QUANTILES:
        figures[f"p{round(q * 100)}"] = quantiles[q]
    figures["max"] = longest
    figures["never_2nd"] = never
    for col in ("p50", "p90", "max"):  # no reuse at all: unknown, not zero
        figures[col] = np.ma.masked_array(figures[col], mask=n_reuse == 0)
    return _layer_view(seq, **figures)


# ----------------------------------------------------------------------------- overlap


def overlap(trace: Trace, lags: Sequence[int] = OVERLAP_LAGS) -> pd.DataFrame:
    """Per layer, for each lag g: the mean over cells i >= g of the share (%) of cell i's
    experts also routed in cell i-g; the ``ALL`` row pools every layer's cells. A layer with
    no cell i >= g (fewer than g+1 cells: in prefill the last layer often routes only the
    final prompt token) shows 0.0, as the established analysis prints its empty mean."""
    seq, _ = _sequence(trace)
    return as_frame(_overlap(seq, lags))


def _cell_blocks(seq: _Sequence, block: int = 1 << 20) -> Iterable[tuple[int, int, int, int]]:
    """Consecutive blocks of whole cells of about `block` rows: (first cell, end cell, first
    row, end row). Per-cell work block by block keeps its scratch memory bounded."""
    n_cells, n_rows = len(seq.cell_start), seq.n_rows
    bounds = np.unique(np.searchsorted(seq.cell_start, np.arange(0, n_rows, block)))
    for a, b in itertools.pairwise([*bounds.tolist(), n_cells]):
        if a < b:
            lo = int(seq.cell_start[a])
            yield a, b, lo, int(seq.cell_start[b]) if b < n_cells else n_rows


def _cell_sets(seq: _Sequence) -> np.ndarray:
    """Each cell's set of experts as a bitmask: (words, cells) uint64, expert e at bit e % 64
    of word e // 64 (a word's row contiguous: the lags compare whole rows)."""
    n_cells = len(seq.cell_start)
    words = max(1, (seq.n_expert + 63) // 64)
    masks = np.zeros((words, n_cells), dtype=np.uint64)
    ids = np.arange(words * 64, dtype=np.uint64)
    # per word, each expert id's bit in that word (0 outside it): one small table lookup
    in_word = ids // np.uint64(64) == np.arange(words, dtype=np.uint64)[:, None]
    bits = np.where(in_word, np.left_shift(np.uint64(1), ids % np.uint64(64)), np.uint64(0))
    for a, b, lo, hi in _cell_blocks(seq):
        expert = seq.expert[lo:hi]
        starts = seq.cell_start[a:b] - lo
        for w in range(words):
            masks[w, a:b] = np.bitwise_or.reduceat(bits[w][expert], starts)
    return masks


def _shared(masks: np.ndarray, lag: int) -> np.ndarray:
    """Per cell c >= lag: the experts cell c shares with cell c - lag."""
    count = np.bitwise_count(masks[0, lag:] & masks[0, :-lag]).astype(np.int64)
    for w in range(1, len(masks)):
        count += np.bitwise_count(masks[w, lag:] & masks[w, :-lag])
    return count


def _overlap(seq: _Sequence, lags: Sequence[int]) -> View:
    n_cells = len(seq.cell_start)
    masks = _cell_sets(seq)
    size = np.bitwise_count(masks[0]).astype(np.int64)
    for w in range(1, len(masks)):
        size += np.bitwise_count(masks[w])
    cols: dict[str, Any] = {}
    pooled: dict[str, Any] = {}
    for g in lags:
        if g < 1:
            raise BmoeError(f"overlap lag {g}: lags count cells back, from 1")
        inter = np.zeros(n_cells, dtype=np.int64)  # cell c against cell c-g (same layer where
        if g < n_cells:  # its index in the layer is >= g: layers are contiguous)
            inter[g:] = _shared(masks, g)
        counted = (seq.cell_index >= g) & (size > 0)
        pct = np.where(counted, 100.0 * inter / np.maximum(size, 1), 0.0)
        total = np.bincount(seq.cell_layer_idx, weights=pct, minlength=seq.n_layers)
        n = np.bincount(seq.cell_layer_idx, weights=counted, minlength=seq.n_layers)
        cols[f"lag_{g}"] = np.where(n > 0, total / np.maximum(n, 1), 0.0)
        pooled[f"lag_{g}"] = float(pct[counted].mean()) if counted.any() else 0.0
    return _with_all_row(_layer_view(seq, **cols), pooled)


# ----------------------------------------------------------------------------- workset


def workset(
    trace: Trace,
    marks: Sequence[int] = WORKSET_MARKS,
    expert_bytes: Mapping[int, int] | None = None,
) -> pd.DataFrame:
    """Per layer: ``of`` (experts in the model), cumulative distinct experts after m steps
    of the layer's sequence at each mark <= the step count (``s<m>`` columns, plus the step
    count itself), and ``union_mib``, the bytes of that union; the ``ALL`` row sums them."""
    seq, meta_trace = _sequence(trace)
    sizes = expert_bytes if expert_bytes is not None else _sizes(meta_trace)
    return as_frame(_workset(seq, marks, sizes, _n_expert(meta_trace, seq)))


def _sizes(trace: Facts | None) -> dict[int, int]:
    return trace.expert_bytes() if trace is not None else {}


def _n_expert(trace: Facts | None, seq: _Sequence) -> int:
    n = trace.meta.get("n_expert") if trace is not None else None
    return int(n) if isinstance(n, int) else seq.n_expert


def workset_marks(n_steps: int, marks: Sequence[int] = WORKSET_MARKS) -> list[int]:
    chosen = [m for m in marks if m <= n_steps]
    return [*chosen, n_steps] if n_steps and (not chosen or chosen[-1] != n_steps) else chosen


def _first_cells(seq: _Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Per distinct (layer, expert): its layer index and the first cell that routed it."""
    order, key = seq.by_key()
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, int)
    return key[start].astype(np.int64) // max(seq.n_expert, 1), seq.cell[order[start]]


def _workset(seq: _Sequence, marks: Sequence[int], sizes: Mapping[int, int], n_expert: int) -> View:
    chosen = workset_marks(seq.n_steps, marks)
    layer_idx, first = _first_cells(seq)
    cols: dict[str, Any] = {"of": np.full(seq.n_layers, n_expert, dtype=np.int64)}
    for m in chosen:
        cols[f"s{m}"] = np.bincount(layer_idx[first < m], minlength=seq.n_layers).astype(np.int64)
    distinct = np.bincount(layer_idx, minlength=seq.n_layers)
    one = np.array([sizes.get(int(x), np.nan) for x in seq.layers], dtype=np.float64)
    cols["union_mib"] = distinct * one / MIB
    return _with_workset_totals(_layer_view(seq, **cols))


def _with_workset_totals(view: View) -> View:
    totals: dict[str, float] = {
        c: int(v.sum()) for c, v in view.items() if c not in ("layer", "union_mib")
    }
    totals["union_mib"] = float(np.sum(view["union_mib"]))
    return _with_all_row(view, totals)


def workset_curve(trace: Trace) -> pd.DataFrame:
    """Working-set growth for every m: layer, steps (m), distinct experts after m cells of
    the layer's sequence, and their bytes (MiB; nan where the preamble lacks the size)."""
    import pandas as pd

    seq, meta_trace = _sequence(trace)
    sizes = _sizes(meta_trace)
    layer_idx, first = _first_cells(seq)
    frames = []
    new = np.zeros((seq.n_layers, int(seq.cells_per_layer.max()) if seq.n_layers else 0))
    np.add.at(new, (layer_idx, first), 1)
    for i, layer in enumerate(seq.layers):  # one pass per layer, not per row
        n = int(seq.cells_per_layer[i])
        distinct = np.cumsum(new[i, :n]).astype(np.int64)
        frames.append(
            pd.DataFrame(
                {
                    "layer": int(layer),
                    "steps": np.arange(1, n + 1, dtype=np.int64),
                    "distinct": distinct,
                    "mib": distinct * sizes.get(int(layer), np.nan) / MIB,
                }
            )
        )
    if not frames:
        return pd.DataFrame(columns=["layer", "steps", "distinct", "mib"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- cache


def cache(trace: Trace) -> pd.DataFrame:
    """Per layer and overall (``ALL``): the share of routings that missed (residency 0),
    hit (1) or hit a prefetched expert on its first touch (2), and the routing count."""
    seq, _ = _sequence(trace)
    return as_frame(_cache(seq))


def _no_rows(names: Iterable[str]) -> View:
    """A view with these columns and no rows (untyped: object columns)."""
    return {name: np.zeros(0, dtype=object) for name in names}


def _cache(seq: _Sequence) -> View:
    cols = ("miss_pct", "hit_pct", "prefetch_pct")
    if "residency" not in seq.rows:
        return _no_rows(["layer", *cols, "routings"])
    res = seq.rows["residency"]
    counts = np.zeros((seq.n_layers, 3), dtype=np.int64)
    routings = np.zeros(seq.n_layers, dtype=np.int64)
    for a, b in seq.layer_blocks():  # one layer's rows at a time
        i = int(seq.layer_idx[a])
        counts[i] = np.bincount(np.clip(res[a:b], 0, 2), minlength=3)[:3]
        routings[i] = b - a
    with np.errstate(invalid="ignore", divide="ignore"):
        share = 100.0 * counts / routings[:, None]
    frame = _layer_view(seq, **{c: share[:, i] for i, c in enumerate(cols)})
    frame["routings"] = routings.astype(np.int64)
    n = int(routings.sum())
    pooled = {c: 100.0 * counts[:, i].sum() / n if n else np.nan for i, c in enumerate(cols)}
    return _with_all_row(frame, {**pooled, "routings": n})


def prefetch_slots(trace: Trace) -> pd.DataFrame:
    """Prefetch hits (residency 2) by router slot: count, share of all prefetch hits and
    share of that slot's routings. Empty when no prefetch hit was recorded."""
    return as_frame(prefetch_slot_columns(trace))


def prefetch_slot_columns(trace: Trace) -> View:
    """:func:`prefetch_slots` as columns."""
    rows = _trace_columns(trace)
    columns = ["slot", "prefetch_hits", "share_pct", "of_slot_pct"]
    if "residency" not in rows or "slot" not in rows:
        return _no_rows(columns)
    slot = rows["slot"].astype(np.int64)
    hit = rows["residency"] == 2
    if not hit.any():
        return _no_rows(columns)
    n = int(slot.max()) + 1
    hits = np.bincount(slot[hit], minlength=n)
    routings = np.bincount(slot, minlength=n)
    return {
        "slot": np.arange(n, dtype=np.int64),
        "prefetch_hits": hits.astype(np.int64),
        "share_pct": 100.0 * hits / hits.sum(),
        "of_slot_pct": 100.0 * hits / np.maximum(routings, 1),
    }


# ----------------------------------------------------------------------------- entropy


def entropy(trace: Trace) -> pd.DataFrame:
    """Per layer, averaged over cells: the entropy (bits) of the cell's known weights
    normalised by their sum, and the top-1 share (%). Cells with weight sum <= 0 are
    skipped; the maximum entropy is log2(k)."""
    seq, _ = _sequence(trace)
    return as_frame(_entropy(seq))


def _entropy(seq: _Sequence) -> View:
    n_cells = len(seq.cell_start)
    if "weight" not in seq.rows or not n_cells:
        return _layer_view(
            seq, entropy_bits=np.full(seq.n_layers, np.nan), top1_pct=np.full(seq.n_layers, np.nan)
        )
    _, total, acc, top = seq.cell_weights()
    ok = total > 0
    safe = np.where(ok, total, 1.0)
    bits = np.log2(safe) - acc / safe
    share = 100.0 * top / safe
    n = np.bincount(seq.cell_layer_idx, weights=ok, minlength=seq.n_layers)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_bits = (
            np.bincount(seq.cell_layer_idx, weights=np.where(ok, bits, 0), minlength=seq.n_layers)
            / n
        )
        mean_top = (
            np.bincount(seq.cell_layer_idx, weights=np.where(ok, share, 0), minlength=seq.n_layers)
            / n
        )
    return _layer_view(seq, entropy_bits=mean_bits, top1_pct=mean_top)


# ----------------------------------------------------------------------------- bytes


def bytes_read(trace: Trace) -> pd.DataFrame:
    """Per layer: MiB read from flash (sum of the ``expert_bytes`` column), one expert's
    and the dense weights' MiB (from the preamble) and read MiB per step; the ``ALL`` row
    holds the totals (``mib_per_step`` averages over distinct steps)."""
    seq, meta_trace = _sequence(trace)
    return as_frame(_bytes(seq, meta_trace))


def _bytes(seq: _Sequence, trace: Facts | None) -> View:
    if "expert_bytes" in seq.rows:
        values = seq.rows["expert_bytes"]
        read = np.zeros(seq.n_layers)
        for a, b in seq.layer_blocks():  # exact integer sums, one layer's rows at a time
            read[int(seq.layer_idx[a])] = float(values[a:b].sum(dtype=np.int64))
    else:
        read = np.full(seq.n_layers, np.nan)
    one = _sizes(trace)
    dense = trace.dense_bytes() if trace is not None else {}
    steps = max(seq.n_steps, 1)
    frame = _layer_view(
        seq,
        read_mib=read / MIB,
        expert_mib=np.array([one.get(int(x), np.nan) for x in seq.layers], dtype=float) / MIB,
        dense_mib=np.array([dense.get(int(x), np.nan) for x in seq.layers], dtype=float) / MIB,
        mib_per_step=read / MIB / steps,
    )
    total = float(read.sum()) / MIB
    return _with_all_row(
        frame,
        {
            "read_mib": total,
            "expert_mib": np.nan,
            "dense_mib": float(np.sum(frame["dense_mib"])),
            "mib_per_step": total / steps,
        },
    )


# ----------------------------------------------------------------------------- matrix


def matrix(trace: Trace, cells: str = "experts", limit: int | None = MATRIX_STEPS) -> pd.DataFrame:
    """The step x layer matrix: one row per step (the first `limit` steps; None for all),
    one text column per layer (``L<n>``). Cells: ``experts`` (ids in slot order, ``*``
    marking an id the same layer routed on the previous row), ``weights`` (2 decimals),
    ``mb`` (MiB the cell read) or ``hit`` (H/M/P per slot: hit, miss, prefetch hit)."""
    if cells not in MATRIX_CELLS:
        raise BmoeError(f"unknown matrix cells {cells!r} (choose {', '.join(MATRIX_CELLS)})")
    seq, _ = _sequence(trace)
    return _matrix(seq, cells, limit)


def _matrix(seq: _Sequence, cells: str, limit: int | None) -> pd.DataFrame:
    import pandas as pd

    rows = seq.rows
    steps, step_row = np.unique(seq.cell_step_code, return_inverse=True)
    if limit is not None:
        steps = steps[:limit]
    n_rows = len(steps)
    cell_keep = step_row < n_rows
    row_keep = cell_keep[seq.gcell]
    cell_row = step_row[seq.gcell][row_keep]  # matrix row of each kept routing
    layer_idx = seq.layer_idx[row_keep]
    expert = seq.expert[row_keep].astype(np.int64)
    if cells == "experts":
        E = seq.n_expert
        present = np.zeros((n_rows + 1) * seq.n_layers * E, dtype=bool)
        code = (cell_row.astype(np.int64) * seq.n_layers + layer_idx) * E + expert
        present[code] = True
        prev = code - seq.n_layers * E
        star = (cell_row > 0) & present[np.maximum(prev, 0)]
        text = np.where(star, "*", "") + expert.astype(str)
        sep = " "
    elif cells == "weights":
        text = (
            np.char.mod("%.2f", rows["weight"].astype(np.float64)[row_keep])
            if "weight" in rows
            else np.full(len(expert), "?")
        )
        sep = " "
    elif cells == "hit":
        res = rows["residency"][row_keep] if "residency" in rows else np.full(len(expert), -1)
        text = pd.Series(res).map(RESIDENCY_LETTERS).fillna("?").to_numpy(str)
        sep = ""
    else:  # mb: one figure per cell
        read = (
            rows["expert_bytes"].astype(np.float64)[row_keep]
            if "expert_bytes" in rows
            else np.zeros(len(expert))
        )
        text, sep = None, ""
    kept_cells = np.flatnonzero(cell_keep)
    cell_pos = np.searchsorted(kept_cells, seq.gcell[row_keep])  # index among kept cells
    if text is None:
        mib = np.bincount(cell_pos, weights=read, minlength=len(kept_cells)) / MIB
        cell_text = pd.Series(np.char.mod("%.2f", mib))
    else:
        cell_text = _join_by_group(pd.Series(text, dtype=object), cell_pos, len(kept_cells), sep)
    grid = np.full((n_rows, seq.n_layers), None, dtype=object)
    grid[step_row[kept_cells], seq.cell_layer_idx[kept_cells]] = cell_text.to_numpy(object)
    step_of = rows["step"][seq.cell_start]
    first_cell_of_row = np.full(n_rows, -1, dtype=np.int64)
    first_cell_of_row[step_row[kept_cells][::-1]] = kept_cells[::-1]
    frame = (
        pd.DataFrame({"step": step_of[first_cell_of_row].astype(np.int64)})
        if n_rows
        else pd.DataFrame({"step": pd.Series(dtype="int64")})
    )
    if "turn" in rows and len(np.unique(rows["turn"])) > 1:
        frame.insert(0, "turn", rows["turn"][seq.cell_start][first_cell_of_row].astype(np.int64))
    for j, layer in enumerate(seq.layers):
        frame[f"L{int(layer)}"] = grid[:, j]
    return frame


def _join_by_group(text: pd.Series, group: np.ndarray, n_groups: int, sep: str) -> pd.Series:
    """Concatenate `text` per group (rows of a group are contiguous and in order)."""
    import pandas as pd

    if not len(text):
        return pd.Series([""] * n_groups, dtype=object)
    start = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    pos = np.arange(len(group)) - np.repeat(start, np.diff(np.append(start, len(group))))
    wide = pd.DataFrame({"g": group, "p": pos, "t": text.to_numpy(object)}).pivot(
        index="g", columns="p", values="t"
    )
    joined = wide[wide.columns[0]].astype(object)
    for col in wide.columns[1:]:
        part = wide[col]
        joined = joined.where(part.isna(), joined + sep + part.fillna(""))
    return joined.reindex(range(n_groups)).fillna("").reset_index(drop=True)


# ----------------------------------------------------------------------------- all views


def route_views(
    trace: Trace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    top: int = 8,
    cells: str = "experts",
    matrix_limit: int | None = MATRIX_STEPS,
) -> dict[str, pd.DataFrame]:
    """Several views at once, sharing one pass of ordering: name -> DataFrame."""
    views = view_columns(trace, names, top=top, cells=cells, matrix_limit=matrix_limit)
    return {name: v if name == "matrix" else as_frame(v) for name, v in views.items()}


def view_columns(
    trace: Trace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    top: int = 8,
    cells: str = "experts",
    matrix_limit: int | None = MATRIX_STEPS,
) -> dict[str, Any]:
    """:func:`route_views` as columns, without pandas: name -> :data:`View` (the matrix, made
    of text cells, is a DataFrame)."""
    names = list(names)
    unknown = [n for n in names if n not in VIEWS]
    if unknown:
        raise BmoeError(f"unknown view {', '.join(unknown)} (choose from {', '.join(VIEWS)})")
    seq, meta_trace = _sequence(trace)
    build = {
        "sanity": lambda: _sanity(seq, meta_trace),
        "hot": lambda: _hot(seq, top),
        "reuse": lambda: _reuse(seq),
        "overlap": lambda: _overlap(seq, OVERLAP_LAGS),
        "workset": lambda: _workset(
            seq, WORKSET_MARKS, _sizes(meta_trace), _n_expert(meta_trace, seq)
        ),
        "cache": lambda: _cache(seq),
        "entropy": lambda: _entropy(seq),
        "bytes": lambda: _bytes(seq, meta_trace),
        "matrix": lambda: _matrix(seq, cells, matrix_limit),
    }
    return {name: build[name]() for name in names}


# ----------------------------------------------------------------------------- reuse in bytes


def reuse_bytes_distances(trace: RouteTrace) -> pd.DataFrame:
    """Every reuse with its LRU stack distance in bytes: the bytes of the distinct experts
    (of any layer) looked up between an expert's previous lookup and this one. An LRU cache
    holding at least that many bytes plus the expert itself still has it resident.

    Lookups follow the engine's batches: prefill is one batch per layer holding every prompt
    token's experts, decode one batch per (step, layer); a repeated id inside a batch is one
    lookup. Sizes come from the preamble (a layer without one is an error, never free).
    Computed by the replay's stack-distance kernel (one implementation)."""
    from bmoe.analyze.replay import lru_reuse_bytes

    return lru_reuse_bytes(trace)


# ----------------------------------------------------------------------------- grids for plots


def routing_grid(trace: Trace, value: str = "residency") -> pd.DataFrame:
    """The step x (layer, slot) grid of one column (``residency`` or ``expert``): one row
    per step (index: step), columns a (layer, slot) MultiIndex, -1 where nothing was routed."""
    import pandas as pd

    seq, _ = _sequence(trace)
    rows = seq.rows
    if value not in ("residency", "expert"):
        raise BmoeError(f"unknown grid value {value!r} (choose residency or expert)")
    if value not in rows or not seq.n_rows:
        return pd.DataFrame()
    slot = rows["slot"].astype(np.int64) if "slot" in rows else seq.cell * 0
    k = int(slot.max()) + 1
    steps, step_row = np.unique(seq.cell_step_code, return_inverse=True)
    grid = np.full((len(steps), seq.n_layers * k), -1, dtype=np.int16)
    grid[step_row[seq.gcell], seq.layer_idx * k + slot] = rows[value].astype(np.int16)
    step_of = np.zeros(len(steps), dtype=np.int64)
    step_of[step_row] = rows["step"][seq.cell_start]
    columns = pd.MultiIndex.from_product(
        [seq.layers.astype(np.int64), np.arange(k)], names=["layer", "slot"]
    )
    return pd.DataFrame(grid, index=pd.Index(step_of, name="step"), columns=columns)


# ----------------------------------------------------------------------------- in passes


def route_views_in_passes(
    blocks: Callable[[], Iterable[pd.DataFrame]],
    trace: RouteTrace,
    names: Iterable[str] = DEFAULT_VIEWS,
    *,
    phase: str = "decode",
    turn: int | None = None,
    layers: Collection[int] | None = None,
    steps: Collection[int] | None = None,
    top: int = 8,
    max_rows: int = 20_000_000,
) -> dict[str, pd.DataFrame]:
    """The views of :func:`route_views` (all but the matrix) of a trace too large to hold,
    holding about `max_rows` rows at a time. Every view is per layer (the pooled rows are
    sums), so a first pass over the blocks counts each layer's rows and the distinct steps,
    then each further pass analyses a group of whole layers and the groups are joined.

    `blocks()` starts a fresh walk over the rows, block by block (for a file:
    ``lambda: iter_route_rows(path)``); `trace` gives the preamble (its rows are unused).
    The figures are :func:`route_views`'s on the same selection (the pooled means to the
    last bits of a float)."""
    names = list(names)
    unknown = [n for n in names if n not in DEFAULT_VIEWS]
    if unknown:
        raise BmoeError(
            f"view {', '.join(unknown)} cannot be analysed in passes "
            f"(choose from {', '.join(DEFAULT_VIEWS)})"
        )
    per_layer: dict[int, int] = {}
    step_keys = np.zeros(0, dtype=np.int64)
    empty: pd.DataFrame | None = None
    for block in blocks():
        empty = block.iloc[:0] if empty is None else empty
        cols = _columns(block)
        keep = _kept(cols, phase, turn, layers, steps)
        ids, counts = np.unique(cols["layer"][keep], return_counts=True)
        for layer, count in zip(ids.tolist(), counts.tolist(), strict=True):
            per_layer[layer] = per_layer.get(layer, 0) + count
        step_keys = np.union1d(step_keys, np.unique(_step_keys(cols, keep)))
    if not per_layer:
        import pandas as pd

        none = empty if empty is not None else pd.DataFrame(columns=["step", "layer", "expert"])
        return route_views(dataclasses.replace(trace, rows=none), names, top=top)
    groups: list[list[int]] = [[]]
    held = 0
    for layer in sorted(per_layer):
        if groups[-1] and held + per_layer[layer] > max_rows:
            groups.append([])
            held = 0
        groups[-1].append(layer)
        held += per_layer[layer]
    parts = [
        _group_views(blocks, trace, group, len(step_keys), phase, turn, steps, top)
        for group in groups
    ]
    joined = _join_groups(parts, len(step_keys))
    return {name: as_frame(joined[name]) for name in names}


def _step_keys(rows: Columns, keep: np.ndarray) -> np.ndarray:
    """(turn, step, phase) as one int64 per kept row, the same for every block."""
    key = rows["step"][keep].astype(np.int64)
    if "turn" in rows:
        key += rows["turn"][keep].astype(np.int64) << 32
    key <<= 1
    if "phase" in rows:
        key += rows["phase"][keep]
    return key


def _group_views(
    blocks: Callable[[], Iterable[pd.DataFrame]],
    trace: RouteTrace,
    group: list[int],
    n_steps: int,
    phase: str,
    turn: int | None,
    steps: Collection[int] | None,
    top: int,
) -> dict[str, Any]:
    """One pass: the rows of the layers in `group`, and their views and counts."""
    parts = []
    for block in blocks():
        cols = _columns(block)
        keep = _kept(cols, phase, turn, group, steps)
        parts.append({c: a[keep] for c, a in cols.items()})
    rows = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    del parts
    seq = dataclasses.replace(_order(rows), n_steps=n_steps)
    sizes = _sizes(trace)
    out: dict[str, Any] = {
        "sanity": _sanity(seq, trace),
        "hot": _hot(seq, top),
        "reuse": _reuse(seq),
        "overlap": _without_all(_overlap(seq, OVERLAP_LAGS)),
        "workset": _without_all(_workset(seq, WORKSET_MARKS, sizes, _n_expert(trace, seq))),
        "cache": _without_all(_cache(seq)),
        "entropy": _entropy(seq),
        "bytes": _without_all(_bytes(seq, trace)),
        "cells": seq.cells_per_layer,
    }
    return out


def _without_all(view: View) -> View:
    layer = view.get("layer")
    if layer is None or not len(layer):
        return view
    keep = layer != ALL
    out = {c: v[keep] for c, v in view.items()}
    out["layer"] = out["layer"].astype(np.int64)
    return out


def _concat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    if any(isinstance(a, np.ma.MaskedArray) for a in arrays):
        return np.ma.concatenate(arrays)
    return np.concatenate(arrays)


def _join_groups(parts: list[dict[str, Any]], n_steps: int) -> dict[str, View]:
    """The groups' per-layer rows one after the other, and the pooled rows recomputed."""

    def cat(name: str) -> View:
        return {c: _concat([p[name][c] for p in parts]) for c in parts[0][name]}

    out = {name: cat(name) for name in ("hot", "reuse", "entropy")}
    cells = np.concatenate([p["cells"] for p in parts])  # per layer, in the views' order
    overlap = cat("overlap")
    pooled = {}
    for g in OVERLAP_LAGS:
        counted = np.maximum(cells - g, 0)
        total = float((overlap[f"lag_{g}"] * counted).sum())
        pooled[f"lag_{g}"] = total / counted.sum() if counted.sum() else 0.0
    out["overlap"] = _with_all_row(overlap, pooled)
    out["workset"] = _with_workset_totals(cat("workset"))
    cache = cat("cache")
    if "routings" in cache and len(cache["routings"]):
        routings = cache["routings"]
        n = int(routings.sum())
        share = {
            c: 100.0 * float(np.round(cache[c] * routings / 100.0).sum()) / n if n else np.nan
            for c in ("miss_pct", "hit_pct", "prefetch_pct")
        }
        cache = _with_all_row(cache, {**share, "routings": n})
    out["cache"] = cache
    by = cat("bytes")
    total = float(np.nansum(by["read_mib"]))
    out["bytes"] = _with_all_row(
        by,
        {
            "read_mib": total,
            "expert_mib": np.nan,
            "dense_mib": float(np.sum(by["dense_mib"])),
            "mib_per_step": total / max(n_steps, 1),
        },
    )
    san = cat("sanity")
    k = san["k"][0]
    out["sanity"] = _one_row(
        {
            "rows": int(san["rows"].sum()),
            "cells": int(san["cells"].sum()),
            "steps": n_steps,
            "layers": int(san["layers"].sum()),
            "k": k,
            "cells_not_k": int(san["cells_not_k"].sum()) if k is not None else None,
            "steps_per_layer_min": int(san["steps_per_layer_min"].min()),
            "steps_per_layer_max": int(san["steps_per_layer_max"].max()),
            "cells_weighed": int(san["cells_weighed"].sum()),
            "weight_sum_min": _nan_extreme(san["weight_sum_min"], np.nanmin),
            "weight_sum_max": _nan_extreme(san["weight_sum_max"], np.nanmax),
        }
    )
    return out


def _nan_extreme(values: np.ndarray, pick: Callable[[np.ndarray], Any]) -> float:
    known = np.asarray(values, dtype=np.float64)
    known = known[~np.isnan(known)]
    return float(pick(known)) if len(known) else np.nan
