"""Measure a target's flash directly: O_DIRECT reads at several sizes and lane counts.

The probe runs one POSIX shell script through the sweep's target transport (local, adb, ssh),
so it needs nothing on the device but ``sh``, ``dd`` with ``iflag=direct`` and ``date +%s%N``.
Each measurement starts ``lanes`` ``dd`` processes at once, each reading ``reads`` blocks of one
request size from its own region of the file with O_DIRECT, and times the whole: a request's
latency with that many lanes busy is the elapsed time over the reads one lane made. Repeats
give the spread. The result is a profile's flash table (:data:`bmoe.formats.profile.
FLASH_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bmoe.analyze.device.flash import flash_row
from bmoe.errors import BmoeError
from bmoe.sweep.targets import Target, TargetSpec, open_target
from bmoe.units import KIB, MIB

DEFAULT_SIZES = (64 * KIB, 256 * KIB, MIB)
DEFAULT_LANES = (1, 2, 4)

#: $1 file, $2 request bytes, $3 lanes, $4 reads per lane, $5 blocks per lane's region.
PROBE_SCRIPT = r"""
f=$1; bs=$2; lanes=$3; n=$4; region=$5
[ -r "$f" ] || { echo "cannot read $f" >&2; exit 3; }
start=$(date +%s%N)
i=0
while [ "$i" -lt "$lanes" ]; do
  dd if="$f" of=/dev/null bs="$bs" count="$n" skip=$((i * region)) iflag=direct 2>/dev/null &
  i=$((i + 1))
done
status=0
for job in $(jobs -p); do wait "$job" || status=$?; done
end=$(date +%s%N)
[ "$status" -eq 0 ] || { echo "dd iflag=direct failed ($status)" >&2; exit 4; }
echo $((end - start))
"""

#: $1 file: its size in bytes.
SIZE_SCRIPT = r"""wc -c < "$1" """


def target_spec(text: str) -> TargetSpec:
    """``local``, ``adb[:SERIAL]`` or ``ssh:[USER@]HOST[:PORT]`` -> a target spec."""
    kind, _, rest = text.partition(":")
    if kind == "local" and not rest:
        return TargetSpec(name="local", kind="local")
    if kind == "adb":
        return TargetSpec(name=text, kind="adb", serial=rest or None)
    if kind == "ssh" and rest:
        user, _, host = rest.rpartition("@")
        host, _, port = host.partition(":")
        if port and not port.isdigit():
            raise BmoeError(f"--probe {text}: port {port!r} is not a number")
        return TargetSpec(name=text, kind="ssh", host=host, user=user or None, port=int(port or 22))
    raise BmoeError(f"--probe {text!r}: name a target as local, adb[:SERIAL] or ssh:[USER@]HOST")


def _file_size(target: Target, path: str) -> int:
    done = target.shell(SIZE_SCRIPT, [path], timeout=30.0)
    text = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode or not text.isdigit():
        raise BmoeError(f"target {target.name}: cannot read {path}")
    return int(text)


def probe_flash(
    target: Target,
    path: str,
    sizes: Sequence[int] = DEFAULT_SIZES,
    lanes: Sequence[int] = DEFAULT_LANES,
    *,
    reads: int = 32,
    repeats: int = 3,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """The flash table of `path` on `target`: per (lanes, request size), the median, 10th
    and 90th percentile request latency over `repeats`, the throughput, and the reads."""
    file_size = _file_size(target, path)
    rows = []
    total = len(sizes) * len(lanes) * repeats
    done_count = 0
    for size in sizes:
        blocks = file_size // size
        for n_lanes in lanes:
            per_lane = min(reads, blocks // max(n_lanes, 1))
            if per_lane < 1:
                raise BmoeError(f"{path}: too small for {n_lanes} lanes of {size} bytes")
            region = blocks // n_lanes
            latencies = []
            for _ in range(repeats):
                done = target.shell(
                    PROBE_SCRIPT, [path, str(size), str(n_lanes), str(per_lane), str(region)],
                    timeout=300.0,
                )  # fmt: skip
                out = done.stdout.decode("utf-8", "replace").strip()
                if done.returncode or not out.isdigit():
                    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
                    raise BmoeError(
                        f"target {target.name}: probe of {path} failed: "
                        f"{err[-1] if err else out or 'no output'}"
                    )
                latencies.append(int(out) / 1e6 / per_lane)
                done_count += 1
                if progress is not None:
                    progress(done_count, total)
            lat = np.asarray(latencies)
            rows.append(
                flash_row(n_lanes, size, float(np.median(lat)), lat, per_lane * n_lanes * repeats)
            )
    return pd.DataFrame(rows)


def probe(
    spec_text: str,
    path: str,
    state_dir: Path,
    sizes: Sequence[int] = DEFAULT_SIZES,
    lanes: Sequence[int] = DEFAULT_LANES,
    **options,
) -> pd.DataFrame:
    """:func:`probe_flash` on the target `spec_text` names (see :func:`target_spec`)."""
    target = open_target(target_spec(spec_text), state_dir)
    try:
        return probe_flash(target, path, sizes, lanes, **options)
    finally:
        target.close()


__all__ = ["DEFAULT_LANES", "DEFAULT_SIZES", "probe", "probe_flash", "target_spec"]
