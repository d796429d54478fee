"""The device profile: a versioned JSON file of what a device's runs measured.

A profile holds what a prediction needs to turn a replay's reads into time: flash request
latency by request size and lane count, compute time per token, cache-management cost per
expert admitted, the prefill rate, and the model it was measured on (expert sizes: a profile
prices reads of that model's experts only). This module reads, validates and writes the file;
building one from runs is :mod:`bmoe.analyze.device`.

Layout (``version`` 2)::

    {"format": "bmoe_profile", "version": 2,
     "mode": "serial" | "overlap" | "mixed",
     "model": {"name", "arch", "n_layer", "n_expert", "n_expert_used",
               "expert_bytes": {"<layer>": bytes} ({} when no run said),
               "read_bytes_per_expert": {"<layer>": bytes}, "slices_per_expert": n,
               "sizes_from": where the sizes came from (None: unknown),
               "read_unit_bytes": bytes one priced read moves},
     "flash": [{"lanes", "req_bytes", "latency_ms", "latency_ms_p10", "latency_ms_p90",
                "batch_overhead_ms", "mib_s", "reads", "source"}, ...],
     "flash_by_read": [{"lanes", "read_mib", "excess_ms"}, ...] (the serial runs' measured
                      flash wait a token beyond the table's, by lanes and MiB read a token;
                      none where a lane count's runs read one volume),
     "overlap": {"stall_ms", "stall_ms_per_miss", "lanes"} (runs with --overlap only),
     "compute": {"token_ms", "token_ms_p10", "token_ms_p90", "expert_share", "source"},
     "mgmt": {"token_ms", "per_admit_ms"},
     "memory": {"ms_per_fault", "points": [{"asked_mib", "available_mib", "faults_per_token"}],
                "resident_mib", "available_mib"} (runs that recorded majflt only),
     "prefill": {"tok_s", "load_s"},
     "terms": {"<term>": {"runs", "columns", "tokens", "value", "spread_pct", "settled", ...}},
     "absent": {"<term>": why no run measured it},
     "runs": [{"name", "lanes", "overlap", "traced", "cpu_share", "off_cpu_pct", ...}],
     "tracing": {"how", ...}, "coverage": 0.8, "unsettled": [...],
     "model_error": {"method", "sd_rel", "configurations", "rms_pct", "held_out": [...], "why"}
                    (the runs held out and predicted from the others; none for one run),
     "levers": {"baseline": {"prefetch", "policy", "drop"},
                "terms": [{"lever", "value", "factor", "sd_rel", "runs", "error_pct"}]}
               (a term per value other than the baseline its runs measured),
     "sources": [...], "caveats": [...]}

Version 1 files (no ``terms``/``runs``/``memory``; every term implicitly measured) still read:
they are upgraded in memory and say so in their caveats. Every per-read figure (flash latency,
``per_admit_ms``, ``stall_ms_per_miss``) is per read of ``read_unit_bytes``: one expert where the
sizes are known, one MiB where they are not.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bmoe.errors import BmoeError
from bmoe.formats.inputs import read_limited

PROFILE_FORMAT = "bmoe_profile"
PROFILE_VERSION = 2
#: Versions this bmoe reads (older ones are upgraded in memory).
READABLE_VERSIONS = (1, 2)
MODES = ("serial", "overlap", "mixed")
#: The coverage a profile's prediction intervals are meant to have, unless it says otherwise.
DEFAULT_COVERAGE = 0.8
FLASH_COLUMNS = (
    "lanes",
    "req_bytes",
    "latency_ms",
    "latency_ms_p10",
    "latency_ms_p90",
    "batch_overhead_ms",
    "mib_s",
    "reads",
)
#: Text columns of the flash table (optional).
FLASH_TEXT = ("source",)


@dataclass
class DeviceProfile:
    """One device's measured costs (see the module docstring for the fields)."""

    mode: str
    model: dict[str, Any]
    flash: pd.DataFrame
    compute: dict[str, float]  # expert_share may be None (no compute trace)
    mgmt: dict[str, float]
    prefill: dict[str, float] = field(default_factory=dict)
    overlap: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    path: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    tracing: dict[str, Any] = field(default_factory=dict)
    coverage: float = DEFAULT_COVERAGE
    unsettled: list[str] = field(default_factory=list)
    model_error: dict[str, Any] = field(default_factory=dict)
    flash_by_read: list[dict[str, float]] = field(default_factory=list)
    #: the levers' baseline values and a term per other value its runs measured
    #: (see :mod:`bmoe.analyze.device.levers`)
    levers: dict[str, Any] = field(default_factory=dict)
    version: int = PROFILE_VERSION  # of the file it was read from

    def expert_bytes(self) -> dict[int, int]:
        """Bytes of one expert per MoE layer of the model the profile was measured on ({} when
        the runs did not say: such a profile prices MiB read, not reads)."""
        return {int(k): int(v) for k, v in (self.model.get("expert_bytes") or {}).items()}

    @property
    def sized(self) -> bool:
        """Whether the profile knows its model's expert sizes."""
        return bool(self.model.get("expert_bytes"))

    def read_bytes_per_expert(self) -> dict[int, int]:
        """Bytes a read of one expert moves per layer (alignment included), else its size."""
        measured = self.model.get("read_bytes_per_expert") or {}
        sizes = self.expert_bytes()
        return {layer: int(measured.get(str(layer), size)) for layer, size in sizes.items()}

    @property
    def read_unit_bytes(self) -> float:
        """Bytes of one priced read: the median read of one expert, or 1 MiB when unsized."""
        unit = self.model.get("read_unit_bytes")
        if unit:
            return float(unit)
        per = list(self.read_bytes_per_expert().values())
        return float(sorted(per)[len(per) // 2]) if per else float(1 << 20)

    @property
    def settled(self) -> bool:
        """No term of the profile is unsettled (see ``unsettled``)."""
        return not self.unsettled

    def to_dict(self) -> dict[str, Any]:
        columns = list(FLASH_COLUMNS) + [c for c in FLASH_TEXT if c in self.flash]
        flash = self.flash[columns].astype(object)
        return {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "mode": self.mode,
            "model": self.model,
            "flash": [
                {k: _plain(v) for k, v in row.items()} for row in flash.to_dict(orient="records")
            ],
            "flash_by_read": _jsonable(self.flash_by_read),
            "overlap": self.overlap,
            "compute": self.compute,
            "mgmt": self.mgmt,
            "memory": _jsonable(self.memory),
            "prefill": self.prefill,
            "terms": _jsonable(self.terms),
            "absent": dict(self.absent),
            "runs": _jsonable(self.runs),
            "tracing": _jsonable(self.tracing),
            "coverage": self.coverage,
            "unsettled": list(self.unsettled),
            "model_error": _jsonable(self.model_error),
            "levers": _jsonable(self.levers),
            "sources": list(self.sources),
            "caveats": list(self.caveats),
        }


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _jsonable(value: Any) -> Any:
    """Nested dicts/lists with numpy scalars unwrapped and non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return _plain(value)


# ----------------------------------------------------------------------------- reading
# A profile comes from a file someone hands over: it is read like the data files (a regular
# file, a bounded size, UTF-8) and every value is checked against SCHEMA before it is used.

#: Largest profile file read (a real one is a few KiB, some hundred KiB for a large sweep).
MAX_BYTES = 16 << 20
#: Deepest nesting of objects and lists (the schema's deepest is 4: terms.x.runs[i]).
MAX_DEPTH = 8
#: Longest text value (a caveat naming runs, a source path, the model's name).
MAX_TEXT = 65536
#: Longest decimal integer read (an int64 has 19 digits).
MAX_DIGITS = 20
#: Largest millisecond figure (a day): beyond it a profile measured nothing real, and the
#: prediction's arithmetic would overflow long before.
MAX_MS = 86_400_000.0
#: Bound of a descriptive figure (a percentage, a mean of a term): finite and far from
#: overflowing anything it is shown or summed with.
MAX_FIGURE = 1e15
#: Most entries of a list or keys of a map (runs, flash rows, held-out runs, sources).
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Field:
    """One key of the profile: what its value must be.

    `kind`: ``choice`` (one of `choices`), ``number`` (finite, `low` to `high`; above `low`
    when `positive`, below `high` when `below`), ``count`` (a whole number, `low` to
    `high`), ``flag`` (true or false), ``text`` (a string of at most :data:`MAX_TEXT`
    characters), ``scalar`` (text, a finite number or a flag: a value copied from a run's
    preamble), ``texts`` (a list of at most `high` texts), ``sizes`` (layer -> bytes: keys
    ``0`` to ``65535``, values 1 to `high`), ``section`` (an object), ``map`` (an object of
    at most `high` keys of any text, its values as the ``name{}`` entry says), ``rows`` (a
    list of `low` to `high` objects), ``list`` (a list of at most `high` values, as the
    ``name[]`` entry says). `nullable`: null is allowed (and means absent). `required`: the
    key must be there when its section is (a key of an optional section only when that
    section is not empty). Keys the schema does not name are kept as they are (within the
    size and depth bounds): a newer bmoe's fields read back.
    """

    kind: str
    required: bool = False
    low: float = 0.0
    high: float = math.inf
    positive: bool = False
    below: bool = False
    nullable: bool = False
    choices: tuple[Any, ...] = ()


def _ms(required: bool = False, nullable: bool = False, positive: bool = False) -> Field:
    return Field("number", required, high=MAX_MS, nullable=nullable, positive=positive)


def _figure(signed: bool = False) -> Field:
    """A descriptive figure (a statistic shown, not priced), null where it was not finite."""
    return Field("number", low=-MAX_FIGURE if signed else 0.0, high=MAX_FIGURE, nullable=True)


_TEXT = Field("text", nullable=True)
_TEXTS = Field("texts", nullable=True, high=MAX_ENTRIES)
_COUNT = Field("count", nullable=True, high=2**53)
_FLAG = Field("flag", nullable=True)
_BYTES = 2**40  # a TiB: beyond any expert or read

#: Every key a profile holds (``a.b`` a key of section a, ``a[].b`` a key of each row of list
#: a, ``a{}`` each value of map a), sections before their keys. One entry per field: a new
#: field is one more line here.
SCHEMA: dict[str, Field] = {
    "format": Field("choice", required=True, choices=(PROFILE_FORMAT,)),
    "version": Field("choice", required=True, choices=READABLE_VERSIONS),
    "mode": Field("choice", required=True, choices=MODES),
    "model": Field("section", required=True),
    "model.name": _TEXT,
    "model.route_trace": _TEXT,
    "model.arch": _TEXT,
    "model.n_layer": Field("count", nullable=True, high=65536),
    "model.n_expert": Field("count", nullable=True, high=65536),
    "model.n_expert_used": Field("count", nullable=True, high=65536),
    "model.expert_bytes": Field("sizes", required=True, nullable=True, low=1, high=_BYTES),
    "model.read_bytes_per_expert": Field("sizes", nullable=True, high=_BYTES),
    "model.slices_per_expert": Field("count", required=True, low=1, high=1024),
    "model.sizes_from": _TEXT,
    "model.read_unit_bytes": Field("number", nullable=True, high=_BYTES),
    "flash": Field("rows", required=True, low=1, high=MAX_ENTRIES),
    "flash[].lanes": Field("count", required=True, low=1, high=4096),
    "flash[].req_bytes": Field("count", required=True, low=1, high=_BYTES),
    "flash[].latency_ms": _ms(required=True),
    "flash[].latency_ms_p10": _ms(nullable=True),
    "flash[].latency_ms_p90": _ms(nullable=True),
    "flash[].batch_overhead_ms": _ms(required=True),
    "flash[].mib_s": Field("number", nullable=True, high=1e9),
    "flash[].reads": Field("count", required=True, high=2**53),
    "flash[].source": _TEXT,
    "flash_by_read": Field("rows", nullable=True, high=MAX_ENTRIES),
    "flash_by_read[].lanes": Field("count", required=True, low=1, high=4096),
    "flash_by_read[].read_mib": Field("number", required=True, high=_BYTES),
    "flash_by_read[].excess_ms": Field("number", required=True, low=-MAX_MS, high=MAX_MS),
    "overlap": Field("section", nullable=True),
    "overlap.stall_ms": _ms(),
    "overlap.stall_ms_per_miss": _ms(required=True),
    "overlap.lanes": Field("list", nullable=True, high=4096),
    "overlap.lanes[]": Field("count", low=1, high=4096),
    "compute": Field("section", required=True),
    "compute.token_ms": _ms(required=True, positive=True),
    "compute.token_ms_p10": _ms(required=True),
    "compute.token_ms_p90": _ms(required=True),
    "compute.expert_share": Field("number", nullable=True, high=1.0),
    "compute.source": _TEXT,
    "compute.threads": Field("count", nullable=True, high=4096),
    "compute.by_read": Field("rows", nullable=True, high=MAX_ENTRIES),
    "compute.by_read[].read_mib": Field("number", required=True, high=_BYTES),
    "compute.by_read[].token_ms": _ms(required=True),
    "mgmt": Field("section", required=True),
    "mgmt.token_ms": _ms(required=True),
    "mgmt.per_admit_ms": _ms(required=True),
    "memory": Field("section", nullable=True),
    "memory.ms_per_fault": _ms(required=True),
    "memory.points": Field("rows", required=True, high=MAX_ENTRIES),
    "memory.points[].run": _TEXT,
    "memory.points[].cache_mb": Field("number", nullable=True, high=_BYTES),
    "memory.points[].resident_other_mib": Field("number", nullable=True, high=_BYTES),
    "memory.points[].asked_mib": Field("number", required=True, high=_BYTES),
    "memory.points[].available_mib": Field("number", required=True, positive=True, high=_BYTES),
    "memory.points[].faults_per_token": Field("number", required=True, high=1e12),
    "memory.resident_mib": Field("number", nullable=True, high=_BYTES),
    "memory.available_mib": Field("number", nullable=True, positive=True, high=_BYTES),
    "prefill": Field("section", nullable=True),
    "prefill.tok_s": Field("number", positive=True, high=1e9),
    "prefill.prefill_s": Field("number", high=MAX_MS / 1000),
    "prefill.load_s": Field("number", high=MAX_MS / 1000),
    "terms": Field("map", nullable=True, high=1024),
    "terms{}": Field("section"),
    "terms{}.runs": _TEXTS,
    "terms{}.columns": _TEXTS,
    "terms{}.tokens": _COUNT,
    "terms{}.value": _figure(signed=True),
    "terms{}.p10": _figure(signed=True),
    "terms{}.p90": _figure(signed=True),
    "terms{}.run_means": Field("map", nullable=True, high=MAX_ENTRIES),
    "terms{}.run_means{}": _figure(signed=True),
    "terms{}.run_ratios": Field("map", nullable=True, high=MAX_ENTRIES),
    "terms{}.run_ratios{}": _figure(signed=True),
    "terms{}.block_cv_pct": _figure(),
    "terms{}.se_pct": _figure(),
    "terms{}.run_cv_pct": _figure(),
    "terms{}.repeat_cv_pct": _figure(),
    "terms{}.runs_disagree_pct": _figure(),
    "terms{}.drift_cv_pct": _figure(),
    "terms{}.sd_rel": Field("number", nullable=True, high=1e6),
    "terms{}.settled": _FLAG,
    "terms{}.why": _TEXT,
    "terms{}.note": _TEXT,
    "absent": Field("map", nullable=True, high=1024),
    "absent{}": Field("text"),
    "runs": Field("rows", nullable=True, high=MAX_ENTRIES),
    "runs[].name": _TEXT,
    "runs[].version": _COUNT,
    "runs[].tokens": _COUNT,
    "runs[].tok_s": _figure(),
    "runs[].cache_mb": Field("number", nullable=True, high=_BYTES),
    "runs[].io_threads": Field("count", nullable=True, high=4096),
    "runs[].prefetch": _COUNT,
    "runs[].overlap": Field("count", nullable=True, high=1),
    "runs[].policy": _TEXT,
    "runs[].threads": Field("count", nullable=True, high=4096),
    "runs[].n_expert_used": Field("count", nullable=True, high=65536),
    "runs[].dense_weights": Field("scalar", nullable=True),
    "runs[].traced": _FLAG,
    "runs[].compute_traced": _FLAG,
    "runs[].assumed": Field("map", nullable=True, high=1024),
    "runs[].assumed{}": Field("text"),
    "runs[].system_warnings": _TEXTS,
    "runs[].load_1m": _figure(),
    "runs[].cpu_share": _figure(),
    "runs[].off_cpu_pct": _figure(signed=True),
    "runs[].starved": _FLAG,
    "runs[].compute_over_cpu": _figure(),
    "runs[].contended": _FLAG,
    "runs[].slowdown": _figure(),
    "runs[].drop": _figure(),
    "runs[].asked_mib": _figure(),
    "runs[].available_mib": _figure(),
    "runs[].left_min_mib": _figure(),
    "runs[].swap_mib": _figure(),
    "runs[].majflt_per_token": _figure(),
    "runs[].rss_anon_mib": _figure(),
    "runs[].peak_rss_mib": _figure(),
    "runs[].memory_from": _TEXT,
    "runs[].lever_term": _TEXT,
    "tracing": Field("section", nullable=True),
    "tracing.how": _TEXT,
    "tracing.traced_runs": _TEXTS,
    "tracing.timing_runs": _TEXTS,
    "tracing.overhead_ms": Field("map", nullable=True, high=1024),
    "tracing.overhead_ms{}": _figure(signed=True),
    "coverage": Field("number", positive=True, high=1.0, below=True),
    "unsettled": _TEXTS,
    "model_error": Field("section", nullable=True),
    "model_error.method": _TEXT,
    "model_error.sd_rel": Field("number", nullable=True, high=1e6),
    "model_error.configurations": _COUNT,
    "model_error.sd_rel_inside": Field("number", nullable=True, high=1e6),
    "model_error.configurations_inside": _COUNT,
    "model_error.sd_rel_zero": Field("number", nullable=True, high=1e6),
    "model_error.sd_rel_unit": Field("number", nullable=True, high=1e6),
    "model_error.configurations_at": Field("rows", nullable=True, high=MAX_ENTRIES),
    "model_error.configurations_at[].io_threads": _COUNT,
    "model_error.configurations_at[].read_mib": _figure(),
    "model_error.rms_pct": _figure(),
    "model_error.spread_rms_pct": _figure(),
    "model_error.why": _TEXT,
    "model_error.held_out": Field("rows", nullable=True, high=MAX_ENTRIES),
    "model_error.held_out[].run": _TEXT,
    "model_error.held_out[].measured_tok_s": _figure(),
    "model_error.held_out[].predicted_tok_s": _figure(),
    "model_error.held_out[].error_pct": _figure(signed=True),
    "model_error.held_out[].spread_pct": _figure(),
    "model_error.held_out[].why": _TEXT,
    "model_error.held_out[].read_mib": _figure(),
    "model_error.held_out[].inside": _FLAG,
    "model_error.held_out[].io_threads": _COUNT,
    "model_error.held_out[].distance": _figure(),
    "model_error.held_out[].lanes_from_profile": _FLAG,
    "levers": Field("section", nullable=True),
    "levers.baseline": Field("map", nullable=True, high=64),
    "levers.baseline{}": Field("text"),
    "levers.terms": Field("rows", nullable=True, high=MAX_ENTRIES),
    "levers.terms[].lever": Field("text", required=True),
    "levers.terms[].value": Field("text", required=True),
    "levers.terms[].factor": Field("number", required=True, positive=True, high=1e6),
    "levers.terms[].sd_rel": Field("number", required=True, high=1e6),
    "levers.terms[].runs": _TEXTS,
    "levers.terms[].error_pct": Field("list", nullable=True, high=MAX_ENTRIES),
    "levers.terms[].error_pct[]": _figure(signed=True),
    "sources": _TEXTS,
    "caveats": _TEXTS,
}


class _NotFinite(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` as the file spells it (never a float here)."""


class _LongNumber(str):
    """An integer of more than :data:`MAX_DIGITS` digits, kept as its text."""


class _Duplicate(ValueError):
    pass


def _integer(text: str) -> int | _LongNumber:
    return int(text) if len(text) <= MAX_DIGITS else _LongNumber(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _shown(value: Any) -> str:
    """`value` for a message: the file's spelling, cut short."""
    if isinstance(value, _LongNumber):
        return f"a {len(value)}-digit number"
    if isinstance(value, _NotFinite):
        return str(value)
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_profile_text(text: str, where: str = "profile") -> Any:
    """The JSON document of a profile file's text: non-finite numbers and over-long integers
    kept as their spelling (the schema names them), a key given twice, nesting deeper than
    :data:`MAX_DEPTH` and anything that is not JSON refused with one line."""
    try:
        data = json.loads(
            text, parse_constant=_NotFinite, parse_int=_integer, object_pairs_hook=_unique
        )
    except _Duplicate as exc:
        key = exc.args[0] if len(exc.args[0]) <= 40 else exc.args[0][:37] + "..."
        raise BmoeError(f"{where}: key {key!r} appears twice in one object") from None
    except RecursionError:
        raise BmoeError(f"{where}: nested too deep (at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise BmoeError(f"{where}:{exc.lineno}: not JSON ({exc.msg})") from None
    except ValueError as exc:  # a number the decoder cannot hold
        raise BmoeError(f"{where}: not JSON ({str(exc).splitlines()[0][:80]})") from None
    depth = _depth(data)
    if depth > MAX_DEPTH:
        raise BmoeError(f"{where}: nested {depth} levels deep (at most {MAX_DEPTH})")
    return data


def _depth(data: Any) -> int:
    """How deep lists and objects nest in `data` (without recursion; stops past the bound)."""
    deepest = 0
    stack = [(data, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((v, level) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def _located(data: dict[str, Any], name: str) -> list[tuple[str, dict[str, Any], str]]:
    """(label, the object holding it, key) of each place SCHEMA key `name` applies to."""
    places: list[tuple[str, Any]] = [("", data)]
    parts = name.split(".")
    for part in parts[:-1]:
        nxt: list[tuple[str, Any]] = []
        for label, node in places:
            key = part.removesuffix("[]").removesuffix("{}")
            value = node.get(key) if isinstance(node, dict) else None
            if part.endswith("[]") and isinstance(value, list):
                nxt += [(f"{label}{key}[{i}].", row) for i, row in enumerate(value)]
            elif part.endswith("{}") and isinstance(value, dict):
                nxt += [(f"{label}{key}.{k}.", v) for k, v in value.items()]
            elif not part.endswith(("[]", "{}")) and isinstance(value, dict):
                nxt.append((f"{label}{key}.", value))
        places = nxt
    last = parts[-1]
    if last.endswith("{}"):  # each value of a map: the map itself holds them
        key = last.removesuffix("{}")
        return [
            (f"{label}{key}.{k}", value, k)
            for label, node in places
            if isinstance(node, dict) and isinstance(value := node.get(key), dict)
            for k in value
        ]
    return [(f"{label}{last}", node, last) for label, node in places if isinstance(node, dict)]


def _bounds(spec: Field, number: float, value: Any) -> str | None:
    if number < spec.low or (spec.positive and number <= spec.low):
        return f"must be {'>' if spec.positive else '>='} {spec.low:g}, not {_shown(value)}"
    if number > spec.high or (spec.below and number >= spec.high):
        return f"must be {'below' if spec.below else 'at most'} {spec.high:g}, not {_shown(value)}"
    return None


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, _LongNumber | _NotFinite)


def _problem(spec: Field, value: Any) -> str | None:
    """Why `value` is not what `spec` asks (None when it is)."""
    kind = spec.kind
    if kind == "choice":
        if any(type(value) is type(c) and value == c for c in spec.choices):
            return None
        return f"{_shown(value)} is not one of {', '.join(map(str, spec.choices))}"
    if kind in ("number", "count"):
        if isinstance(value, _LongNumber):
            if value.startswith("-"):
                return f"must be >= {spec.low:g}, not {_shown(value)}"
            return f"must be at most {spec.high:g}, not {_shown(value)}"
        if isinstance(value, _NotFinite | bool):
            return f"must be a finite number, not {_shown(value)}"
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            return f"must be a finite number, not {_shown(value)}"
        number = float(value)
        if kind == "count" and not number.is_integer():
            return f"must be a whole number, not {_shown(value)}"
        return _bounds(spec, number, value)
    if kind == "flag":
        return None if isinstance(value, bool) else f"must be true or false, not {_shown(value)}"
    if kind == "text":
        if not _is_text(value):
            return f"must be text, not {_shown(value)}"
        if len(value) > MAX_TEXT:
            return f"is {len(value)} characters long (at most {MAX_TEXT})"
        return None
    if kind == "scalar":
        if isinstance(value, bool) or _is_text(value):
            return _problem(Field("text"), value) if _is_text(value) else None
        return _problem(Field("number", low=-MAX_FIGURE, high=MAX_FIGURE), value)
    if kind in ("texts", "list"):
        if not isinstance(value, list):
            what = "a list of texts" if kind == "texts" else "a list"
            return f"must be {what}, not {_shown(value)}"
        if len(value) > spec.high:
            return f"holds {len(value)} entries (at most {spec.high:g})"
        if kind == "texts":
            for i, item in enumerate(value):
                problem = _problem(Field("text"), item)
                if problem:
                    return f"[{i}] {problem}"
        return None
    if kind == "sizes":
        if not isinstance(value, dict):
            return f"must map layers to bytes, not {_shown(value)}"
        if len(value) > 65536:
            return f"holds {len(value)} layers (at most 65536)"
        for layer, size in value.items():
            if not re.fullmatch(r"[0-9]{1,5}", layer) or int(layer) > 65535:
                return f"key {_shown(layer)} is not a layer (0 to 65535)"
            problem = _problem(Field("count", low=max(spec.low, 1), high=spec.high), size)
            if problem:
                return f"[{layer!r}] {problem}"
        return None
    if kind in ("section", "map"):
        if not isinstance(value, dict):
            return f"must be an object, not {_shown(value)}"
        if kind == "map":
            if len(value) > spec.high:
                return f"holds {len(value)} keys (at most {spec.high:g})"
            long = next((k for k in value if len(k) > MAX_TEXT), None)
            if long is not None:
                return f"has a key {len(long)} characters long (at most {MAX_TEXT})"
        return None
    if kind == "rows":
        if not isinstance(value, list):
            return f"must be a list of objects, not {_shown(value)}"
        if len(value) < spec.low:
            return f"must list at least {spec.low:g} measurement, not {_shown(value)}"
        if len(value) > spec.high:
            return f"holds {len(value)} rows (at most {spec.high:g})"
        bad = next((i for i, row in enumerate(value) if not isinstance(row, dict)), None)
        return None if bad is None else f"[{bad}] is not an object"
    raise ValueError(f"unknown schema kind {kind!r}")


def _parent(name: str) -> str | None:
    """The SCHEMA entry of the section holding key `name` (None at the top)."""
    if "." not in name:
        return None
    return name.rsplit(".", 1)[0].removesuffix("[]").removesuffix("{}")


def check_profile(data: Any, where: str = "profile") -> dict[str, Any]:
    """`data` (a parsed profile file) checked against :data:`SCHEMA`, then the few rules
    between keys (the mode's overlap figures, the model's expert sizes): every problem a
    :class:`BmoeError` naming the file and the key."""
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise BmoeError(f'{where}: not a bmoe device profile (no "format": "{PROFILE_FORMAT}")')
    version = data.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BmoeError(
            f"{where}: profile version {_shown(version)} is not one this bmoe reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); rebuild it with bmoe profile"
        )
    for name, spec in SCHEMA.items():
        parent = _parent(name)
        optional_parent = parent is not None and not SCHEMA[parent].required
        for label, holder, key in _located(data, name):
            if key not in holder:
                # a key of an optional section is required only where the section holds any
                if spec.required and not (optional_parent and not holder):
                    raise BmoeError(f"{where}: {label} is missing")
                continue
            value = holder[key]
            if value is None and spec.nullable:
                continue
            problem = _problem(spec, value)
            if problem:
                sep = "" if problem.startswith("[") else " "  # an entry: flash[2], caveats[0]
                raise BmoeError(f"{where}: {label}{sep}{problem}")
    overlap = data.get("overlap") or {}
    if data["mode"] == "overlap" and "stall_ms_per_miss" not in overlap:
        raise BmoeError(f"{where}: overlap.stall_ms_per_miss is missing (mode is overlap)")
    model = data["model"]
    unsized = version >= 2 and not model["expert_bytes"] and model.get("sizes_from") is None
    if not unsized and not model["expert_bytes"]:
        raise BmoeError(
            f"{where}: model.expert_bytes must map layers to bytes (it is empty"
            + (")" if version < 2 else ", and model.sizes_from names a source)")
        )
    memory = data.get("memory") or {}
    for key in ("resident_mib", "available_mib") if memory.get("points") else ():
        if memory.get(key) is None:
            raise BmoeError(f"{where}: memory.{key} is missing (memory.points are given)")
    return data


def profile_from_dict(data: Any, path: str | None = None) -> DeviceProfile:
    """Validate a parsed profile (:func:`check_profile`) and build the
    :class:`DeviceProfile`; every problem is a :class:`BmoeError` naming the file and the key.
    A version 1 profile is upgraded (a caveat says what it lacks)."""
    where = path or "profile"
    data = check_profile(data, where)
    version = data["version"]
    flash = pd.DataFrame(data["flash"])
    for key in FLASH_COLUMNS:
        if key not in flash:
            flash[key] = float("nan")
    columns = list(FLASH_COLUMNS) + [c for c in FLASH_TEXT if c in flash]
    flash = flash[columns].astype({"lanes": "int32", "req_bytes": "int64", "reads": "int64"})
    caveats = [str(s) for s in data.get("caveats") or []]
    if version == 1:
        caveats.append(
            "a version 1 profile: it does not say which runs and columns each term came from, "
            "nor how settled they are; rebuild it with bmoe profile"
        )
    coverage = data.get("coverage")
    return DeviceProfile(
        mode=data["mode"],
        model=data["model"],
        flash=flash.sort_values(["lanes", "req_bytes"], ignore_index=True),
        compute=dict(data["compute"]),
        mgmt=dict(data["mgmt"]),
        prefill=dict(data.get("prefill") or {}),
        overlap=dict(data.get("overlap") or {}),
        sources=[str(s) for s in data.get("sources") or []],
        caveats=caveats,
        path=path,
        memory=dict(data.get("memory") or {}),
        terms={str(k): dict(v) for k, v in (data.get("terms") or {}).items()},
        absent={str(k): str(v) for k, v in (data.get("absent") or {}).items()},
        runs=[dict(r) for r in data.get("runs") or []],
        tracing=dict(data.get("tracing") or {}),
        coverage=DEFAULT_COVERAGE if coverage is None else float(coverage),
        unsettled=[str(s) for s in data.get("unsettled") or []],
        model_error=dict(data.get("model_error") or {}),
        flash_by_read=[dict(p) for p in data.get("flash_by_read") or []],
        levers=dict(data.get("levers") or {}),
        version=int(version),
    )


def read_profile(path: str | os.PathLike) -> DeviceProfile:
    """Read and validate a profile file: a regular file (a FIFO or a device is refused before
    it is opened) of at most :data:`MAX_BYTES`, UTF-8 JSON, every value as :data:`SCHEMA`
    says."""
    where = os.fspath(path)
    raw = read_limited(where, MAX_BYTES, "a device profile is some KiB of JSON")
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BmoeError(
            f"{where}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); a profile is JSON "
            "in UTF-8"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise BmoeError(f"{where}:{line}: a NUL byte; a profile is JSON text")
    return profile_from_dict(parse_profile_text(text, where), where)


def write_profile(profile: DeviceProfile, path: str | os.PathLike) -> None:
    """Write `profile` as indented JSON (validated first, so a written file always reads)."""
    data = profile.to_dict()
    profile_from_dict(json.loads(json.dumps(data)), os.fspath(path))
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


__all__ = [
    "DEFAULT_COVERAGE",
    "FLASH_COLUMNS",
    "FLASH_TEXT",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "READABLE_VERSIONS",
    "SCHEMA",
    "DeviceProfile",
    "Field",
    "check_profile",
    "parse_profile_text",
    "profile_from_dict",
    "read_profile",
    "write_profile",
]
