"""Device-side companions of a run: the ``.metrics`` pressure sidecar and the ``.state`` snapshot.

The pressure sidecar is flat ``key=value`` lines written by the ~1 Hz sampler
(``peak_rss_kb``, ``mem_avail_floor_kb``, ``cpu_temp_max_mC``, ...). The state snapshot is the
free-form ``--- BEFORE ---`` / ``--- AFTER ---`` dump of cpufreq policies, meminfo and thermal
zones; it is read best effort.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bmoe.formats import kv
from bmoe.formats.csvtable import BOM, PathLike, read_bytes
from bmoe.formats.errors import FormatError
from bmoe.formats.inputs import regular_file

#: Keys the native benchmarking practice writes, in its order.
PRESSURE_KEYS = (
    "peak_rss_kb", "mem_avail_before_kb", "mem_avail_floor_kb", "mem_avail_after_kb",
    "batt_temp_before_dC", "batt_temp_max_dC", "batt_temp_after_dC", "cpu_temp_before_mC",
    "cpu_temp_max_mC",
)  # fmt: skip


def parse_pressure(text: str) -> dict[str, Any]:
    """Typed ``key=value`` pairs, one per line; other lines are ignored, unknown keys kept."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.strip().lstrip("\ufeff")
        if "=" in line and " " not in line and not line.startswith("#"):
            out.update(kv.parse_tokens(line))
    return out


def read_pressure(source: PathLike | bytes) -> dict[str, Any]:
    """Read a ``.metrics`` pressure sidecar (also tolerates the key=value tail of a run log)."""
    data, _path = read_bytes(source)
    if data.startswith(BOM):
        data = data[len(BOM) :]
    return parse_pressure(data.decode("utf-8", "replace"))


def write_pressure(values: dict[str, Any], dest: PathLike | TextIO) -> None:
    text = "".join(f"{k}={kv.format_value(k, v)}\n" for k, v in values.items())
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_text(text, encoding="utf-8")
    else:
        dest.write(text)


def pressure_sidecar_for(csv_path: PathLike) -> Path | None:
    """The ``.metrics`` file beside a run's CSV (same stem), if it exists and is a sidecar."""
    path = Path(csv_path).with_suffix(".metrics")
    if path == Path(csv_path) or not path.is_file():
        return None
    try:
        with open(regular_file(path), "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except (FormatError, OSError):
        return None
    return path if "=" in head and "," not in head.splitlines()[0] else None


@dataclass
class DeviceState:
    """One section (``BEFORE`` or ``AFTER``) of a ``.state`` snapshot."""

    date: str | None = None
    scaling_max_freq: dict[str, int] = field(default_factory=dict)  # policy -> kHz
    hw_max_freq: dict[str, int] = field(default_factory=dict)
    meminfo_kb: dict[str, int] = field(default_factory=dict)
    battery_temp_dC: int | None = None
    thermal_status: int | None = None
    temps_c: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_temp_max_c(self) -> float | None:
        cpu = [v for k, v in self.temps_c.items() if k.upper().startswith("CPU")]
        return max(cpu) if cpu else None


_POLICY = re.compile(r"^(policy\d+):\s*(.*)$")
_MEM = re.compile(r"(\w+):\s*(\d+)\s*kB")
_TEMP = re.compile(r"mValue=([-\d.]+).*?mName=([^,}]+)")


def parse_state(text: str) -> dict[str, DeviceState]:
    """Sections of a ``.state`` snapshot by name (``before``, ``after``), best effort."""
    sections: dict[str, DeviceState] = {}
    current: DeviceState | None = None
    for raw in text.splitlines():
        line = raw.strip().lstrip("\ufeff")
        m = re.match(r"^---\s*(\w+)\s*---$", line)
        if m:
            current = sections.setdefault(m.group(1).lower(), DeviceState())
            continue
        if current is None or not line:
            continue
        if line.startswith("date:"):
            current.date = line[5:].strip()
        elif pm := _POLICY.match(line):
            vals = kv.parse_tokens(pm.group(2))
            if isinstance(vals.get("scaling_max"), int):
                current.scaling_max_freq[pm.group(1)] = vals["scaling_max"]
            if isinstance(vals.get("hw_max"), int):
                current.hw_max_freq[pm.group(1)] = vals["hw_max"]
        elif line.startswith("meminfo:"):
            current.meminfo_kb.update({k: int(v) for k, v in _MEM.findall(line)})
        elif line.startswith("battery_temp_dC:"):
            value = line.split(":", 1)[1].strip()
            current.battery_temp_dC = int(value) if value.lstrip("-").isdigit() else None
        elif line.startswith("Thermal Status:"):
            value = line.split(":", 1)[1].strip()
            current.thermal_status = int(value) if value.isdigit() else None
        elif tm := _TEMP.search(line):
            current.temps_c[tm.group(2).strip()] = float(tm.group(1))
    return sections


def read_state(source: PathLike | bytes) -> dict[str, DeviceState]:
    data, _path = read_bytes(source)
    return parse_state(data.decode("utf-8", "replace"))
