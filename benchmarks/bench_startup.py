"""Benchmark: command-line start-up. ``bmoe --help`` and ``bmoe info FILE`` (a small metrics
CSV, and a small route trace: 1,000 rows) in fresh interpreters, against the same command
lines with every command module imported up front (what start-up cost before the lazy
command index), and ``bmoe info`` through the format's full reader (pandas, pyarrow),
measured interleaved in one run; `--baseline DIR` adds another checkout's ``bmoe info``
lines to each round.

    python benchmarks/bench_startup.py [--runs 15] [--baseline DIR]

Prints, per command line, the best, median and worst wall time and the median CPU time (user
+ sys of the child), the load average over the rounds, the ratios eager / lazy, and whether
``bmoe info`` on a small file is under 0.2 s (median wall). On a busy machine the CPU time
is the steadier figure; the wall time is what a user waits.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
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

SMALL_ROUTE = (
    "# route_trace v1\n# model=m.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2\n"
    "# layer=0 expert_bytes=1000\n# layer=1 expert_bytes=1000\n"
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
    + "".join(f"0,1,{s},{x},{k},{(3 * s + k) % 8},0.5,1,0\n" for s in range(250) for x in (0, 1)
              for k in (0, 1))
)  # fmt: skip
#: the target of `bmoe info` on a small file (median wall, seconds)
INFO_TARGET_S = 0.2

EAGER = "import sys; from bmoe import cli; cli.register(); sys.exit(cli.main(sys.argv[1:]))"
#: ``bmoe info`` through the full reader of the format (pandas and pyarrow), as before the
#: quick path for small metrics files
FULL_READER = (
    "import sys; from bmoe.formats import info; info.describe = info.describe_fully; "
    "from bmoe import cli; sys.exit(cli.main(sys.argv[1:]))"
)


#: command lines that aborted at exit (run again): name -> count
ABORTS: dict[str, int] = {}


def timed(argv: list[str], tree: str | None = None, name: str = "") -> tuple[float, float]:
    """(wall s, CPU s) of one child process (with the bmoe of the checkout `tree`). A run
    that aborts (SIGABRT: pyarrow's threads at interpreter exit, now and then, where pyarrow
    was imported) is counted in :data:`ABORTS` and run again."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, cwd=tree, check=False)  # fmt: skip
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != -signal.SIGABRT:
            break
        ABORTS[name] = ABORTS.get(name, 0) + 1
    done.check_returncode()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="runs of each command line")
    ap.add_argument("--baseline", type=Path, help="another checkout's root, run alongside")
    args = ap.parse_args()
    for tree in [ROOT, *([args.baseline] if args.baseline else [])]:  # as an install has it
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "bmoe")], check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.csv"
        small.write_text(SMALL_METRICS, encoding="utf-8")
        route = Path(tmp) / "small.route.csv"
        route.write_text(SMALL_ROUTE, encoding="utf-8")
        lines = {
            "python -c pass": [py, "-c", "pass"],
            "bmoe --help": [py, "-m", "bmoe", "--help"],
            "bmoe --help (eager)": [py, "-c", EAGER, "--help"],
            "bmoe info small.csv": [py, "-m", "bmoe", "info", str(small)],
            "bmoe info small.csv (eager)": [py, "-c", EAGER, "info", str(small)],
            "bmoe info small.csv (full reader)": [py, "-c", FULL_READER, "info", str(small)],
            "bmoe info small.route.csv": [py, "-m", "bmoe", "info", str(route)],
            "bmoe info small.route.csv (full)": [py, "-c", FULL_READER, "info", str(route)],
        }
        envs = {name: None for name in lines}
        if args.baseline:
            for name in ("bmoe info small.csv", "bmoe info small.route.csv"):
                lines[f"baseline {name}"] = lines[name]
                envs[f"baseline {name}"] = str(args.baseline)
        for name, argv in lines.items():  # warm the file cache and the .pyc files
            timed(argv, envs[name], name)
        walls: dict[str, list[float]] = {k: [] for k in lines}
        cpus: dict[str, list[float]] = {k: [] for k in lines}
        loads = []
        for _ in range(args.runs):  # interleaved, so load drift hits every line alike
            for name, argv in lines.items():
                wall, cpu = timed(argv, envs[name], name)
                walls[name].append(wall)
                cpus[name].append(cpu)
            loads.append(os.getloadavg()[0])
    print(f"{args.runs} runs each, interleaved; load average {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'command line':38} {'wall best / median / worst':>28} {'median CPU':>11}")
    for name in lines:
        w = walls[name]
        wall = f"{1000 * min(w):.0f} / {1000 * statistics.median(w):.0f} / {1000 * max(w):.0f} ms"
        cpu = 1000 * statistics.median(cpus[name])
        print(f"{name:38} {wall:>28} {cpu:8.0f} ms")
    print()
    for cmd in ("bmoe --help", "bmoe info small.csv"):
        eager = f"{cmd} (eager)"
        cpu_ratio = statistics.median(cpus[eager]) / statistics.median(cpus[cmd])
        wall_ratio = min(walls[eager]) / min(walls[cmd])
        print(f"{cmd}: eager / lazy = {cpu_ratio:.1f}x CPU, {wall_ratio:.1f}x best wall")
    for cmd in ("bmoe info small.csv", "bmoe info small.route.csv"):
        median = statistics.median(walls[cmd])
        verdict = "under" if median < INFO_TARGET_S else "NOT under"
        print(f"{cmd}: median wall {1000 * median:.0f} ms, {verdict} {1000 * INFO_TARGET_S:.0f} ms")
    for name, count in ABORTS.items():
        print(f"{name}: {count} run(s) aborted at exit (SIGABRT) and were run again")
    full = "bmoe info small.csv (full reader)"
    cpu_ratio = statistics.median(cpus[full]) / statistics.median(cpus["bmoe info small.csv"])
    wall_ratio = min(walls[full]) / min(walls["bmoe info small.csv"])
    print(
        f"bmoe info small.csv: full reader / quick = {cpu_ratio:.1f}x CPU, "
        f"{wall_ratio:.1f}x best wall"
    )


if __name__ == "__main__":
    main()
