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
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bmoe.errors import BmoeError

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


def _number(where: str, section: dict, key: str) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BmoeError(f"{where}: {key} must be a number, not {value!r}")
    if value < 0:
        raise BmoeError(f"{where}: {key} must be >= 0, not {value!r}")
    return float(value)


def profile_from_dict(data: Any, path: str | None = None) -> DeviceProfile:
    """Validate a parsed profile and build the :class:`DeviceProfile`; every problem is a
    :class:`BmoeError` naming the file and the key."""
    where = path or "profile"
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise BmoeError(f'{where}: not a bmoe device profile (no "format": "{PROFILE_FORMAT}")')
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise BmoeError(
            f"{where}: profile version {version!r} is not one this bmoe reads ({PROFILE_VERSION})"
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
    if not isinstance(sizes, dict) or not sizes:
        raise BmoeError(f"{where}: model.expert_bytes must map layers to bytes")
    for layer, size in sizes.items():
        if not str(layer).isdigit() or not isinstance(size, int) or size <= 0:
            raise BmoeError(f"{where}: model.expert_bytes[{layer!r}] = {size!r} is not a size")
    slices = model["slices_per_expert"]
    if not isinstance(slices, int) or slices < 1:
        raise BmoeError(f"{where}: model.slices_per_expert must be a whole number >= 1")
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
    flash = flash[list(FLASH_COLUMNS)].astype(
        {"lanes": "int32", "req_bytes": "int64", "reads": "int64"}
    )
    overlap = data.get("overlap") or {}
    if mode == "overlap":
        _number(f"{where}: overlap", overlap, "stall_ms_per_miss")
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
    "FLASH_COLUMNS",
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "DeviceProfile",
    "profile_from_dict",
    "read_profile",
    "write_profile",
]
