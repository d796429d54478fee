"""Benchmark: the replay of a trace larger than memory. The gemma trace tiled to each of
``--rows`` (default 5 M and 20 M rows) is written block by block as CSV (and with
``--parquet`` as Parquet), then ``bmoe analyze replay FILE --stream`` runs in a child process
per policy (every policy that streams, ``--jobs 1``, at ``--budgets``) and once with
``--mrc`` (with ``--route`` also ``bmoe analyze route FILE --stream``, the route views in
passes): CPU per row, peak RSS, and the peak at the largest size over the peak at the
smallest (flat = constant memory). First, at ``--check-rows`` (default 1 M), the streamed
views are compared with the whole-trace replay's (curve and exact LRU curve, every policy)
and both peaks are printed.

    python benchmarks/bench_stream.py [--rows 5e6,20e6] [--parquet] [--route] [--policies lru,arc]

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

from bmoe.cache import POLICIES  # noqa: E402
from bmoe.formats.route import RouteTraceWriter, read_route_trace  # noqa: E402

#: rows per Parquet row group the benchmark writes
ROW_GROUP = 1 << 20


def write_tiled(rows: int, dest: Path, parquet: Path | None = None) -> None:
    """The gemma trace's decode part repeated to `rows` rows, written copy by copy as CSV at
    `dest` (and as Parquet at `parquet`, in row groups of :data:`ROW_GROUP` rows)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bmoe.formats.parquet import to_table

    trace = read_route_trace(default_corpus() / GEMMA)
    frame = trace.rows
    decode = frame[frame["phase"] != 0]
    prefill = frame[frame["phase"] == 0]
    span = int(decode["step"].max()) - int(decode["step"].min()) + 1
    step_type = frame["step"].dtype
    schema = to_table(trace, "route").schema
    writer = pq.ParquetWriter(parquet, schema, compression="zstd") if parquet else None
    pending: list[pd.DataFrame] = []
    held = 0

    def flush() -> None:
        nonlocal pending, held
        if writer is not None and pending:
            part = pd.concat(pending, ignore_index=True)
            writer.write_table(pa.Table.from_pandas(part, schema=schema, preserve_index=False))
        pending, held = [], 0

    with open(dest, "w", encoding="utf-8", newline="\n") as fh:
        out = RouteTraceWriter(fh, trace.meta, trace.layers, tuple(frame.columns))
        for part in _copies(prefill, decode, span, rows, step_type):
            out.rows(part)
            if writer is not None:
                pending.append(part)
                held += len(part)
                if held >= ROW_GROUP:
                    flush()
    flush()
    if writer is not None:
        writer.close()


def _copies(prefill, decode, span: int, rows: int, step_type):
    yield prefill
    done, copy = len(prefill), 0
    while done < rows:
        part = decode.iloc[: rows - done].copy()
        part["step"] = (part["step"].astype("int64") + copy * span).astype(step_type)
        yield part
        done += len(part)
        copy += 1


def views(path: Path, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "analyze", "replay", str(path), "-f", "json", *extra],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return json.loads(out.stdout)


def check(rows: int, tmp: Path, budgets: str) -> None:
    """The streamed views against the whole trace's, and both peaks, at `rows`."""
    path = tmp / "check.route.csv"
    write_tiled(rows, path)
    asked = ("--policies", ",".join(POLICIES), "--budgets", budgets, "--mrc")
    streamed = views(path, "--stream", *asked)
    whole = views(path, *asked)
    same = streamed == whole  # shape, curve, mrc_budgets, mrc
    _, cpu_s, peak_s = child("analyze", "replay", str(path), "--stream", *asked)
    _, cpu_w, peak_w = child("analyze", "replay", str(path), *asked)
    print(
        f"check at {rows:,} rows, {len(POLICIES)} policies x {budgets} MiB + --mrc: "
        f"same views as the whole trace: {'yes' if same else 'NO'}; --stream {cpu_s:.1f} CPU-s, "
        f"peak {peak_s:.0f} MiB; whole {cpu_w:.1f} CPU-s, peak {peak_w:.0f} MiB"
    )
    path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="5e6,20e6", help="sizes of the tiled trace (rows)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budgets", default="500,2000,6000", help="MiB, comma-separated")
    ap.add_argument("--parquet", action="store_true", help="also replay the Parquet form (lru)")
    ap.add_argument(
        "--route",
        action="store_true",
        help="also the route views in passes (analyze route --stream)",
    )
    ap.add_argument("--check-rows", type=float, default=1e6, help="0: no check")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default a tmp dir)")
    args = ap.parse_args()
    sizes = [int(float(r)) for r in args.rows.split(",")]
    policies = args.policies.split(",")
    n_budgets = len(args.budgets.split(","))
    runs: dict[str, list[str]] = {p: ["--policies", p] for p in policies}
    runs["lru --mrc"] = ["--policies", "lru", "--mrc"]
    peaks: dict[str, dict[int, float]] = {}
    cpus: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        tmp = Path(name)
        if args.check_rows:
            check(int(args.check_rows), tmp, args.budgets)
        print(f"--stream --jobs 1 --budgets {args.budgets}: CPU per row, peak RSS")
        for rows in sizes:
            path = tmp / "tiled.route.csv"
            pq_path = tmp / "tiled.route.parquet" if args.parquet else None
            write_tiled(rows, path, pq_path)
            inputs = {"": path} | ({"parquet ": pq_path} if pq_path else {})
            sizes_said = ", ".join(f"{p.stat().st_size / 1e9:.2f} GB {p.suffix[1:]}" for p in
                                   inputs.values())  # fmt: skip
            print(f"  {rows:,} rows ({sizes_said})")
            todo = [("", label, extra) for label, extra in runs.items()]
            if pq_path:
                todo.append(("parquet ", "lru", ["--policies", "lru"]))
            if args.route:
                todo += [(form, "route views", []) for form in inputs]
            for form, label, extra in todo:
                if label == "route views":
                    wall, cpu, peak = child("analyze", "route", str(inputs[form]), "--stream")
                else:
                    argv = ["analyze", "replay", str(inputs[form]), "--stream", "--jobs", "1"]
                    wall, cpu, peak = child(*argv, "--budgets", args.budgets, *extra)
                peaks.setdefault(form + label, {})[rows] = peak
                cpus.setdefault(form + label, {})[rows] = cpu
                per_budget = (
                    ""
                    if label == "route views"
                    else (f" ({1e9 * cpu / rows / n_budgets:4.0f} per row and budget)")
                )
                print(
                    f"    {form + label:<19} {cpu:7.1f} CPU-s {wall:7.1f} s wall "
                    f"{1e9 * cpu / rows:6.0f} ns/row{per_budget}  peak {peak:5.0f} MiB"
                )
            for p in inputs.values():
                p.unlink()
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(
            f"peak RSS at {hi:,} rows / at {lo:,} rows (1.00 = flat); CPU per row from "
            f"{lo:,} to {hi:,} rows (start-up excluded):"
        )
        for label, by in peaks.items():
            per_row = 1e9 * (cpus[label][hi] - cpus[label][lo]) / (hi - lo)
            print(
                f"    {label:<19} {by[hi] / by[lo]:.2f} ({by[lo]:.0f} -> {by[hi]:.0f} MiB)  "
                f"{per_row:5.0f} ns/row"
            )
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
