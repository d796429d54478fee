"""A real route trace tiled to any size, for the replay benchmarks.

The corpus gemma trace (30 MoE layers, 128 experts, top-6, ~31 k rows recorded on a phone)
is repeated decode step after decode step, its steps shifted so that each copy continues
the last: the prefill stays once, the decode routing is the recorded one over and over.
Reuse and working set are therefore a real model's; only the length is made up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from bmoe.formats.route import RouteTrace, read_route_trace

ROOT = Path(__file__).resolve().parent.parent
GEMMA = "route-trace/gemma.route.csv"


def default_corpus() -> Path:
    return Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus"))


def tiled(trace: RouteTrace, rows: int) -> RouteTrace:
    """`trace` with its decode part repeated until it has `rows` rows (cut there)."""
    frame = trace.rows
    decode = frame[frame["phase"] != 0]
    prefill = frame[frame["phase"] == 0]
    span = int(decode["step"].max()) - int(decode["step"].min()) + 1
    copies = max(1, -(-(rows - len(prefill)) // len(decode)))
    parts = [prefill]
    for i in range(copies):
        part = decode.copy()
        part["step"] = (part["step"] + i * span).astype("int64")
        parts.append(part)
    out = pd.concat(parts, ignore_index=True).iloc[:rows]
    for name in out.columns:
        if out[name].dtype.kind in "iu":
            out[name] = pd.to_numeric(out[name], downcast="integer")
    return RouteTrace(trace.path, trace.version, trace.meta, trace.layers, out)


def gemma_tiled(rows: int, corpus: Path | None = None) -> RouteTrace:
    """The corpus gemma route trace tiled to `rows` rows."""
    return tiled(read_route_trace((corpus or default_corpus()) / GEMMA), rows)
