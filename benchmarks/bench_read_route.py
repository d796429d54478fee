"""Reading a large route trace: ``read_route_trace`` against a plain ``csv``-module reader.

Generates a decode-phase route trace (48 layers, top-8, 5000 steps: 1.92 million rows) with the
project's own writer into a temporary directory, then reads it in fresh subprocesses, one per
reader and repeat, so that each peak RSS is that reader's alone:

- ``bmoe``: :func:`bmoe.formats.route.read_route_trace` (pyarrow, compact dtypes);
- ``csv``: the standard library's ``csv.reader``, each row converted to a tuple of ints and a
  float, the way a stdlib analysis script holds a trace.

Reports wall time (best and median of ``--repeat`` runs, the readers interleaved so both see
the same machine), the peak RSS growth during the read (the kernel's peak mark is reset after
the imports) and the DataFrame's bytes per row. Targets: at least 10x faster than the csv
reader, at most 40 bytes per row.

    python benchmarks/bench_read_route.py             # the full 1.92 M rows
    python benchmarks/bench_read_route.py --steps 500 # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEEDUP_TARGET = 10.0
BYTES_PER_ROW_TARGET = 40.0


def generate(path: Path, steps: int, layers: int, top_k: int, n_expert: int, seed: int) -> int:
    """Write a synthetic decode trace with the project's writer; returns the row count."""
    import numpy as np
    import pandas as pd

    from bmoe.formats.route import RouteTraceWriter

    rng = np.random.default_rng(seed)
    expert_bytes = 4_336_640
    meta = {
        "model": "synthetic-48x128.gguf",
        "arch": "qwen3moe",
        "n_layer": layers,
        "n_expert": n_expert,
        "n_expert_used": top_k,
    }
    sizes = pd.DataFrame(
        {"layer": np.arange(layers), "expert_bytes": expert_bytes, "dense_bytes": 25_165_824}
    )
    prompt = 29
    rows = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = RouteTraceWriter(fh, meta, sizes)
        block = 100
        for start in range(0, steps, block):
            n_steps = min(block, steps - start)
            cells = n_steps * layers
            experts = np.argsort(rng.random((cells, n_expert)), axis=1)[:, :top_k]
            weights = rng.random((cells, top_k)) ** 3
            weights = np.sort(weights / weights.sum(axis=1, keepdims=True), axis=1)[:, ::-1]
            residency = rng.choice([0, 1, 2], p=[0.22, 0.75, 0.03], size=(cells, top_k))
            n = cells * top_k
            frame = pd.DataFrame(
                {
                    "turn": np.zeros(n, dtype=np.int16),
                    "phase": np.ones(n, dtype=np.int8),
                    "step": np.repeat(prompt + start + np.arange(n_steps), layers * top_k),
                    "layer": np.tile(np.repeat(np.arange(layers), top_k), n_steps),
                    "slot": np.tile(np.arange(top_k), cells),
                    "expert": experts.ravel(),
                    "weight": np.round(weights.ravel(), 6).astype(np.float32),
                    "residency": residency.ravel(),
                    "expert_bytes": np.where(residency.ravel() == 0, expert_bytes, 0),
                    "dropped": np.zeros(n, dtype=np.int8),
                }
            )
            writer.rows(frame)
            rows += n
    return rows


# ----------------------------------------------------------------------------- the readers


def read_with_csv_module(path: str) -> list[tuple]:
    """The stdlib way: skip '#' lines, then one tuple per row with ints and a float."""
    import csv

    out = []
    with open(path, newline="") as fh:
        lines = (line for line in fh if not line.startswith("#"))
        reader = csv.reader(lines)
        header = next(reader)
        weight = header.index("weight")
        for row in reader:
            out.append(tuple(float(v) if i == weight else int(v) for i, v in enumerate(row)))
    return out


def child(mode: str, path: str) -> dict:
    """Run in a fresh interpreter: import, (read), report wall time and peak RSS."""
    import csv  # noqa: F401  (the baseline imports what both readers import)

    import pandas  # noqa: F401
    import pyarrow.csv  # noqa: F401

    from bmoe.formats.route import read_route_trace

    result: dict = {"mode": mode}
    before_kb = _reset_peak()
    start = time.perf_counter()
    if mode == "bmoe":
        trace = read_route_trace(path)
        result["rows"] = len(trace.rows)
        result["frame_bytes"] = int(trace.rows.memory_usage(deep=True, index=False).sum())
        result["dtypes"] = {c: str(t) for c, t in trace.rows.dtypes.items()}
    elif mode == "csv":
        result["rows"] = len(read_with_csv_module(path))
    result["wall_s"] = time.perf_counter() - start
    result["peak_kb"] = _peak_kb() - before_kb
    return result


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Current RSS in KiB, after resetting the peak-RSS mark so it covers the read alone."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return _status_kb("VmRSS")


def _peak_kb() -> int:
    try:
        return _status_kb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_child(mode: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"{mode} reader failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="decode steps (default 5000)")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader; best is kept")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="bmoe-bench-") as tmp:
        path = Path(tmp) / "big.route.csv"
        start = time.perf_counter()
        rows = generate(path, args.steps, args.layers, args.top_k, 128, seed=1)
        generated = time.perf_counter() - start
        size = path.stat().st_size
        print(
            f"route trace: {rows:,} rows ({args.layers} layers, top-{args.top_k}, "
            f"{args.steps} steps), {size / 2**20:.1f} MiB, written in {generated:.1f} s"
        )
        load_before = os.getloadavg()[0]
        runs: dict[str, list[dict]] = {"bmoe": [], "csv": []}
        for _ in range(args.repeat):  # interleaved, so both readers see the same machine
            for mode in runs:
                runs[mode].append(run_child(mode, path))
        load_after = os.getloadavg()[0]
        results = {}
        for mode, done in runs.items():
            assert all(r["rows"] == rows for r in done), f"{mode} read the wrong row count"
            walls = sorted(r["wall_s"] for r in done)
            results[mode] = {
                "wall_s": walls[0],
                "median_s": walls[len(walls) // 2],
                "peak_mib": max(r["peak_kb"] for r in done) / 1024,
                **{k: v for k, v in done[0].items() if k in ("frame_bytes", "dtypes")},
            }

    bmoe, plain = results["bmoe"], results["csv"]
    speedup = plain["wall_s"] / bmoe["wall_s"]
    frame_bpr = bmoe["frame_bytes"] / rows
    print(f"load average {load_before:.1f} before, {load_after:.1f} after (CPUs: {os.cpu_count()})")
    head = f"{'reader':<22}{'best s':>9}{'median s':>10}{'peak RSS MiB':>15}{'peak B/row':>12}"
    print("\n" + head)
    for name, res in (("read_route_trace", bmoe), ("csv module (tuples)", plain)):
        peak = res["peak_mib"]
        print(
            f"{name:<22}{res['wall_s']:>9.3f}{res['median_s']:>10.3f}{peak:>15.1f}"
            f"{peak * 2**20 / rows:>12.1f}"
        )
    print(f"\nDataFrame dtypes: {', '.join(f'{c}={t}' for c, t in bmoe['dtypes'].items())}")
    ok_speed = speedup >= SPEEDUP_TARGET
    ok_bytes = frame_bpr <= BYTES_PER_ROW_TARGET
    print(
        f"speed-up over the csv module: {speedup:.1f}x "
        f"(target >= {SPEEDUP_TARGET:.0f}x: {'met' if ok_speed else 'MISSED'})"
    )
    print(
        f"DataFrame memory: {frame_bpr:.1f} bytes/row "
        f"(target <= {BYTES_PER_ROW_TARGET:.0f}: {'met' if ok_bytes else 'MISSED'}); "
        f"peak RSS {bmoe['peak_mib'] / plain['peak_mib']:.2f}x the csv reader's"
    )
    return 0 if (ok_speed and ok_bytes) or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
