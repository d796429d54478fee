"""The device profile: a versioned JSON file of what a device's runs measured.

A profile holds what a prediction needs to turn a replay's reads into time: flash request
latency by request size and lane count, compute time per token, cache-management cost per
expert admitted, the prefill rate, and the model it was measured on (expert sizes: a profile
prices reads of that model's experts only). This module reads, validates and writes the file;
building one from runs is :mod:`bmoe.analyze.profile`.

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
     "sources": [...], "caveats": [...]}

Version 1 files (no ``terms``/``runs``/``memory``; every term implicitly measured) still read:
they are upgraded in memory and say so in their caveats. Every per-read figure (flash latency,
``per_admit_ms``, ``stall_ms_per_miss``) is per read of ``read_unit_bytes``: one expert where the
sizes are known, one MiB where they are not.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bmoe.errors import BmoeError

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
_REQUIRED = {
    "compute": ("token_ms", "token_ms_p10", "token_ms_p90"),
    "mgmt": ("token_ms", "per_admit_ms"),
    "model": ("expert_bytes", "slices_per_expert"),
}


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


def _number(where: str, section: dict, key: str) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BmoeError(f"{where}: {key} must be a number, not {value!r}")
    if value < 0:
        raise BmoeError(f"{where}: {key} must be >= 0, not {value!r}")
    return float(value)


def profile_from_dict(data: Any, path: str | None = None) -> DeviceProfile:
    """Validate a parsed profile and build the :class:`DeviceProfile`; every problem is a
    :class:`BmoeError` naming the file and the key. A version 1 profile is upgraded."""
    where = path or "profile"
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise BmoeError(f'{where}: not a bmoe device profile (no "format": "{PROFILE_FORMAT}")')
    version = data.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise BmoeError(
            f"{where}: profile version {version!r} is not one this bmoe reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); rebuild it with bmoe profile"
        )
    mode = data.get("mode")
    if mode not in MODES:
        raise BmoeError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}")
    for name, keys in _REQUIRED.items():
        section = data.get(name)
        if not isinstance(section, dict):
            raise BmoeError(f"{where}: no {name} section")
        for key in keys:
            if key not in section:
                raise BmoeError(f"{where}: {name}.{key} is missing")
        if name != "model":
            for key in keys:
                _number(f"{where}: {name}", section, key)
    model = data["model"]
    sizes = model["expert_bytes"]
    unsized = version >= 2 and sizes in ({}, None) and model.get("sizes_from") is None
    if not unsized and (not isinstance(sizes, dict) or not sizes):
        raise BmoeError(f"{where}: model.expert_bytes must map layers to bytes")
    for layer, size in (sizes or {}).items():
        if not str(layer).isdigit() or not isinstance(size, int) or size <= 0:
            raise BmoeError(f"{where}: model.expert_bytes[{layer!r}] = {size!r} is not a size")
    slices = model["slices_per_expert"]
    if not isinstance(slices, int) or slices < 1:
        raise BmoeError(f"{where}: model.slices_per_expert must be a whole number >= 1")
    unit = model.get("read_unit_bytes")
    if unit is not None:
        _number(f"{where}: model", model, "read_unit_bytes")
    flash_rows = data.get("flash")
    if not isinstance(flash_rows, list) or not flash_rows:
        raise BmoeError(f"{where}: flash must list at least one measurement")
    for i, row in enumerate(flash_rows):
        if not isinstance(row, dict):
            raise BmoeError(f"{where}: flash[{i}] is not an object")
        for key in FLASH_COLUMNS:
            if key in ("latency_ms_p10", "latency_ms_p90", "mib_s") and row.get(key) is None:
                continue
            _number(f"{where}: flash[{i}]", row, key)
        if row["lanes"] < 1 or row["req_bytes"] <= 0:
            raise BmoeError(f"{where}: flash[{i}]: lanes must be >= 1 and req_bytes > 0")
    flash = pd.DataFrame(flash_rows)
    for key in FLASH_COLUMNS:
        if key not in flash:
            flash[key] = float("nan")
    columns = list(FLASH_COLUMNS) + [c for c in FLASH_TEXT if c in flash]
    flash = flash[columns].astype({"lanes": "int32", "req_bytes": "int64", "reads": "int64"})
    overlap = data.get("overlap") or {}
    if mode == "overlap" or (mode == "mixed" and overlap):
        _number(f"{where}: overlap", overlap, "stall_ms_per_miss")
        if "stall_ms" in overlap:
            _number(f"{where}: overlap", overlap, "stall_ms")
    sections = {
        name: _section(where, data, name, kind)
        for name, kind in (
            ("memory", dict),
            ("terms", dict),
            ("absent", dict),
            ("runs", list),
            ("tracing", dict),
            ("unsettled", list),
            ("model_error", dict),
        )
    }
    memory = sections["memory"]
    if memory:
        _number(f"{where}: memory", memory, "ms_per_fault")
        points = memory.get("points")
        if not isinstance(points, list):
            raise BmoeError(f"{where}: memory.points must list the measured points")
        for i, point in enumerate(points):
            if not isinstance(point, dict):
                raise BmoeError(f"{where}: memory.points[{i}] is not an object")
            for key in ("asked_mib", "available_mib", "faults_per_token"):
                _number(f"{where}: memory.points[{i}]", point, key)
    error = sections["model_error"]
    for key in ("sd_rel", "configurations"):
        if error.get(key) is not None:
            _number(f"{where}: model_error", error, key)
    coverage = data.get("coverage", DEFAULT_COVERAGE)
    if (
        isinstance(coverage, bool)
        or not isinstance(coverage, int | float)
        or not (0 < coverage < 1)
    ):
        raise BmoeError(f"{where}: coverage must be a fraction between 0 and 1, not {coverage!r}")
    caveats = [str(s) for s in data.get("caveats") or []]
    terms = sections["terms"]
    if version == 1:
        caveats.append(
            "a version 1 profile: it does not say which runs and columns each term came from, "
            "nor how settled they are; rebuild it with bmoe profile"
        )
    for name, term in terms.items():
        if not isinstance(term, dict):
            raise BmoeError(f"{where}: terms.{name} is not an object")
    return DeviceProfile(
        mode=mode,
        model=model,
        flash=flash.sort_values(["lanes", "req_bytes"], ignore_index=True),
        compute=dict(data["compute"]),
        mgmt=dict(data["mgmt"]),
        prefill=dict(data.get("prefill") or {}),
        overlap=dict(overlap),
        sources=[str(s) for s in data.get("sources") or []],
        caveats=caveats,
        path=path,
        memory=dict(memory),
        terms={str(k): dict(v) for k, v in terms.items()},
        absent={str(k): str(v) for k, v in sections["absent"].items()},
        runs=[dict(r) for r in sections["runs"] if isinstance(r, dict)],
        tracing=dict(sections["tracing"]),
        coverage=float(coverage),
        unsettled=[str(s) for s in sections["unsettled"]],
        model_error=dict(sections["model_error"]),
        version=int(version),
    )


def _section(where: str, data: dict, name: str, kind: type) -> Any:
    """An optional section of `kind` (empty when absent)."""
    value = data.get(name)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise BmoeError(f"{where}: {name} must be {'an object' if kind is dict else 'a list'}")
    return value


def read_profile(path: str | os.PathLike) -> DeviceProfile:
    """Read and validate a profile file."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise BmoeError(f"{where}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise BmoeError(f"{where}:{exc.lineno}: not JSON ({exc.msg})") from None
    return profile_from_dict(data, where)


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
    "DeviceProfile",
    "profile_from_dict",
    "read_profile",
    "write_profile",
]
