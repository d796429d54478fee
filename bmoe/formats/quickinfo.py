"""``bmoe info`` of a small metrics CSV without pandas or pyarrow, and of a route trace's CSV
through its numpy columns (:func:`describe_route_columns`).

A command that describes one small file should start in a blink; importing pandas and pyarrow
costs more than reading the file. :func:`describe_small_metrics` reads the preamble, the header,
the ``# summary`` trailers and counts the rows with plain Python, and gives the figures
:func:`bmoe.formats.info.describe` would. It handles only the well-formed file: anything the full
reader would warn about or refuse (a cut last line, a row of the wrong width, a value that is not
a number in a numeric column, quotes, blank lines) returns None and the full reader takes over,
so the output is the same either way.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from bmoe.formats import kv
from bmoe.formats.detect import BOM, PathLike, detect_bytes
from bmoe.formats.metrics_columns import FLOAT_COLUMNS, INT_COLUMN_BITS, run_unfinished

#: Files up to this size take the quick path (bytes); a metrics CSV is ~200 bytes a token.
QUICK_LIMIT = 1 << 20

#: The columns the metrics reader types: integer ones and float ones.
_INT_COLUMNS = frozenset(INT_COLUMN_BITS)
_FLOAT_COLUMNS = frozenset(FLOAT_COLUMNS)
#: ``# summary`` keys typed float even when spelled like an integer (``metrics.SUMMARY_PRECISION``
#: among the keys ``bmoe info`` shows).
_SUMMARY_FLOATS = frozenset(
    {"tok/s", "s/tok", "read_MiB", "cache_hit_pct", "prefill_tps", "load_s"}
)
_INT = re.compile(r"-?\d{1,18}")
_FLOAT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_VERSION = re.compile(r"^bmoe_metrics\s+v(\d+)\s*$")


class _NotQuick(Exception):
    """The file needs the full reader."""


def describe_small_metrics(
    path: PathLike, key_params: tuple[str, ...], key_summary: tuple[str, ...]
) -> dict[str, dict[str, Any]] | None:
    """The ``file``, ``parameters`` and ``summary`` views of a small, well-formed metrics CSV
    at `path`, or None when the file is anything else (the full reader decides then)."""
    try:
        data = _read_small(path)
        if data is None or detect_bytes(data[:65536]) != "metrics":
            return None
        return _describe(str(path), data, key_params, key_summary)
    except (_NotQuick, OSError, UnicodeDecodeError):
        return None


def describe_route_columns(
    path: PathLike, key_params: tuple[str, ...]
) -> dict[str, dict[str, Any]] | None:
    """The ``file`` and ``parameters`` views (and ``warnings``) of a route trace's CSV, read
    as numpy columns (:func:`~bmoe.formats.route.read_route_columns`: no pandas for a plain
    trace, the same rows and warnings as the full reader); None for anything else (Parquet,
    other formats)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return None
    if detect_bytes(head) != "route":
        return None
    import numpy as np

    from bmoe.formats.route import read_route_columns

    trace = read_route_columns(path)
    step = trace.column("step")
    rows = trace.n_rows
    view: dict[str, Any] = {"file": str(path)}
    view.update(format="route_trace", version=trace.version, rows=rows)
    view["steps"] = len(np.unique(step)) if step is not None and rows else 0
    view["layers with sizes"] = len(trace.expert_bytes())
    view["recorded with dropping"] = trace.recorded_with_dropping
    views = {"file": view, "parameters": {k: trace.meta[k] for k in key_params if k in trace.meta}}
    if trace.warnings:
        views["warnings"] = {f"warning {i + 1}": w for i, w in enumerate(trace.warnings)}
    return views


def _read_small(path: PathLike) -> bytes | None:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > QUICK_LIMIT:
        return None
    with open(path, "rb") as fh:
        return fh.read(QUICK_LIMIT + 1)


def _describe(
    name: str, data: bytes, key_params: tuple[str, ...], key_summary: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    data = data.removeprefix(BOM)
    if not data.endswith(b"\n") or b"\x00" in data or b'"' in data or b"\r" in data:
        raise _NotQuick
    lines = data.decode("utf-8").split("\n")[:-1]
    version, params, summaries = 0, {}, []
    header: list[str] | None = None
    width = 0
    step_col = turn_col = -1
    checks: list[tuple[int, re.Pattern[str]]] = []
    rows = 0
    last_steps: int | None = None
    turns: set[int] = set()
    for line in lines:
        if line.startswith("#"):
            text = line[1:].strip()
            if header is None:
                m = _VERSION.match(text)
                if m:
                    version = int(m.group(1))
                elif not text.startswith("summary"):
                    params.update(kv.parse_tokens(text))
            elif text.startswith("summary"):
                summaries.append(_parse_summary(text[len("summary") :]))
            continue
        if header is None:
            if not line.strip():
                continue
            header = [h.strip() for h in line.strip().split(",")]
            width = len(header)
            if "step" not in header or "wall_ms" not in header or len(set(header)) != width:
                raise _NotQuick
            checks = [(i, _INT) for i, h in enumerate(header) if h in _INT_COLUMNS]
            checks += [(i, _FLOAT) for i, h in enumerate(header) if h in _FLOAT_COLUMNS]
            step_col = header.index("steps") if "steps" in header else -1
            turn_col = header.index("turn") if "turn" in header else -1
            continue
        fields = line.split(",")
        if len(fields) != width:
            raise _NotQuick
        for i, pattern in checks:
            if not pattern.fullmatch(fields[i]):
                raise _NotQuick
        rows += 1
        if step_col >= 0:
            last_steps = int(fields[step_col])
        if turn_col >= 0:
            turns.add(int(fields[turn_col]))
    if header is None:
        raise _NotQuick
    partial = run_unfinished(summaries, rows, last_steps, len(turns) or 1)
    head: dict[str, Any] = {"file": name}
    head.update(format="bmoe_metrics", version=version, rows=rows)
    head.update(steps=last_steps, partial=partial, turns=len(summaries) or None)
    summary = summaries[-1] if summaries else {}
    return {
        "file": head,
        "parameters": {k: params[k] for k in key_params if k in params},
        "summary": {k: summary[k] for k in key_summary if k in summary},
    }


def _parse_summary(text: str) -> dict[str, Any]:
    """``metrics.parse_summary`` for the keys ``bmoe info`` shows."""
    out: dict[str, Any] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key:
            typed = kv.parse_value(key, value)
            if key in _SUMMARY_FLOATS and type(typed) is int:
                typed = float(typed)
            out[key] = typed
    return out
