"""What the terms are measured from: each run's decode tokens and the evidence shared.

Per decode token of one run, in the profile's units: the times its metrics recorded and
the reads it made (demand misses per read batch, speculative reads).

What the profile's sections are built from, and what they report while they are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.device.runs import ProfileRun, RunConfig, number
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace
from bmoe.units import MIB


def decode_misses(route: RouteTrace) -> pd.DataFrame:
    """Per decode (step, layer) of a recorded run: the distinct experts it missed (read on
    demand). ``token`` numbers the decode steps 0, 1, ... in order."""
    rows = route.rows
    dec = rows[rows["phase"] != 0] if "phase" in rows else rows
    if "residency" not in dec:
        raise BmoeError(f"{route.path or 'route trace'}: no residency column (misses unknown)")
    read = dec["residency"] == 0
    if "dropped" in dec:  # a dropped routing was never read
        read &= dec["dropped"] == 0
    turn = dec["turn"] if "turn" in dec else pd.Series(0, index=dec.index)
    frame = pd.DataFrame({"turn": turn, "step": dec["step"], "layer": dec["layer"]})
    keys = frame[read].assign(expert=dec.loc[read, "expert"]).drop_duplicates()
    per = keys.groupby(["turn", "step", "layer"]).size().rename("misses").reset_index()
    tokens = frame[["turn", "step"]].drop_duplicates().sort_values(["turn", "step"])
    tokens["token"] = np.arange(len(tokens))
    return per.merge(tokens, on=["turn", "step"], how="left")


@dataclass
class Tokens:
    """Per decode token of one run, in the profile's units: the times the metrics recorded
    (NaN where a column is absent), reads of ``unit`` bytes (demand ``misses`` and
    ``prefetched``), and the per-batch matrix of demand reads (tokens x read batches)."""

    frame: pd.DataFrame
    batches: np.ndarray  # float64, tokens x layers (one column when the layers are unknown)
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def values(self, column: str) -> np.ndarray:
        """A column of `frame` as a float64 array, made once (read-only: callers copy)."""
        out = self._arrays.get(column)
        if out is None:
            out = self.frame[column].to_numpy(np.float64)
            out.flags.writeable = False
            self._arrays[column] = out
        return out


def column(rows: pd.DataFrame, name: str, default: float = np.nan) -> np.ndarray:
    """A numeric column of `rows` as float64 (`default` throughout when it is absent), an
    array of its own (a view of Arrow memory would be read-only: no rows, for one)."""
    if name not in rows:
        return np.full(len(rows), default)
    return pd.to_numeric(rows[name], errors="coerce").to_numpy(np.float64, copy=True)


def _has_spec_io(run: ProfileRun) -> bool:
    return run.io is not None and "spec" in run.io.rows and len(run.io.rows) > 0


def _spec_bytes(run: ProfileRun, read: np.ndarray) -> np.ndarray:
    """Per token, the bytes read speculatively: from the io trace, else the summary's
    ``spec_read_MiB`` spread evenly (never more than the token read)."""
    n = len(read)
    spec = np.zeros(n)
    if run.io is not None and _has_spec_io(run):
        io = run.io.rows
        dec = io[io["phase"] != 0] if "phase" in io else io
        if len(dec):
            steps = np.sort(dec["step"].unique())
            moved = dec[dec["spec"] != 0].groupby("step")["read_bytes"].sum()
            idx = np.searchsorted(steps, moved.index.to_numpy())
            keep = idx < n
            np.add.at(spec, idx[keep], moved.to_numpy(np.float64)[keep])
    else:
        total = number(run.figure("spec_read_MiB")) or 0.0
        if total > 0 and n:
            spec = np.minimum(np.full(n, total * MIB / n), read)
    return spec


def _route_matrix(route: RouteTrace, n: int) -> np.ndarray:
    """Tokens x layers: the distinct experts each decode token missed per layer."""
    per = decode_misses(route)
    per = per[per["token"] < n]
    layers = sorted(route.expert_bytes()) or sorted(per["layer"].unique())
    col = {layer: i for i, layer in enumerate(layers)}
    matrix = np.zeros((n, max(len(layers), 1)))
    known = per["layer"].isin(col)
    np.add.at(
        matrix,
        (per.loc[known, "token"].to_numpy(np.int64),
         per.loc[known, "layer"].map(col).to_numpy(np.int64)),
        per.loc[known, "misses"].to_numpy(np.float64),
    )  # fmt: skip
    return matrix


def split_evenly(misses: np.ndarray, n_layers: int | None) -> np.ndarray:
    """Tokens x layers: each token's reads rounded and spread evenly over `n_layers` (the
    first layers take the remainder); one column of the reads themselves without layers."""
    if not n_layers:
        return misses[:, None]
    whole = np.rint(misses)
    base, extra = np.divmod(whole, n_layers)
    return base[:, None] + (np.arange(n_layers)[None, :] < extra[:, None])


def _prefetched(run: ProfileRun, spec: np.ndarray, unit: float) -> np.ndarray:
    """Per token, the experts prefetched: counted in the io trace where it says which,
    else the speculative bytes in reads of `unit` bytes."""
    n = len(spec)
    prefetched = spec / unit
    if run.io is None or not _has_spec_io(run):
        return prefetched
    io = run.io.rows
    dec = io[(io["spec"] != 0) & (io["phase"] != 0)] if "phase" in io else io[io["spec"] != 0]
    if len(dec):  # count experts, not bytes, where the trace says which
        steps = np.sort(io.loc[io["phase"] != 0, "step"].unique()) if "phase" in io else (
            np.sort(io["step"].unique()))  # fmt: skip
        per = dec[["step", "layer", "expert"]].drop_duplicates().groupby("step").size()
        idx = np.searchsorted(steps, per.index.to_numpy())
        keep = idx < n
        prefetched = np.zeros(n)
        np.add.at(prefetched, idx[keep], per.to_numpy(np.float64)[keep])
    return prefetched


def token_reads(
    run: ProfileRun, unit: float, n_layers: int | None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Per decode token of `run`: demand and speculative reads (in reads of `unit` bytes) and
    the per-batch matrix of demand reads. From the route trace where the run has one (exact
    per layer), else the token's ``read_bytes`` (the speculative share from the io trace or,
    spread evenly, the summary's ``spec_read_MiB``) split evenly over `n_layers` (one batch
    per token when the layers are unknown)."""
    rows = run.metrics.rows.reset_index(drop=True)
    n = len(rows)
    read = column(rows, "read_bytes", 0.0)
    spec = _spec_bytes(run, read)
    demand = np.maximum(read - spec, 0.0)
    if run.route is not None and "residency" in run.route.rows and n_layers:
        matrix = _route_matrix(run.route, n)
    else:
        matrix = split_evenly(demand / unit, n_layers)
    frame = pd.DataFrame(
        {
            "read_mib": read / MIB,
            "spec_mib": spec / MIB,
            "misses": matrix.sum(axis=1),
            "prefetched": _prefetched(run, spec, unit),
        }
    )
    return frame, matrix


def token_frame(run: ProfileRun, unit: float, n_layers: int | None) -> Tokens:
    """Per decode token of `run`: its recorded times beside its reads (see :class:`Tokens`);
    CPU time of 0 throughout is unmeasured (NaN), and so are major faults where the
    platform reported neither."""
    rows = run.metrics.rows.reset_index(drop=True)
    reads, matrix = token_reads(run, unit, n_layers)
    cpu = column(rows, "cpu_ms")
    if np.nansum(cpu) <= 0:
        cpu[:] = np.nan  # 0 means unmeasured
    majflt = column(rows, "majflt")
    if "majflt" in rows and np.nansum(majflt) <= 0 and np.nansum(cpu) != np.nansum(cpu):
        majflt[:] = np.nan  # a platform that reports neither
    frame = pd.DataFrame(
        {
            "wall_ms": column(rows, "wall_ms"),
            "io_ms": column(rows, "io_ms"),
            "compute_ms": column(rows, "compute_ms"),
            "mgmt_ms": column(rows, "mgmt_ms"),
            "stall_ms": column(rows, "stall_ms", 0.0),
            "cpu_ms": cpu,
            "majflt": majflt,
            **{c: reads[c].to_numpy() for c in reads},
        }
    )
    return Tokens(frame, matrix)


@dataclass
class Evidence:
    """The runs, per run its configuration and tokens, and the runs' system states; the model's read
    geometry (``slices`` per expert, ``req`` bytes per flash request); which runs the timing
    terms come from (``timing``); and what the sections found on the way (``caveats``,
    ``unsettled``, ``absent`` and the ``terms`` records, in the order they were found)."""

    runs: list[ProfileRun]
    configs: dict[str, RunConfig]
    tokens: dict[str, Tokens]
    states: list[dict[str, Any]]
    slices: int
    req: float
    timing: list[ProfileRun] = field(default_factory=list)
    untraced: list[ProfileRun] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)
    terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Figures of one run that do not depend on which runs are beside it, made once and
    #: shared with every subset (see :meth:`subset`).
    per_run: dict[tuple[str, str], Any] = field(default_factory=dict)

    def subset(self, runs: list[ProfileRun]) -> Evidence:
        """The evidence of `runs` alone (what the sections found so far left behind)."""
        names = {r.name for r in runs}
        return Evidence(
            runs=list(runs),
            configs={n: c for n, c in self.configs.items() if n in names},
            tokens={n: t for n, t in self.tokens.items() if n in names},
            states=[s for s in self.states if s["name"] in names],
            slices=self.slices,
            req=self.req,
            per_run=self.per_run,
        )

    @property
    def state(self) -> dict[str, dict[str, Any]]:
        """Each run's system state by name."""
        return {s["name"]: s for s in self.states}

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        return {name: t.frame for name, t in self.tokens.items()}

    def frame(self, run: ProfileRun) -> pd.DataFrame:
        return self.tokens[run.name].frame

    def values(self, run: ProfileRun, column: str) -> np.ndarray:
        """A column of the run's tokens (read-only)."""
        return self.tokens[run.name].values(column)

    def admits(self, run: ProfileRun) -> np.ndarray:
        """Per token, the experts the run admitted (demand misses and prefetched)."""
        return self.values(run, "misses") + self.values(run, "prefetched")

    def measured(self, run: ProfileRun, column: str) -> bool:
        """Whether the run recorded `column` for any token."""
        return bool((~np.isnan(self.values(run, column))).any())

    def starved(self, run: ProfileRun) -> bool:
        return bool(self.state[run.name]["starved"])

    def config_key(self, run: ProfileRun) -> tuple:
        """What makes two runs repeats of one configuration: the grid axes, top-k and the
        dense weights' placement."""
        config = self.configs[run.name]
        return (
            tuple(config.axes().items()),
            config.n_expert_used,
            run.metrics.params.get("dense_weights"),
        )

    def config_keys(self, runs: list[ProfileRun]) -> dict[str, tuple]:
        """Each run's configuration key by name (see :meth:`config_key`)."""
        return {r.name: self.config_key(r) for r in runs}

    def contended(self, run: ProfileRun) -> bool:
        """Starved, or its compute waited for a core (see ``run_state``)."""
        state = self.state[run.name]
        return bool(state.get("contended", state["starved"]))


__all__ = [
    "Evidence",
    "Tokens",
    "column",
    "decode_misses",
    "split_evenly",
    "token_frame",
    "token_reads",
]
