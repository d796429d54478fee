"""Benchmark: an LRU replay of a trace larger than memory. The gemma trace tiled to
``--rows`` rows (default 20 M) is written as CSV block by block, then ``bmoe analyze replay
FILE --stream`` (blocks of rows, one cache carried across them) and the whole-trace
``bmoe analyze replay FILE --policies lru`` run on it in child processes, in one run:
wall, CPU, peak RSS, CPU per row, the memory ratio, and whether both print the same curve.

    python benchmarks/bench_stream.py [--rows 20000000]

Target: constant memory in the trace's length (the peak follows the block size), the same
figures as the whole-trace replay.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_replay import CHILD, child  # noqa: E402
from tiled_trace import GEMMA, default_corpus  # noqa: E402

from bmoe.formats.route import RouteTraceWriter, read_route_trace  # noqa: E402


def write_tiled_csv(rows: int, dest: Path) -> None:
    """The gemma trace's decode part repeated to `rows` rows, written copy by copy."""
    trace = read_route_trace(default_corpus() / GEMMA)
    frame = trace.rows
    decode = frame[frame["phase"] != 0]
    prefill = frame[frame["phase"] == 0]
    span = int(decode["step"].max()) - int(decode["step"].min()) + 1
    with open(dest, "w", encoding="utf-8", newline="\n") as fh:
        writer = RouteTraceWriter(fh, trace.meta, trace.layers, tuple(frame.columns))
        writer.rows(prefill)
        done, copy = len(prefill), 0
        while done < rows:
            part = decode.iloc[: rows - done].copy()
            part["step"] = part["step"].astype("int64") + copy * span
            writer.rows(part)
            done += len(part)
            copy += 1


def curve(path: Path, *extra: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "analyze", "replay", str(path), "-f", "json", *extra],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return json.loads(out.stdout)["curve"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000, help="rows of the tiled trace")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiled.route.csv"
        write_tiled_csv(args.rows, path)
        print(f"gemma tiled to {args.rows:,} rows: {path.stat().st_size / 1e6:.0f} MB of CSV")
        runs = {
            "--stream": ("--stream",),
            "whole trace (--policies lru)": ("--policies", "lru"),
        }
        peaks = {}
        for label, extra in runs.items():
            wall, cpu, peak = child("analyze", "replay", str(path), *extra)
            peaks[label] = peak
            print(
                f"  bmoe analyze replay {label}: {wall:.1f} s wall, {cpu:.1f} s CPU "
                f"({1e9 * cpu / args.rows:.0f} ns/row), peak RSS {peak:.0f} MiB"
            )
        same = curve(path, "--stream") == curve(path, "--policies", "lru")
    ratio = peaks["whole trace (--policies lru)"] / peaks["--stream"]
    print(f"  memory whole / stream = {ratio:.1f}x; same curve: {'yes' if same else 'NO'}")
    print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
