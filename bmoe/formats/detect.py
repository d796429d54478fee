"""Which telemetry format a file holds, decided from its content, never its name."""

from __future__ import annotations

import os

from bmoe.formats.inputs import regular_file

#: The UTF-8 byte order mark (``csvtable.BOM``; spelled here so detection imports no pandas).
BOM = b"\xef\xbb\xbf"

PathLike = str | os.PathLike

#: Kinds :func:`detect` can return.
KINDS = (
    "metrics",  # per-token metrics CSV (any version)
    "route",  # route_trace
    "compute",  # compute_trace (per node or per layer)
    "io",  # io_trace
    "protocol",  # BMOE_* progress/session stream (stdout of --progress / --session)
    "log",  # end-of-run text lines (stdout/stderr of a one-shot run)
    "pressure",  # device `.metrics` sidecar (flat key=value lines)
    "state",  # device `.state` snapshot
    "parquet",  # a file written by `bmoe convert`
)

_TAGS = {
    "bmoe_metrics": "metrics",
    "route_trace": "route",
    "compute_trace": "compute",
    "io_trace": "io",
}

_RUN_LINES = (
    "generation:", "compute:", "mode:", "prefill:", "moe-stream:", "moe-cache:",
    "moe-prefetch:", "moe-overlap:", "moe-drop:", "moe-rows:", "moe-route-ahead:", "mtp:",
    "ngram:", "=== perf ===", "=== answer ===",
)  # fmt: skip


def detect_bytes(head: bytes) -> str | None:
    """The kind of a file from its first few KiB, or None when it is none of ours."""
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(BOM):
        head = head[len(BOM) :]
    if b"\x00" in head[:4096]:
        return None
    text = head.decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        return None
    first = lines[0]
    if first.startswith("#"):
        tag = first[1:].strip().split(" ", 1)[0]
        if tag in _TAGS:
            return _TAGS[tag]
    body = [ln for ln in lines if not ln.startswith("#")]
    if body:
        header = {c.strip() for c in body[0].split(",")}
        if {"step", "wall_ms"} <= header:
            return "metrics"
        if {"step", "layer", "expert"} <= header and "slot" in header:
            return "route"
        if {"wall_ns", "op"} <= header:
            return "compute"
        if {"latency_ns", "read_bytes"} <= header:
            return "io"
    if any(ln.startswith("BMOE_") for ln in lines[:50]):
        return "protocol"
    if any(ln.startswith("--- BEFORE ---") for ln in lines[:5]):
        return "state"
    if any(ln.startswith(_RUN_LINES) for ln in lines):
        return "log"
    if any(ln.startswith("error: ") for ln in lines[-20:]):
        return "log"  # the engine refused to run: its stderr
    kv_lines = [ln for ln in lines if "=" in ln and " " not in ln]
    if (
        kv_lines
        and len(kv_lines) == len(lines)
        and any(ln.split("=", 1)[0].endswith(("_kb", "_dC", "_mC")) for ln in kv_lines)
    ):
        return "pressure"
    return None


def detect(source: PathLike) -> str | None:
    """The kind of the file at `source` (see :data:`KINDS`), or None."""
    with open(regular_file(source), "rb") as fh:
        head = fh.read(65536)
    return detect_bytes(head)
