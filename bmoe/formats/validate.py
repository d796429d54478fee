"""The telemetry contract's checks: a file in, findings (error or warning, with lines) out.

A file that cannot be read at all (missing, empty, binary, unrecognised, rows that do not
parse) raises :class:`~bmoe.formats.errors.FormatError`: that is "unreadable", not a finding.
Everything else the contract says is checked here: required columns for the format version,
value domains, uniqueness of routing cells, step order, preamble keys, per-layer sizes, summary
and completeness. A problem shared by many rows is one finding naming the first few lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bmoe.formats import protocol
from bmoe.formats.csvtable import PathLike, Sections, load_sections, row_lines
from bmoe.formats.errors import Finding, FormatError
from bmoe.formats.load import detect_kind, load_file

ERROR, WARNING = "error", "warning"
_SHOW_LINES = 3

#: Columns each metrics version must have (later versions only append).
METRICS_REQUIRED = {
    0: ("step", "steps", "wall_ms", "io_ms", "compute_ms", "read_bytes", "cache_hit_pct"),
}
#: Preamble keys a metrics CSV with a preamble must carry.
METRICS_PREAMBLE = (
    "model",
    "arch",
    "n_layer",
    "n_expert",
    "n_expert_used",
    "moe_stream",
    "cache_mb",
)
ROUTE_COLUMNS = (
    "turn", "phase", "step", "layer", "slot", "expert", "weight", "residency", "expert_bytes",
)  # fmt: skip
ROUTE_PREAMBLE = ("model", "arch", "n_layer", "n_expert", "n_expert_used")
COMPUTE_COLUMNS = ("turn", "phase", "step", "seq", "layer", "op", "name", "wall_ns", "majflt")
IO_COLUMNS = (
    "turn", "phase", "step", "layer", "expert", "proj", "lane", "spec", "offset", "req_bytes",
    "read_bytes", "latency_ns",
)  # fmt: skip
PROGRESS_KEYS = (
    "step", "steps", "wall_ms", "io_ms", "compute_ms", "stall_ms", "read_mb", "cache_hit_pct",
)  # fmt: skip


@dataclass
class _Report:
    """Collects findings; maps data-row indices to file lines when the file is a CSV."""

    path: str | None
    sec: Sections | None = None
    findings: list[Finding] = field(default_factory=list)

    def add(self, severity: str, message: str, line: int | None = None) -> None:
        self.findings.append(Finding(severity, self.path, line, message))

    def lines(self, rows: np.ndarray) -> np.ndarray | None:
        if self.sec is None or not self.sec.header_line:
            return None
        return row_lines(self.sec, rows)

    def rows(self, mask: Any, severity: str, message: str) -> None:
        """One finding for every row where `mask` holds (count and first lines)."""
        bad = np.flatnonzero(np.asarray(mask, dtype=bool))
        if not len(bad):
            return
        lines = self.lines(bad[:_SHOW_LINES])
        first = int(lines[0]) if lines is not None else None
        if len(bad) > 1:
            where = (
                f"lines {', '.join(str(int(n)) for n in lines)}"
                if lines is not None
                else f"rows {', '.join(str(int(r) + 1) for r in bad[:_SHOW_LINES])}"
            )
            more = ", ..." if len(bad) > _SHOW_LINES else ""
            message = f"{message} ({len(bad)} rows: {where}{more})"
        self.add(severity, message, first)

    def columns(self, frame: pd.DataFrame, required: Sequence[str], what: str) -> list[str]:
        missing = [c for c in required if c not in frame.columns]
        if missing:
            line = self.sec.header_line if self.sec is not None and self.sec.header_line else None
            self.add(ERROR, f"{what} lacks required column(s): {', '.join(missing)}", line)
        return missing

    def preamble(self, values: dict[str, Any], required: Sequence[str], severity: str) -> None:
        missing = [k for k in required if k not in values]
        if missing:
            self.add(severity, f"preamble lacks key(s): {', '.join(missing)}", 1)


def _col(frame: pd.DataFrame, name: str) -> np.ndarray | None:
    return frame[name].to_numpy() if name in frame.columns else None


def _not_in(values: np.ndarray, allowed: Sequence[int]) -> np.ndarray:
    return ~np.isin(values, np.asarray(allowed))


def _span(values: np.ndarray) -> int:
    return int(values.max()) - int(values.min()) + 1


def _packed_key(frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray | None:
    """One int64 per row that is equal exactly where the rows agree on every one of the
    integer `columns` (each shifted to its minimum and packed in the bits its range needs),
    or None when their ranges do not fit 63 bits. A few bytes per row, where grouping by
    several columns builds several label arrays."""
    key = np.zeros(len(frame), dtype=np.int64)
    shift = 0
    for name in columns:
        values = frame[name].to_numpy()
        if values.dtype.kind not in "iu":
            return None
        lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        bits = (hi - lo).bit_length()
        if shift + bits > 63:
            return None
        if bits:
            part = values.astype(np.int64)  # the one temporary, worked on in place
            part -= lo
            part <<= shift
            key |= part
            del part
        shift += bits
    return key


def _packed(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray | None:
    """The columns `names` as one int64 per row ordered like the tuples of their values (a
    mixed radix over each column's range); None when the ranges do not fit in 63 bits."""
    total = 1
    for name in names:
        total *= _span(frame[name].to_numpy())
        if total >= 2**62:
            return None
    packed = np.zeros(len(frame), dtype=np.int64)
    for name in names:
        values = frame[name].to_numpy()
        packed *= _span(values)
        packed += values
        packed -= int(values.min())
    return packed


def _speculated(meta: dict[str, Any]) -> bool:
    """The file says a draft source speculated (``spec=ngram|mtp`` in its preamble)."""
    return str(meta.get("spec", "off")) not in ("off", "")


def _group_tail_ok(wall: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Rows that are the later tokens of a speculated group: after a row with a positive
    ``wall_ms`` (the decode) and within its ``mtp_batch``, with the same ``mtp_batch``
    (a verify decode charges its whole cost to the group's first row, zeros to the rest)."""
    index = np.arange(len(wall))
    start = np.maximum.accumulate(np.where(wall > 0, index, -1))
    first = np.maximum(start, 0)
    return (start >= 0) & (index - start < batch[first]) & (batch == batch[first]) & (batch > 1)


def _step_goes_back(frame: pd.DataFrame, groups: Sequence[str], strict: bool) -> np.ndarray:
    """Rows whose ``step`` is below (or, `strict`, not above) the previous row of its group,
    groups being the rows sharing the values of `groups` (in file order within a group)."""
    steps = frame["step"].to_numpy()
    bad = np.zeros(len(frame), dtype=bool)
    if len(frame) < 2:
        return bad
    present = [g for g in groups if g in frame.columns]
    if present:
        key = _packed_key(frame, present)
        if key is None:
            key = frame.groupby(present, sort=False, observed=True).ngroup().to_numpy()
        order = np.argsort(key, kind="stable")
    else:
        key = np.zeros(len(frame), dtype=np.int64)
        order = np.arange(len(frame))
    k = key[order]
    same = k[1:] == k[:-1]
    del k, key
    s = steps[order]  # compared, never subtracted: no overflow, no int64 copy
    back = same & ((s[1:] <= s[:-1]) if strict else (s[1:] < s[:-1]))
    bad[order[1:][back]] = True
    return bad


# ----------------------------------------------------------------------------- per format


def _check_metrics(run: Any, rep: _Report) -> None:
    rows = run.rows
    version = run.version
    required: Sequence[str] | None = METRICS_REQUIRED.get(version)
    if required is None:
        from bmoe.formats.metrics import COLUMNS_V1, COLUMNS_V2

        required = COLUMNS_V1 if version == 1 else COLUMNS_V2
    rep.columns(rows, required, f"bmoe_metrics v{version}" if version else "a metrics CSV")
    if version >= 1:
        rep.preamble(run.params, METRICS_PREAMBLE, ERROR)
    if version >= 2 and "engine" not in run.params:
        rep.add(ERROR, "v2 preamble lacks its '# engine=' line", 2)
    if (hit := _col(rows, "cache_hit_pct")) is not None:
        rep.rows(
            ~(((hit >= 0) & (hit <= 100)) | (hit == -1)),
            ERROR,
            "cache_hit_pct outside [0, 100] and not -1",
        )
    if (wall := _col(rows, "wall_ms")) is not None:
        wall = wall.astype(np.float64)
        # every per-token rate divides by it: nan, inf and 0 are as wrong as negative
        rep.rows(wall < 0, ERROR, "wall_ms is negative")
        bad = np.isnan(wall) | np.isinf(wall) | (wall == 0)
        if (batch := _col(rows, "mtp_batch")) is not None and bad.any():
            bad &= ~_group_tail_ok(wall, batch.astype(np.int64))
        rep.rows(bad, ERROR, "wall_ms is nan, inf or 0")
    for name in ("io_ms", "compute_ms", "stall_ms", "mgmt_ms", "cpu_ms", "read_bytes"):
        if (values := _col(rows, name)) is not None:
            rep.rows(values < 0, ERROR, f"{name} is negative")
            if values.dtype.kind == "f":
                rep.rows(np.isinf(values), ERROR, f"{name} is infinite")
    if (frac := _col(rows, "dense_resident_frac")) is not None:
        rep.rows(
            ~(((frac >= 0) & (frac <= 1)) | (frac == -1)),
            ERROR,
            "dense_resident_frac outside [0, 1] and not -1",
        )
    if "step" in rows and len(rows):
        rep.rows(_step_goes_back(rows, ["turn"], strict=True), ERROR, "step does not increase")
        if "steps" in rows:
            over = rows["step"].to_numpy() > rows["steps"].to_numpy()
            rep.rows(over, ERROR, "step is beyond steps")
        rep.rows(rows["step"].to_numpy() < 1, ERROR, "step is below 1 (steps are 1-based)")
    if not run.summaries:
        rep.add(WARNING, "no '# summary' trailer: the run did not finish (partial)")
    elif run.partial and not any("tokens" in s for s in run.summaries):
        rep.add(WARNING, f"partial run: {run.tokens} of {run.steps} steps")  # else: below
    if "turn" in rows and len(run.summaries) > 1:
        per_turn = rows["turn"].value_counts(sort=False).tolist()  # turns in file order
    else:
        per_turn = [len(rows)]
    for n, summary in enumerate(run.summaries):
        tokens = summary.get("tokens")
        have = per_turn[n] if n < len(per_turn) else 0
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens != have:
            rep.add(WARNING, f"summary {n + 1} says tokens={tokens}, its rows are {have}")
        hit = summary.get("cache_hit_pct")
        if isinstance(hit, int | float) and not (0 <= hit <= 100 or hit == -1):
            rep.add(ERROR, f"summary {n + 1}: cache_hit_pct={hit} outside [0, 100] and not -1")


def _check_route(trace: Any, rep: _Report) -> None:
    rows, meta = trace.rows, trace.meta
    if trace.version != 1:
        rep.add(WARNING, "no '# route_trace v1' line: version unknown", 1)
    rep.preamble(meta, ROUTE_PREAMBLE, WARNING)
    missing = rep.columns(rows, ROUTE_COLUMNS, "route_trace v1")
    k = meta.get("n_expert_used")
    n_expert = meta.get("n_expert")
    n_layer = meta.get("n_layer")
    if (res := _col(rows, "residency")) is not None:
        rep.rows(_not_in(res, (0, 1, 2)), ERROR, "residency not in 0/1/2")
    if (phase := _col(rows, "phase")) is not None:
        rep.rows(_not_in(phase, (0, 1)), ERROR, "phase not 0 (prefill) or 1 (decode)")
    if (dropped := _col(rows, "dropped")) is not None:
        rep.rows(_not_in(dropped, (0, 1)), ERROR, "dropped not 0 or 1")
    if (slot := _col(rows, "slot")) is not None and isinstance(k, int):
        rep.rows((slot < 0) | (slot >= k), ERROR, f"slot outside 0..{k - 1} (n_expert_used={k})")
    if (expert := _col(rows, "expert")) is not None and isinstance(n_expert, int):
        rep.rows((expert < 0) | (expert >= n_expert), ERROR, f"expert outside 0..{n_expert - 1}")
    if (layer := _col(rows, "layer")) is not None and isinstance(n_layer, int):
        rep.rows((layer < 0) | (layer >= n_layer), ERROR, f"layer outside 0..{n_layer - 1}")
    if (weight := _col(rows, "weight")) is not None:
        w = weight if weight.dtype.kind == "f" else weight.astype(np.float64)
        rep.rows(~np.isnan(w) & ((w < 0) | np.isinf(w)), ERROR, "weight negative or infinite")
    if (eb := _col(rows, "expert_bytes")) is not None:
        rep.rows(eb < 0, ERROR, "expert_bytes is negative")
        if res is not None:
            rep.rows((eb > 0) & (res != 0), ERROR, "expert_bytes on a hit (only misses read)")
    # Under speculation a verify decode routes its drafts' positions and a rejected one is
    # routed again by the next decode: in the decode phase a position may repeat (a cell
    # holds k rows per routing of it), so uniqueness and order are checked on prefill rows.
    spec = _speculated(meta) and phase is not None
    repeatable = (phase == 1) if spec and phase is not None else np.zeros(len(rows), bool)
    cell = [c for c in ("turn", "phase", "step", "layer", "slot") if c in rows.columns]
    # a trace in the order engines write it, (turn, step, phase, layer, slot) ascending,
    # answers the three order checks in one pass; any other order takes the general ones
    engine_order = ["turn", "step", "phase", "layer", "slot"]
    packed = _packed(rows, engine_order) if len(cell) == 5 and len(rows) and not spec else None
    in_order = packed is not None and bool((packed[1:] >= packed[:-1]).all())
    if len(cell) == 5 and len(rows):
        if in_order:
            assert packed is not None
            dup = np.zeros(len(rows), dtype=bool)
            dup[1:] = packed[1:] == packed[:-1]
        else:
            dup = rows.duplicated(subset=cell, keep="first").to_numpy() & ~repeatable
        rep.rows(dup, ERROR, "(turn, phase, step, layer, slot) repeats an earlier row")
        del dup
    if "step" in rows and len(rows) and not in_order:
        back = _step_goes_back(rows, ["turn", "phase", "layer"], strict=False) & ~repeatable
        rep.rows(back, ERROR, "step goes back within its turn, phase and layer")
    if "layer" in rows and "layer" not in missing and len(rows):
        sizes = trace.expert_bytes()
        used = np.unique(rows["layer"].to_numpy())
        absent = [int(x) for x in used if int(x) not in sizes]
        if absent:
            shown = ", ".join(str(x) for x in absent[:10]) + (", ..." if len(absent) > 10 else "")
            rep.add(ERROR, f"no '# layer=... expert_bytes=' line for routed layer(s) {shown}", 1)
    if isinstance(k, int) and len(cell) >= 4 and len(rows):
        if in_order:  # cells are runs of rows: their sizes are the run lengths
            assert packed is not None
            packed //= _span(rows["slot"].to_numpy())
            starts = np.flatnonzero(np.r_[True, packed[1:] != packed[:-1]])
            sizes_per_cell = np.diff(np.append(starts, len(packed)))
        else:
            sizes_per_cell = rows.groupby(cell[:4], sort=False, observed=True).size().to_numpy()
        odd = int(((sizes_per_cell % k != 0) if spec else (sizes_per_cell != k)).sum())
        if odd:
            rep.add(WARNING, f"{odd} cell(s) do not hold n_expert_used={k} rows")


def _check_compute(trace: Any, rep: _Report) -> None:
    rows = trace.rows
    if trace.version != 1:
        rep.add(WARNING, "no '# compute_trace v1' line: version unknown", 1)
    rep.columns(rows, COMPUTE_COLUMNS, "compute_trace v1")
    for name in ("wall_ns", "majflt"):
        if (values := _col(rows, name)) is not None:
            rep.rows(values < 0, ERROR, f"{name} is negative")
    if (layer := _col(rows, "layer")) is not None:
        rep.rows(layer < -1, ERROR, "layer below -1")
    if (phase := _col(rows, "phase")) is not None:
        rep.rows(_not_in(phase, (0, 1)), ERROR, "phase not 0 (prefill) or 1 (decode)")
    if "step" in rows and len(rows) and not _speculated(trace.meta):
        back = _step_goes_back(rows, ["turn", "phase"], strict=False)
        rep.rows(back, ERROR, "step goes back within its turn and phase")
    if {"turn", "phase", "step", "seq"} <= set(rows.columns) and len(rows):
        dup = rows.duplicated(subset=["turn", "phase", "step", "seq"]).to_numpy().copy()
        if _speculated(trace.meta):  # two decodes can end on one position (a rejected draft)
            dup &= rows["phase"].to_numpy() == 0
        rep.rows(dup, ERROR, "(turn, phase, step, seq) repeats an earlier row")


def _check_io(trace: Any, rep: _Report) -> None:
    rows = trace.rows
    if trace.version != 1:
        rep.add(WARNING, "no '# io_trace v1' line: version unknown", 1)
    rep.columns(rows, IO_COLUMNS, "io_trace v1")
    for name in ("offset", "req_bytes", "read_bytes", "latency_ns", "lane", "expert"):
        if (values := _col(rows, name)) is not None:
            rep.rows(values < 0, ERROR, f"{name} is negative")
    req, got = _col(rows, "req_bytes"), _col(rows, "read_bytes")
    if req is not None and got is not None:
        rep.rows(got < req, ERROR, "read_bytes below req_bytes (the read window is aligned out)")
    if (spec := _col(rows, "spec")) is not None:
        rep.rows(_not_in(spec, (0, 1)), ERROR, "spec not 0 or 1")
    if (phase := _col(rows, "phase")) is not None:
        rep.rows(_not_in(phase, (0, 1)), ERROR, "phase not 0 (prefill) or 1 (decode)")
    if "step" in rows and len(rows) and not _speculated(trace.meta):
        # under speculation a decode is stamped with its last position, and after a rejected
        # draft the next decode's last position can be lower
        back = _step_goes_back(rows, ["turn", "phase"], strict=False)
        rep.rows(back, ERROR, "step goes back within its turn and phase")


def _check_stream(data: bytes, rep: _Report) -> None:
    """Line by line, so one bad line is a finding and the rest is still checked."""
    open_request: int | None = None
    request_line = 0
    last_step: int | None = None
    lines = data.splitlines(keepends=True)
    for n, raw in enumerate(lines, start=1):
        try:
            event = protocol.parse_line(raw, path=rep.path, lineno=n)
        except FormatError as exc:
            cut = n == len(lines) and not raw.endswith(b"\n")
            rep.add(WARNING if cut else ERROR, exc.problem + (" (cut short)" if cut else ""), n)
            continue
        if event is None:
            continue
        if isinstance(event, protocol.Begin):
            if open_request is not None:
                rep.add(ERROR, f"BMOE_BEGIN before request {open_request} ended", n)
            open_request, request_line, last_step = event.id, n, None
        elif isinstance(event, protocol.Progress):
            missing = [k for k in PROGRESS_KEYS if k not in event.data]
            if missing:
                rep.add(ERROR, f"BMOE_PROGRESS lacks {', '.join(missing)}", n)
            step, steps = event.step, event.steps
            if step is not None:
                if last_step is not None and step <= last_step and not event.is_reset:
                    rep.add(ERROR, f"step {step} does not increase (previous {last_step})", n)
                if steps is not None and not 1 <= step <= steps:
                    rep.add(ERROR, f"step {step} outside 1..{steps}", n)
                last_step = step
            hit = event.cache_hit_pct
            if hit is not None and not (0 <= hit <= 100 or hit == -1):
                rep.add(ERROR, f"cache_hit_pct={hit} outside [0, 100] and not -1", n)
        elif isinstance(event, protocol.Done | protocol.Decide | protocol.Error):
            if open_request is not None and event.id is not None and event.id != open_request:
                rep.add(ERROR, f"BMOE_{event.tag} id={event.id} answers request {open_request}", n)
            open_request, last_step = None, None
            if isinstance(event, protocol.Error) and event.fatal:
                rep.add(WARNING, f"fatal engine error: {protocol.printable(event.msg or '')}", n)
        elif isinstance(event, protocol.Unknown):
            rep.add(WARNING, f"unknown event BMOE_{event.tag} (kept, not checked)", n)
    if open_request is not None:
        rep.add(WARNING, f"request {open_request} never ended (stream cut?)", request_line)


def _check_log(run: Any, rep: _Report) -> None:
    if run.failure:
        rep.add(ERROR, f"the engine refused to run: {run.failure}")
    elif "tokens" not in run.figures:
        rep.add(WARNING, "no 'generation:' line: the run did not finish")
    for line in run.figures.get("other_lines", []):
        rep.add(WARNING, f"end-of-run line of an unknown shape: {line!r}")


def _check_pressure(values: dict[str, Any], rep: _Report) -> None:
    from bmoe.formats.sidecar import PRESSURE_KEYS

    missing = [k for k in PRESSURE_KEYS if k not in values]
    if missing:
        rep.add(WARNING, f"pressure sidecar lacks {', '.join(missing)}")
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            rep.add(ERROR, f"{key}={value!r} is not an integer")


def _check_state(sections: dict[str, Any], rep: _Report) -> None:
    if not sections:
        rep.add(WARNING, "no '--- BEFORE ---' / '--- AFTER ---' sections found")
    for name in ("before", "after"):
        if sections and name not in sections:
            rep.add(WARNING, f"no '--- {name.upper()} ---' section")


_CHECKS: dict[str, Callable[[Any, _Report], None]] = {
    "metrics": _check_metrics,
    "route": _check_route,
    "compute": _check_compute,
    "io": _check_io,
    "log": _check_log,
    "pressure": _check_pressure,
    "state": _check_state,
}


def validate_file(path: PathLike) -> list[Finding]:
    """The contract's findings for the file at `path` (empty when it is clean).

    Raises :class:`FormatError` when the file cannot be read at all.
    """
    from bmoe.formats.csvtable import read_bytes
    from bmoe.formats.parquet import parquet_kind

    name = str(path)
    kind = detect_kind(path)
    if kind == "protocol":  # checked line by line: one bad line is a finding, not the end
        rep = _Report(name)
        data, _ = read_bytes(path)
        _check_stream(data, rep)
        for line in protocol.to_text(data).splitlines():
            if line.startswith("error: "):
                rep.add(ERROR, f"the engine failed: {protocol.printable(line[7:])}")
        return rep.findings
    obj = load_file(path, kind)
    if kind == "parquet":
        kind = parquet_kind(path)
        rep = _Report(name)
    elif kind in ("metrics", "route", "compute", "io"):
        rep = _Report(name, load_sections(path))
    else:
        rep = _Report(name)
    for text in getattr(obj, "warnings", []) or []:
        where, message = _split_location(text, name)
        rep.add(WARNING, message, where)
    if kind is None or kind not in _CHECKS:
        raise FormatError(name, None, f"no checks for {kind} files")
    _CHECKS[kind](obj, rep)
    return rep.findings


def _split_location(text: str, path: str) -> tuple[int | None, str]:
    """``file:line: message`` (a reader warning) -> (line, message)."""
    prefix = f"{path}:"
    if text.startswith(prefix):
        rest = text[len(prefix) :]
        head, sep, message = rest.partition(": ")
        if sep and head.isdigit():
            return int(head), message
        return None, rest.lstrip(" ")
    return None, text
