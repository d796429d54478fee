"""Benchmark: ``bmoe analyze replay`` as a whole command (a fresh process: start-up, reading
the CSV, cutting the batches, the replays, printing) against libCacheSim's replay alone on
the same lookups, paired run by run; then where the command's time goes.

    python benchmarks/bench_replay_command.py [--rows 1000000] [--repeat 5]
        [--policies lru,lfu,s3fifo] [--budgets 1000,2000,4000] [--baseline DIR]

The trace is the corpus gemma route trace tiled to `--rows` rows (``tiled_trace.py``),
written as CSV. libCacheSim (its Python package; not a dependency of bmoe: without it the
benchmark says so and exits 0) replays the same lookups, one request per lookup, from an
oracleGeneral file written beforehand (the conversion not counted): its CPU time is that of
its ``process_trace`` calls alone, one per policy and budget. Each round runs the command
(its CPU time from the child's rusage) and then libCacheSim; `--baseline DIR` adds the
command of another checkout to each round (e.g. an older commit, to see a change). The
ratios are per round; min / median / max and the load average are printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_libcachesim import request_stream, write_oracle  # noqa: E402
from tiled_trace import default_corpus, gemma_tiled  # noqa: E402

from bmoe.analyze import replay as rp  # noqa: E402
from bmoe.formats.route import write_route_trace  # noqa: E402

MIB = 1 << 20
LCS_NAMES = {"lru": "LRU", "lfu-incache": "LFU", "lfu": "LFU", "s3fifo": "S3FIFO",
             "s3fifo-libcachesim": "S3FIFO", "arc": "ARC", "belady": "Belady",
             "lfuda": "LFUDA", "sieve": "Sieve", "clock": "Clock", "random": "Random"}  # fmt: skip

# the phases of the command, timed in a child process as the command runs them
PHASES = """
import sys, time
t = [time.process_time()]
out = []
def mark(label):
    now = time.process_time(); out.append((label, now - t[0])); t[0] = now
import numpy; mark("import numpy")
import pyarrow, pyarrow.csv; mark("import pyarrow")
import pandas; mark("import pandas")
import numba; mark("import numba")
import bmoe.cli.replay; mark("import the CLI (typer, rich, bmoe)")
from bmoe.analyze import replay as rp
from bmoe.formats.route import read_route_trace
trace = read_route_trace(sys.argv[1], rp.REPLAY_COLUMNS); mark("read the CSV (pyarrow)")
from bmoe.cache.kernels import batches
batches.next_uses(numpy.zeros(1, dtype=numpy.int64), numpy.zeros(0, dtype=numpy.int32), 0)
mark("numba's first call (its start-up)")
b = rp.prepare_batches(trace); mark("cut the batches")
policies, budgets = sys.argv[2].split(","), [float(x) for x in sys.argv[3].split(",")]
rp.replay_curve(b, budgets[:1], policies, jobs=1); mark("load the kernels (+ one budget)")
rp.replay_curve(b, budgets, policies, jobs=1); mark("the replays (every budget)")
for label, cpu in out:
    print(f"{cpu:.3f} {label}")
"""


def child_cpu(argv: list[str], cwd: Path) -> float:
    """CPU seconds (user + system) of `argv` run to completion in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=cwd,
                   env={**os.environ, "PYTHONPATH": str(cwd)})  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policies", default="lru,lfu,s3fifo")
    ap.add_argument("--budgets", default="1000,2000,4000", help="MiB, comma-separated")
    ap.add_argument("--baseline", type=Path, help="another checkout's root, run alongside")
    ap.add_argument("--corpus", type=Path, default=default_corpus())
    args = ap.parse_args()
    try:
        import libcachesim as lcs
    except ImportError:
        print("libcachesim is not installed (pip install libcachesim): nothing to compare")
        return
    policies = args.policies.split(",")
    budgets = [float(b) for b in args.budgets.split(",")]
    missing = [p for p in policies if p not in LCS_NAMES]
    if missing:
        sys.exit(f"libCacheSim has no counterpart of {', '.join(missing)}")

    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "tiled.route.csv"
        trace = gemma_tiled(args.rows, args.corpus)
        write_route_trace(trace, csv)
        batches = rp.prepare_batches(trace)
        stream = Path(tmp) / "stream.oracleGeneral.bin"
        write_oracle(stream, *request_stream(batches))
        n = len(batches.look)
        del trace, batches
        command = [sys.executable, "-m", "bmoe", "analyze", "replay", str(csv), "--policies",
                   args.policies, "--budgets", args.budgets]  # fmt: skip
        trees = {"bmoe": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
        for root in trees.values():  # compile or load every kernel before timing
            child_cpu(command, root)

        def libcachesim_cpu() -> float:
            used = 0.0
            for budget in budgets:
                for policy in policies:
                    cache = getattr(lcs, LCS_NAMES[policy])(round(budget * MIB))
                    reader = lcs.TraceReader(str(stream), lcs.TraceType.ORACLE_GENERAL_TRACE)
                    start = time.process_time()
                    cache.process_trace(reader)
                    used += time.process_time() - start
            return used

        load = os.getloadavg()[0]
        print(
            f"{args.rows:,} rows, {n:,} lookups; {', '.join(policies)} at {args.budgets} MiB; "
            f"libcachesim {lcs.__version__}; load average {load:.1f} on {os.cpu_count()} CPUs"
        )
        runs: dict[str, list[float]] = {name: [] for name in [*trees, "libcachesim"]}
        for r in range(args.repeat):
            for name, root in trees.items():
                runs[name].append(child_cpu(command, root))
            runs["libcachesim"].append(libcachesim_cpu())
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in runs.items()),
                  flush=True)  # fmt: skip
        print()
        print("CPU-s, min / median / max:")
        for name, values in runs.items():
            label = "libCacheSim's replays alone" if name == "libcachesim" else f"{name} command"
            print(f"  {label:<30} {spread(values)}")
        lcs_runs = runs["libcachesim"]
        for name in trees:
            ratios = [a / b for a, b in zip(runs[name], lcs_runs, strict=True)]
            print(f"  {name} command / libCacheSim, per round: {spread(ratios)}")
        print(f"  (load average now {os.getloadavg()[0]:.1f})")
        print()
        print("where the command's time goes (one run of its phases, CPU-s):")
        done = subprocess.run(
            [sys.executable, "-c", PHASES, str(csv), args.policies, args.budgets],
            check=True, capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        print("\n".join(f"  {line}" for line in done.stdout.splitlines()))


if __name__ == "__main__":
    main()
