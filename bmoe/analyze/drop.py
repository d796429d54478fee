"""Drop replay: what cache-aware expert dropping would have saved on a recorded trace.

Per routing cell (one token at one layer) with known weights, a cache-aware rule drops a
MISS whose gate weight is below ``frac x 1/k`` (never the cell's highest-weight slot). For
each frac it reports the share of miss bytes saved (``io_saved``), the share of gate weight
mass lost (``mass_lost``) and how many experts survive per cell. The static baseline keeps
the first ``keep_k`` slots whatever the cache held (what ``--n-expert-used`` does). A trace
recorded with dropping on also reports what its ``dropped`` column says was dropped; that
trace's routing is what the ROUTER asked for. Decode and prefill are reported apart.

Misses are rows with ``residency`` 0, and bytes come from the row's ``expert_bytes`` (what
the engine read: 0 for a repeat inside a prefill batch or a dropped routing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_FRACS = (0.25, 0.5, 0.75, 1.0)
PHASES = {"decode": 1, "prefill": 0}
#: Rows per chunk of a row-sized temporary (its peak: a few MiB, not a copy of a column).
_CHUNK = 1 << 20


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else float("nan")


def survivors_text(counts: pd.Series) -> str:
    """``n:pct%`` for every survivor count that occurs (the reference's histogram form)."""
    total = counts.sum()
    return " ".join(f"{int(n)}:{100 * c / total:.0f}%" for n, c in counts.items() if c)


def _phase_rows(trace: RouteTrace, phase: int, turn: int | None) -> pd.DataFrame:
    """The rows of one phase (and turn); the frame itself, not a copy, when that is all."""
    rows = trace.rows
    if "phase" in rows:
        chosen = rows["phase"].to_numpy() == phase
        if not chosen.all():
            rows = rows[chosen]
    elif phase != 1:
        rows = rows.iloc[:0]
    if turn is not None and "turn" in rows:
        chosen = rows["turn"].to_numpy() == turn
        if not chosen.all():
            rows = rows[chosen]
    return rows


def _cell_ids(rows: pd.DataFrame) -> np.ndarray:
    """0-based id of each row's cell (turn, step, layer), in order of first appearance."""
    turns = rows["turn"].to_numpy() if "turn" in rows else np.zeros(len(rows), np.int16)
    step, layer = rows["step"].to_numpy(), rows["layer"].to_numpy()
    columns = (turns, step, layer)
    bits = ((turns, 16), (step, 32), (layer, 16))
    if len(rows) and all(
        int(a.min()) >= -(2 ** (b - 1)) and int(a.max()) < 2 ** (b - 1) for a, b in bits
    ):  # (turn, step, layer) packs into one int64 key: 16 / 32 / 16 bits
        ids = _runs_or_factorized(columns)
    else:
        import pandas as pd

        ids = pd.factorize(pd.MultiIndex.from_arrays(list(columns)))[0]
    return ids.astype(np.int32, copy=False) if len(ids) < 2**31 else ids


def _packed_keys(columns: tuple[np.ndarray, ...], at: np.ndarray | None = None) -> np.ndarray:
    """The int64 key (turn, step, layer) of every row, or of the rows `at`."""
    n = len(columns[0]) if at is None else len(at)
    key = np.zeros(n, dtype=np.int64)
    fields = zip(columns, (0xFFFF, 0xFFFFFFFF, 0xFFFF), (48, 16, 0), strict=True)
    for values, mask, shift in fields:
        part = (values if at is None else values[at]).astype(np.int64)
        part &= mask
        part <<= shift
        key |= part
        del part
    return key


def _runs_or_factorized(columns: tuple[np.ndarray, ...]) -> np.ndarray:
    """Ids of equal (turn, step, layer), numbered in order of first appearance. A trace
    writes each cell's rows together, so a cell is one run of equal rows: when no cell
    starts two runs, the run number is the id (a bool and an int32 per row, and a key per
    run, where a key and a hash table per row need far more)."""
    n = len(columns[0])
    change = np.zeros(n, dtype=bool)
    change[:1] = True
    differs = np.empty(max(n - 1, 0), dtype=bool)
    for values in columns:
        np.not_equal(values[1:], values[:-1], out=differs)
        change[1:] |= differs
    del differs
    firsts = np.sort(_packed_keys(columns, np.flatnonzero(change)))
    if not (firsts[1:] == firsts[:-1]).any():
        del firsts
        ids: np.ndarray = np.cumsum(change, dtype=np.int64 if n >= 2**31 else np.int32)
        np.subtract(ids, 1, out=ids)
        return ids
    import pandas as pd

    return pd.factorize(_packed_keys(columns))[0]


def _read_bytes(trace: RouteTrace, rows: pd.DataFrame) -> np.ndarray:
    """Bytes each row's routing reads on a miss: the row's ``expert_bytes`` (the frame's own
    array, not a copy), or for older traces the layer's size from the preamble."""
    if "expert_bytes" in rows:
        return rows["expert_bytes"].to_numpy()
    per_layer = trace.expert_bytes()
    sizes = rows["layer"].map(per_layer).to_numpy(dtype=np.float64)
    if np.isnan(sizes).any():
        raise BmoeError(f"{trace.path or 'trace'}: a layer has no expert_bytes")
    return sizes


def _sum64(values: np.ndarray) -> float:
    """The float64 sum of `values` (widened first: the same sum as of a float64 array)."""
    return values.astype(np.float64, copy=False).sum()


def _top_slots(cid: np.ndarray, w: np.ndarray, n_cells: int) -> np.ndarray:
    """Each cell's highest-weight row (the first of equal weights, in file order)."""
    best = np.full(n_cells, -np.inf)
    np.maximum.at(best, cid, w)
    candidates = np.concatenate(  # by chunks: no row-sized copy of the cells' maxima
        [
            lo + np.flatnonzero(w[lo : lo + _CHUNK] == best[cid[lo : lo + _CHUNK]])
            for lo in range(0, len(cid), _CHUNK)
        ]
        or [np.zeros(0, dtype=np.int64)]
    )
    _cells, first = np.unique(cid[candidates], return_index=True)
    top = np.zeros(len(cid), dtype=bool)
    top[candidates[first]] = True
    return top


def drop_phase(
    trace: RouteTrace,
    phase: str = "decode",
    fracs: Sequence[float] = DEFAULT_FRACS,
    *,
    turn: int | None = None,
) -> dict[str, pd.DataFrame | dict]:
    """The drop replay of one phase: ``summary`` (figures), ``threshold`` (one row per
    frac), ``static_k`` (one row per keep_k) and ``survivors`` (cells per survivor count,
    one row per frac)."""
    import pandas as pd

    missing = [c for c in ("residency", "slot", "weight") if c not in trace.rows]
    if missing:
        raise BmoeError(
            f"{trace.path or 'trace'}: drop replay needs the {', '.join(missing)} column(s) "
            "(hit or miss, rank, gate weight)"
        )
    rows = _phase_rows(trace, PHASES[phase], turn)
    k = trace.n_expert_used or (int(rows["slot"].max()) + 1 if len(rows) else 0)
    cell_id = _cell_ids(rows)
    weight = rows["weight"].to_numpy()  # float32 as read: widened where it is summed
    if weight.dtype not in (np.float32, np.float64):
        weight = weight.astype(np.float64)
    miss = rows["residency"].to_numpy() == 0
    sizes = _read_bytes(trace, rows)
    n_cells = int(cell_id.max()) + 1 if len(cell_id) else 0
    # The work is sized by the rows, not the preamble's k: no cell keeps more experts than it
    # routed, and keeping the first keep_k slots drops nothing once keep_k passes the last slot.
    routed = np.bincount(cell_id, minlength=n_cells)
    widest = int(routed.max()) if n_cells else 0
    slots = int(rows["slot"].max()) + 1 if len(rows) else 0

    summary: dict = {
        "phase": phase,
        "cells": n_cells,
        "routed": len(rows),
        "miss_pct": _pct(int(miss.sum()), len(rows)),
        "k": k,
        "uniform_share_pct": 100.0 / k if k else float("nan"),
    }
    dropped = rows["dropped"].to_numpy() != 0 if "dropped" in rows else np.zeros(0, bool)
    if dropped.any():  # recorded with dropping on: what the run actually dropped
        known_w = np.nan_to_num(weight.astype(np.float64))
        summary["recorded_dropped"] = int(dropped.sum())
        summary["recorded_dropped_pct"] = _pct(int(dropped.sum()), len(rows))
        summary["recorded_mass_pct"] = float(_pct(known_w[dropped].sum(), known_w.sum()))

    # cells with known weights only
    unknown = np.zeros(n_cells, dtype=bool)
    unknown[cell_id[np.isnan(weight)]] = True
    cid, w, m, size = cell_id, weight, miss, sizes
    slot = rows["slot"].to_numpy()
    if unknown.any():  # (copies only when some cell has an unknown weight)
        keep = ~unknown[cell_id]
        cid, w, m, size, slot = cid[keep], w[keep], m[keep], size[keep], slot[keep]
    del weight, sizes

    def miss_bytes(rows_dropped: np.ndarray) -> float:  # bytes the dropped misses would read
        return float(size[rows_dropped & m].sum(dtype=np.float64))

    summary["cells_with_weights"] = int((~unknown).sum())
    total_w = _sum64(w)
    total_mb = miss_bytes(np.ones(len(m), dtype=bool))
    top = _top_slots(cid, w, n_cells)
    routed_known = routed if not unknown.any() else np.bincount(cid, minlength=n_cells)

    thr_rows, surv_rows = [], []
    cells_known = np.flatnonzero(~unknown)
    for frac in fracs:
        thr = frac / k if k else float("nan")
        drop = m & (w < np.float64(thr)) & ~top  # compared in float64
        surviving = (routed_known - np.bincount(cid[drop], minlength=n_cells))[cells_known]
        counts = pd.Series(surviving.astype(int)).value_counts().sort_index()
        counts = counts.reindex(range(0, min(k, widest) + 1), fill_value=0)
        thr_rows.append(
            {
                "frac": frac,
                "thr_pct": 100.0 * thr,
                "io_saved_pct": float(_pct(miss_bytes(drop), total_mb)),
                "mass_lost_pct": float(_pct(_sum64(w[drop]), total_w)),
                "dropped": int(drop.sum()),
                "surviving": survivors_text(counts),
            }
        )
        surv_rows.append({"frac": frac, **{str(n): int(c) for n, c in counts.items()}})
    static_rows = []
    for keep_k in range(min(k, max(slots, 1)) - 1, 0, -1):
        drop = slot >= keep_k
        static_rows.append(
            {
                "keep_k": keep_k,
                "io_saved_pct": float(_pct(miss_bytes(drop), total_mb)),
                "mass_lost_pct": float(_pct(_sum64(w[drop]), total_w)),
            }
        )
    return {
        "summary": summary,
        "threshold": pd.DataFrame(thr_rows),
        "static_k": pd.DataFrame(static_rows, columns=["keep_k", "io_saved_pct", "mass_lost_pct"]),
        "survivors": pd.DataFrame(surv_rows),
    }


def drop_replay(
    trace: RouteTrace,
    fracs: Sequence[float] = DEFAULT_FRACS,
    *,
    turn: int | None = None,
) -> dict[str, dict[str, pd.DataFrame | dict]]:
    """The drop replay per phase (``decode``, then ``prefill``), phases with rows only."""
    out = {}
    for phase in PHASES:
        if len(_phase_rows(trace, PHASES[phase], turn)):
            out[phase] = drop_phase(trace, phase, fracs, turn=turn)
    if not out:
        raise BmoeError(f"{trace.path or 'trace'}: no routing rows")
    return out
