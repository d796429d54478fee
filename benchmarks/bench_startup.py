"""Benchmark: command-line start-up. ``bmoe --help`` and ``bmoe info FILE`` (a small metrics
CSV) in fresh interpreters, against the same command lines with every command module imported
up front (what start-up cost before the lazy command index), and ``bmoe info`` through the
format's full reader (pandas, pyarrow), measured interleaved in one run.

    python benchmarks/bench_startup.py [--runs 15]

Prints, per command line, the best and median wall time and the median CPU time (user + sys
of the child), and the ratios eager / lazy. On a busy machine the CPU time is the steadier
figure; the wall time is what a user waits.
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

SMALL_METRICS = (
    "# bmoe_metrics v1\n"
    "# model=m.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2 threads=4\n"
    "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct\n"
    + "".join(f"{i},32,10.5,1.0,9.5,{100 * i},50.0\n" for i in range(1, 33))
    + "# summary tokens=32 s/tok=0.0105 tok/s=95.2 cache_hit_pct=50.0\n"
)

EAGER = "import sys; from bmoe import cli; cli.register(); sys.exit(cli.main(sys.argv[1:]))"
#: ``bmoe info`` through the full reader of the format (pandas and pyarrow), as before the
#: quick path for small metrics files
FULL_READER = (
    "import sys; from bmoe.formats import info; info.describe = info.describe_fully; "
    "from bmoe import cli; sys.exit(cli.main(sys.argv[1:]))"
)


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="runs of each command line")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.csv"
        small.write_text(SMALL_METRICS, encoding="utf-8")
        lines = {
            "python -c pass": [py, "-c", "pass"],
            "bmoe --help": [py, "-m", "bmoe", "--help"],
            "bmoe --help (eager)": [py, "-c", EAGER, "--help"],
            "bmoe info small.csv": [py, "-m", "bmoe", "info", str(small)],
            "bmoe info small.csv (eager)": [py, "-c", EAGER, "info", str(small)],
            "bmoe info small.csv (full reader)": [py, "-c", FULL_READER, "info", str(small)],
        }
        for argv in lines.values():  # warm the file cache and the .pyc files
            timed(argv)
        walls: dict[str, list[float]] = {k: [] for k in lines}
        cpus: dict[str, list[float]] = {k: [] for k in lines}
        for _ in range(args.runs):  # interleaved, so load drift hits every line alike
            for name, argv in lines.items():
                wall, cpu = timed(argv)
                walls[name].append(wall)
                cpus[name].append(cpu)
    print(f"{args.runs} runs each, interleaved; load average {os.getloadavg()[0]:.1f}")
    print(f"{'command line':34} {'best wall':>10} {'median wall':>12} {'median CPU':>11}")
    for name in lines:
        best, median = 1000 * min(walls[name]), 1000 * statistics.median(walls[name])
        cpu = 1000 * statistics.median(cpus[name])
        print(f"{name:34} {best:8.0f} ms {median:9.0f} ms {cpu:8.0f} ms")
    print()
    for cmd in ("bmoe --help", "bmoe info small.csv"):
        eager = f"{cmd} (eager)"
        cpu_ratio = statistics.median(cpus[eager]) / statistics.median(cpus[cmd])
        wall_ratio = min(walls[eager]) / min(walls[cmd])
        print(f"{cmd}: eager / lazy = {cpu_ratio:.1f}x CPU, {wall_ratio:.1f}x best wall")
    full = "bmoe info small.csv (full reader)"
    cpu_ratio = statistics.median(cpus[full]) / statistics.median(cpus["bmoe info small.csv"])
    wall_ratio = min(walls[full]) / min(walls["bmoe info small.csv"])
    print(
        f"bmoe info small.csv: full reader / quick = {cpu_ratio:.1f}x CPU, "
        f"{wall_ratio:.1f}x best wall"
    )


if __name__ == "__main__":
    main()
