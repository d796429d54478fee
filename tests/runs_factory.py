"""Constructed metrics files for the run-analysis tests, written with the project's own writer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bmoe.formats.metrics import COLUMNS_V2, MetricsWriter
from bmoe.formats.sidecar import write_pressure

BASE_PARAMS: dict[str, Any] = {
    "model": "m.gguf", "arch": "qwen3moe", "n_layer": 4, "n_expert": 8, "n_expert_used": 2,
    "threads": 4, "moe_stream": True, "cache_mb": 2000, "load_all": False, "io_threads": 4,
    "o_direct": True, "overlap": False, "prefetch": 0, "predict_log": False,
    "prefetch_sync": False, "dense_weights": "mmap", "drop_cold_frac": 0.0, "temp": 0.0,
    "top_k": 40, "seed": 1, "compute_trace_layers": 0, "spec": "off",
}  # fmt: skip


def rows(n: int = 64, wall: float = 100.0, **columns: Any) -> list[dict[str, Any]]:
    """`n` identical token rows (plus any column given as a constant or a list)."""
    out = []
    for i in range(n):
        row = {"step": i + 1, "steps": n, "wall_ms": wall, "io_ms": wall * 0.4,
               "compute_ms": wall * 0.5, "mgmt_ms": wall * 0.1, "read_bytes": 100 << 20,
               "cpu_ms": wall * 0.5 * 4, "cache_hit_pct": 70.0, "mtp_batch": 1}  # fmt: skip
        for key, value in columns.items():
            row[key] = value[i] if isinstance(value, list) else value
        out.append(row)
    return out


def write_run(
    path: Path,
    token_rows: list[dict[str, Any]] | None = None,
    *,
    summary: dict[str, Any] | bool = True,
    pressure: dict[str, Any] | None = None,
    mtime: float | None = None,
    **params: Any,
) -> Path:
    """Write a v2 metrics CSV at `path` (and a `.metrics` sidecar when `pressure` is given)."""
    token_rows = token_rows if token_rows is not None else rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = MetricsWriter(fh, {**BASE_PARAMS, **params}, COLUMNS_V2)
        for row in token_rows:
            writer.row(row)
        if summary is not False:
            extra = summary if isinstance(summary, dict) else {}
            total_ms = sum(r["wall_ms"] for r in token_rows)
            read = sum(r.get("read_bytes", 0) for r in token_rows) / 1048576
            writer.summary(
                {"tokens": len(token_rows), "tok/s": len(token_rows) / (total_ms / 1000),
                 "read_MiB": read, "cache_hit_pct": 70.0, "load_s": 1.0, "prefill_s": 0.5,
                 "prefill_tps": 40.0, **extra}
            )  # fmt: skip
    if pressure is not None:
        write_pressure(pressure, path.with_suffix(".metrics"))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path
