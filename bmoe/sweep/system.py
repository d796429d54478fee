"""The machine a run ran on, and whether it was quiet enough to trust (as ``pyperf system``).

Per target, once per sweep: CPU model, kernel, the engine's ``--version`` (native) and the
SHA-256 of each model file; per sweep: bmoe's version and the git commit of the
configuration's folder. Per run: the entry state's governor, other runnable tasks and CPU caps
(:mod:`bmoe.sweep.gate`), the engine's CPU share (CPU time over wall time, from its CSV) and
the CPU temperature reached; :func:`system_warnings` says which of them make the run's
figures unreliable.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from bmoe.sweep.gate import EntryState
from bmoe.sweep.targets import Target, TargetError

#: CPU model (x86 "model name", ARM "Hardware" / "Processor"), kernel, OS and Android model.
MACHINE_SCRIPT = r"""
m=
while IFS= read -r line; do
  case $line in
    "model name"*|Hardware*|Processor*) [ -z "$m" ] && m=${line#*: };;
  esac
done < /proc/cpuinfo 2>/dev/null
echo "cpu_model=$m"
echo "kernel=$(uname -r 2>/dev/null)"
echo "os=$(uname -s 2>/dev/null) $(uname -m 2>/dev/null)"
command -v getprop >/dev/null 2>&1 && echo "device=$(getprop ro.product.model 2>/dev/null)"
exit 0
"""
#: The engine's own version line(s): ``exec PROGRAM --version``.
VERSION_SCRIPT = 'exec "$@" --version 2>&1'
#: SHA-256 of file $1 on the target (empty when it has no sha256sum).
DIGEST_SCRIPT = 'sha256sum "$1" 2>/dev/null | cut -d " " -f 1'

#: Thresholds of the warnings (pyperf's spirit: a quiet, uncapped, cool machine).
#: Other work: more runnable tasks than half the CPUs when the run starts (an instant count,
#: not the load average, which still holds the sweep's own previous run).
MAX_BUSY_PER_CPU = 0.5
MIN_CPU_SHARE = 0.5  # the engine ran less than half a CPU on average
MAX_CPU_TEMP_C = 80.0  # hot enough to throttle on most devices


def _key_values(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and value.strip():
            out[key.strip()] = value.strip()[:200]
    return out


def machine_info(target: Target, engine: str) -> dict[str, Any]:
    """CPU model, kernel, OS (and device) of `target`, and the native engine's version."""
    info: dict[str, Any] = {}
    try:
        res = target.shell(MACHINE_SCRIPT, [], timeout=60)
        info.update(_key_values(res.stdout.decode("utf-8", "replace")))
        if engine == "native":
            res = target.shell(VERSION_SCRIPT, target.engine_program(engine), timeout=60)
            lines = res.stdout.decode("utf-8", "replace").strip().splitlines()
            if res.returncode == 0 and lines:
                info["engine_build"] = " ".join(lines[:3])[:300]
    except (TargetError, OSError, subprocess.SubprocessError):
        pass
    return info


def _local_digest(path: Path, cache: Path | None) -> str | None:
    """SHA-256 of a local file, remembered in `cache` by path, size and mtime."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    known: dict[str, str] = {}
    if cache is not None and cache.is_file():
        try:
            known = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
    if key in known:
        return known[key]
    try:
        digest = _digest_uncached(path)
    except OSError:
        return None
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({**known, key: digest}), encoding="utf-8")
        except OSError:
            pass
    return digest


def _digest_uncached(path: Path) -> str:
    """SHA-256 of `path`, asking the kernel to drop each piece from the page cache once read:
    hashing the model must not leave it cached for the runs that measure reading it."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        offset = 0
        while chunk := fh.read(8 << 20):
            h.update(chunk)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, offset, len(chunk), os.POSIX_FADV_DONTNEED)
            offset += len(chunk)
    return h.hexdigest()


def model_digest(target: Target, model: str, cache: Path | None = None) -> str | None:
    """SHA-256 of the model file `model` (its path on `target`)."""
    if target.spec.kind == "local":
        return _local_digest(Path(model), cache)
    try:
        res = target.shell(DIGEST_SCRIPT, [model], timeout=1800)
    except (TargetError, OSError, subprocess.SubprocessError):
        return None
    digest = res.stdout.decode("utf-8", "replace").strip()
    return digest if len(digest) == 64 else None


def config_commit(folder: str | Path) -> str | None:
    """The git commit of the configuration's folder (``+dirty`` with uncommitted changes
    there), or None outside a repository."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def bmoe_version() -> str:
    from bmoe._version import __version__

    return str(__version__)


def engine_cpu_share(csv: Path) -> float | None:
    """The engine's CPU time over its wall time across the run's tokens (1.0 = one CPU busy
    the whole time); None where the engine cannot count CPU time (it writes 0)."""
    import warnings

    from bmoe.errors import BmoeError
    from bmoe.formats.metrics import read_metrics

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = read_metrics(csv).rows
    except (BmoeError, OSError):
        return None
    if "cpu_ms" not in rows or "wall_ms" not in rows or rows.empty:
        return None
    cpu, wall = float(rows["cpu_ms"].sum()), float(rows["wall_ms"].sum())
    if cpu <= 0 or wall <= 0:
        return None
    return round(cpu / wall, 4)


def system_warnings(
    entry: EntryState, cpu_share: float | None, cpu_temp_max_c: float | None
) -> list[str]:
    """Why a run's figures may not be reliable (empty when nothing was seen)."""
    out = []
    slow = sorted({g for g in entry.governor.values() if g != "performance"})
    if slow:
        out.append(f"CPU governor {', '.join(slow)} (not performance): the clock varies")
    capped = [
        p for p, khz in entry.scaling_max_freq_khz.items()
        if entry.hardware_max_freq_khz.get(p, 0) > khz
    ]  # fmt: skip
    if capped:
        out.append(f"CPU frequency capped below the hardware maximum ({', '.join(capped)}): "
                   "thermal or power limits")  # fmt: skip
    busy, cpus = entry.busy_tasks, entry.cpus
    if busy is not None and cpus and busy > MAX_BUSY_PER_CPU * cpus:
        out.append(f"{busy} other tasks were running on {cpus} CPUs before the run: "
                   "other work competes for the CPUs")  # fmt: skip
    if cpu_share is not None and cpu_share < MIN_CPU_SHARE:
        out.append(f"the engine got {cpu_share:.0%} of a CPU: it waited on other work or I/O")
    if cpu_temp_max_c is not None and cpu_temp_max_c >= MAX_CPU_TEMP_C:
        out.append(f"CPU reached {cpu_temp_max_c:.0f} °C: it may have throttled")
    return out


class MachineFacts:
    """What :func:`machine_info`, :func:`model_digest` and :func:`config_commit` found, each
    asked once per sweep (per target, per model) from whichever thread runs first."""

    def __init__(self, cache: Path | None = None):
        self.cache = cache
        self._lock = threading.Lock()
        self._machines: dict[str, dict[str, Any]] = {}
        self._models: dict[tuple[str, str], str | None] = {}
        self._commits: dict[str, str | None] = {}

    def record_fields(self, target: Target, engine: str, model: str, base_dir: str) -> dict:
        """The metadata fields of a run's record."""
        with self._lock:
            if target.name not in self._machines:
                self._machines[target.name] = machine_info(target, engine)
            if (target.name, model) not in self._models:
                self._models[(target.name, model)] = model_digest(target, model, self.cache)
            if base_dir not in self._commits:
                self._commits[base_dir] = config_commit(base_dir) if os.path.isdir(
                    base_dir) else None  # fmt: skip
            return {
                "machine": dict(self._machines[target.name]),
                "model_sha256": self._models[(target.name, model)],
                "bmoe_version": bmoe_version(),
                "config_commit": self._commits[base_dir],
            }
