"""Device state around a cell: the gate it waits at, the entry state it logs, and the ~1 Hz
pressure sampler that runs beside the engine and becomes the ``.metrics`` sidecar.

Everything is read on the target by small POSIX ``sh`` scripts (they run unchanged under
Android's mksh/toybox, on Linux hosts and over ssh) whose output is parsed here. No value
from the configuration is ever part of a script's text: values travel as positional
parameters.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bmoe.formats.sidecar import PRESSURE_KEYS


@dataclass(frozen=True)
class GateSettings:
    """Wait before each cell until the device is cool and has memory back, up to a bound."""

    max_cpu_temp_c: float | None = None
    min_mem_available_mb: float | None = None
    poll_s: float = 5.0
    max_wait_s: float = 300.0

    @property
    def active(self) -> bool:
        return self.max_cpu_temp_c is not None or self.min_mem_available_mb is not None


#: Shell functions the probes share: CPU temperature (max over thermal zones whose type
#: starts with "cpu"), MemAvailable, battery temperature, a process's VmHWM.
PROBES = r"""
cpu_temp() {
  m=
  for z in /sys/class/thermal/thermal_zone*; do
    [ -r "$z/type" ] || continue
    read t < "$z/type" || continue
    case $t in
      cpu*|CPU*)
        v=
        read v < "$z/temp" 2>/dev/null || continue
        case $v in ''|*[!0-9-]*) continue;; esac
        if [ -z "$m" ] || [ "$v" -gt "$m" ]; then m=$v; fi;;
    esac
  done
  echo "$m"
}
mem_avail() {
  while read k v u; do
    if [ "$k" = "MemAvailable:" ]; then echo "$v"; return; fi
  done < /proc/meminfo 2>/dev/null
}
batt_temp() {
  command -v dumpsys >/dev/null 2>&1 || return 0
  dumpsys battery 2>/dev/null | while read k v; do
    if [ "$k" = "temperature:" ]; then echo "$v"; fi
  done
}
hwm() {
  [ -r "/proc/$1/status" ] || return 0
  while read k v u; do
    if [ "$k" = "VmHWM:" ]; then echo "$v"; return; fi
  done < "/proc/$1/status"
}
"""

#: Prints the entry state: ``cpu_mC=``, ``avail_kb=``, then ``policyN=<scaling_max_freq kHz>``,
#: ``gov_policyN=<scaling_governor>``, ``hwmax_policyN=<cpuinfo_max_freq kHz>``, the 1-minute
#: load average ``load1=``, the tasks runnable at that instant ``runnable=`` (this script
#: included) and the online CPUs ``ncpu=`` (what pyperf's system check reads).
STATE_SCRIPT = (
    PROBES
    + r"""
echo "cpu_mC=$(cpu_temp)"
echo "avail_kb=$(mem_avail)"
for p in /sys/devices/system/cpu/cpufreq/policy*; do
  [ -r "$p/scaling_max_freq" ] || continue
  read f < "$p/scaling_max_freq" && echo "${p##*/}=$f"
  g=
  read g < "$p/scaling_governor" 2>/dev/null && echo "gov_${p##*/}=$g"
  h=
  read h < "$p/cpuinfo_max_freq" 2>/dev/null && echo "hwmax_${p##*/}=$h"
done
l1=
if read l1 l5 l15 tasks rest < /proc/loadavg 2>/dev/null; then
  echo "load1=$l1"
  echo "runnable=${tasks%/*}"
fi
n=0
while read k rest; do
  [ "$k" = processor ] && n=$((n+1))
done < /proc/cpuinfo 2>/dev/null
echo "ncpu=$n"
"""
)

#: Runs the engine ($3...) with the sampler beside it. $1: file that holds the engine's pid
#: while it runs (how strays are found and how a run is stopped); $2: the samples file.
#: Standard input reaches the engine (session mode); the exit status is the engine's.
WRAPPER_SCRIPT = (
    PROBES
    + r"""
pidfile=$1; samples=$2; shift 2
sample() {
  h=
  if [ -n "$2" ]; then h=$(hwm "$2"); fi
  echo "$1 t=$(date +%s) avail_kb=$(mem_avail) cpu_mC=$(cpu_temp)" \
    "batt_dC=$(batt_temp) hwm_kb=$h" >> "$samples"
}
sample before
exec 3<&0
"$@" 0<&3 3<&- &
pid=$!
exec 3<&-
echo "$pid" > "$pidfile"
(
  while kill -0 "$pid" 2>/dev/null; do
    sample during "$pid"
    sleep 1
  done
) </dev/null >/dev/null 2>&1 &
sampler=$!
wait "$pid"
rc=$?
kill "$sampler" 2>/dev/null
sample after
rm -f "$pidfile"
exit $rc
"""
)


@dataclass
class EntryState:
    """The device as a cell found it, and how long the gate made it wait."""

    cpu_temp_c: float | None = None
    mem_available_mb: float | None = None
    scaling_max_freq_khz: dict[str, int] = field(default_factory=dict)
    governor: dict[str, str] = field(default_factory=dict)  # policy -> scaling_governor
    hardware_max_freq_khz: dict[str, int] = field(default_factory=dict)  # cpuinfo_max_freq
    load_1m: float | None = None
    busy_tasks: int | None = None  # other tasks runnable when the state was read
    cpus: int | None = None
    waited_s: float = 0.0
    gave_up: bool = False
    polls: int = 0

    def columns(self) -> dict[str, Any]:
        """Flat ``entry_*`` columns for the results table."""
        freqs = self.scaling_max_freq_khz
        out: dict[str, Any] = {
            "entry_cpu_temp_c": self.cpu_temp_c,
            "entry_mem_available_mb": self.mem_available_mb,
            "entry_scaling_max_freq_khz": max(freqs.values()) if freqs else None,
            "entry_waited_s": round(self.waited_s, 3),
            "entry_gave_up": self.gave_up,
            "entry_governor": ",".join(sorted(set(self.governor.values()))) or None,
            "entry_load_1m": self.load_1m,
            "entry_busy_tasks": self.busy_tasks,
            "entry_cpus": self.cpus,
        }
        for policy, khz in sorted(freqs.items()):
            out[f"entry_scaling_max_freq_khz_{policy}"] = khz
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EntryState:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _int(text: str) -> int | None:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None


def parse_entry_state(text: str) -> EntryState:
    """Parse :data:`STATE_SCRIPT` output. Unknown or empty values stay None."""
    state = EntryState()
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        number = _int(value)
        if key.startswith("gov_policy") and value.strip():
            state.governor[key[4:]] = value.strip()
        elif key.startswith("hwmax_policy") and number is not None:
            state.hardware_max_freq_khz[key[6:]] = number
        elif key == "load1":
            with contextlib.suppress(ValueError):
                state.load_1m = float(value)
        elif key == "runnable" and number is not None:
            state.busy_tasks = max(0, number - 1)  # not the probe itself
        elif key == "ncpu" and number:
            state.cpus = number
        elif key == "cpu_mC" and number is not None:
            state.cpu_temp_c = number / 1000.0
        elif key == "avail_kb" and number is not None:
            state.mem_available_mb = number / 1024.0
        elif key.startswith("policy") and number is not None:
            state.scaling_max_freq_khz[key] = number
    return state


def gate_open(state: EntryState, gate: GateSettings) -> bool:
    """Whether `state` meets the gate. An unreadable figure does not hold a cell back."""
    if (
        gate.max_cpu_temp_c is not None
        and state.cpu_temp_c is not None
        and state.cpu_temp_c > gate.max_cpu_temp_c
    ):
        return False
    return not (
        gate.min_mem_available_mb is not None
        and state.mem_available_mb is not None
        and state.mem_available_mb < gate.min_mem_available_mb
    )


def wait_for_gate(
    read_state: Callable[[], EntryState],
    gate: GateSettings,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
    stop: Callable[[], bool] = lambda: False,
) -> EntryState:
    """Poll the target until the gate opens or ``max_wait_s`` passes (then ``gave_up``).

    Returns the last reading (the entry state), with the seconds waited.
    """
    start = clock()
    polls = 1
    state = read_state()
    while gate.active and not gate_open(state, gate):
        waited = clock() - start
        if waited >= gate.max_wait_s or stop():
            state.gave_up = True
            break
        sleep(min(gate.poll_s, max(0.0, gate.max_wait_s - waited)))
        state = read_state()
        polls += 1
    state.waited_s = clock() - start
    state.polls = polls
    return state


# ----------------------------------------------------------------------------- pressure


def parse_samples(text: str) -> list[dict[str, Any]]:
    """The sampler's lines: ``<phase> t=.. avail_kb=.. cpu_mC=.. batt_dC=.. hwm_kb=..``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("before", "during", "after"):
            continue
        row: dict[str, Any] = {"phase": parts[0]}
        for token in parts[1:]:
            key, sep, value = token.partition("=")
            if sep:
                row[key] = _int(value)
        out.append(row)
    return out


def pressure_from_samples(samples: list[dict[str, Any]]) -> dict[str, int]:
    """The ``.metrics`` sidecar values (:data:`PRESSURE_KEYS`) from the sampler's readings.

    Peak RSS is the highest VmHWM read; the MemAvailable floor and the temperature maxima are
    over the readings taken while the engine ran (and after, when it ran too briefly for
    one). Keys with no reading are left out.
    """

    def values(phase: str | tuple[str, ...], key: str) -> list[int]:
        phases = (phase,) if isinstance(phase, str) else phase
        return [s[key] for s in samples if s["phase"] in phases and s.get(key) is not None]

    during = [s for s in samples if s["phase"] == "during"]
    span = ("during",) if during else ("before", "after")
    out: dict[str, int | None] = {
        "peak_rss_kb": max(values("during", "hwm_kb"), default=None),
        "mem_avail_before_kb": next(iter(values("before", "avail_kb")), None),
        "mem_avail_floor_kb": min(values(span, "avail_kb"), default=None),
        "mem_avail_after_kb": next(iter(values("after", "avail_kb")), None),
        "batt_temp_before_dC": next(iter(values("before", "batt_dC")), None),
        "batt_temp_max_dC": max(values((*span, "after"), "batt_dC"), default=None),
        "batt_temp_after_dC": next(iter(values("after", "batt_dC")), None),
        "cpu_temp_before_mC": next(iter(values("before", "cpu_mC")), None),
        "cpu_temp_max_mC": max(values((*span, "after"), "cpu_mC"), default=None),
    }
    return {k: v for k in PRESSURE_KEYS if (v := out.get(k)) is not None}
