"""Per-token measurements outside ggml: CPU time and faults, memory, dense-weight residency.

Everything here is measured or reported as unmeasured (``0`` for counters the platform does not
give, ``-1`` for the residency fraction), never estimated.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

from bmoe.engine.embedded import libc
from bmoe.formats.metrics_columns import with_role
from bmoe.units import MIB

_PAGE = resource.getpagesize()


@dataclass(frozen=True, slots=True)
class Usage:
    """Process CPU time (all threads) and major faults so far."""

    cpu_s: float
    majflt: int


def usage() -> Usage:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(ru.ru_utime + ru.ru_stime, ru.ru_majflt)


def majflt_mib(majflt: int) -> float:
    return majflt * _PAGE / MIB


_STATUS_KEYS = {
    "VmRSS": "rss_mib",
    "RssAnon": "rss_anon_mib",
    "RssFile": "rss_file_mib",
    "VmSwap": "swap_mib",
    "VmHWM": "peak_rss_mib",
}
_MEMINFO_KEYS = {
    "MemAvailable": "mem_available_mib",
    "MemFree": "mem_free_mib",
    "SwapFree": "swap_free_mib",
}
#: The memory block of a metrics row: the column table's memory columns.
MEMORY_COLUMNS = with_role("memory")


def _kv_kib(path: str, keys: dict[str, str], out: dict[str, float]) -> None:
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = keys.get(key)
        if name is not None:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name] = int(parts[0]) / 1024.0


def memory() -> dict[str, float]:
    """The memory block of a metrics row (MiB; 0 where the platform does not say)."""
    out = dict.fromkeys(MEMORY_COLUMNS, 0.0)
    out["peak_rss_mib"] = 0.0
    _kv_kib("/proc/self/status", _STATUS_KEYS, out)
    _kv_kib("/proc/meminfo", _MEMINFO_KEYS, out)
    return out


def mapping_base(path: str) -> int | None:
    """The address file offset 0 of `path` has in this process's mapping of it, from
    ``/proc/self/maps`` (llama.cpp maps the whole file once, then may unmap the header)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].strip() == real:
                    return int(parts[0].split("-")[0], 16) - int(parts[2], 16)
    except OSError:
        return None
    return None


class DenseResidency:
    """The fraction of the dense weights' pages in RAM, by mincore, at most every `interval_s`.

    Reports the latest sample, ``-1`` before the first one or when the mapping is unknown.
    """

    def __init__(
        self,
        base: int | None,
        ranges: list[tuple[int, int]],
        interval_s: float = 0.1,
    ):
        self.base = base
        self.ranges = ranges
        self.interval_s = interval_s
        self.value = -1.0
        self._start = time.perf_counter()
        self._last = None if base is None else self._start

    def sample(self, force: bool = False) -> tuple[float, float]:
        """(fraction, seconds spent probing) for this token."""
        if self.base is None or self._last is None:
            return -1.0, 0.0
        now = time.perf_counter()
        if not force and now - self._last < self.interval_s:
            return self.value, 0.0
        resident = total = 0
        try:
            for offset, nbytes in self.ranges:
                r, n = libc.resident_pages(self.base + offset, nbytes)
                resident += r
                total += n
        except OSError:
            self.base = None
            return -1.0, time.perf_counter() - now
        self._last = time.perf_counter()
        self.value = resident / total if total else -1.0
        return self.value, self._last - now
