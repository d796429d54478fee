"""Stall attribution: where each token's wall time went, in shares that add up to the wall.

Four parts per token, none of them the ``compute_ms`` residual read as compute, filled in
this order so that they partition ``wall_ms`` by construction:

* **flash wait** = ``io_ms`` in serial runs, ``stall_ms`` under overlap (where ``io_ms`` is
  summed lane-busy time and can exceed the wall): wall time the compute threads waited;
* **cache mgmt** = ``mgmt_ms``, another wait the engine clocks on the wall;
* **compute** = ``cpu_ms`` / compute threads (an attribution *proxy*), up to the wall the
  waits left over;
* **unattributed** = what remains (off-CPU time: swap-in, preemption, frequency caps).

Waits are wall time by definition; the compute proxy is busy time, and process CPU also
covers the I/O lanes and every other thread, which run *while* the compute threads wait. So
the proxy can add up past the wall (172 % on a serial two-lane run). That surplus is not
wall time: it is reported beside the parts as **overlapped** (busy time that ran alongside
the waits, plus any wait a file records beyond its token's wall), never stacked on them. No
part is rescaled: each is its measured value until the wall runs out.

Where ``cpu_ms`` is unmeasured (the column is absent, or 0 because the platform cannot report
it) compute falls back to the ``compute_ms`` residual and is labelled as such. Speculation
groups are spread over their tokens first (see :func:`bmoe.analyze.metrics.per_token`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bmoe.analyze.metrics import MEMORY_COLUMNS, per_token
from bmoe.formats.metrics import MetricsRun

#: The parts of a token's wall time (they sum to ``wall_ms``).
COMPONENTS = ("compute_ms", "flash_ms", "mgmt_ms", "unattributed_ms")
#: Busy time counted beyond the wall (beside the parts, never added to them).
OVERLAPPED = "overlapped_ms"

COMPUTE_PROXY = "cpu_ms / threads"
COMPUTE_RESIDUAL = "compute_ms residual"


@dataclass
class StallAttribution:
    """The panel for one run: per token, per run, and how each term was decided."""

    tokens: pd.DataFrame  # step, wall_ms, the COMPONENTS, overlapped_ms, ...
    summary: pd.DataFrame  # component, ms_per_token, pct_of_wall, source, overlapped
    overlap: bool
    overlap_source: str
    threads: int | None
    compute_source: str  # COMPUTE_PROXY, COMPUTE_RESIDUAL or "mixed (...)"
    notes: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, object]:
        """How the panel was built, as named figures."""
        return {
            "overlap": self.overlap,
            "overlap decided by": self.overlap_source,
            "compute threads": self.threads,
            "compute from": self.compute_source,
        }


def decide_overlap(run: MetricsRun, overlap: bool | None = None) -> tuple[bool, str]:
    """Whether the run overlapped reads with compute, and how that was decided.

    The preamble's ``overlap=`` when present. A file without it (v0) is read as overlapped
    when some token has ``stall_ms > 0`` (the engine writes 0 in serial mode) or
    ``io_ms > wall_ms`` (summed lane time can exceed the wall only under overlap), else serial.
    """
    if overlap is not None:
        return bool(overlap), "given"
    if "overlap" in run.params:
        value = run.params["overlap"]
        whole = isinstance(value, bool) or (isinstance(value, float) and value.is_integer())
        said = int(value) if whole else value  # overlap=1, not True or 1.0; inf stays inf
        return bool(value), f"the preamble's overlap={said}"
    rows = run.rows
    if "stall_ms" in rows and bool((rows["stall_ms"] > 0).any()):
        return True, "inferred: no preamble, stall_ms > 0 on some tokens"
    if {"io_ms", "wall_ms"} <= set(rows.columns) and bool((rows["io_ms"] > rows["wall_ms"]).any()):
        return True, "inferred: no preamble, io_ms > wall_ms on some tokens"
    return False, "inferred: no preamble, stall_ms is 0 throughout"


def stall_attribution(
    run: MetricsRun, threads: int | None = None, overlap: bool | None = None
) -> StallAttribution:
    """The attribution panel per token and per run.

    `threads` overrides the preamble's ``threads=`` (needed for the cpu_ms proxy in files
    without a preamble); `overlap` overrides :func:`decide_overlap`.
    """
    tokens = per_token(run)
    n = len(tokens)
    notes: list[str] = []
    is_overlap, overlap_source = decide_overlap(run, overlap)
    threads = threads if threads is not None else run.params.get("threads")
    threads = int(threads) if isinstance(threads, int | float) and threads > 0 else None

    wall = tokens["wall_ms"].to_numpy(dtype=float)
    zeros = np.zeros(n)
    unknown = np.full(n, np.nan)
    mgmt = tokens["mgmt_ms"].to_numpy(dtype=float) if "mgmt_ms" in tokens else unknown
    if "mgmt_ms" not in tokens:
        notes.append("no mgmt_ms column: cache mgmt is unknown (folded into the residual)")
    flash_col = "stall_ms" if is_overlap else "io_ms"
    if flash_col in tokens:
        flash = tokens[flash_col].to_numpy(dtype=float)
    else:
        flash = unknown
        notes.append(f"no {flash_col} column: flash wait is unknown")

    residual = tokens["compute_ms"].to_numpy(dtype=float) if "compute_ms" in tokens else None
    if residual is None:
        residual = np.clip(wall - np.nan_to_num(flash) - np.nan_to_num(mgmt), 0.0, None)
    cpu = tokens["cpu_ms"].to_numpy(dtype=float) if "cpu_ms" in tokens else None
    if cpu is not None and threads is None and bool((cpu > 0).any()):
        notes.append("cpu_ms is measured but the thread count is unknown (pass threads)")
    use_proxy = (cpu > 0) if cpu is not None and threads else np.zeros(n, dtype=bool)
    busy = np.where(use_proxy, (cpu if cpu is not None else zeros) / (threads or 1), residual)
    if use_proxy.all() and n:
        compute_source = COMPUTE_PROXY
    elif not use_proxy.any():
        compute_source = COMPUTE_RESIDUAL
    else:
        compute_source = f"mixed ({int((~use_proxy).sum())} tokens use the compute_ms residual)"
    parts = partition_wall(wall, np.nan_to_num(flash), np.nan_to_num(mgmt), busy)
    overlapped = parts["overlapped"]
    if n and bool((overlapped > 0).any()):
        share = 100.0 * overlapped.sum() / wall.sum() if wall.sum() > 0 else float("nan")
        notes.append(
            f"busy time equal to {share_text(share)} % of the wall time ran alongside the waits "
            f"(the {compute_source} proxy counts the I/O lanes and other threads): shown as "
            "overlapped, not stacked on the wall"
        )

    out = pd.DataFrame(
        {
            "step": tokens["step"].to_numpy(),
            "turn": tokens["turn"].to_numpy(),
            "wall_ms": wall,
            "compute_ms": parts["compute"],
            "flash_ms": np.where(np.isnan(flash), np.nan, parts["flash"]),
            "mgmt_ms": np.where(np.isnan(mgmt), np.nan, parts["mgmt"]),
            "unattributed_ms": parts["unattributed"],
            "overlapped_ms": overlapped,
            "compute_is_residual": ~use_proxy,
        }
    )
    summary = attribution_summary(out, compute_source, flash_col)
    return StallAttribution(
        out, summary, is_overlap, overlap_source, threads, compute_source, notes
    )


def share_text(pct: float) -> str:
    """A share of the wall as the attribution table prints it (one decimal), so a note and
    the table give the same figure."""
    return f"{pct:.1f}"


def partition_wall(
    wall: np.ndarray, wait: np.ndarray, mgmt: np.ndarray, busy: np.ndarray
) -> dict[str, np.ndarray]:
    """Split each token's `wall` into flash wait, cache mgmt, compute and unattributed (in that
    order, each its measured value up to what the wall has left), and the ``overlapped``
    surplus: measured time that did not fit in the wall (busy time that ran alongside the
    waits). flash + mgmt + compute + unattributed == wall, exactly, for every token."""
    wall = np.clip(np.nan_to_num(wall), 0.0, None)
    flash = np.clip(np.minimum(wait, wall), 0.0, None)
    left = wall - flash
    manage = np.clip(np.minimum(mgmt, left), 0.0, None)
    left = left - manage
    compute = np.clip(np.minimum(busy, left), 0.0, None)
    unattributed = left - compute
    surplus = (wait - flash) + (mgmt - manage) + (busy - compute)
    return {
        "flash": flash, "mgmt": manage, "compute": compute, "unattributed": unattributed,
        "overlapped": np.clip(surplus, 0.0, None),
    }  # fmt: skip


def attribution_summary(tokens: pd.DataFrame, compute_source: str, flash_col: str) -> pd.DataFrame:
    """Per-run bars: mean ms/token of each part and its share of the mean wall time.

    The four parts partition each token's wall, so their shares add up to 100 % (a part the
    file cannot measure, e.g. cache mgmt without ``mgmt_ms``, is None and lies in the
    unattributed share). The last row, ``overlapped``, is not wall time and is not part of
    the 100 %: busy time that ran alongside the waits.
    """
    n = len(tokens)
    wall = float(tokens["wall_ms"].mean()) if n else float("nan")
    sources = {
        "wall_ms": "wall_ms",
        "compute_ms": compute_source,
        "flash_ms": flash_col,
        "mgmt_ms": "mgmt_ms",
        "unattributed_ms": "wall - flash - mgmt - compute",
        "overlapped_ms": f"{compute_source} + {flash_col} + mgmt_ms beyond the wall",
    }
    names = {
        "wall_ms": "wall",
        "compute_ms": "compute",
        "flash_ms": "flash wait",
        "mgmt_ms": "cache mgmt",
        "unattributed_ms": "unattributed",
        "overlapped_ms": "overlapped (not wall time)",
    }
    rows = []
    for col, name in names.items():
        value = float(tokens[col].mean()) if n and tokens[col].notna().any() else None
        share = 100.0 * value / wall if value is not None and wall > 0 else None
        rows.append({"component": name, "ms_per_token": value, "pct_of_wall": share,
                     "source": sources[col],
                     "in_wall": None if col == "wall_ms" else col != "overlapped_ms"})  # fmt: skip
    return pd.DataFrame(rows)


def stall_by_run(runs: Mapping[str, MetricsRun]) -> pd.DataFrame:
    """Many runs' attribution panels side by side: one row per run (keyed by the mapping's
    keys, e.g. a sweep's run ids) with each component's mean ms per token and its share of
    the wall (the ``ms_per_token`` and ``pct_of_wall`` of :func:`stall_attribution`'s
    summary), how compute was measured and whether the run overlapped reads."""
    rows = []
    for name, run in runs.items():
        att = stall_attribution(run)
        row: dict[str, object] = {"run": name, "tokens": len(att.tokens)}
        for item in att.summary.itertuples(index=False):
            key = _COMPONENT_KEYS[item.component]
            row[f"{key}_ms"] = item.ms_per_token
            if key != "wall":
                row[f"{key}_pct"] = item.pct_of_wall
        row["compute_source"] = att.compute_source
        row["overlap"] = att.overlap
        row["notes"] = "; ".join(att.notes) or None
        rows.append(row)
    parts = [
        f"{k}_{unit}" for k in _COMPONENT_KEYS.values() if k != "wall" for unit in ("ms", "pct")
    ]
    columns = ["run", "tokens", "wall_ms", *parts, "compute_source", "overlap", "notes"]
    return pd.DataFrame(rows, columns=columns)


_COMPONENT_KEYS = {
    "wall": "wall",
    "compute": "compute",
    "flash wait": "flash",
    "cache mgmt": "mgmt",
    "unattributed": "unattributed",
    "overlapped (not wall time)": "overlapped",
}


def memory_picture(run: MetricsRun) -> pd.DataFrame:
    """The memory columns over steps (rss anon/file, swap, MemAvailable, cache budget, ...).

    Columns that are 0 throughout (the platform could not report them) are left out; a file
    without any memory column gives an empty frame with only ``step``.
    """
    rows = run.rows
    out = pd.DataFrame({"step": np.arange(1, len(rows) + 1)})
    if "step" in rows:
        out["step"] = rows["step"].to_numpy()
    if "turn" in rows:
        out["turn"] = rows["turn"].to_numpy()
    for col in MEMORY_COLUMNS:
        if col in rows and bool((rows[col] != 0).any()):
            out[col] = rows[col].to_numpy(dtype=float)
    return out


__all__ = [
    "COMPONENTS",
    "COMPUTE_PROXY",
    "COMPUTE_RESIDUAL",
    "OVERLAPPED",
    "StallAttribution",
    "attribution_summary",
    "decide_overlap",
    "memory_picture",
    "partition_wall",
    "share_text",
    "stall_attribution",
    "stall_by_run",
]
