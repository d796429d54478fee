"""The device profile: a versioned JSON file of what a device's runs measured.

A profile holds what a prediction needs to turn a replay's reads into time: flash request
latency by request size and lane count, compute time per token, cache-management cost per
expert admitted, the prefill rate, and the model it was measured on (expert sizes: a profile
prices reads of that model's experts only). This module reads, validates and writes the file;
building one from runs is :mod:`bmoe.analyze.profile`.

Layout (``version`` 1)::

    {"format": "bmoe_profile", "version": 1,
     "mode": "serial" | "overlap",
     "model": {"name", "arch", "n_layer", "n_expert", "n_expert_used",
               "expert_bytes": {"<layer>": bytes}, "read_bytes_per_expert": {"<layer>": bytes},
               "slices_per_expert": n},
     "flash": [{"lanes", "req_bytes", "latency_ms", "latency_ms_p10", "latency_ms_p90",
                "batch_overhead_ms", "mib_s", "reads"}, ...],
     "overlap": {"stall_ms_per_miss"} (overlap mode only),
     "compute": {"token_ms", "token_ms_p10", "token_ms_p90", "expert_share"},
     "mgmt": {"token_ms", "per_admit_ms"},
     "prefill": {"tok_s", "load_s"},
     "sources": [...], "caveats": [...]}
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
PROFILE_VERSION = 1
MODES = ("serial", "overlap")
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


@dataclass
class DeviceProfile:
    """One device's measured costs (see the module docstring for the fields)."""

    mode: str
    model: dict[str, Any]
    flash: pd.DataFrame
    compute: dict[str, float]  # expert_share may be None (no compute trace)
    mgmt: dict[str, float]
    prefill: dict[str, float] = field(default_factory=dict)
    overlap: dict[str, float] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    path: str | None = None

    def expert_bytes(self) -> dict[int, int]:
        """Bytes of one expert per MoE layer of the model the profile was measured on."""
        return {int(k): int(v) for k, v in self.model["expert_bytes"].items()}

    def read_bytes_per_expert(self) -> dict[int, int]:
        """Bytes a read of one expert moves per layer (alignment included), else its size."""
        measured = self.model.get("read_bytes_per_expert") or {}
        sizes = self.expert_bytes()
        return {layer: int(measured.get(str(layer), size)) for layer, size in sizes.items()}

    def to_dict(self) -> dict[str, Any]:
        flash = self.flash[list(FLASH_COLUMNS)].astype(object)
        return {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "mode": self.mode,
            "model": self.model,
            "flash": [
                {k: _plain(v) for k, v in row.items()} for row in flash.to_dict(orient="records")
            ],
            "overlap": self.overlap,
            "compute": self.compute,
            "mgmt": self.mgmt,
            "prefill": self.prefill,
            "sources": list(self.sources),
            "caveats": list(self.caveats),
        }


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ----------------------------------------------------------------------------- reading
# A profile comes from a file someone hands over: it is read like the data files (a regular
# file, a bounded size, UTF-8) and every value is checked against SCHEMA before it is used.

#: Largest profile file read (a real one is a few KiB: a flash row per size and lane count).
MAX_BYTES = 16 << 20
#: Deepest nesting of objects and lists (the schema's deepest is 3: flash[i].lanes).
MAX_DEPTH = 8
#: Longest text value (a caveat, a source path, the model's name).
MAX_TEXT = 4096
#: Longest decimal integer read (an int64 has 19 digits).
MAX_DIGITS = 20
#: Largest millisecond figure (a day): beyond it a profile measured nothing real, and the
#: prediction's arithmetic would overflow long before.
MAX_MS = 86_400_000.0


@dataclass(frozen=True)
class Field:
    """One key of the profile: what its value must be.

    `kind`: ``choice`` (one of `choices`), ``number`` (finite, `low` to `high`, above `low`
    when `positive`), ``count`` (a whole number, `low` to `high`), ``text`` (a string of at
    most :data:`MAX_TEXT` characters), ``texts`` (a list of at most `high` of them),
    ``sizes`` (layer -> bytes: keys ``0`` to ``65535``, values 1 to `high`), ``section`` (an
    object), ``rows`` (a list of 1 to `high` objects). `nullable`: null is allowed (and means
    absent). Keys the schema does not name are kept as they are (within the size and depth
    bounds): a newer bmoe's fields read back.
    """

    kind: str
    required: bool = False
    low: float = 0.0
    high: float = math.inf
    positive: bool = False
    nullable: bool = False
    choices: tuple[Any, ...] = ()


#: Every key a profile holds (``a.b`` a key of section a, ``a[].b`` a key of each row of list
#: a), sections before their keys. One entry per field: a new field is one more line here.
SCHEMA: dict[str, Field] = {
    "format": Field("choice", required=True, choices=(PROFILE_FORMAT,)),
    "version": Field("choice", required=True, choices=(PROFILE_VERSION,)),
    "mode": Field("choice", required=True, choices=MODES),
    "model": Field("section", required=True),
    "model.name": Field("text", nullable=True),
    "model.route_trace": Field("text", nullable=True),
    "model.arch": Field("text", nullable=True),
    "model.n_layer": Field("count", nullable=True, high=65536),
    "model.n_expert": Field("count", nullable=True, high=65536),
    "model.n_expert_used": Field("count", nullable=True, high=65536),
    "model.expert_bytes": Field("sizes", required=True, low=1, high=2**40),
    "model.read_bytes_per_expert": Field("sizes", nullable=True, high=2**40),
    "model.slices_per_expert": Field("count", required=True, low=1, high=1024),
    "flash": Field("rows", required=True, high=100_000),
    "flash[].lanes": Field("count", required=True, low=1, high=4096),
    "flash[].req_bytes": Field("count", required=True, low=1, high=2**40),
    "flash[].latency_ms": Field("number", required=True, high=MAX_MS),
    "flash[].latency_ms_p10": Field("number", nullable=True, high=MAX_MS),
    "flash[].latency_ms_p90": Field("number", nullable=True, high=MAX_MS),
    "flash[].batch_overhead_ms": Field("number", required=True, high=MAX_MS),
    "flash[].mib_s": Field("number", nullable=True, high=1e9),
    "flash[].reads": Field("count", required=True, high=2**53),
    "overlap": Field("section", nullable=True),
    "overlap.stall_ms_per_miss": Field("number", high=MAX_MS),
    "compute": Field("section", required=True),
    "compute.token_ms": Field("number", required=True, positive=True, high=MAX_MS),
    "compute.token_ms_p10": Field("number", required=True, high=MAX_MS),
    "compute.token_ms_p90": Field("number", required=True, high=MAX_MS),
    "compute.expert_share": Field("number", nullable=True, high=1.0),
    "mgmt": Field("section", required=True),
    "mgmt.token_ms": Field("number", required=True, high=MAX_MS),
    "mgmt.per_admit_ms": Field("number", required=True, high=MAX_MS),
    "prefill": Field("section", nullable=True),
    "prefill.tok_s": Field("number", positive=True, high=1e9),
    "prefill.prefill_s": Field("number", high=MAX_MS / 1000),
    "prefill.load_s": Field("number", high=MAX_MS / 1000),
    "sources": Field("texts", nullable=True, high=100_000),
    "caveats": Field("texts", nullable=True, high=1000),
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
        raise BmoeError(f"{where}: key {exc.args[0]!r} appears twice in one object") from None
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
            rows = part.endswith("[]")
            key = part.removesuffix("[]")
            value = node.get(key) if isinstance(node, dict) else None
            if rows and isinstance(value, list):
                nxt += [(f"{label}{key}[{i}].", row) for i, row in enumerate(value)]
            elif not rows and isinstance(value, dict):
                nxt.append((f"{label}{key}.", value))
        places = nxt
    last = parts[-1]
    return [(f"{label}{last}", node, last) for label, node in places if isinstance(node, dict)]


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
        if number < spec.low or (spec.positive and number <= spec.low):
            return f"must be {'>' if spec.positive else '>='} {spec.low:g}, not {_shown(value)}"
        if number > spec.high:
            return f"must be at most {spec.high:g}, not {_shown(value)}"
        return None
    if kind == "text":
        if not isinstance(value, str) or isinstance(value, _LongNumber | _NotFinite):
            return f"must be text, not {_shown(value)}"
        if len(value) > MAX_TEXT:
            return f"is {len(value)} characters long (at most {MAX_TEXT})"
        return None
    if kind == "texts":
        if not isinstance(value, list):
            return f"must be a list of texts, not {_shown(value)}"
        if len(value) > spec.high:
            return f"holds {len(value)} entries (at most {spec.high:g})"
        for i, item in enumerate(value):
            problem = _problem(Field("text"), item)
            if problem:
                return f"[{i}] {problem}"
        return None
    if kind == "sizes":
        if not isinstance(value, dict):
            return f"must map layers to bytes, not {_shown(value)}"
        if spec.required and not value:
            return "must map layers to bytes (it is empty)"
        if len(value) > 65536:
            return f"holds {len(value)} layers (at most 65536)"
        for layer, size in value.items():
            if not re.fullmatch(r"[0-9]{1,5}", layer) or int(layer) > 65535:
                return f"key {_shown(layer)} is not a layer (0 to 65535)"
            problem = _problem(Field("count", low=max(spec.low, 1), high=spec.high), size)
            if problem:
                return f"[{layer!r}] {problem}"
        return None
    if kind == "section":
        return None if isinstance(value, dict) else f"must be an object, not {_shown(value)}"
    if kind == "rows":
        if not isinstance(value, list) or not value:
            return f"must list at least one measurement, not {_shown(value)}"
        if len(value) > spec.high:
            return f"holds {len(value)} rows (at most {spec.high:g})"
        bad = next((i for i, row in enumerate(value) if not isinstance(row, dict)), None)
        return None if bad is None else f"[{bad}] is not an object"
    raise ValueError(f"unknown schema kind {kind!r}")


def check_profile(data: Any, where: str = "profile") -> dict[str, Any]:
    """`data` (a parsed profile file) checked against :data:`SCHEMA`: every problem a
    :class:`BmoeError` naming the file and the key."""
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise BmoeError(f'{where}: not a bmoe device profile (no "format": "{PROFILE_FORMAT}")')
    version = data.get("version")
    if type(version) is not int or version != PROFILE_VERSION:
        raise BmoeError(
            f"{where}: profile version {_shown(version)} is not one this bmoe reads "
            f"({PROFILE_VERSION})"
        )
    for name, spec in SCHEMA.items():
        for label, holder, key in _located(data, name):
            value = holder.get(key)
            if key not in holder or (value is None and spec.nullable):
                if spec.required:
                    raise BmoeError(f"{where}: {label} is missing")
                continue
            problem = _problem(spec, value)
            if problem:
                sep = "" if problem.startswith("[") else " "  # an entry: flash[2], caveats[0]
                raise BmoeError(f"{where}: {label}{sep}{problem}")
    if data["mode"] == "overlap" and "stall_ms_per_miss" not in (data.get("overlap") or {}):
        raise BmoeError(f"{where}: overlap.stall_ms_per_miss is missing (mode is overlap)")
    return data


def profile_from_dict(data: Any, path: str | None = None) -> DeviceProfile:
    """Validate a parsed profile (:func:`check_profile`) and build the
    :class:`DeviceProfile`; every problem is a :class:`BmoeError` naming the file and the key."""
    where = path or "profile"
    data = check_profile(data, where)
    mode = data["mode"]
    model = data["model"]
    flash = pd.DataFrame(data["flash"])
    for key in FLASH_COLUMNS:
        if key not in flash:
            flash[key] = float("nan")
    flash = flash[list(FLASH_COLUMNS)].astype(
        {"lanes": "int32", "req_bytes": "int64", "reads": "int64"}
    )
    overlap = data.get("overlap") or {}
    return DeviceProfile(
        mode=mode,
        model=model,
        flash=flash.sort_values(["lanes", "req_bytes"], ignore_index=True),
        compute=dict(data["compute"]),
        mgmt=dict(data["mgmt"]),
        prefill=dict(data.get("prefill") or {}),
        overlap=dict(overlap),
        sources=[str(s) for s in data.get("sources") or []],
        caveats=[str(s) for s in data.get("caveats") or []],
        path=path,
    )


def read_profile(path: str | os.PathLike) -> DeviceProfile:
    """Read and validate a profile file: a regular file (a FIFO or a device is refused before
    it is opened) of at most :data:`MAX_BYTES`, UTF-8 JSON, every value as :data:`SCHEMA`
    says."""
    where = os.fspath(path)
    raw = read_limited(where, MAX_BYTES, "a device profile is a few KiB of JSON")
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
    "FLASH_COLUMNS",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "SCHEMA",
    "DeviceProfile",
    "Field",
    "check_profile",
    "parse_profile_text",
    "profile_from_dict",
    "read_profile",
    "write_profile",
]
